"""The text of the report's ``client`` section (``--client-results``): what the client saw beside the
server, one row per quantity, then the gap named in sentences. Kept apart from ``outputs/text.py`` so
that the report's layout and this section change independently."""

from __future__ import annotations

import textwrap
from typing import Any

from diagnoser.outputs.term import shown


def client_lines(sec: dict[str, Any] | None, width: int = 80) -> list[str]:
    if not sec:
        return []
    out = textwrap.wrap(f"What the client saw ({shown(sec.get('tool'))}, {shown(sec.get('source'))})", width, subsequent_indent="  ",
                        break_on_hyphens=False)
    w = sec.get("window") or {}
    if w.get("start"):
        out.extend(textwrap.wrap(f"window {w['start']} → {w['end']}, from {w.get('basis')}", width, initial_indent="  ",
                                 subsequent_indent="    "))
    rows = [r for r in sec.get("rows") or [] if r.get("client") is not None or r.get("server") is not None]
    if rows:
        lw = max(len(r["quantity"]) for r in rows)
        out.append(f"  {'':<{lw}}  {'client':>12}  {'server':>12}")
        for r in rows:
            d = r.get("diff")
            diff = f"  {d:+.0%}" if isinstance(d, int | float) and r.get("server") else ""
            out.append(f"  {r['quantity']:<{lw}}  {r['client_text']:>12}  {r['server_text']:>12}{diff}"[:width])
    for g in sec.get("gaps") or []:
        out.extend(textwrap.wrap(g, width, initial_indent="  · ", subsequent_indent="    "))
    for n in sec.get("notes") or []:
        out.extend(textwrap.wrap(n, width, initial_indent="  note: ", subsequent_indent="    "))
    out.append("")
    return out
