"""SGLang's scheduler and memory model (diagnoser/engines/sglang/scheduler_model.py) and the checks every
suggestion passes: one test per wrong suggestion issue 16 lists, on real engine data where it exists.

The numbers the model encodes were read from SGLang's source at the tags its docstring names; the tests
pin them (a change to SGLang's defaults must show up here, not silently in the advice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnoser.capacity.build import planner_for
from diagnoser.capacity.throughput import MIN_R2, fit
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.engines.sglang import scheduler_model as SM
from diagnoser.evaluate import Report, check_suggestions
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.replay import collect_replay
from diagnoser.rules.kv02_kv_retraction import KVRetraction
from diagnoser.timeline import Timeline
from tests.rules.helpers import run, window

DATA = Path(__file__).parent / "data"
RUNS = DATA / "sglang-cpu-real"
CONFIGS = Path(__file__).parent / "capacity_configs"
ADAPTER = get_adapter("sglang")


def _report(findings: list[Finding]) -> Report:
    return Report(findings=findings)


def _diagnose(tls: list[Timeline], extras: dict[str, Any] | None = None) -> Report:
    from diagnoser.advice import enrich
    from diagnoser.evaluate import evaluate

    rep = evaluate(tls, ADAPTER, extras=extras)
    enrich(rep, tls, extras or {})
    return rep


# -- the numbers -------------------------------------------------------------------------------------
def test_new_token_ratio_is_sglangs() -> None:
    r = SM.new_token_ratio(1.0)
    assert (r.init, r.floor) == (0.7, pytest.approx(0.098)) and r.decay_per_step == pytest.approx((0.7 - 0.098) / 600)
    # the cap: from 1/0.7 up the ratio starts at 1.0, and floor and decay follow the start
    for c in (1.43, 2.0, 4.0, 5.2):
        assert SM.new_token_ratio(c).init == pytest.approx(1.0, abs=0.002) and SM.new_token_ratio(c).capped == (c * 0.7 >= 1)
    assert SM.new_token_ratio(4.0) == SM.new_token_ratio(5.2).__class__(4.0, 1.0, 0.14, (1.0 - 0.14) / 600)
    assert SM.ratio_after_retraction(decoded_tokens=500, max_new_tokens_total=1024, retracted=1) == pytest.approx(520 / 1025)
    assert SM.ratio_after_retraction(decoded_tokens=5000, max_new_tokens_total=1024, retracted=1) == 1.0


def test_reservation_ignores_the_ratio_for_ignore_eos_and_clips_at_4096() -> None:
    assert SM.reserved_tokens(256, 56, 0.3) == pytest.approx(60.0)
    assert SM.reserved_tokens(256, 56, 0.3, ignore_eos=True) == 200.0  # the whole remaining max_new_tokens
    assert SM.reserved_tokens(10000, 0, 1.0) == SM.CLIP_MAX_NEW_TOKENS
    assert SM.admission_need(111, 10000, page_size=1) == 111 + 4096 + 1


def test_pool_is_min_of_profile_and_cap() -> None:
    assert SM.effective_pool(10_244_894, 8192) == (8192, "max_total_tokens")
    assert SM.effective_pool(5000, 8192) == (5000, "memory")
    assert SM.effective_pool(5000, None) == (5000, "memory")
    assert SM.effective_pool(None, 8192) == (8192, "max_total_tokens")


@pytest.mark.parametrize(("version", "requested", "want"), [
    ((0, 5, 23), 100_000, (32768, "pool")),  # explicit: bounded by pool // 2 (0.5.16+)
    ((0, 5, 23), 336, (336, "flag")),
    ((0, 5, 23), None, (4096, "context")),  # unset: min(clamp(65536 / 2048 x 512, 2048, 4096), pool // 2)
    ((0, 5, 10), 100_000, (4096, "context")),  # 0.5.10: explicit bounded by the context-length estimate
    ((0, 5, 2), 100_000, (100_000, "flag")),  # <= 0.5.2: the flag as given
])
def test_max_running_requests_per_version(version: tuple[int, int, int], requested: int | None, want: tuple[int, str]) -> None:
    assert SM.effective_max_running_requests(requested, 65536, 2048, version) == want


# -- the cases ---------------------------------------------------------------------------------
def test_mem_fraction_is_not_proposed_while_max_total_tokens_pins_the_pool() -> None:
    """Issue 16: `--mem-fraction-static 0.716 → 0.95`, "pool 8,192 → 10,244,894 tokens", while
    --max-total-tokens pins the pool. The real kv-full-retract run (CPU, --max-total-tokens 2048, mem
    fraction 0.716) with the model config gave exactly that before (pool 2,048 → 10,459,580)."""
    col = collect_replay(str(RUNS / "kv-full-retract"), ADAPTER)
    rep = _diagnose(col.timelines, {"model_config": str(CONFIGS / "tiny-llama.json")})
    sugg = [(f.rule, s) for f in rep.findings for s in f.suggestions]
    assert not any(s.flag in ("--mem-fraction-static", "--kv-cache-dtype") for _r, s in sugg), sugg
    kv = next(s for r, s in sugg if r == "kv_saturation")
    assert kv.flag == "--max-total-tokens" and kv.current == 2048 and kv.proposed > 2048
    # and a suggestion that grows only the profile is rewritten with the flag that binds
    state = SM.ServerState(pool_tokens=8192, cap_tokens=8192, args_known=True, mem_fraction=0.716)
    v = SM.vet("--mem-fraction-static", 0.716, 0.95, state)
    assert v.kind == "rewrite" and v.flag == "--max-total-tokens" and v.current == 8192 and v.proposed == 16384
    assert "min(profile, cap)" in v.reason and "kv_cache_configurator.py" in v.cites
    assert SM.vet("--kv-cache-dtype", "auto", "fp8_e4m3", state).flag == "--max-total-tokens"
    # memory sizes the pool when the engine says the cap exceeds its profile: then the fraction is the lever
    state2 = SM.ServerState(pool_tokens=5000, cap_tokens=8192, profiled_tokens=5000, args_known=True, mem_fraction=0.716)
    assert SM.vet("--mem-fraction-static", 0.716, 0.8, state2).ok
    v2 = SM.vet("--max-total-tokens", 8192, 16384, state2)
    assert v2.kind == "rewrite" and v2.flag == "--mem-fraction-static"


def test_pinned_pool_inferred_from_metrics_alone() -> None:
    """From /metrics only (Prometheus): weights + KV use a sliver of the memory the fraction would give,
    so a --max-total-tokens cap sizes the pool (the real kv-full-retract scrapes: 1 MB of KV, 21 GiB free)."""
    tl = Timeline(target="t")
    for k, v in (("max_total_tokens", 2048), ("kv_cache_gb", 0.000977), ("weight_mem_gb", 0.0), ("available_gpu_mem_gb", 21.3)):
        tl.set_config(k, v, "scrape")
    st = SM.ServerState.from_config(tl.cfg)
    pinned, why = st.pool_pinned()
    assert pinned is True and "cap" in why
    # a GPU whose static share is what its fraction says: memory sizes it
    gpu = SM.ServerState(pool_tokens=116171, kv_gib=7.6, weights_gib=72.0, free_after_gib=11.4, mem_fraction=0.85)
    assert gpu.pool_pinned()[0] is False


def test_conservativeness_above_its_cap_is_a_noop() -> None:
    """Issue 16: `--schedule-conservativeness 4.0 → 5.2` with its own assumption "new_token_ratio 1.00 →
    1.00". KV02 on the real kv-full-retract retractions, with the server started at 4.0."""
    log = RUNS / "kv-full-retract" / "server.log"
    tl = collect_logs(ADAPTER, [str(log)]).timelines[0]
    tl.set_config("schedule_conservativeness", 4.0, "server.log:12 schedule_conservativeness")
    f = run(KVRetraction, tl)
    assert f is not None and f.suggestions and f.suggestions[0].proposed == 5.2  # what the rule asks for
    rep = _report([f])
    check_suggestions(rep, [tl])
    assert f.suggestions == []
    assert any("--schedule-conservativeness" in n and "does nothing" in n and "new_token_ratio_tracker.py" in n for n in f.notes), f.notes
    assert rep.dropped[0]["reason"].startswith("no effect: new_token_ratio starts at")
    # 1.3 → 1.69 runs as 1.43: the smallest value at the cap
    v = SM.vet("--schedule-conservativeness", 1.3, 1.69, SM.ServerState(conservativeness=1.3))
    assert v.kind == "capped" and v.proposed == 1.43
    # ignore_eos requests reserve their whole max_new_tokens whatever the ratio
    v = SM.vet("--schedule-conservativeness", 1.0, 1.3, SM.ServerState(conservativeness=1.0, ignore_eos=True))
    assert v.kind == "noop" and "ignore_eos" in v.reason
    assert SM.vet("--schedule-conservativeness", 1.0, 1.3, SM.ServerState(conservativeness=1.0)).ok


def test_ignore_eos_from_the_command_line_drops_conservativeness() -> None:
    tl = collect_logs(ADAPTER, [str(RUNS / "kv-full-retract" / "server.log")]).timelines[0]
    rep = _diagnose([tl], {"ignore_eos": True})
    assert not any(s.flag == "--schedule-conservativeness" for f in rep.findings for s in f.suggestions)
    kv02 = next(f for f in rep.findings if f.rule == "kv_retraction")
    assert any("ignore_eos" in n for n in kv02.notes)


def test_weak_step_time_fit_gives_no_throughput_number() -> None:
    """Issue 16: a throughput projection labelled medium confidence on a step-time fit with R² 0.00."""
    import random

    rnd = random.Random(5)
    batches = [float(rnd.choice((8, 10, 12, 14, 16))) for _ in range(60)]
    tps = [b / rnd.uniform(0.02, 0.2) for b in batches]  # step time unrelated to the batch
    m = fit(batches, tps)
    assert m is not None and m.method == "fit" and (m.r2 or 0) < MIN_R2 and not m.projectable
    assert m.why_not().startswith("not enough variation in batch size to project") and f"R² {m.r2:.2f}" in m.why_not()
    good = fit([float(b) for b in range(4, 40)], [b / (0.01 + 0.001 * b) for b in range(4, 40)])
    assert good is not None and good.projectable and good.quality()["r2"] == 1.0


def test_projection_carries_the_fit_and_withholds_the_number(tmp_path: Path) -> None:
    """The real long-queue run: the batch sat at 4 in every reading, so raising the slot cap projects
    the running batch (bounded by the demand) but no throughput, and says why."""
    tl = collect_logs(ADAPTER, [str(RUNS / "long-queue" / "server.log")]).timelines[0]
    rep = _diagnose([tl])
    s = next(s for f in rep.findings for s in f.suggestions if s.flag == "--max-running-requests")
    assert s.projection is not None and s.projection["projected_gen_throughput_tps"] is None and s.gain is None
    assert s.projection["no_throughput"].startswith("not enough variation in batch size to project")
    assert s.projection["fit"]["projectable"] is False and s.projection["confidence"] == "low"
    assert "no throughput number: not enough variation" in s.effect


def test_cuda_graph_and_fp8_advice_is_irrelevant_on_cpu() -> None:
    cpu = SM.ServerState(device="cpu")
    for flag, cur, prop in (("--cuda-graph-max-bs", 32, 64), ("--cuda-graph-max-bs-decode", 32, 64), ("--disable-cuda-graph", True, False),
                            ("--kv-cache-dtype", "auto", "fp8_e4m3")):
        v = SM.vet(flag, cur, prop, cpu)
        assert v.kind == "noop", flag
    assert SM.vet("--cuda-graph-max-bs", 32, 64, SM.ServerState(device="cuda")).ok


def test_swa_ratio_only_for_a_sliding_window_pool() -> None:
    """The real CPU scrapes export swa_token_usage 0 for a plain Llama: no SWA/full split to move."""
    col = collect_replay(str(RUNS / "kv-full-retract"), ADAPTER)
    from diagnoser.capacity.serverstate import server_state

    assert server_state(col.timelines[0]).hybrid_swa is False
    assert SM.vet("--swa-full-tokens-ratio", 0.8, 0.2, SM.ServerState(hybrid_swa=False)).kind == "noop"
    assert SM.vet("--swa-full-tokens-ratio", 0.8, 0.2, SM.ServerState(hybrid_swa=True)).ok


def test_slot_and_chunk_changes_sglang_would_cap_or_ignore() -> None:
    st = SM.ServerState(pool_tokens=2048, max_running_requests=1024, context_len=2048, version=(0, 5, 23))
    v = SM.vet("--max-running-requests", 1024, 4096, st)
    assert v.kind == "noop" and "pool // 2" in v.reason  # already at pool // 2 = 1024
    v = SM.vet("--max-running-requests", 64, 4096, SM.ServerState(pool_tokens=2048, max_running_requests=64, context_len=2048))
    assert v.kind == "capped" and v.proposed == 1024
    off = SM.ServerState(chunked_prefill_size=-1)
    assert SM.vet("--chunked-prefill-size", -1, 8192, off).kind == "noop"
    short = SM.ServerState(chunked_prefill_size=2048, prompt_tokens=600.0)
    assert SM.vet("--chunked-prefill-size", 2048, 8192, short).kind == "noop"
    assert SM.vet("--chunked-prefill-size", 128, 8192, SM.ServerState(chunked_prefill_size=128, prompt_tokens=1515.0)).ok
    # a set --max-running-requests is bounded by pool // 2 (0.5.23), not by the context: --context-length adds no slot
    ctx = SM.ServerState(args_known=True, max_running_requests_arg=128, version=(0, 5, 23))
    assert SM.vet("--context-length", 32768, 8192, ctx).kind == "noop"
    assert SM.vet("--context-length", 32768, 8192, SM.ServerState(args_known=True, max_running_requests_arg=128, version=(0, 5, 10))).ok


def test_planner_sizes_changes_as_sglang_runs_them() -> None:
    tl = collect_logs(ADAPTER, [str(RUNS / "kv-full-retract" / "server.log")]).timelines[0]
    planner, _ = planner_for(tl, {"model_config": str(CONFIGS / "tiny-llama.json")})
    assert planner.state is not None and planner.state.pool_pinned()[0] is True
    sc = planner.mem_fraction(0.95)
    assert sc.pool_tokens == 2048 and sc.gain == 0.0 and "raise --max-total-tokens instead" in sc.assumptions[0]
    assert planner.max_total_tokens(16384).pool_tokens == 16384
    cons = planner.schedule_conservativeness(4.0)
    assert "0.70 → 1.00" in cons.assumptions[0] and "ignore_eos" in cons.assumptions[0]


def test_rewrite_keeps_one_suggestion_per_flag() -> None:
    """A rewritten suggestion that lands on a flag another finding already proposes is not shown twice."""
    tl = window(token_usage=[0.99] * 6, queue_reqs=[10.0] * 6, running_reqs=[6.0] * 6,
                config={"max_total_tokens": 2048, "arg.max_total_tokens": 2048, "arg.mem_fraction_static": 0.8,
                        "mem_fraction_static": 0.8, "arg.model_path": "m"})
    f = Finding("kv_saturation", Severity.WARNING, "medium", tl.target, "full",
                suggestions=[Suggestion("--max-total-tokens", 2048, 16384, "cap"), Suggestion("--mem-fraction-static", 0.8, 0.9, "more")])
    rep = _report([f])
    check_suggestions(rep, [tl])
    assert [s.flag for s in f.suggestions] == ["--max-total-tokens"]
    assert any("became --max-total-tokens" in n for n in f.notes)



def test_conservativeness_comes_after_the_pool_change_that_pulls_the_other_way() -> None:
    """Raising the conservativeness shrinks the batch while a larger pool grows it: when both are
    suggested for one server, the conservativeness waits for the pool change; alone it stands as is."""
    tl = window(token_usage=[0.99] * 6, queue_reqs=[10.0] * 6, running_reqs=[6.0] * 6,
                config={"max_total_tokens": 2048, "arg.max_total_tokens": 2048, "arg.schedule_conservativeness": 1.0,
                        "arg.model_path": "m"})

    def findings(with_pool: bool) -> tuple[Finding, Finding]:
        sat = Finding("kv_saturation", Severity.WARNING, "medium", tl.target, "full",
                      suggestions=[Suggestion("--max-total-tokens", 2048, 16384, "cap")] if with_pool else [])
        ret = Finding("kv_retraction", Severity.WARNING, "high", tl.target, "retracted",
                      suggestions=[Suggestion("--schedule-conservativeness", 1.0, 1.3, "reserve more")])
        return sat, ret

    sat, ret = findings(True)
    check_suggestions(_report([sat, ret]), [tl])
    check_suggestions(_report([sat, ret]), [tl])  # run again (after enrich): said once
    (s,) = ret.suggestions
    assert s.why.count("only if retractions persist") == 1 and "after --max-total-tokens 2048 → 16384" in s.why
    sat, ret = findings(False)
    check_suggestions(_report([sat, ret]), [tl])
    assert ret.suggestions[0].why == "reserve more"


def test_real_retracting_run_orders_its_two_fixes() -> None:
    """On the bundled real run (pool capped at 2,048 tokens, nine retractions) the pool change is the
    top fix and the conservativeness is conditional on it."""
    from diagnoser.evaluate import top_cause

    col = collect_replay(str(Path(__file__).parent.parent / "examples" / "kv-full-retract.dgb"), ADAPTER)
    rep = _diagnose(col.timelines)
    target = col.timelines[0].target
    _, first = top_cause(rep.findings, target)
    assert first is not None and first.flag == "--max-total-tokens"
    (ret,) = [f for f in rep.findings if f.rule == "kv_retraction"]
    cons = [s for s in ret.suggestions if s.flag == "--schedule-conservativeness"]
    assert cons and "only if retractions persist" in cons[0].why
