"""The shared admission model on the real recordings: what held the waiting requests back, and bounded proposals."""

from __future__ import annotations

import pytest

from diagnoser.cli.run import analyse, build_parser
from diagnoser.engines import get_adapter
from diagnoser.replay import collect_replay
from diagnoser.rules.admission import admission
from diagnoser.rules.base import RuleContext
from tests.conftest import DATA

ADAPTER = get_adapter("sglang")
# recording → the class that held most readings with a queue ("" when nothing waited)
EXPECTED = {
    "sglang-cpu-real/kv-full-retract": "kv",
    "sglang-cpu-real/medium-engine-bound-kv-full": "kv",
    "sglang-cpu-real/long-queue": "slots",
    "sglang-cpu-real/prefill-capped": "budget",
    "sglang-cpu-real/client-bound-low-occupancy": "",
    "sglang-cpu-issue25/slot-cap-shared-prefix": "slots",
    "sglang-cpu-issue25/queue-full-503": "slots",
    "sglang-cpu-issue25/context-length-400": "",
}


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_the_admission_model_names_what_held_the_queue(run: str) -> None:
    col = collect_replay(str(DATA / run), ADAPTER)
    ctx = RuleContext(col.timelines[0], {}, ADAPTER, None, {}, {})
    a = admission(ctx)
    top, share = a.top()
    assert top == EXPECTED[run], (run, top, share, {c: round(a.share(c), 2) for c in ("slots", "kv", "budget", "none")})
    if top:
        assert share >= 0.5, (run, share)


@pytest.mark.parametrize("run", ["sglang-cpu-real/long-queue", "sglang-cpu-issue25/slot-cap-shared-prefix", "sglang-cpu-issue25/queue-full-503",
                                 "sglang-cpu-real/kv-full-retract", "sglang-cpu-real/medium-engine-bound-kv-full"])
def test_proposals_are_bounded_by_memory_demand_and_the_engine(run: str) -> None:
    """Every proposed slot cap or pool is bounded by the demand seen (running + waiting, with headroom; twice
    that when the queue limit turned requests away) and by SGLang's own bound (pool // 2 slots)."""
    col = collect_replay(str(DATA / run), ADAPTER)
    tl = col.timelines[0]
    a = admission(RuleContext(tl, {}, ADAPTER, None, {}, {}))
    demand = a.demand()
    _report, doc = analyse(build_parser().parse_args(["--once", "--log", "-"]), col, ADAPTER)
    sugg = [s for f in doc["findings"] for s in f["suggestions"] if isinstance(s["proposed"], int | float)]
    for s in sugg:
        if s["flag"] == "--max-running-requests":
            assert s["current"] < s["proposed"] <= 2 * 1.25 * demand + 8, (run, s, demand)
            assert s["proposed"] <= (a.pool or 0) // 2, (run, s, a.pool)
        if s["flag"] == "--max-total-tokens":
            assert s["current"] < s["proposed"] <= 65536, (run, s)
    assert sugg, run
