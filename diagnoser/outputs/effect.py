"""A suggestion's effect as the outputs show it: without the ``Assumes: …`` and ``Risk: …`` sentences
that :meth:`diagnoser.capacity.scenario.Scenario.effect_text` folds into it (listed once, apart), and in
one line (:func:`one_line`). Shared by the text report and the dashboard (:mod:`diagnoser.web.present`).
"""

from __future__ import annotations

from typing import Any

from diagnoser.outputs.text import current_text

UNSIZED = "the capacity model does not size this change"


def _strip_assumes(effect: str, assumptions: list[str]) -> str:
    """Remove `` Assumes: a; b.`` when every item is one of ``assumptions`` (exact text, so a change in the
    wording upstream leaves the effect as it is rather than cutting the wrong part)."""
    head = " Assumes: "
    i = effect.find(head)
    if i < 0 or not assumptions:
        return effect
    items = sorted({a.rstrip(".") for a in assumptions if a}, key=len, reverse=True)
    j = i + len(head)
    while True:
        item = next((a for a in items if effect.startswith(a, j)), None)
        if item is None:
            return effect
        j += len(item)
        if effect.startswith("; ", j):
            j += 2
            continue
        if effect.startswith(".", j):
            return effect[:i] + effect[j + 1:]
        return effect


def _strip_risks(effect: str, risks: list[str]) -> str:
    text = " Risk: " + " ".join(risks)
    return effect.replace(text, "", 1) if risks and text in effect else effect


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for a in items:
        key = a.strip().rstrip(".").lower()
        if a and key not in seen:
            seen.add(key)
            out.append(a.strip())
    return out


def present_suggestion(s: dict[str, Any]) -> dict[str, Any]:
    """The suggestion document plus ``effect_text``, ``effect_line``, ``assumes`` and ``risks``."""
    proj = s.get("projection") if isinstance(s.get("projection"), dict) else {}
    risks = _unique([str(r) for r in (proj.get("risks") or [])])
    assumes = _unique([str(a) for a in (s.get("assumptions") or []) if str(a) not in risks])
    effect = str(s.get("effect") or "")
    text = _strip_risks(_strip_assumes(effect, assumes), risks).strip()
    out = dict(s)
    out.update({"effect_text": text, "effect_line": one_line(text), "assumes": assumes, "risks": risks,
                "current_text": str(current_text(s))})
    return out


def one_line(effect: str) -> str:
    """The effect's first claim: the projection's before → after numbers when the capacity model moved
    them, else the rule's own expected effect (followed by what the model does say, unless it only says
    it does not size the change)."""
    if not effect:
        return ""
    main, _, tail = effect.partition(" — ")
    if not tail and " no longer binds: " in main:
        main, _, tail = main.partition(" Once ")
        tail = tail.partition(" no longer binds: ")[2]
    main = main.partition(" Needs also: ")[0].strip()
    tail = tail.strip()
    if tail and "→" not in main and not main.startswith("Does not fit"):
        main = tail if main.startswith(UNSIZED) else f"{tail} · {main}"
    return main[:1].upper() + main[1:]
