"""``--format markdown``: a short card (at most :data:`MAX_LINES` lines) to paste into a GitHub issue or a
chat: the version and model, the verdict, the findings, the fixes with their effect and the key numbers
with their sources. Built from the (already redacted) report document; every server-provided string is
redacted again and its Markdown and HTML specials escaped, so a model name cannot become a link or a tag.
"""

from __future__ import annotations

import re
from typing import Any

from diagnoser.floor import above
from diagnoser.outputs.term import shown
from diagnoser.outputs.text import HEADLINE, _fmt, _order_by_target, _secs, _top_fix, change_text

MAX_LINES = 40
MAX_FINDINGS = 6
MAX_FIXES = 4
_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")


def md(value: Any) -> str:
    """A server-provided string as inert Markdown: redacted, control characters gone, specials escaped."""
    return _SPECIAL.sub(r"\\\1", shown(value).replace("\n", " "))


def _model(doc: dict[str, Any], target: str) -> str | None:
    cfg = doc.get("config", {}).get(target, {})
    for k in ("served_model_name", "model_path", "arg.served_model_name", "arg.model_path"):
        if k in cfg and cfg[k].get("value"):
            return str(cfg[k]["value"])
    return None


def _sources(f: dict[str, Any]) -> str:
    srcs = [str(e.get("source")) for e in f.get("evidence") or [] if e.get("source")]
    return md(srcs[0]) if srcs else ""


def render_markdown(doc: dict[str, Any]) -> str:
    out: list[str] = []
    targets = _order_by_target(doc)
    version = doc.get("version") or "version unknown"
    status = str(doc.get("status", "")).upper()
    out.append(f"### diagnoser: {doc.get('engine', 'sglang')} {md(version)} · {status}")
    w = doc.get("window") or {}
    if w.get("start"):
        out.append(f"Window {_secs(w['start'])} → {_secs(w['end'])}.")
    for target in targets[:3]:
        findings = [f for f in doc.get("findings", []) if f["target"] == target]
        top = (doc.get("top") or {}).get(target)
        model = _model(doc, target)
        out.append("")
        out.append(f"**{md(target)}**" + (f" · model {md(model)}" if model else ""))
        if top:
            out.append(f"**Verdict:** {md(top['rule'])} ({top['severity']}): {md(top['summary'])}")
        elif doc.get("status") == "error":
            said = [m for i in doc.get("inputs", []) for m in i.get("messages", [])] + [
                e["error"] for e in doc.get("errors", []) if e.get("source") == "input"]
            out.append("**Verdict:** nothing usable was read" + (f": {md(said[0])}" if said else "."))
        elif not findings:
            out.append("**Verdict:** no problem found (nothing at warning or above).")
        sigs = doc.get("signals", {}).get(target, {})
        cells = []
        for key, label, fmt in HEADLINE[:6]:
            st = sigs.get(key)
            if st and st.get("n"):
                which = "window" if "window" in st else ("max" if key == "ttft_seconds_p95" else "mean")
                val = above(_fmt(fmt, st.get(which)), which in st.get("lower_bounds", ()))  # "> 100.00": a quantile's floor
                cells.append(f"{label} {val} (max {_fmt(fmt, st['max'])})" if key in ("queue_reqs", "token_usage") else f"{label} {val}")
        if cells:
            out.append("")
            n = (sigs.get("running_reqs") or {}).get("n")
            srcs = ", ".join(f"{i['kind']} {md(i['source'])}" for i in doc.get("inputs", []) if i["kind"] != "replay")
            out.append("Key numbers: " + " · ".join(cells) + (f" ({n} readings" if n else " (") + (f"; from {srcs})." if srcs else ")."))
        if findings:
            out.append("")
            out.append("| severity | finding | summary | source |")
            out.append("|---|---|---|---|")
            for f in findings[:MAX_FINDINGS]:
                summary = str(f["summary"])
                summary = summary if len(summary) <= 160 else summary[:157].rsplit(" ", 1)[0] + " …"
                out.append(f"| {f['severity']} | {md(f['rule'])} | {md(summary)} | {_sources(f)} |")
            if len(findings) > MAX_FINDINGS:
                out.append(f"| | … | {len(findings) - MAX_FINDINGS} more | |")
        lf, first, rest = _top_fix(findings, top)
        fixes = ([(lf, first)] if first is not None and lf is not None else []) + rest
        if fixes:
            out.append("")
            out.append("Fixes, in order:")
            from diagnoser.outputs.text import _effect

            for i, (f, s) in enumerate(fixes[:MAX_FIXES]):
                eff = _effect(s)
                out.append(f"{i + 1}. `{change_text(s, short=True).replace('`', '')}` ({md(f['rule'])})" + (f": {md(eff)}" if eff else ""))
    if len(targets) > 3:
        out.append("")
        out.append(f"… and {len(targets) - 3} more target(s): `--format json` has them all.")
    out.append("")
    out.append("<sub>diagnoser · `--verbose` shows the evidence and the rules checked · secrets redacted</sub>")
    if len(out) > MAX_LINES:
        out = out[: MAX_LINES - 1] + ["<sub>(cut to 40 lines: `--format json` has everything)</sub>"]
    return "\n".join(out) + "\n"
