"""Terminal rendering of a report document, readable at 80 columns: headline numbers first."""

from __future__ import annotations

import textwrap
from typing import Any

from diagnoser.model import basis_text
from diagnoser.outputs.termsafe import term_safe

WIDTH = 80
HEADLINE = [
    ("running_reqs", "running", "{:.0f}"),
    ("queue_reqs", "queued", "{:.0f}"),
    ("token_usage", "KV usage", "{:.2f}"),
    ("gen_throughput_tps", "gen tok/s", "{:.0f}"),
    ("cache_hit_rate", "cache hit", "{:.0%}"),
    ("ttft_seconds_p95", "TTFT p95 s", "{:.2f}"),
    ("request_rate", "req/s", "{:.1f}"),
    ("output_tps", "out tok/s", "{:.0f}"),
]
SEV_MARK = {"critical": "CRIT", "warning": "WARN", "info": "info"}


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _wrap(text: str, indent: str = "  ", first: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first if first is not None else indent, subsequent_indent=indent) or [indent.rstrip()]


def _secs(stamp: str) -> str:
    """``2026-11-29T10:29:56.005387Z`` → ``2026-11-29T10:29:56Z`` (the JSON keeps the full stamp)."""
    if "." in stamp and stamp.endswith("Z"):
        return stamp.split(".", 1)[0] + "Z"
    return stamp


def _per_rank(sigs: dict[str, Any]) -> list[str]:
    """``dp0 running 10 KV 0.50 · dp1 running 30 KV 0.90``: DP imbalance at a glance."""
    out = []
    ranks = sorted({k[k.index("[") + 1 : -1] for k in sigs if k.startswith("running_reqs[")})
    for r in ranks:
        run, use = sigs.get(f"running_reqs[{r}]") or {}, sigs.get(f"token_usage[{r}]") or {}
        cell = f"{r} running {_fmt('{:.0f}', run.get('mean'))}"
        if use.get("n"):
            cell += f" KV {_fmt('{:.2f}', use.get('max'))}"
        out.append(cell)
    return out


def render(doc: dict[str, Any], verbose: bool = False) -> str:
    if doc.get("fleet"):  # fleet mode: summary first, then the worst targets
        from diagnoser.outputs.fleet import render_fleet

        return term_safe(render_fleet(doc, verbose))
    out: list[str] = []
    status = doc["status"]
    title = f"diagnoser · {doc.get('engine', 'sglang')} {doc.get('version') or '(version unknown)'} · status: {status.upper()}"
    out.append(title[:WIDTH])
    w = doc.get("window") or {}
    if w.get("start"):
        out.append(f"window {_secs(w['start'])} → {_secs(w['end'])}")
    out.append("")
    for target, sigs in doc.get("signals", {}).items():
        out.append(f"▸ {target}"[:WIDTH])
        cells = []
        for key, label, fmt in HEADLINE:
            st = sigs.get(key)
            if not st or not st.get("n"):
                continue
            if key in ("running_reqs", "queue_reqs") and st["min"] != st["max"]:
                val = f"{_fmt(fmt, st['min'])}–{_fmt(fmt, st['max'])}"
            elif key == "token_usage":
                val = f"{_fmt(fmt, st['mean'])} (max {_fmt(fmt, st['max'])})"
            else:
                # latency: the quantile over the whole window when the histograms gave one; counter rates:
                # the increase over the window / its length
                val = _fmt(fmt, st.get("window", st["max"]) if key == "ttft_seconds_p95" else st.get("window", st["mean"]))
            cells.append(f"{label} {val}")
        line = "  "
        for c in cells:
            if len(line) + len(c) + 3 > WIDTH:
                out.append(line.rstrip())
                line = "  "
            line += c + " · "
        if line.strip():
            out.append(line.rstrip(" ·"))
        ranks = _per_rank(sigs)
        if ranks:
            out.extend(_wrap("per rank: " + " · ".join(ranks), "    ", "  "))
        cfg = doc.get("config", {}).get(target, {})
        facts = []
        for k, label in (("max_total_tokens", "pool"), ("max_running_requests", "max running"), ("mem_fraction_static", "mem frac"), ("chunked_prefill_size", "chunk"), ("tp_size", "tp")):
            if k in cfg:
                v = cfg[k]["value"]
                facts.append(f"{label} {v:,}" if isinstance(v, int) else f"{label} {v}")
        if facts:
            out.extend(_wrap(" · ".join(facts), "  "))
        top = (doc.get("top") or {}).get(target)
        if top:
            first = top.get("suggestion")
            change = f"; first change {first['flag']} {current_text(first)} → {first['proposed']}" if first else ""
            out.extend(_wrap(f"top cause: {top['rule']} ({top['severity']}){change}", "    ", "  "))
        out.append("")
    findings = doc.get("findings", [])
    if findings:
        out.append(f"Findings ({len(findings)})")
        for f in findings:
            mark = SEV_MARK.get(f["severity"], f["severity"])
            on = basis_text(f.get("basis") or {})
            head = f"[{mark}] {f['rule']} ({f['confidence']} confidence{', ' + on if on else ''})"
            if len(doc.get("signals", {})) > 1:
                head += f" · {f['target']}"
            out.extend(_wrap(head, "    ", ""))
            out.extend(_wrap(f["summary"], "    "))
            if f.get("evidence"):
                for e in f["evidence"][: (None if verbose else 4)]:
                    thr = f" (threshold {e['threshold']})" if e.get("threshold") not in (None, "") else ""
                    src = f" ← {e['source']}" if e.get("source") else ""
                    out.extend(_wrap(f"{e['signal']} = {e['observed']}{thr}{src}", "      ", "    · "))
            for i, s in enumerate(f.get("suggestions", [])):
                cur = current_text(s)
                out.extend(_wrap(f"{s['flag']} {cur} → {s['proposed']}: {s['why']}", "      ", f"    {i + 1}. "))
                if s.get("effect"):
                    out.extend(_wrap(f"effect: {s['effect']}", "       "))
            for n in f.get("notes", []):
                out.extend(_wrap(n, "      ", "    note: "))
            out.append(f"    docs: {f['docs']}"[:WIDTH])
            out.append("")
    elif status != "error":
        out.append("No problem found: nothing at warning or above.")
        out.append("")
    for i in doc.get("inputs", []):
        if i["kind"] == "replay":  # the recording itself: the inputs it held are listed above with their counts
            line = (f"input replay {i['source']}: {i.get('scrapes', 0)} scrapes and {i.get('lines_read', 0)} log lines "
                    f"replayed, {i['errors']} errors")
        else:
            what = f"{i.get('lines_read', i.get('scrapes', 0))} {'lines' if i['kind'] == 'log' else 'reads'}"
            line = f"input {i['kind']} {i['source']}: {what}, {i['lines_recognized']} recognised, {i['errors']} errors"
        out.extend(_wrap(line, "  ", ""))
        for m in i.get("messages", []):
            out.extend(_wrap(m, "    ", "  ! "))
    said = {m for i in doc.get("inputs", []) for m in i.get("messages", [])}
    for e in doc.get("errors", []):
        if e.get("source") == "input" and e["error"] in said:
            continue  # already printed under the input it came from
        out.extend(_wrap(f"{e.get('rule', e.get('source'))}: {e['error']}", "    ", "  ! "))
    return term_safe("\n".join(out).rstrip() + "\n")  # server- and bundle-provided strings: no terminal control


def current_text(s: dict[str, Any]) -> Any:
    """The current value as printed. ``None`` in the JSON means the inputs do not show the flag, not that
    it is unset; only a suggestion that says the flag is at its default prints as such."""
    if s.get("current") is not None:
        return s["current"]
    said = " ".join([str(s.get("why") or ""), *[str(a) for a in s.get("assumptions") or []]]).lower()
    if "at its default" in said or "at the default" in said:
        return "unset (default)"
    return "unknown (not in the inputs)"
