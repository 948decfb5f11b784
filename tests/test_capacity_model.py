"""Pool facts from the engine, the throughput fit, the job ETA and the what-ifs.

Real engine data (tests/data) where it exists; the seed case (written by us from issue 4's numbers,
see tests/cases/seed-kimi-k25/source.md) for the TP-8 MLA what-ifs no public log covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.capacity.build import planner_for, workload_from_timeline
from diagnoser.capacity.eta import progress_from_timeline
from diagnoser.capacity.kvbytes import GIB, load_model_config, model_shape
from diagnoser.capacity.pool import pool_from_timeline
from diagnoser.capacity.throughput import decode_points, fit
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline

CONFIGS = Path(__file__).parent / "capacity_configs"
SEED = Path(__file__).parent / "cases" / "seed-kimi-k25"
SEED_EXTRAS = {"model_config": str(SEED / "config.json"), "client_concurrency": 150, "job_requests": 88000,
               "avg_tokens_per_request": 4340}


def log_timeline(path: Path) -> Timeline:
    return collect_logs(get_adapter("sglang"), [str(path)]).timelines[0]


def scrape_timeline(run: Path) -> Timeline:
    tl = Timeline(target="t")
    target = MetricsTarget("http://127.0.0.1:30000", get_adapter("sglang"))
    for f in sorted((run / "metrics").glob("*.prom")):
        assert target.ingest_text(f.read_text(), float(f.stem.split("_")[-1]), tl)
    tl.aggregate_ranks()
    return tl


@pytest.fixture(scope="module")
def seed() -> Timeline:
    return log_timeline(SEED / "server.log")


# -- pool from the engine -------------------------------------------------------------------------
def test_qwen3_pool_and_memory_split_from_the_real_startup_log(data_dir: Path) -> None:
    tl = log_timeline(data_dir / "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log")
    shape = model_shape(load_model_config(CONFIGS / "qwen3-8b.json"))
    p = pool_from_timeline(tl, shape)
    assert p.pool_tokens == 1707904 and "log_startup_qwen3_8b" in p.pool_source
    assert (p.pre_gib, p.after_weights_gib, p.headroom_gib) == (275.75, 260.48, 21.24)
    assert p.bpt == 147456 and not p.notes  # engine KV size agrees with the formula (no disagreement note)
    # SGLang's rule: budget = after − pre × (1 − f); the K+V size printed implies f ≈ 0.906
    f = 1 - (p.after_weights_gib - p.kv_gib) / p.pre_gib
    assert 0.90 < f < 0.91
    p.mem_fraction = round(f, 4)
    assert abs(p.budget_gib(p.mem_fraction) - p.kv_gib) < 0.05


def test_seed_pool_is_the_engine_number_and_formula_agrees(seed: Timeline) -> None:
    planner, notes = planner_for(seed, SEED_EXTRAS)
    p = planner.pool
    assert (p.pool_tokens, p.total_tokens, p.pools) == (116171, 116171, 1)
    assert p.bpt == 70272 and p.mem_fraction == 0.85 and p.tp == 8
    # 21.78 − 0.15 × 94.52 (the log's rounded numbers) reproduces the pool within 0.1 %
    assert abs(p.budget_gib(0.85) * GIB / p.bpt / 116171 - 1) < 0.001
    assert notes == []


def test_cpu_real_pool_from_server_info_and_log(data_dir: Path) -> None:
    run = data_dir / "sglang-cpu-real/kv-full-retract"
    tl = log_timeline(run / "server.log")
    get_adapter("sglang").ingest_server_info(json.loads((run / "get_server_info.json").read_text()), tl, "server_info",
                                             VersionRange())
    p = pool_from_timeline(tl, model_shape(load_model_config(CONFIGS / "tiny-llama.json")))
    assert p.pool_tokens == 2048 and p.max_running_requests == 64 and p.mem_fraction == 0.716


# -- throughput ------------------------------------------------------------------------------------
def test_fit_predicts_a_held_out_batch_on_real_decode_lines(data_dir: Path) -> None:
    """kv-full-retract (real SGLang 0.5.23 on CPU): fit on batches 4–7, predict batch 8's throughput."""
    tl = log_timeline(data_dir / "sglang-cpu-real/kv-full-retract/server.log")
    bs, xs = decode_points(tl)
    assert len(bs) >= 150
    train = [(b, x) for b, x in zip(bs, xs, strict=True) if b < 8]
    held = [x for b, x in zip(bs, xs, strict=True) if b == 8]
    assert held, "the real log has decode lines at batch 8"
    m = fit([b for b, _ in train], [x for _, x in train])
    assert m is not None and m.method == "fit", m
    assert m.b > 0 and m.r2 is not None
    observed = sum(held) / len(held)
    assert abs(m.tps(8) / observed - 1) < 0.15, (m.describe(), observed)
    assert m.confidence(8) in ("medium", "high") and m.confidence(30) == "low"


def test_fit_on_the_engine_bound_real_run(data_dir: Path) -> None:
    """medium-engine-bound (real, batch 4–10): step time grows with the batch on a compute-bound engine."""
    tl = log_timeline(data_dir / "sglang-cpu-real/medium-engine-bound-kv-full/server.log")
    m = fit(*decode_points(tl))
    assert m is not None and m.method == "fit" and m.b > 0
    # throughput grows less than proportionally: doubling the batch from 5 gives < 2× tok/s
    assert m.tps(10) < 2 * m.tps(5)


def test_constant_batch_falls_back_low_confidence(data_dir: Path) -> None:
    tl = log_timeline(data_dir / "sglang-cpu-real/client-bound-low-occupancy/server.log")
    m = fit(*decode_points(tl))
    assert m is not None and m.method == "constant-step" and m.confidence(4) == "low"
    assert "did not vary" in m.note
    assert m.tps(4) == pytest.approx(2 * m.tps(2))


def test_seed_fit_recovers_the_step_time_written_into_the_log(seed: Timeline) -> None:
    m = fit(*decode_points(seed))
    assert m is not None and m.method == "fit" and m.batch_min == 48 and m.batch_max == 56
    # generate.py draws 42.8 ms + 0.379 ms × batch with noise: the fit lands near it at the mean batch
    assert abs(m.step_time(52) - (0.0428 + 0.000379 * 52)) < 0.001


# -- ETA -------------------------------------------------------------------------------------------
def test_eta_from_the_real_request_counter(data_dir: Path) -> None:
    run = data_dir / "sglang-cpu-real/kv-full-retract"
    tl = scrape_timeline(run)
    summary = json.loads((run / "load_summary.json").read_text())
    jp = progress_from_timeline(tl, job_requests=1000)
    assert jp.completed == summary["ok"] == 160
    assert "requests_completed" in jp.completed_source
    wall_rate = summary["ok"] / summary["wall_s"]
    assert 0.75 < jp.rate_rps / wall_rate < 1.35
    assert jp.eta_hours() == pytest.approx(840 / jp.rate_rps / 3600)
    assert jp.eta_hours(2.0) == pytest.approx(jp.eta_hours() / 2)


def test_seed_eta_is_about_five_days(seed: Timeline) -> None:
    w = workload_from_timeline(seed, SEED_EXTRAS)
    assert 48 <= w.running <= 56 and 780 <= w.gen_tps <= 890 and w.kv_bound
    assert 3900 < w.output_tokens_per_request < 4300  # 4340 − the prompt seen in the prefill lines
    hours = w.progress.eta_hours()
    assert 4.5 * 24 < hours < 5.5 * 24  # the issue: "about 4.9 days"


# -- what-ifs --------------------------------------------------------------------------------------
def test_mem_fraction_adds_a_share_of_free_memory_not_a_proportion(seed: Timeline) -> None:
    planner, _ = planner_for(seed, SEED_EXTRAS)
    sc = planner.mem_fraction(0.90)
    added = int(0.05 * 94.52 * GIB // 70272)
    assert sc.pool_tokens == 116171 + added  # ≈ +72k, +62 % (a proportional guess says +6 %)
    assert sc.headroom_gib == pytest.approx(11.42 - 0.05 * 94.52)
    assert any("5–8" in r for r in sc.risks) and sc.fits and not sc.risky
    hi = planner.mem_fraction(0.95)
    assert hi.risky and "likely OOM" in hi.risks[0]
    best = planner.best_mem_fraction()
    assert best is not None and best.proposed == 0.90  # the largest that keeps ≥ 6 GiB free


def test_fp8_doubles_the_pool(seed: Timeline) -> None:
    planner, _ = planner_for(seed, SEED_EXTRAS)
    sc = planner.kv_fp8()
    assert sc is not None and sc.pool_tokens == 2 * 116171 and sc.proposed == "fp8_e4m3"


def test_dp_attention_counts_replicated_attention_weights(seed: Timeline) -> None:
    planner, _ = planner_for(seed, SEED_EXTRAS)
    sc = planner.dp_attention()
    assert sc is not None and sc.fits
    shape = planner.pool.shape
    extra = shape.attn_params_sharded * 2 * (1 - 1 / 8) / GIB
    # 7.60 GiB of KV cannot hold the 8.5 GiB of weights: the projection pairs it with mem fraction 0.90
    assert extra > 7.6 and any("0.9" in f for f in sc.extra_flags)
    per_rank = int((7.6 - extra + 0.05 * 94.52) * GIB // 70272)
    assert abs(sc.pool_tokens_per_rank - per_rank) <= 2
    assert sc.pool_tokens == 8 * sc.pool_tokens_per_rank
    assert sc.projected_running == 150  # capped by the client's concurrency
    assert any("replicated" in a for a in sc.assumptions)


def test_hicache_never_raises_decode_concurrency(seed: Timeline) -> None:
    planner, _ = planner_for(seed, SEED_EXTRAS)
    planner.pool.host_mem_gib = 449.0
    now = planner.now()
    sc = planner.hicache(size_gb=300)
    assert sc.pool_tokens == now.pool_tokens and sc.projected_running == now.projected_running and sc.gain is None
    assert not sc.fits and "--hicache-size" in sc.risks[0]  # 300 GB × 8 ranks does not fit 449 GiB − 10
    ok = planner.hicache(size_gb=50)
    assert ok.fits and "prefix" in ok.assumptions[0] and "not the number of requests" in ok.assumptions[0]


def test_159k_pool_projects_inside_the_realized_range(seed: Timeline) -> None:
    """Issue 4: once the pool reached 159K tokens, 930–1350 tok/s was realized. What does the model say?"""
    planner, _ = planner_for(seed, SEED_EXTRAS)
    f = 0.85 + (159000 - 116171) * 70272 / GIB / 94.52
    sc = planner.mem_fraction(f)
    assert abs(sc.pool_tokens - 159000) < 100
    assert 930 <= sc.projected_gen_throughput_tps <= 1350, sc.to_dict()


def test_other_what_ifs_have_numbers(seed: Timeline) -> None:
    planner, _ = planner_for(seed, SEED_EXTRAS)
    mrr = planner.max_running_requests(40)
    assert mrr.projected_running == 40 and mrr.pool_tokens == 116171
    ctx = planner.context_length(32768)
    assert "2048" in ctx.assumptions[0]
    chunk = planner.chunked_prefill_size(16384)
    assert chunk.headroom_gib == pytest.approx(11.42 - 8192 * 1.5 / 1024)
    graph = planner.cuda_graph_max_bs(512)
    per_bs = (planner.pool.graph_gib / 256) if planner.pool.graph_gib else 2 / 1024  # measured, else docs/sglang.md#mem-fraction-default's 2 MiB per bs
    assert graph.headroom_gib == pytest.approx(11.42 - 256 * per_bs)
    cons = planner.schedule_conservativeness(1.3)
    assert "0.70 → 0.91" in cons.assumptions[0]
    assert planner.max_prefill_tokens(32768).pool_tokens == 116171


def test_model_config_from_a_local_model_path_in_server_info(tmp_path: Path) -> None:
    from diagnoser.capacity.build import shape_for

    (tmp_path / "config.json").write_text((CONFIGS / "qwen3-8b.json").read_text())
    tl = Timeline(target="t")
    tl.set_config("model_path", str(tmp_path), "server_info model_path")
    shape, why = shape_for(tl, None)
    assert shape is not None and shape.kv_heads == 8 and why == ""
    tl2 = Timeline(target="t")
    tl2.set_config("model_path", "Qwen/Qwen3-8B", "server_info model_path")  # a hub id, not a local path
    shape2, why2 = shape_for(tl2, None)
    assert shape2 is None and "--model-config" in why2


def test_pool_is_extrapolated_only_where_the_engine_is_silent() -> None:
    tl = Timeline(target="t")
    for k, v in (("avail_mem_before_weights_gb", 275.75), ("avail_mem_after_weights_gb", 260.48), ("mem_fraction_static", 0.9)):
        tl.set_config(k, v, "server.log:1")
    p = pool_from_timeline(tl, model_shape(load_model_config(CONFIGS / "qwen3-8b.json")))
    assert p.pool_tokens == int((260.48 - 275.75 * 0.1) * GIB // 147456)
    assert p.pool_source.startswith("extrapolated") and any("extrapolated" in n for n in p.notes)
    tl.set_config("max_total_tokens", 1707904, "server.log:2")
    p2 = pool_from_timeline(tl, model_shape(load_model_config(CONFIGS / "qwen3-8b.json")))
    assert p2.pool_tokens == 1707904 and p2.pool_source == "server.log:2" and not p2.notes


def test_slot_bound_real_run_grows_to_the_demand_not_the_slots(data_dir: Path) -> None:
    """long-queue (real): 4 running, 36 waiting, KV usage 0.01. Raising the cap to 400 is bounded by the
    40 requests the client keeps in flight; the batch never moved from 4, so no throughput is projected."""
    tl = log_timeline(data_dir / "sglang-cpu-real/long-queue/server.log")
    planner, _ = planner_for(tl, {})
    assert planner.work.demand == 40
    sc = planner.max_running_requests(400)
    assert 36 <= sc.projected_running <= 40
    assert any("demand seen" in a for a in sc.assumptions)
    assert sc.projected_gen_throughput_tps is None and sc.gain is None and sc.job_eta_hours is None
    assert sc.no_throughput.startswith("not enough variation in batch size to project") and "batch 4–4" in sc.no_throughput
    assert sc.fit is not None and sc.fit["projectable"] is False
    assert "no throughput number: not enough variation" in sc.effect_text(planner.now())
    assert sc.confidence == "low"


def test_lifting_max_total_tokens_on_the_real_kv_full_run(data_dir: Path) -> None:
    run = data_dir / "sglang-cpu-real/kv-full-retract"
    tl = log_timeline(run / "server.log")
    planner, _ = planner_for(tl, {"model_config": str(CONFIGS / "tiny-llama.json")})
    planner.work.kv_bound = True
    sc = planner.max_total_tokens(16384)
    assert sc.pool_tokens == 16384
    # 40 clients in flight bound the batch long before 16K tokens do
    assert sc.projected_running <= 41
    assert planner.pool.device == "cpu" and planner.kv_fp8() is None  # FP8 KV is a GPU feature: not proposed on CPU
    planner.pool.device = "gpu"  # the same numbers on a GPU engine
    fp8 = planner.kv_fp8()
    # --max-total-tokens 2048 pins the pool (SGLang takes min(profile, cap)): FP8 grows only the profile
    assert fp8.pool_tokens == 2048 and fp8.gain == 0.0 and "--max-total-tokens" in fp8.assumptions[0]
    assert planner.for_kv_saturation() == []  # nothing that grows only the profile is ranked for a pinned pool
    planner.state.cap_tokens = None  # without the cap, memory sizes the pool and FP8 doubles it
    fp8 = planner.kv_fp8()
    assert fp8.pool_tokens == 4096 and fp8.projected_running == pytest.approx(2 * planner.work.running, rel=0.01)


def test_pool_and_dp_ranks_derived_from_real_decode_lines_when_no_summary() -> None:
    """Case 010 (real, DP attention, ranks DP0…DP7 in the excerpt) prints no summary line: the pool per
    rank comes from #token / token usage and the pool count from the highest DP tag."""
    tl = log_timeline(Path(__file__).parent / "data" / "cases/010-sglang-pr6081-mtp-dp-attention-healthy/server.log")
    p = pool_from_timeline(tl)
    assert p.pools == 8 and p.dp == 8
    assert p.pool_source.startswith("server.log:") and "#token / token usage" in p.pool_source
    line = (Path(__file__).parent / "data" / "cases/010-sglang-pr6081-mtp-dp-attention-healthy/server.log").read_text().splitlines()[
        int(p.pool_source.split(":")[1].split()[0]) - 1]
    import re

    used = int(re.search(r"#token: (\d+)", line).group(1))
    usage = float(re.search(r"token usage: ([\d.]+)", line).group(1))
    assert p.pool_tokens == round(used / usage)
    assert any("derived" in n for n in p.notes)


def test_dp_attention_only_for_mla(data_dir: Path) -> None:
    """A GQA model at TP > 1 splits its KV heads already: no DP-attention what-if, with or without a config."""
    tl = log_timeline(data_dir / "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log")
    tl.set_config("tp_size", 8, "test")
    planner, _ = planner_for(tl, {})
    assert planner.pool.attention_hint == "mha" and planner.dp_attention() is None
    planner2, _ = planner_for(tl, {"model_config": str(CONFIGS / "qwen3-8b.json")})
    assert planner2.dp_attention() is None
    seed_planner, _ = planner_for(log_timeline(SEED / "server.log"), {})  # MLA known from 'KV size' alone
    assert seed_planner.pool.attention_hint == "mla" and seed_planner.dp_attention() is not None
