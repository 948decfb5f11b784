"""Terminal rendering of a report document: short by default, detail under ``--verbose``.

The default answers in one screen: the headline numbers of each target, the verdict (its top cause),
one line for each other finding, the first fix of the top cause with its effect and the next fixes one
line each. ``--verbose`` adds every finding's evidence with its source, each suggestion's reasons,
effect and assumptions, the notes, the inputs and every rule that ran with why it is fine (or what it
lacked to judge). A sentence is said once: a note or an effect that repeats a clause already printed
says "(as above)" instead. Width and colour come from :mod:`diagnoser.outputs.term`; every string a
server or a bundle provided goes through :func:`diagnoser.outputs.term.shown` on its way out.
"""

from __future__ import annotations

import re
from typing import Any

from diagnoser.floor import above
from diagnoser.model import basis_text
from diagnoser.outputs.term import SEV_STYLE, Term, shown
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
MAX_NEXT_FIXES = 4  # the default report's "then" list; --verbose shows every suggestion


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _wrap(text: str, indent: str = "  ", first: str | None = None, width: int = WIDTH) -> list[str]:
    return Term(width=width).wrap(text, indent, first)


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


def _cells(t: Term, cells: list[str], indent: str = "  ") -> list[str]:
    """Cells joined by `` · `` and wrapped between cells (a cell is never split)."""
    out: list[str] = []
    line = indent
    for c in cells:
        if line.strip() and len(line) + len(c) + 3 > t.width:
            out.append(line.rstrip(" ·"))
            line = indent
        line += c + " · "
    if line.strip():
        out.append(line.rstrip(" ·"))
    return out


def _headline(t: Term, doc: dict[str, Any], target: str, sigs: dict[str, Any]) -> list[str]:
    out = [t.paint(x, "bold") for x in t.wrap(shown(target), "  ", "▸ ")]  # a long path wraps at a '/', never cut
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
            which = "window" if "window" in st else ("max" if key == "ttft_seconds_p95" else "mean")
            val = above(_fmt(fmt, st[which]), which in st.get("lower_bounds", ()))
        cells.append(f"{label} {val}")
    out.extend(_cells(t, cells))
    ranks = _per_rank(sigs)
    if ranks:
        out.extend(t.wrap("per rank: " + " · ".join(ranks), "    ", "  "))
    cfg = doc.get("config", {}).get(target, {})
    facts = []
    for k, label in (("max_total_tokens", "pool"), ("max_running_requests", "max running"), ("mem_fraction_static", "mem frac"), ("chunked_prefill_size", "chunk"), ("tp_size", "tp")):
        if k in cfg:
            v = cfg[k]["value"]
            facts.append(f"{label} {v:,}" if isinstance(v, int) else f"{label} {shown(v)}")
    out.extend(_cells(t, facts))
    return out


def change_text(s: dict[str, Any], short: bool = False) -> str:
    """``--flag current → proposed``. A proposal relative to a current value the inputs do not show
    ("2 x the current") reads ``--flag → 2 x the current``, never ``unknown → 2 x the current``; in the
    short report an unknown current value is left out (``--verbose`` says it is not in the inputs)."""
    cur = current_text(s)
    prop = shown(s.get("proposed"))
    if s.get("current") is None and "the current" in prop:
        return f"{shown(s.get('flag'))} → {prop}"
    if s.get("current") is None and short and cur != "unset (default)":
        cur = "unknown"
    return f"{shown(s.get('flag'))} {shown(cur)} → {prop}"


_CLAUSE = re.compile(r"(?<=[.;:])\s+|\s+—\s+")


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .;:")


def once(text: str, said: set[str]) -> str | None:
    """``text`` without the clauses (30 characters or more) already printed: ``None`` when it says
    nothing new, else what is new followed by "(as above)" where a repeat was left out. Every clause
    printed is remembered in ``said``."""
    parts = [p for p in _CLAUSE.split(str(text)) if p.strip()]
    kept: list[str] = []
    dropped = False
    for p in parts:
        key = _norm(p)
        if len(key) >= 30 and (key in said or any(key in k for k in said if len(k) > len(key))):
            dropped = True
            continue
        kept.append(p)
        if len(key) >= 30:
            said.add(key)
    if not kept:
        return None
    if dropped and all(len(_norm(p)) < 30 for p in kept):
        return None  # only a lead-in is left ("--mem-fraction-static unset → current + 0.03 became …:")
    return " ".join(kept) + (" (as above)" if dropped else "")


def _effect(s: dict[str, Any]) -> str:
    from diagnoser.outputs.effect import present_suggestion

    return str(present_suggestion(s).get("effect_line") or "")


def _order_by_target(doc: dict[str, Any]) -> list[str]:
    """The targets in the findings' order (the worst first: evaluate.cause_order), then the rest."""
    order = dict.fromkeys(f["target"] for f in doc.get("findings", []))  # (a fleet's: 10,000 targets)
    order.update(dict.fromkeys(doc.get("signals", {})))  # (the targets already in it keep their place)
    return list(order)


def _top_fix(findings: list[dict[str, Any]], top: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """(the finding and suggestion of the first fix, the next ones) for one target, in the findings' order."""
    all_s = [(f, s) for f in findings for s in f.get("suggestions") or []]
    first = None
    want = (top or {}).get("suggestion") or {}
    for f, s in all_s:
        if want and s.get("flag") == want.get("flag") and s.get("proposed") == want.get("proposed"):
            first = (f, s)
            break
    if first is None and want:
        first = next(iter(all_s), None)
    rest, flags = [], {first[1].get("flag")} if first else set()
    for f, s in all_s:
        if first and s is first[1] or s.get("flag") in flags:
            continue
        flags.add(s.get("flag"))
        rest.append((f, s))
    return (first[0], first[1], rest) if first else (None, None, rest)


def _mark(t: Term, sev: str) -> str:
    return t.paint(f"[{SEV_MARK.get(sev, sev)}]", SEV_STYLE.get(sev))


def _short_target(t: Term, doc: dict[str, Any], target: str, many: bool) -> list[str]:
    from diagnoser.evaluate import explains

    out: list[str] = []
    findings = [f for f in doc.get("findings", []) if f["target"] == target]
    top = (doc.get("top") or {}).get(target)
    lead = next((f for f in findings if top and f["rule"] == top["rule"]), None)
    if lead is not None:
        on = basis_text(lead.get("basis") or {})
        head = f"{SEV_MARK.get(lead['severity'], lead['severity'])} top cause: {lead['rule']} ({lead['confidence']} confidence{', ' + on if on else ''})"
        out.extend(t.paint(x, SEV_STYLE.get(lead["severity"])) for x in t.wrap(head, "    ", "  "))
        out.extend(t.wrap(shown(lead["summary"]), "    "))
    others = [f for f in findings if f is not lead]
    for f in others:
        how = "follows from it" if lead is not None and explains(lead["rule"], f["rule"]) else f"{f['confidence']} confidence"
        line = t.fit(f"  {SEV_MARK.get(f['severity'], f['severity'])} {f['rule']} ({how}): {shown(f['summary'])}")
        mark = SEV_MARK.get(f["severity"], f["severity"])
        out.append(line.replace(mark, t.paint(mark, SEV_STYLE.get(f["severity"])), 1))
    lf, first, rest = _top_fix(findings, top)
    if first is not None:
        out.append("")
        out.extend(t.paint(x, "bold") for x in t.wrap(f"Fix first: {change_text(first, short=True)} ({lf['rule'] if lf else ''})", "    ", "  "))
        if first.get("why"):
            out.extend(t.wrap(shown(first["why"]), "    "))
        eff = _effect(first)
        if eff:
            out.extend(t.wrap(f"effect: {shown(eff)}", "    "))
    if rest:
        out.append("  Then:" if first is not None else "  Fixes:")
        for i, (f, s) in enumerate(rest[:MAX_NEXT_FIXES]):
            eff = _effect(s)
            out.append(t.fit(f"  {i + 2 if first is not None else i + 1}. {change_text(s, short=True)} ({f['rule']})" + (f": {shown(eff)}" if eff else "")))
        if len(rest) > MAX_NEXT_FIXES:
            out.append(f"  and {len(rest) - MAX_NEXT_FIXES} more: --verbose shows them")
    return out


def _said_by_findings(doc: dict[str, Any], m: str) -> bool:
    """An input's message that a finding's summary already says (a server that did not answer)."""
    return any(m in str(f.get("summary") or "") for f in doc.get("findings", []))


def _inputs_verbose(t: Term, doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for i in doc.get("inputs", []):
        if i["kind"] == "replay":  # the recording itself: the inputs it held are listed above with their counts
            line = (f"input replay {shown(i['source'])}: {i.get('scrapes', 0)} scrapes and {i.get('lines_read', 0)} log lines "
                    f"replayed, {i['errors']} errors")
        else:
            what = f"{i.get('lines_read', i.get('scrapes', 0))} {'lines' if i['kind'] == 'log' else 'reads'}"
            line = f"input {i['kind']} {shown(i['source'])}: {what}, {i['lines_recognized']} recognised, {i['errors']} errors"
        out.extend(t.wrap(line, "  ", ""))
        for m in i.get("messages", []):
            if not _said_by_findings(doc, m):  # said once: the finding above already says it
                out.extend(t.wrap(shown(m), "    ", "  ! "))
    return out


def _inputs_short(t: Term, doc: dict[str, Any]) -> list[str]:
    """One line for the inputs; an input with errors, or a report with nothing usable, says them in full."""
    inputs = doc.get("inputs", [])
    if doc.get("status") == "error" or any(i.get("errors") for i in inputs):
        return _inputs_verbose(t, doc)
    kinds = [i for i in inputs if i["kind"] != "replay"]
    replay = next((i for i in inputs if i["kind"] == "replay"), None)
    parts = []
    for i in kinds:
        n = i.get("lines_read", i.get("scrapes", 0))
        parts.append(f"{i['kind']} ({n:,} {'lines' if i['kind'] == 'log' else 'reads'})" if isinstance(n, int) else i["kind"])
    src = f" from {shown(replay['source'])}" if replay else ""
    return t.wrap(f"read {', '.join(parts) or 'nothing'}{src}, no errors", "  ", "")


def _errors(t: Term, doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    said = {m for i in doc.get("inputs", []) for m in i.get("messages", [])}
    for e in doc.get("errors", []):
        if e.get("source") == "input" and (e["error"] in said or _said_by_findings(doc, e["error"])):
            continue  # already printed under the input it came from, or by a finding
        out.extend(t.wrap(shown(f"{e.get('rule', e.get('source'))}: {e['error']}"), "    ", "  ! "))
    return out


def _finding_verbose(t: Term, doc: dict[str, Any], f: dict[str, Any], said: set[str]) -> list[str]:
    out: list[str] = []
    on = basis_text(f.get("basis") or {})
    head = f"{_mark(t, f['severity'])} {f['rule']} ({f['confidence']} confidence{', ' + on if on else ''})"
    if len(doc.get("signals", {})) > 1:
        head += f" · {shown(f['target'])}"
    out.extend(t.wrap(head, "    ", ""))
    out.extend(t.wrap(shown(f["summary"]), "    "))
    for e in f.get("evidence") or []:
        thr = f" (threshold {e['threshold']})" if e.get("threshold") not in (None, "") else ""
        src = f" ← {e['source']}" if e.get("source") else ""
        obs = e.get("bound") or e["observed"]  # a quantile's lower bound says its range ("> 100 s")
        out.extend(t.wrap(shown(f"{e['signal']} = {obs}{thr}{src}"), "      ", "    · "))
    for i, s in enumerate(f.get("suggestions", [])):
        why = once(shown(s.get("why") or ""), said) or "(as above)"
        out.extend(t.wrap(f"{change_text(s)}: {why}", "      ", f"    {i + 1}. "))
        eff = once(shown(s.get("effect") or ""), said) if s.get("effect") else None
        if eff:
            out.extend(t.wrap(f"effect: {eff}", "       "))
    for n in f.get("notes", []):
        note = once(shown(n), said)
        if note:
            out.extend(t.wrap(note, "      ", "    note: "))
    out.append(t.fit(f"    docs: {f['docs']}"))
    return out


def _checked(t: Term, doc: dict[str, Any]) -> list[str]:
    rows = doc.get("checked") or []
    if not rows:
        return []
    many = len({r["target"] for r in rows if r["target"] != "fleet"}) > 1
    out = [t.paint(f"Rules checked ({len(rows)})", "bold")]
    label = {"fired": "fired", "fine": "fine", "not_judged": "no data", "error": "error"}
    for r in rows:
        where = f" · {shown(r['target'])}" if many or r["target"] == "fleet" else ""
        out.extend(t.wrap(shown(f"{r['code']} {r['rule']}{where} — {label.get(r['status'], r['status'])}: {r['why']}"), "      ", "  "))
    return out


def render(doc: dict[str, Any], verbose: bool = False, term: Term | None = None) -> str:
    """The report as text at ``term``'s width (80 columns, no colour when not given)."""
    t = term or Term()
    if doc.get("fleet"):  # fleet mode: summary first, then the worst targets
        from diagnoser.outputs.fleet import render_fleet

        body = render_fleet(doc, verbose, t)
        return body if t.color else term_safe(body)
    out: list[str] = []
    status = doc["status"]
    title = f"diagnoser · {doc.get('engine', 'sglang')} {shown(doc.get('version') or '(version unknown)')} · status: {status.upper()}"
    out.append(t.paint(t.fit(title), SEV_STYLE.get("warning") if status == "problems" else "bold"))
    w = doc.get("window") or {}
    if w.get("start"):
        out.append(f"window {_secs(w['start'])} → {_secs(w['end'])}")
    out.append("")
    findings = doc.get("findings", [])
    targets = _order_by_target(doc)
    many = len(targets) > 1
    said: set[str] = set()
    for target in targets:
        if target in doc.get("signals", {}):
            out.extend(_headline(t, doc, target, doc["signals"][target]))
        elif not any(f["target"] == target for f in findings):
            continue
        else:
            out.extend(t.paint(x, "bold") for x in t.wrap(shown(target), "  ", "▸ "))
        if not verbose:
            out.extend(_short_target(t, doc, target, many))
        else:
            top = (doc.get("top") or {}).get(target)
            if top:
                first = top.get("suggestion")
                change = f"; first change {change_text(first)}" if first else ""
                out.extend(t.wrap(f"top cause: {top['rule']} ({top['severity']}){change}", "    ", "  "))
        out.append("")
    if verbose and findings:
        out.append(t.paint(f"Findings ({len(findings)})", "bold"))
        for f in findings:
            out.extend(_finding_verbose(t, doc, f, said))
            out.append("")
    if not findings and status != "error":
        out.append("No problem found: nothing at warning or above.")
        out.append("")
    from diagnoser.outputs.client import client_lines  # --client-results: what the client saw

    out.extend(client_lines(doc.get("client"), t.width))
    if verbose:
        out.extend(_inputs_verbose(t, doc))
    else:
        out.extend(_inputs_short(t, doc))
    out.extend(_errors(t, doc))
    if verbose:
        checked = _checked(t, doc)
        if checked:
            out.append("")
            out.extend(checked)
    elif findings:
        n = len(doc.get("checked") or [])
        out.extend(t.wrap(f"--verbose: the evidence with its sources, the assumptions{f' and the {n} rules checked' if n else ''}", "  ", ""))
    body = "\n".join(out).rstrip() + "\n"
    # every server- or bundle-provided string went through shown(); without colour the whole text is
    # passed through term_safe as well (with colour, its own escape codes must stay)
    return body if t.color else term_safe(body)


def current_text(s: dict[str, Any]) -> Any:
    """The current value as printed. ``None`` in the JSON means the inputs do not show the flag, not that
    it is unset; only a suggestion that says the flag is at its default prints as such."""
    if s.get("current") is not None:
        return s["current"]
    said = " ".join([str(s.get("why") or ""), *[str(a) for a in s.get("assumptions") or []]]).lower()
    if "at its default" in said or "at the default" in said:
        return "unset (default)"
    return "unknown (not in the inputs)"
