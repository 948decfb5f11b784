"""Boundary tests for the engine-feature rules (prefill, graphs, speculation, cache, DP, OOM)."""

from __future__ import annotations

from pathlib import Path

from diagnoser.model import Severity
from diagnoser.rules.ca01_low_cache_hit import LowCacheHit
from diagnoser.rules.cg01_cuda_graph_disabled_or_exceeded import CudaGraphDisabledOrExceeded
from diagnoser.rules.dp01_dp_imbalance import DPImbalance
from diagnoser.rules.er01_oom import OOM
from diagnoser.rules.pf01_prefill_stall import PrefillStall
from diagnoser.rules.pf02_prefill_decode_interference import PrefillDecodeInterference
from diagnoser.rules.sp01_low_spec_acceptance import LowSpecAcceptance
from diagnoser.timeline import Series
from tests.rules.helpers import run, window


# -- prefill_stall -----------------------------------------------------------------------------
def _capped(n_at_cap: int, total: int = 20) -> object:
    new = [128] * n_at_cap + [60] * (total - n_at_cap)
    tl = window(prefill_new_tokens=new, queue_reqs=[8] * total, pending_tokens=[12000] * total, token_usage=[0.2] * total,
                config={"chunked_prefill_size": 128, "max_prefill_tokens": 128})
    return run(PrefillStall, tl)


def test_prefill_stall_capped_boundary() -> None:
    f = _capped(11)  # 55 % at the cap
    assert f is not None and f.confidence == "high"
    by = {s.flag: s for s in f.suggestions}
    assert by["--chunked-prefill-size"].current == 128 and by["--chunked-prefill-size"].proposed == 8192  # pending p50 12000 → capped at 8192
    assert by["--max-prefill-tokens"].proposed == 16384
    assert _capped(9) is None  # 45 %


def test_prefill_stall_needs_kv_room() -> None:
    tl = window(prefill_new_tokens=[128] * 10, queue_reqs=[8] * 10, token_usage=[0.95] * 10, config={"chunked_prefill_size": 128})
    assert run(PrefillStall, tl) is None


def test_prefill_stall_inferred_cap_without_config() -> None:
    tl = window(prefill_new_tokens=[4096] * 8 + [1000] * 2, queue_reqs=[20] * 10, token_usage=[0.3] * 10)
    f = run(PrefillStall, tl)
    assert f is not None and f.confidence == "medium" and f.suggestions[0].current is None


def test_admission_stall_boundary() -> None:
    # requests wait with free KV and no prefill batch at all: 19 s vs 21 s (the running count moves: nothing
    # the admission model knows holds them)
    def tl(seconds: int, running: list[int] | None = None) -> object:
        n = seconds + 1
        return window(step=1.0, queue_reqs=[10] * n, token_usage=[0.3] * n, running_reqs=running or [5, 4] * (n // 2) + [5] * (n % 2),
                      config={"max_running_requests": 64, "schedule_conservativeness": 1.0})
    assert run(PrefillStall, tl(19)) is None
    f = run(PrefillStall, tl(21))
    assert f is not None and "21 s" in f.summary
    (s,) = f.suggestions
    assert s.flag == "--schedule-conservativeness" and s.current == 1.0 and s.proposed == 0.3
    # a running count held at one value below the cap is the KV reservation (kv_saturation), not a stall:
    # lowering the conservativeness would admit requests the pool then retracts
    assert run(PrefillStall, tl(21, [5] * 22)) is None


def test_admission_with_prefills_is_not_a_stall() -> None:
    tl = window(step=1.0, queue_reqs=[10] * 40, token_usage=[0.3] * 40, running_reqs=[5] * 40,
                prefill_new_tokens=[100] * 40, config={"max_running_requests": 64})
    assert run(PrefillStall, tl) is None


# -- prefill_decode_interference ------------------------------------------------------------------
def test_interference_boundary() -> None:
    assert run(PrefillDecodeInterference, window(prefill_new_tokens=[8400] * 3, running_reqs=[40] * 3)) is not None
    assert run(PrefillDecodeInterference, window(prefill_new_tokens=[8000] * 3, running_reqs=[40] * 3)) is None
    assert run(PrefillDecodeInterference, window(prefill_new_tokens=[33000] * 2, running_reqs=[40] * 2)) is None  # run of 2


def test_interference_needs_running_requests_and_no_decode_between() -> None:
    assert run(PrefillDecodeInterference, window(prefill_new_tokens=[33000] * 4, running_reqs=[0] * 4)) is None
    tl = window(prefill_new_tokens=[33000] * 4, running_reqs=[40] * 4)
    tl.add("gen_throughput_tps", tl.get("prefill_new_tokens").ts[1] + 0.5, 900.0, "server.log:2")  # type: ignore[union-attr]
    # a decode line between lines 2 and 3 would split the run; line numbers decide, so shift the prefill sources
    # (series are read-only: each is rebuilt with the new sources)
    def resourced(key: tuple[str, str], sources: list[str]) -> None:
        old = tl.series[key]
        tl.series[key] = Series(old.ts, old.values, sources)

    resourced(("prefill_new_tokens", ""), ["server.log:1", "server.log:3", "server.log:5", "server.log:7"])
    resourced(("running_reqs", ""), ["server.log:1", "server.log:3", "server.log:5", "server.log:7"])
    resourced(("gen_throughput_tps", ""), ["server.log:4"])
    f = run(PrefillDecodeInterference, tl)
    assert f is None  # runs of 2 (lines 1,3) and 2 (lines 5,7)


def test_interference_suggestions() -> None:
    f = run(PrefillDecodeInterference, window(prefill_new_tokens=[33557] * 6, running_reqs=[50] * 6))
    assert f is not None
    by = {s.flag: s for s in f.suggestions}
    assert by["--enable-mixed-chunk"].proposed is True and by["--enable-mixed-chunk"].current is None
    assert by["--chunked-prefill-size"].proposed == 8192 and by["--max-prefill-tokens"].proposed == 8192


# -- cuda graph ----------------------------------------------------------------------------------
def _graph(run_reqs: list[float], graph: list[float], version: tuple[int, int, int] | None = None, **cfg: object) -> object:
    return run(CudaGraphDisabledOrExceeded, window(running_reqs=run_reqs, cuda_graph=graph, config=dict(cfg)), version=version)


def test_cuda_graph_exceeded_and_flag_spelling() -> None:
    r = [46, 36, 28, 22, 20, 15, 12, 11]
    g = [0, 0, 1, 1, 1, 1, 1, 1]
    f = _graph(r, g, version=(0, 5, 8))
    assert f is not None and f.severity == Severity.WARNING  # 25 % eager
    (s,) = f.suggestions
    assert s.flag == "--cuda-graph-max-bs" and s.current is None and s.proposed == 64  # p95 42.5 → 64
    f = _graph(r, g, version=(0, 5, 14))
    assert f is not None and f.suggestions[0].flag == "--cuda-graph-max-bs-decode"


def test_cuda_graph_eager_share_boundary() -> None:
    r = [40] + [20] * 5  # 1 of 6 eager = 17 %
    f = _graph(r, [0] + [1] * 5)
    assert f is not None and f.severity == Severity.INFO
    f = _graph([40, 40] + [20] * 6, [0, 0] + [1] * 6)  # 25 %
    assert f is not None and f.severity == Severity.WARNING
    assert _graph([20] * 6, [1] * 6) is None


def test_cuda_graph_disabled_and_cpu() -> None:
    f = _graph([20] * 4, [0] * 4, version=(0, 5, 14), disable_cuda_graph=True)
    assert f is not None and f.suggestions[0].flag == "--cuda-graph-backend-decode"
    f = _graph([20] * 4, [0] * 4, version=(0, 5, 8), disable_cuda_graph=True)
    assert f is not None and f.suggestions[0].flag == "--disable-cuda-graph"
    assert _graph([20] * 4, [0] * 4, device="cpu") is None


# -- speculative ---------------------------------------------------------------------------------
def test_low_spec_acceptance_boundary() -> None:
    def tl(rate: float) -> object:
        return window(spec_accept_len=[rate * 4] * 5, spec_accept_rate=[rate] * 5, running_reqs=[1] * 5)
    f = run(LowSpecAcceptance, tl(0.54))
    assert f is not None
    by = {s.flag: s for s in f.suggestions}
    # draft of 4 inferred (2.16 / 0.54) → 3 steps now; ceil(2.16) = 3 steps proposed = no change, so only topk is left
    assert set(by) == {"--speculative-eagle-topk"} and by["--speculative-eagle-topk"].proposed == 1
    assert run(LowSpecAcceptance, tl(0.56)) is None


def test_low_spec_acceptance_without_rate_and_with_steps() -> None:
    assert run(LowSpecAcceptance, window(spec_accept_len=[2.1] * 4)) is not None
    assert run(LowSpecAcceptance, window(spec_accept_len=[2.3] * 4)) is None  # MTP-like 2.3+: fine (case 010)
    f = run(LowSpecAcceptance, window(spec_accept_len=[2.9] * 4, config={"speculative_num_steps": 7}))  # 2.9 < 0.5 * 8
    assert f is not None
    by = {s.flag: s for s in f.suggestions}
    assert by["--speculative-num-steps"].current == 7 and by["--speculative-num-steps"].proposed == 3
    assert by["--speculative-num-draft-tokens"].proposed == 4
    assert run(LowSpecAcceptance, window(spec_accept_len=[0.0] * 4)) is None  # no speculation: zeros


# -- cache ---------------------------------------------------------------------------------------
def test_low_cache_hit_hicache_boundary() -> None:
    def tl(hit: float) -> object:
        return window(prefill_cached_tokens=[hit * 1000] * 5, prefill_new_tokens=[(1 - hit) * 1000] * 5,
                      config={"enable_hierarchical_cache": True, "hicache_host_gb": 120.0})
    f = run(LowCacheHit, tl(0.09))
    assert f is not None and f.severity == Severity.WARNING
    assert f.suggestions[0].flag == "--enable-hierarchical-cache" and f.suggestions[0].proposed is False
    assert run(LowCacheHit, tl(0.11)) is None


def test_low_cache_hit_needs_more_than_a_low_rate_without_hicache() -> None:
    low = window(prefill_cached_tokens=[5] * 8, prefill_new_tokens=[200] * 8, token_usage=[0.5] * 8)
    assert run(LowCacheHit, low) is None  # unique prompts: nothing to reuse, nothing to fix
    falling = window(prefill_cached_tokens=[500] * 4 + [20] * 4, prefill_new_tokens=[500] * 4 + [980] * 4, token_usage=[0.95] * 8)
    f = run(LowCacheHit, falling)
    assert f is not None and f.severity == Severity.INFO and f.suggestions[0].proposed is True
    assert "decode" in f.suggestions[0].effect  # HiCache never promises decode concurrency


# -- dp imbalance --------------------------------------------------------------------------------
def _dp(hi: float, n: int = 5) -> object:
    return window(ranks={"dp0": {"running_reqs": [hi] * n}, "dp1": {"running_reqs": [10.0] * n},
                         "dp2": {"running_reqs": [10.0] * n}, "dp3": {"running_reqs": [10.0] * n}})


def test_dp_imbalance_boundary() -> None:
    # max/mean with one rank at x and three at 10: x / ((x + 30) / 4), over a window of readings per rank
    assert run(DPImbalance, _dp(26.0)) is not None  # 26 / 14 = 1.86
    assert run(DPImbalance, _dp(17.0)) is None  # 17 / 11.75 = 1.45
    assert run(DPImbalance, _dp(18.5)) is not None  # 18.5 / 12.1 = 1.53


def test_dp_imbalance_on_snapshots_needs_a_material_spread() -> None:
    # one or a few readings per rank (each rank logs at its own moment): a few requests apart is noise
    assert run(DPImbalance, _dp(18.5, n=1)) is None  # 6.4 above the mean
    f = run(DPImbalance, _dp(26.0, n=1))  # 12 above the mean
    assert f is not None and f.basis["readings"] == 1
    assert run(DPImbalance, _dp(18.5, n=1), min_spread=6.0) is not None


# -- oom -----------------------------------------------------------------------------------------
def test_oom_fires_only_on_oom_lines() -> None:
    assert run(OOM, window(running_reqs=[5] * 3, events=[("retraction", 1, {"retracted_reqs": 1})])) is None
    f = run(OOM, window(running_reqs=[40] * 3, config={"max_running_requests": 400},
                        events=[("oom", 2, {"phase": "decode", "text": "Decode out of memory. Try to lower your batch size."})]))
    assert f is not None and f.severity == Severity.CRITICAL and f.evidence[0].source == "server.log:3"
    (s,) = f.suggestions
    assert s.flag == "--max-running-requests" and s.current == 400 and s.proposed == 300


def test_prefill_stall_cap_share_zero_on_real_windows_is_not_an_error(data_dir: Path) -> None:
    """Threshold 0 is the degenerate end of cap_share: a window with no batch at the cap is still not
    capped (before, the rule raised IndexError reading the first capped batch's line)."""
    from diagnoser.collect import collect_logs
    from diagnoser.engines.sglang import ADAPTER
    from diagnoser.evaluate import evaluate

    logs = sorted((data_dir / "sglang-cpu-real").glob("*/server.log"))
    assert len(logs) >= 5
    fired = 0
    for log in logs:
        rep = evaluate(collect_logs(ADAPTER, [str(log)]).timelines, ADAPTER, {"prefill_stall": {"cap_share": 0}})
        assert [e.rule for e in rep.errors] == [], (log, [e.to_dict() for e in rep.errors])
        fired += any(f.rule == "prefill_stall" for f in rep.findings)
    assert fired >= 1  # the prefill-capped window still fires
