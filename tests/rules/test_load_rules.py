"""Boundary tests for the load rules: silent just below each threshold, firing just above."""

from __future__ import annotations

from diagnoser.model import Severity
from diagnoser.rules.kv01_kv_saturation import KVSaturation
from diagnoser.rules.kv02_kv_retraction import KVRetraction
from diagnoser.rules.oc01_low_batch_occupancy import LowBatchOccupancy
from diagnoser.rules.oc02_client_bound import ClientBound
from diagnoser.rules.pf01_prefill_stall import PrefillStall
from diagnoser.rules.qu01_queue_buildup import QueueBuildup
from diagnoser.rules.rg01_runaway_generation import RunawayGeneration
from diagnoser.rules.sl01_max_running_requests_cap import MaxRunningRequestsCap
from diagnoser.timeline import Timeline
from tests.rules.helpers import run, window

CFG = {"max_running_requests": 64, "max_total_tokens": 100_000, "mem_fraction_static": 0.85, "available_gpu_mem_gb": 12.0}


# -- kv_saturation ------------------------------------------------------------------------------
def _kv(u: float) -> object:
    tl = window(token_usage=[u] * 6, queue_reqs=[5] * 6, running_reqs=[20] * 6, used_tokens=[u * 100_000] * 6, config=CFG)
    return run(KVSaturation, tl)


def test_kv_saturation_boundary() -> None:
    assert _kv(0.94) is None  # a short queue at 0.94: the tuning guide's well-used pool
    # with more waiting than the guide's healthy queue (2000) the pool is full from 0.90: admission also
    # reserves room for the running requests' remaining output, so the queue forms before usage reads 1.0
    # (the running count moves, so the admission model's inference from a count held below the cap stays out)
    deep = {"token_usage": [0.91] * 6, "queue_reqs": [2500] * 6, "running_reqs": [20, 19, 20, 18, 20, 17], "config": CFG}
    f = run(KVSaturation, window(**deep))  # type: ignore[arg-type]
    assert f is not None and "reserves room" in f.summary and f.evidence[0].threshold == 0.9
    assert run(KVSaturation, window(**{**deep, "token_usage": [0.89] * 6})) is None  # type: ignore[arg-type]
    assert run(KVSaturation, window(**deep), deep_queue=3000) is None  # type: ignore[arg-type]
    f = _kv(0.96)
    assert f is not None and f.severity == Severity.WARNING
    assert f.evidence[0].signal == "token_usage" and f.evidence[0].observed == 0.96 and f.evidence[0].source == "server.log:1"
    flags = {s.flag: s for s in f.suggestions}
    assert flags["--mem-fraction-static"].current == 0.85 and flags["--mem-fraction-static"].proposed == 0.89
    assert flags["--kv-cache-dtype"].proposed == "fp8_e4m3"


def test_kv_saturation_reads_the_reservation_when_usage_reads_low() -> None:
    """The 94M-model case of issue 25: running pinned at 8 below a cap of 64 while 40 wait, usage at most
    0.6 and no request finished (no sizes): admission reserves room for the running requests' remaining
    output, so the pool is the limit, not a prefill stall."""
    cfg = {"max_running_requests": 64, "max_total_tokens": 4096, "arg.max_total_tokens": 4096, "device": "cpu"}
    tl = window(token_usage=[0.3, 0.4, 0.45, 0.5, 0.55, 0.6] * 2, queue_reqs=[40] * 12, running_reqs=[8] * 12,
                used_tokens=[1229, 1638, 1843, 2048, 2253, 2458] * 2, config=cfg)
    f = run(KVSaturation, tl)
    assert f is not None and "reserves room" in f.summary and f.confidence == "low"
    assert f.suggestions and f.suggestions[0].flag == "--max-total-tokens" and 8192 <= f.suggestions[0].proposed <= 65536
    assert run(PrefillStall, tl) is None
    moving = window(token_usage=[0.3, 0.4, 0.45, 0.5, 0.55, 0.6] * 2, queue_reqs=[40] * 12, running_reqs=[8, 7, 6, 8, 5, 7] * 2, config=cfg)
    assert run(KVSaturation, moving) is None  # a count that moves is not held by anything


def test_kv_saturation_needs_a_queue_or_retraction() -> None:
    tl = window(token_usage=[0.99] * 6, queue_reqs=[0] * 6, running_reqs=[20] * 6, config=CFG)
    assert run(KVSaturation, tl) is None  # full and no one waits: the tuning guide's healthy state
    tl = window(token_usage=[0.99] * 6, queue_reqs=[0] * 6, running_reqs=[20] * 6, config=CFG,
                events=[("retraction", 3, {"retracted_reqs": 1})])
    f = run(KVSaturation, tl)
    assert f is not None and "1 retraction" in f.summary


def test_kv_saturation_leaves_the_slot_cap_to_its_rule() -> None:
    tl = window(token_usage=[0.99] * 6, queue_reqs=[5] * 6, running_reqs=[64] * 6, config=CFG)
    assert run(KVSaturation, tl) is None


def test_kv_saturation_max_total_tokens_cap_is_the_lever() -> None:
    tl = window(token_usage=[0.97] * 6, queue_reqs=[30] * 6, running_reqs=[6] * 6, used_tokens=[1990] * 6,
                config={"max_total_tokens": 2048, "arg.max_total_tokens": 2048, "max_running_requests": 64})
    f = run(KVSaturation, tl)
    assert f is not None
    (s,) = f.suggestions
    assert s.flag == "--max-total-tokens" and s.current == 2048 and s.proposed == 16384  # (6+30) * 332 / 0.9 → next pow2


def test_kv_saturation_sizes_the_pool_by_the_load_not_by_an_idle_tail() -> None:
    """A window that runs past the end of the job (a Prometheus range, a log read after the load) has
    idle readings: the pool is sized by what was in flight while there was work, the same as without them."""
    cfg = {"max_total_tokens": 2048, "arg.max_total_tokens": 2048, "max_running_requests": 64}
    retract = [("retraction", 2, {"retracted_reqs": 1}), ("retraction", 4, {"retracted_reqs": 1})]

    def tl(idle: int) -> Timeline:
        return window(token_usage=[0.97] * 6 + [0.0] * idle, queue_reqs=[30] * 6 + [0] * idle, running_reqs=[6] * 6 + [0] * idle,
                      used_tokens=[1990] * 6 + [0] * idle, config=cfg, events=retract)

    got = [run(KVSaturation, tl(idle)) for idle in (0, 10)]
    assert all(f is not None for f in got)
    assert [f.suggestions[0].proposed for f in got if f] == [16384, 16384]


def test_kv_saturation_few_requests_get_no_flag_advice() -> None:
    tl = window(token_usage=[1.0] * 5, queue_reqs=[0] * 5, running_reqs=[2] * 5, used_tokens=[300_000] * 5,
                events=[("retraction", 4, {"retracted_reqs": 1})])
    f = run(KVSaturation, tl)
    assert f is not None and f.suggestions == [] and "runaway_generation" in f.notes[0]


# -- kv_retraction ------------------------------------------------------------------------------
def _retractions(n: int, step: float = 60.0) -> object:
    ev = [("retraction", i, {"retracted_reqs": 1, "new_token_ratio_before": 0.1, "new_token_ratio_after": 0.9}) for i in range(n)]
    tl = window(step=step, token_usage=[0.9] * 4, events=ev, config={"schedule_conservativeness": 1.0})
    return run(KVRetraction, tl)


def test_kv_retraction_occasional_vs_frequent() -> None:
    f = _retractions(2, step=30.0)  # 2 in 1.5 min: below frequent_count
    assert f is not None and f.severity == Severity.INFO and not f.suggestions
    f = _retractions(3, step=30.0)  # 3 in 1.5 min = 2/min
    assert f is not None and f.severity == Severity.WARNING
    (s,) = f.suggestions
    assert s.flag == "--schedule-conservativeness" and s.current == 1.0 and s.proposed == 1.3


def test_kv_retraction_rate_boundary() -> None:
    f = _retractions(3, step=70.0)  # 3 over about 2.3 min (window from the usage points to the last event) < 1.5/min
    assert f is not None
    rate = next(e.observed for e in f.evidence if e.signal == "retractions per minute")
    assert (f.severity == Severity.WARNING) == (rate >= 1.0)
    f = run(KVRetraction, window(step=90.0, token_usage=[0.9] * 4, events=[("retraction", i, {"retracted_reqs": 1}) for i in range(3)]),
            frequent_per_min=1.0)
    assert f is not None and f.severity == Severity.INFO  # 3 in 3 min = 1/min... over the 4.5 min window: 0.67/min


def test_kv_retraction_implied_from_a_pinned_pool() -> None:
    usage = [1.0, 1.0, 1.0, 0.94, 0.94]
    tl = window(token_usage=usage, running_reqs=[4, 4, 4, 6, 6], gen_throughput_tps=[430, 430, 430, 30, 30])
    f = run(KVRetraction, tl)
    assert f is not None and f.confidence == "low" and f.severity == Severity.WARNING
    assert run(KVRetraction, tl, implied_drop=0.07) is None  # a 0.06 drop is below the threshold
    tl = window(token_usage=usage, running_reqs=[4, 4, 4, 3, 3])  # a request finished: no implication
    assert run(KVRetraction, tl) is None


# -- queue_buildup ------------------------------------------------------------------------------
def test_queue_buildup_persistence_boundary() -> None:
    q = [0] * 3 + [5] * 17  # 85 % non-empty
    assert run(QueueBuildup, window(queue_reqs=q)) is not None
    q = [0] * 5 + [5] * 15  # 75 %
    assert run(QueueBuildup, window(queue_reqs=q)) is None


def test_queue_buildup_growth_makes_it_a_warning() -> None:
    f = run(QueueBuildup, window(step=6.0, queue_reqs=[10 + i for i in range(11)]))  # +10/min
    assert f is not None and f.severity == Severity.WARNING
    f = run(QueueBuildup, window(step=6.0, queue_reqs=[10 + 0.9 * i for i in range(11)]))  # +9/min
    assert f is not None and f.severity == Severity.INFO


def test_queue_buildup_implied_by_a_cap_cut_at_startup() -> None:
    tl = window(config={"max_running_requests": 50}, events=[("max_running_requests_reduced", 0, {"requested": 128, "effective": 50})])
    f = run(QueueBuildup, tl)
    assert f is not None and f.confidence == "low" and "78" in f.summary
    tl = window(config={"max_running_requests": 50})
    assert run(QueueBuildup, tl) is None
    assert run(QueueBuildup, tl, extras={"client_concurrency": 60}) is not None


# -- max_running_requests_cap --------------------------------------------------------------------
def test_max_running_requests_cap_boundary() -> None:
    base = {"max_running_requests": 4, "max_total_tokens": 65536}
    run_at = [4] * 11 + [3] * 9  # 55 % at the cap
    f = run(MaxRunningRequestsCap, window(running_reqs=run_at, queue_reqs=[30] * 20, token_usage=[0.01] * 20, used_tokens=[800] * 20, config=base))
    assert f is not None
    (s,) = f.suggestions
    # the pool holds 0.9 * 65536 / 200 = 294, but the demand seen bounds it: 4 running + 30 waiting (median
    # while busy) x 1.25 = 42.5, down to a multiple of 8
    assert s.flag == "--max-running-requests" and s.current == 4 and s.proposed == 40
    assert "in flight" in s.why
    run_at = [4] * 9 + [3] * 11  # 45 %
    assert run(MaxRunningRequestsCap, window(running_reqs=run_at, queue_reqs=[30] * 20, token_usage=[0.01] * 20, config=base)) is None


def test_max_running_requests_cap_needs_kv_room() -> None:
    base = {"max_running_requests": 4}
    assert run(MaxRunningRequestsCap, window(running_reqs=[4] * 6, queue_reqs=[3] * 6, token_usage=[0.89] * 6, config=base)) is not None
    assert run(MaxRunningRequestsCap, window(running_reqs=[4] * 6, queue_reqs=[3] * 6, token_usage=[0.91] * 6, config=base)) is None


def test_max_running_requests_cap_reduced_at_startup() -> None:
    tl = window(config={"max_running_requests": 50, "context_len": 32768},
                events=[("max_running_requests_reduced", 0, {"requested": 128, "effective": 50})])
    f = run(MaxRunningRequestsCap, tl)
    assert f is not None
    by = {s.flag: s for s in f.suggestions}
    assert by["--context-length"].current == 32768 and by["--context-length"].proposed == 12288  # 32768 * 50/128 → 1024s
    assert by["--max-running-requests"].proposed == 128


# -- occupancy and client ------------------------------------------------------------------------
def test_low_batch_occupancy_boundary() -> None:
    cfg = {"max_running_requests": 64}
    assert run(LowBatchOccupancy, window(running_reqs=[16] * 5, config=cfg)) is not None  # 25 % of 64
    assert run(LowBatchOccupancy, window(running_reqs=[17] * 5, config=cfg)) is None
    assert run(LowBatchOccupancy, window(running_reqs=[8] * 5)) is not None  # cap unknown: small_batch 8
    assert run(LowBatchOccupancy, window(running_reqs=[9] * 5)) is None


def test_client_bound_boundary() -> None:
    def tl(u: float) -> object:
        return window(running_reqs=[2] * 6, queue_reqs=[0] * 6, token_usage=[u] * 6, used_tokens=[300] * 6,
                      config={"max_running_requests": 64, "max_total_tokens": 65536})
    f = run(ClientBound, tl(0.49))
    assert f is not None and f.severity == Severity.INFO
    assert "64" in f.summary and "Raise the client's concurrency toward 64" in f.notes[0]
    assert run(ClientBound, tl(0.51)) is None
    busy_queue = window(running_reqs=[2] * 10, queue_reqs=[0] * 8 + [1] * 2, token_usage=[0.1] * 10, config={"max_running_requests": 64})
    assert run(ClientBound, busy_queue, max_queue_share=0.19) is None  # 20 % of readings queued
    assert run(ClientBound, busy_queue, max_queue_share=0.2) is not None


# -- runaway ------------------------------------------------------------------------------------
def test_runaway_generation_boundary() -> None:
    def tl(u: float) -> object:
        return window(running_reqs=[2] * 5, token_usage=[u] * 5, used_tokens=[300_000 + 80 * i for i in range(5)])
    assert run(RunawayGeneration, tl(0.81)) is not None
    f = run(RunawayGeneration, tl(0.79))  # the pool is not held: only the long-request shape, at info
    assert f is not None and f.severity == Severity.INFO and "150,080 KV tokens each" in f.summary
    assert run(RunawayGeneration, tl(0.79), long_tokens=200_000) is None
    still = window(running_reqs=[2] * 5, token_usage=[1.0] * 5, used_tokens=[300_000] * 5)
    assert run(RunawayGeneration, still) is None  # not growing: not generating


def test_kv_saturation_one_retraction_at_a_brief_peak_is_not_saturation() -> None:
    usage = [0.5, 0.6, 0.96, 0.7, 0.6, 0.5]
    tl = window(token_usage=usage, queue_reqs=[0] * 6, running_reqs=[20] * 6, events=[("retraction", 2, {"retracted_reqs": 1})])
    assert run(KVSaturation, tl) is None
    tl = window(token_usage=usage, queue_reqs=[0, 0, 3, 0, 0, 0], running_reqs=[20] * 6, events=[("retraction", 2, {"retracted_reqs": 1})])
    assert run(KVSaturation, tl) is not None  # someone waited while it retracted


# -- retraction count: parser events, not distinct timestamps ---------------------------------------
def test_kv_retraction_counts_every_logged_retraction_on_the_real_log() -> None:
    """examples/kv-full-retract/server.log (a real cpu-real run) has 9 retraction lines; two share the
    second 09:32:16 (lines 227 and 229) and are two retractions, not one."""
    from pathlib import Path

    from diagnoser.collect import collect_logs
    from diagnoser.engines import get_adapter
    from diagnoser.rules.base import RuleContext
    from diagnoser.rules.kv01_kv_saturation import retraction_count

    log = Path(__file__).resolve().parents[2] / "examples" / "kv-full-retract" / "server.log"
    lines = [i for i, line in enumerate(log.read_bytes().split(b"\n"), 1) if b"KV cache pool is full. Retract requests." in line]
    assert lines == [160, 163, 227, 229, 282, 338, 400, 452, 537]
    tl = collect_logs(get_adapter("sglang"), [str(log)]).timelines[0]
    f = run(KVRetraction, tl)
    assert f is not None and "9 times" in f.summary
    assert next(e.observed for e in f.evidence if e.signal == "retraction events") == 9
    ctx = RuleContext(tl, dict(KVSaturation.defaults), get_adapter("sglang"))
    assert retraction_count(ctx) == (9, "server.log:160")
    sat = run(KVSaturation, tl)
    assert sat is not None and "9 retraction event(s)" in sat.summary


def test_kv_retraction_same_second_events_count_apart_and_requests_add_up() -> None:
    ev = [("retraction", 1, {"retracted_reqs": 2}), ("retraction", 1, {"retracted_reqs": 1}), ("retraction", 2, {"retracted_reqs": 1})]
    f = run(KVRetraction, window(step=10.0, token_usage=[0.9] * 4, events=ev))
    assert f is not None and "3 times" in f.summary and "4 requests in all" in f.summary


def test_compound_limits_in_order_with_the_combined_projection() -> None:
    """Issue 25, item 2: a pool of 3,000 tokens (its cap), running 6 of a slot cap of 10, 26 waiting. The pool
    binds now; after its fix the slot cap binds (SGLang tests the slots before the KV): both changes, in that
    order, with the combined projection ("running 6 → 10, then --max-running-requests 10 binds; with both → 32")."""
    cfg = {"max_total_tokens": 3000, "arg.max_total_tokens": 3000, "max_running_requests": 10, "device": "cpu"}
    tl = window(token_usage=[0.97] * 8, queue_reqs=[26] * 8, running_reqs=[6] * 8, used_tokens=[2900] * 8, config=cfg)
    f = run(KVSaturation, tl)
    assert f is not None
    first, second = f.suggestions[:2]
    assert first.flag == "--max-total-tokens" and first.current == 3000 and first.proposed == 32768
    assert "running 6 → 10 (then --max-running-requests 10 binds" in first.effect and "running → about 32" in first.effect
    assert second.flag == "--max-running-requests" and second.current == 10 and second.proposed == 32
    # the slot cap alone (a pool that holds the demand): one change
    tl = window(token_usage=[0.2] * 8, queue_reqs=[26] * 8, running_reqs=[10] * 8, used_tokens=[4830] * 8,
                config={**cfg, "max_total_tokens": 32768, "arg.max_total_tokens": 32768})
    g = run(MaxRunningRequestsCap, tl)
    assert g is not None and [s.flag for s in g.suggestions] == ["--max-running-requests"]
