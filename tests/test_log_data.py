"""Every real log in tests/data read to the right values: data/sglang/logs, every case's server.log and
every run of the real SGLang 0.5.23 CPU engine — cross-checked against the run's own load results,
flags and /metrics timeline where they overlap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.logs import read_log
from diagnoser.timeline import Timeline
from tests.conftest import DATA

# path under tests/data → what the log says (values checked by hand against the file)
EXPECT: dict[str, dict[str, Any]] = {
    "sglang/logs/lines_from_issue_threads.txt": dict(
        kinds={"prefill": 5, "decode": 3, "exception": 1},
        first={"cache_hit_rate": 0.8083, "prefill_cached_tokens": 757}, last={"used_tokens": 2642688, "swa_token_usage": 0.06},
        maxv={"prefill_running_reqs": 370, "queue_reqs": 646}),
    "sglang/logs/log_decode_lines_test_log_parser_2025-11.log": dict(
        kinds={"decode": 3}, ver=">=0.5.5,<=0.5.8",
        first={"running_reqs": 317, "gen_throughput_tps": 14806.57}, last={"running_reqs": 78, "token_usage": 0.27},
        rank={("running_reqs", "dp6"): 251, ("queue_reqs", "dp6"): 655}),
    "sglang/logs/log_lines_quoted_in_docs.log": dict(
        kinds={"decode": 3, "retraction": 1, "startup": 1, "access": 2}, status={"200": 2},
        first={"running_reqs": 233, "token_usage": 0.82, "queue_reqs": 417}, last={"running_reqs": 10, "used_tokens": 485248},
        cfg={"max_total_tokens": 665690, "max_running_requests": 4096, "context_len": 65536}),
    "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log": dict(
        kinds={"server_args": 1, "startup": 13, "prefill": 1}, ver="0.5.13",
        first={"prefill_new_tokens": 64},
        cfg={"max_total_tokens": 1707904, "kv_pool_tokens_log": 1707904, "chunked_prefill_size": 16384, "context_len": 40960,
             "avail_mem_before_weights_gb": 275.75, "weight_mem_gb": 15.28, "avail_mem_after_pool_gb": 25.28, "graph_mem_gb": 0.6}),
    "sglang/logs/log_startup_tail_tp8_k8s_2025-02.log": dict(
        kinds={"startup": 10, "access": 2, "prefill": 1}, ver=">=0.4.2,<=0.4.3", status={"200": 2},
        cfg={"max_total_tokens": 712400, "max_running_requests": 50, "context_len": 163840, "chunked_prefill_size": 8192}),
    "cases/001-sglang-3909-throughput-decreases-low-concurrency/server.log": dict(
        kinds={"startup": 1, "access": 3, "prefill": 1, "decode": 18}, ver="<=0.4.3",
        first={"prefill_new_tokens": 7593, "used_tokens": 67724, "gen_throughput_tps": 183.54}, last={"used_tokens": 65091, "running_reqs": 8},
        maxv={"running_reqs": 8, "token_usage": 0.14}),
    "cases/007-sglang-2746-runaway-output-kv-full-retract/server.log": dict(
        kinds={"decode": 5, "retraction": 1, "retract_dup": 4}, ver="<=0.4.6", retracted=1,
        first={"token_usage": 1.0, "used_tokens": 307481}, last={"used_tokens": 307801, "gen_throughput_tps": 10.93, "new_token_ratio": 0.9446}),
    "cases/009-sglang-pr13023-cuda-graph-off-above-max-bs/server.log": dict(
        kinds={"decode": 8}, ver=">=0.5.5,<=0.5.8",
        first={"running_reqs": 46, "cuda_graph": 0.0}, last={"running_reqs": 11, "cuda_graph": 1.0, "gen_throughput_tps": 475.19}),
    "cases/010-sglang-pr6081-mtp-dp-attention-healthy/server.log": dict(
        kinds={"decode": 5}, ver=">=0.4.7,<=0.4.9",
        rank={("running_reqs", "dp0"): 8, ("spec_accept_len", "dp7"): 2.65, ("spec_accept_len", "dp2"): 2.58, ("used_tokens", "dp5"): 37565}),
    "cases/012-sglang-11948-eagle3-low-accept-len/server.log": dict(
        kinds={"prefill": 1, "decode": 5}, ver=">=0.5.3,<=0.5.4",
        first={"spec_accept_len": 2.17, "spec_accept_rate": 0.54, "prefill_new_tokens": 28}, last={"spec_accept_len": 1.8, "used_tokens": 412}),
    "cases/022-sglang-26248-swa-retraction-throughput-collapse/server.log": dict(
        kinds={"decode": 10}, ver=">=0.5.9",
        first={"full_token_usage": 1.0, "gen_throughput_tps": 429.34}, last={"full_token_usage": 0.92, "gen_throughput_tps": 22.24, "running_reqs": 6},
        counts={"gen_throughput_tps": 10, "queue_reqs": 3}),
    "cases/029-sglang-pr14050-back-to-back-prefills-starve-decode/server.log": dict(
        kinds={"prefill": 6}, ver=">=0.5.5,<=0.5.8",
        first={"prefill_new_tokens": 34560, "queue_reqs": 17, "prefill_running_reqs": 45}, last={"prefill_new_tokens": 32896, "queue_reqs": 4, "prefill_running_reqs": 58}),
    "cases/035-sglang-30160-max-running-requests-reduced-to-50/server.log": dict(
        kinds={"startup": 2}, cfg={"max_running_requests": 50, "max_running_requests_requested": 128, "req_pool_size": 50}),
    # issue 15: short pastes, startup-only logs, tracebacks, PD, ROCm/NPU, v0.1 (each checked against the file by hand)
    "cases/101-sglang-23177-glm51-prefill-only-queue/server.log": dict(
        kinds={"prefill": 2, "access": 6}, ver=">=0.5.11", status={"200": 6},
        first={"prefill_new_tokens": 15360, "queue_reqs": 238, "pending_tokens": 595000, "prefill_running_reqs": 116, "input_throughput_tps": 25774.75},
        last={"prefill_running_reqs": 122, "token_usage": 0.01}),
    "cases/103-sglang-444-v01-fill-batch-seq1-queue/server.log": dict(
        kinds={"prefill": 1}, ver="<=0.2.99",
        first={"prefill_new_tokens": 2172, "prefill_cached_tokens": 330, "queue_reqs": 57, "running_reqs": 9, "cache_hit_rate": 0.6916}),
    "cases/104-sglang-1270-v02-light-load-invalid-responses/server.log": dict(
        kinds={"decode": 10}, ver="<=0.3.3",
        first={"running_reqs": 2, "used_tokens": 4078, "gen_throughput_tps": 447.31}, last={"running_reqs": 1, "used_tokens": 4142, "gen_throughput_tps": 239.0}),
    "cases/107-inferencex-2128-dsv4-pro-h200-kv-pool-no-room/server.log": dict(
        kinds={"startup": 1, "exception": 1, "oom": 1}, ver=">=0.5.14",
        cfg={"avail_mem_after_weights_gb": 12.25, "weight_mem_gb": 125.65, "mem_fraction_static": 0.88},
        events={"exception": 1, "startup_oom": 1}),
    "cases/109-sglang-4048-request-longer-than-kv-pool/server.log": dict(
        kinds={"exception": 2, "request_too_long": 2},
        events={"exception": 1, "crash_notice": 1, "traceback": 1, "request_too_long": 2}),
    "cases/113-sglang-4602-paged-kv-decode-oom-page64/server.log": dict(
        kinds={"exception": 1, "oom": 5}, events={"exception": 1, "oom": 1, "oom_detail": 4}),
    "cases/116-sglang-5450-pd-prefill-kv-transfer-mb-per-s/server.log": dict(
        kinds={"prefill": 4, "pd": 4}, ver=">=0.4.6,<=0.4.9", events={"kv_transfer_rate": 4},
        rank={("pd_bootstrap_reqs", "dp14"): 341, ("pd_inflight_reqs", "dp15"): 161, ("prefill_new_tokens", "dp11"): 266,
              ("token_usage", "dp11"): 0.08, ("queue_reqs", "dp13"): 0}),
    "cases/117-sglang-pr13466-piecewise-graph-shrinks-kv-pool-kimi/server.log": dict(
        kinds={"startup": 1}, ver=">=0.4.6", cfg={"kv_pool_tokens_log": 8050, "kv_cache_gb": 0.53}),
    "cases/121-sglang-15869-ci-regression-local-healthy-bs1/server.log": dict(
        kinds={"access": 1, "prefill": 1, "decode": 5}, ver=">=0.5.5,<=0.5.8", status={"200": 1},
        first={"gen_throughput_tps": 0.07, "prefill_new_tokens": 18, "cuda_graph": 1.0}, last={"gen_throughput_tps": 111.88, "used_tokens": 211}),
    "cases/123-sglang-3243-rx7900xtx-rocm-single-stream-healthy/server.log": dict(
        kinds={"decode": 5}, ver="<=0.4.9", first={"gen_throughput_tps": 3.5, "used_tokens": 51}, last={"gen_throughput_tps": 28.12, "used_tokens": 211}),
    "cases/125-sglang-pr30047-npu-qwen-hybrid-high-prefix-reuse/server.log": dict(
        kinds={"decode": 6, "prefill": 4}, ver=">=0.5.11",
        first={"running_reqs": 40, "used_tokens": 356096, "mamba_usage": 0.8, "spec_accept_len": 3.84, "cuda_graph": 1.0},
        last={"gen_throughput_tps": 155.34, "used_tokens": 350592}, maxv={"prefill_cached_tokens": 1114624}),
    "cases/126-sglang-9266-pd-bootstrap-failures-high-concurrency/server.log": dict(
        kinds={"pd": 7}, ver=">=0.4.10", events={"pd_failure": 7}),
    "cases/127-sglang-4305-qwq32b-five-requests-53k-tokens-each/server.log": dict(
        kinds={"decode": 7, "access": 1}, ver="<=0.4.9", status={"200": 1},  # SGLang's own prefix (TP0) behind the collector's stamp
        first={"used_tokens": 266623, "token_usage": 0.61}, last={"used_tokens": 267823}, maxv={"running_reqs": 5}),
    "cases/128-sglang-pr25741-chunked-prefill-half-empty-batches/server.log": dict(
        kinds={"prefill": 4}, ver=">=0.5.11",
        first={"prefill_new_tokens": 16384, "pending_tokens": 647168, "swa_token_usage": 0.05}, last={"full_token_usage": 0.11, "prefill_new_tokens": 8192}),
    "cases/131-sglang-38846-mamba-state-cache-caps-running-9-of-32/server.log": dict(
        kinds={"startup": 1}, cfg={"max_running_requests": 9}, events={"max_running_requests_reduced": 1}),
    "sglang-cpu-real/client-bound-low-occupancy/server.log": dict(
        kinds={"startup": 7, "server_args": 1, "exception": 8, "traceback": 20, "prefill": 186, "access": 235, "decode": 317}, ver=">=0.5.13",
        maxv={"running_reqs": 2}),
    "sglang-cpu-real/kv-full-retract/server.log": dict(
        kinds={"startup": 7, "server_args": 1, "exception": 8, "traceback": 20, "prefill": 101, "access": 186, "decode": 160, "retraction": 9}, ver=">=0.5.13",
        first={"prefill_running_reqs": 0, "used_tokens": 739}, maxv={"token_usage": 0.99, "queue_reqs": 35}, retracted=9),
    "sglang-cpu-real/long-queue/server.log": dict(
        kinds={"startup": 7, "server_args": 1, "exception": 8, "traceback": 20, "prefill": 102, "access": 435, "decode": 317}, ver=">=0.5.13",
        maxv={"running_reqs": 4, "queue_reqs": 36}),
    "sglang-cpu-real/medium-engine-bound-kv-full/server.log": dict(
        kinds={"startup": 7, "server_args": 1, "exception": 8, "traceback": 20, "prefill": 15, "access": 80, "decode": 19, "retraction": 3}, ver=">=0.5.13",
        maxv={"token_usage": 0.97}, retracted=3),
    "sglang-cpu-real/prefill-capped/server.log": dict(
        kinds={"startup": 7, "server_args": 1, "exception": 8, "traceback": 20, "prefill": 2364, "access": 224, "decode": 10}, ver=">=0.5.13",
        maxv={"prefill_new_tokens": 128}),
}


def _all_logs() -> list[str]:
    files = sorted((DATA / "sglang" / "logs").glob("*")) + sorted(DATA.glob("cases/*/server.log"))
    files += sorted(DATA.glob("sglang-cpu-real/*/server.log"))
    return [str(p.relative_to(DATA)) for p in files] or sorted(EXPECT)


def _read(path: Path) -> tuple[Timeline, Any]:
    tl = Timeline(target=str(path))
    reader = read_log(ADAPTER, tl, str(path))
    return tl, reader


def test_every_data_log_has_expectations(data_dir: Path) -> None:
    assert set(_all_logs()) == set(EXPECT), "a new log appeared in tests/data: add its expected values here"


@pytest.mark.parametrize("rel", _all_logs())
def test_real_log(data_dir: Path, rel: str) -> None:
    path = data_dir / rel
    raw = path.read_bytes()
    exp = EXPECT[rel]
    tl, reader = _read(path)
    p, rep = reader.parser, reader.report
    assert rep.lines_read == raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
    assert rep.errors == 0
    assert dict(p.kinds) == exp["kinds"]
    # independent of the parser: every scheduler batch line in the file was read as one
    text = raw.decode("utf-8", errors="replace")
    n_batch = sum(1 for ln in text.splitlines() if " batch" in ln and ("Decode batch" in ln or "Prefill batch" in ln or "fill batch." in ln))
    n_batch += sum(1 for ln in text.splitlines() if ln.startswith("#running-req:"))
    assert p.kinds["decode"] + p.kinds["prefill"] == n_batch
    if "ver" in exp:
        assert p.version.text() == exp["ver"], p.version.reasons
    if "status" in exp:
        assert dict(p.status_codes) == exp["status"]
    for key, want in exp.get("first", {}).items():
        s = tl.get(key)
        assert s is not None and s.values[0] == pytest.approx(want), key
    for key, want in exp.get("last", {}).items():
        s = tl.get(key)
        assert s is not None and s.values[-1] == pytest.approx(want), key
    for key, want in exp.get("maxv", {}).items():
        s = tl.get(key)
        assert s is not None and max(s.values) == pytest.approx(want), key
    for key, want in exp.get("counts", {}).items():
        s = tl.get(key)
        assert s is not None and len(s) == want, key
    for (key, rank), want in exp.get("rank", {}).items():
        s = tl.get(key, rank)
        assert s is not None and want in [pytest.approx(v) for v in s.values], (key, rank)
    for key, want in exp.get("cfg", {}).items():
        assert tl.cfg(key) == (pytest.approx(want) if isinstance(want, float) else want), key
    for kind, n in exp.get("events", {}).items():
        assert len(tl.events_of(kind)) == n, kind
    if "retracted" in exp:
        assert sum(e.fields["retracted_reqs"] for e in tl.events_of("retraction")) == exp["retracted"]
    # every point points back at its line
    for s in tl.series.values():
        for src in s.sources:
            name, _, line_no = src.rpartition(":")
            assert name == path.name and 1 <= int(line_no) <= rep.lines_read


CPU_RUNS = ["client-bound-low-occupancy", "kv-full-retract", "long-queue", "medium-engine-bound-kv-full", "prefill-capped"]


@pytest.mark.parametrize("run", CPU_RUNS)
def test_cpu_real_log_agrees_with_the_run(data_dir: Path, run: str) -> None:
    """The log read alone agrees with what the load generator, the flags and /metrics recorded."""
    d = data_dir / "sglang-cpu-real" / run
    tl, reader = _read(d / "server.log")
    p = reader.parser
    load = json.loads((d / "load_summary.json").read_text())
    flags = (d / "run_params.txt").read_text().split("serve flags:")[1].splitlines()[0].split()
    flag = dict(zip(flags[0::2], flags[1::2], strict=True))
    # one access line per request the load generator sent and got back
    assert p.access_paths["POST /generate"] == load["ok"] == load["sent"]
    # the pool and caps the server was started with
    assert tl.cfg("max_total_tokens") == int(flag["--max-total-tokens"])
    assert tl.cfg("max_running_requests") == int(flag["--max-running-requests"])
    if "--chunked-prefill-size" in flag:
        assert tl.cfg("chunked_prefill_size") == int(flag["--chunked-prefill-size"])
        assert max(tl.get("prefill_new_tokens").values) <= int(flag["--chunked-prefill-size"])
    assert max(tl.get("running_reqs").values) <= int(flag["--max-running-requests"])
    # retractions: the log lines, the requests' meta_info and the scheduler counter agree
    retracted = sum(e.fields["retracted_reqs"] for e in tl.events_of("retraction"))
    assert retracted == load["retractions_total_from_meta_info"]
    rows = [ln.split("\t") for ln in (d / "timeline.tsv").read_text().splitlines()]
    head, last = rows[0], rows[-1]
    col = dict(zip(head, last, strict=True))
    assert retracted == int(col["num_retracted_requests_total"] or 0)
    assert int(col["num_requests_total"]) == load["ok"]
    # without retraction every prompt token is prefilled exactly once: new + cached = the prompts sent,
    # plus the one-token request the harness sends before the load (the log's first prefill line)
    new, cached = tl.get("prefill_new_tokens"), tl.get("prefill_cached_tokens")
    total = sum(new.values) + sum(cached.values)
    if retracted == 0:
        assert new.values[0] == 1 and cached.values[0] == 0
        assert total - 1 == load["prompt_tokens_total"]
    else:
        assert total - 1 > load["prompt_tokens_total"]  # retracted requests are prefilled again
    # the log sees every decode report; the 2 s scrapes only sample them
    usage_scraped = max(float(r[head.index("token_usage")] or 0) for r in rows[1:])
    assert max(tl.get("token_usage").values) >= usage_scraped - 1e-9
