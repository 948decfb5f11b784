"""Build small timeline windows for rule boundary tests, and run one rule on them."""

from __future__ import annotations

from typing import Any

from diagnoser.engines import get_adapter
from diagnoser.model import Finding, LogEvent
from diagnoser.rules.base import Rule, RuleContext
from diagnoser.timeline import Timeline

ADAPTER = get_adapter("sglang")
T0 = 1_790_000_000.0


def window(step: float = 2.0, config: dict[str, Any] | None = None, events: list[tuple[str, int, dict[str, Any]]] | None = None,
           ranks: dict[str, dict[str, list[float]]] | None = None, **signals: list[float]) -> Timeline:
    """A timeline whose i-th point of every signal is at T0 + i*step and cites ``server.log:{i+1}``.

    ``events`` are (kind, point index, fields); ``ranks`` maps a rank ("dp0") to its own signals.
    """
    tl = Timeline(target="t")
    for name, vals in signals.items():
        for i, v in enumerate(vals):
            tl.add(name, T0 + i * step, v, f"server.log:{i + 1}")
    for rank, sigs in (ranks or {}).items():
        for name, vals in sigs.items():
            for i, v in enumerate(vals):
                tl.add(name, T0 + i * step, v, f"server.log:{i + 1}", rank)
    for k, v in (config or {}).items():
        tl.set_config(k, v, "server.log:1")
    for kind, i, fields in events or []:
        tl.add_event(LogEvent(kind, T0 + i * step, i + 1, f"server.log:{i + 1}", fields))
    tl.aggregate_ranks()
    return tl


def run(rule: type[Rule], tl: Timeline, version: tuple[int, int, int] | None = None, extras: dict[str, Any] | None = None, **over: Any) -> Finding | None:
    th = dict(rule.defaults)
    th.update(over)
    out = rule().evaluate(RuleContext(tl, th, ADAPTER, version, dict(extras or {})))
    if isinstance(out, list):
        return out[0] if out else None
    return out
