"""The rule catalogue. ``REGISTRY`` is the explicit list of rule classes, in report order.

A finding's ``rule`` field takes exactly these names; ``diagnose rules`` lists them and
``diagnose explain NAME`` prints one rule's doc.
"""

from __future__ import annotations

from diagnoser.rules.base import Rule, RuleContext
from diagnoser.rules.kv01_kv_saturation import KVSaturation

REGISTRY: list[type[Rule]] = [
    KVSaturation,
]


def by_name(name: str) -> type[Rule] | None:
    for r in REGISTRY:
        if r.name == name or r.code == name.upper():
            return r
    return None


__all__ = ["REGISTRY", "Rule", "RuleContext", "by_name"]
