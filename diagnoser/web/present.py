"""What the dashboard leads with: the verdict and the top fixes of a target, and suggestions that state
each assumption once.

Works on the redacted finding documents of :mod:`diagnoser.web.views` (``Finding.to_dict()``), adding
presentation fields and never changing the advice:

* ``effect_text``: the suggestion's expected effect without the ``Assumes: …`` and ``Risk: …`` sentences
  that :meth:`diagnoser.capacity.scenario.Scenario.effect_text` folds into it, since the page lists
  ``assumes`` and ``risks`` once, below it (they were printed twice);
* ``effect_line``: the effect in one line for an overview card (the capacity model's before → after
  numbers, or the rule's own claim when the model does not size the change);
* :func:`top_fixes` ranks the suggestions of a target's findings: firing before pending, then the
  order of the findings (``evaluate.cause_order``: the top cause, what it explains, the rest), then expected gain; one per flag (the checks in ``evaluate.check_suggestions`` already refused
  contradicting ones); a change that does not fit is never a top fix.
"""

from __future__ import annotations

from typing import Any

# the effect of a suggestion in one line is shared with the text report (outputs/effect.py, which the
# start-up path of `diagnose --once` can import without the web package)
from diagnoser.outputs.effect import UNSIZED, one_line, present_suggestion

__all__ = ["UNSIZED", "chips", "one_line", "present_suggestion", "top_fixes", "verdict"]

SEV = {"critical": 3, "warning": 2, "info": 1}


def _gain(s: dict[str, Any]) -> float:
    g = s.get("gain")
    return float(g) if isinstance(g, int | float) else 0.0


def _fits(s: dict[str, Any]) -> bool:
    proj = s.get("projection") if isinstance(s.get("projection"), dict) else {}
    return proj.get("fits") is not False and _gain(s) > -1.0


def chips(s: dict[str, Any]) -> list[dict[str, str]]:
    """The projection's headline numbers after the change (label, value) for a fix: only when the capacity
    model moved them (its effect reads "before → after"); a change it does not size, or that leaves the
    running batch where it is, shows no "after" numbers that would only repeat today's."""
    p = s.get("projection") if isinstance(s.get("projection"), dict) else {}
    out: list[dict[str, str]] = []
    main = str(s.get("effect_text") or "").partition(" — ")[0]
    if "→" not in main or main.startswith(UNSIZED):
        if p.get("confidence") and "confidence)" not in str(s.get("effect_line") or ""):
            out.append({"label": "confidence", "value": str(p["confidence"])})
        return out
    g = s.get("gain")
    if isinstance(g, int | float) and g > 0:
        out.append({"label": "gen throughput", "value": f"+{g:.0%}"})
    if isinstance(p.get("projected_gen_throughput_tps"), int | float):
        out.append({"label": "gen tok/s after", "value": f"{p['projected_gen_throughput_tps']:,.0f}"})
    if isinstance(p.get("projected_running"), int | float):
        out.append({"label": "running after", "value": f"{p['projected_running']:,.0f}"})
    if isinstance(p.get("pool_tokens"), int | float):
        out.append({"label": "KV pool after", "value": f"{p['pool_tokens']:,.0f} tokens"})
    if isinstance(p.get("job_eta_hours"), int | float):
        h = p["job_eta_hours"]
        out.append({"label": "job ETA after", "value": f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} h"})
    if p.get("confidence") and "confidence)" not in str(s.get("effect_line") or ""):
        out.append({"label": "confidence", "value": str(p["confidence"])})
    return out


def top_fixes(findings: list[dict[str, Any]], limit: int = 3) -> list[dict[str, Any]]:
    """The best changes across a target's findings (see the module docstring for the order)."""
    cands = []
    for fi, f in enumerate(findings):
        if f.get("state") not in ("firing", "pending"):
            continue
        for si, s in enumerate(f.get("suggestions") or []):
            if not _fits(s):
                continue
            # the findings come in the report's one order (evaluate.cause_order: the top cause, what it
            # explains, the rest), so the card's first fix is the text report's first change
            key = (f.get("state") != "firing", fi, -_gain(s), si)
            cands.append((key, f, s))
    cands.sort(key=lambda c: c[0])
    out: list[dict[str, Any]] = []
    flags: set[str] = set()
    for _, f, s in cands:
        if s.get("flag") in flags:
            continue
        flags.add(str(s.get("flag")))
        p = s if "effect_line" in s else present_suggestion(s)
        out.append({
            "flag": p.get("flag"), "current": p.get("current"), "current_text": p.get("current_text"), "proposed": p.get("proposed"), "why": p.get("why"),
            "effect_line": p.get("effect_line"), "rule": f.get("rule"), "severity": f.get("severity"), "state": f.get("state"),
            "anchor": f"f-{f.get('rule')}", "chips": chips(p),
        })
        if len(out) >= limit:
            break
    return out


def verdict(doc: dict[str, Any], fixes: list[dict[str, Any]]) -> dict[str, Any]:
    """One sentence on what is wrong now: the finding behind the top fix, else the worst one firing."""
    findings = doc.get("findings") or []
    firing = [f for f in findings if f.get("state") == "firing"]
    pending = [f for f in findings if f.get("state") == "pending"]
    if doc.get("health") == "down":
        return {"level": "down", "title": "Not answering", "text": doc.get("last_error") or "The last scrape failed.", "rule": None}
    if not firing:
        if pending:
            names = ", ".join(str(f.get("rule")) for f in pending)
            return {"level": "pending", "title": "Watching", "text": f"{names}: the condition holds, but not yet for the rule's hold time.", "rule": None}
        return {"level": "ok", "title": "Healthy", "text": "No finding in the last window.", "rule": None}
    lead = next((f for f in firing if fixes and f.get("rule") == fixes[0]["rule"]), None) or firing[0]  # cause order
    others = len(firing) - 1
    return {"level": str(lead.get("severity")), "title": str(lead.get("rule")), "text": str(lead.get("summary") or ""),
            "rule": lead.get("rule"), "anchor": f"f-{lead.get('rule')}", "others": others}
