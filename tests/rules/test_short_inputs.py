"""Every rule on the inputs people actually bring: one pasted line, three lines, a startup log alone, one
/metrics scrape — each once where the rule must fire and once where it must stay silent.

The inputs are written here in SGLang's own line formats of the versions named (reference: SGLang's
``scheduler_metrics_mixin.py`` / ``scheduler.py`` log calls at each release); they go through the real
CLI (``diagnose --once --format json``), parser and rules. Real public inputs of the same kinds are the
golden cases in tests/data/cases (101…131); this file pins each rule's behaviour on the smallest input.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.rules import REGISTRY
from tests.conftest import DATA

D9 = "[2026-03-01 10:00:{s:02d} TP0] Decode batch, #running-req: {run}, #token: {tok}, token usage: {use:.2f}, cuda graph: {graph}, gen throughput (token/s): {gen:.2f}, #queue-req: {q}"
P9 = ("[2026-03-01 10:00:{s:02d} TP0] Prefill batch, #new-seq: {seq}, #new-token: {new}, #cached-token: {cached}, token usage: {use:.2f}, "
      "#running-req: {run}, #queue-req: {q}, #pending-token: {pend}, cuda graph: False, input throughput (token/s): 20000.00")
SUMMARY = ("[2026-03-01 09:59:00 TP0] max_total_num_tokens={pool}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           "max_running_requests={cap}, context_len={ctx}, available_gpu_mem=12.50 GB")


def dec(s: int = 0, run: int = 10, tok: int = 20000, use: float = 0.2, graph: str = "True", gen: float = 900.0, q: int = 0) -> str:
    return D9.format(s=s, run=run, tok=tok, use=use, graph=graph, gen=gen, q=q)


def pre(s: int = 0, seq: int = 1, new: int = 3000, cached: int = 0, use: float = 0.1, run: int = 5, q: int = 0, pend: int = 0) -> str:
    return P9.format(s=s, seq=seq, new=new, cached=cached, use=use, run=run, q=q, pend=pend)


def summary(pool: int = 1_707_904, cap: int = 4096, ctx: int = 40960) -> str:
    return SUMMARY.format(pool=pool, cap=cap, ctx=ctx)


def scrape(running: float, queue: float, usage: float, gen: float = 900.0, extra: str = "") -> str:
    lab = '{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"}'
    return (f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{lab} {running}\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{lab} {queue}\n"
            f"# TYPE sglang:token_usage gauge\nsglang:token_usage{lab} {usage}\n"
            f"# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{lab} {gen}\n" + extra)


def dp_scrape(running: list[float], queue: list[float]) -> str:
    out = ["# TYPE sglang:num_running_reqs gauge"]
    out += [f'sglang:num_running_reqs{{model_name="m",dp_rank="{i}",tp_rank="{i}"}} {r}' for i, r in enumerate(running)]
    out += ["# TYPE sglang:num_queue_reqs gauge"]
    out += [f'sglang:num_queue_reqs{{model_name="m",dp_rank="{i}",tp_rank="{i}"}} {q}' for i, q in enumerate(queue)]
    out += ["# TYPE sglang:token_usage gauge"]
    out += [f'sglang:token_usage{{model_name="m",dp_rank="{i}",tp_rank="{i}"}} 0.3' for i in range(len(running))]
    return "\n".join(out) + "\n"


def diagnose(tmp: Path, text: str, kind: str = "log", *extra: str) -> tuple[int, dict[str, Any]]:
    path = tmp / ("metrics.txt" if kind == "metrics" else "server.log")
    path.write_text(text + "\n")
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["--once", "--format", "json", "--metrics-file" if kind == "metrics" else "--log", str(path), *extra])
    return rc, json.loads(buf.getvalue())


def by_rule(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in doc["findings"]}


# (rule, shape, input kind, text, fires, what the finding must say or the most confidence it may have)
CASES: list[tuple[str, str, str, str, bool, str]] = [
    # kv_saturation: one line with a deep queue at 0.93 is KV-bound; the same line with no queue is healthy
    ("kv_saturation", "one line", "log", "Decode batch. #running-req: 1010, #token: 55006, token usage: 0.93, gen throughput (token/s): 1397, #queue-req: 12279", True, "low"),
    ("kv_saturation", "one line", "log", "Decode batch. #running-req: 1010, #token: 55006, token usage: 0.93, gen throughput (token/s): 1397, #queue-req: 0", False, ""),
    ("kv_saturation", "three lines", "log", "\n".join(dec(i, run=48, tok=97000, use=0.97, q=30) for i in range(3)), True, "medium"),
    ("kv_saturation", "three lines", "log", "\n".join(dec(i, run=48, tok=40000, use=0.40, q=30) for i in range(3)), False, ""),
    ("kv_saturation", "startup only", "log", summary() + "\n[2026-03-01 10:00:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 4096, #new_token_ratio: 0.4000 -> 0.7000", True, "The KV pool ran out"),
    ("kv_saturation", "startup only", "log", summary(), False, ""),
    ("kv_saturation", "one scrape", "metrics", scrape(40, 25, 0.96), True, "low"),
    ("kv_saturation", "one scrape", "metrics", scrape(40, 25, 0.50), False, ""),
    # kv_retraction: one retraction line (0.4.7-0.5.6 wording) is one event, occasional
    ("kv_retraction", "one line", "log", "[2025-06-01 10:00:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.3000 -> 0.6000", True, "occasional"),
    ("kv_retraction", "one line", "log", dec(q=3), False, ""),
    # kv_pool_too_small: a pool below one full-context request; a request rejected by the pool's limit
    ("kv_pool_too_small", "startup only", "log", summary(pool=8050, ctx=131072), True, "less than one prefill batch"),
    ("kv_pool_too_small", "startup only", "log", summary(pool=100_000, ctx=131072), True, "less than one request of the configured context length"),
    ("kv_pool_too_small", "startup only", "log", summary(), False, ""),
    ("kv_pool_too_small", "one line", "log", "[2025-03-03 06:49:28 TP0] Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens). Use a shorter input or enable --allow-auto-truncate.", True, "the KV pool"),
    ("kv_pool_too_small", "one line", "log", "[2025-03-03 06:49:28 TP0] Input length (40000 tokens) exceeds the maximum allowed length (32762 tokens). Use a shorter input or enable --allow-auto-truncate.", False, ""),
    # queue_buildup: a v0.1 fill line with 57 waiting; one scrape with a queue
    ("queue_buildup", "one line", "log", "new fill batch. #seq: 1. #cached_token: 330. #new_token: 2172. #remaining_req: 57. #running_req: 9. tree_cache_hit_rate: 69.16%", True, "low"),
    ("queue_buildup", "one line", "log", "new fill batch. #seq: 1. #cached_token: 330. #new_token: 2172. #remaining_req: 0. #running_req: 9. tree_cache_hit_rate: 69.16%", False, ""),
    ("queue_buildup", "one scrape", "metrics", scrape(162, 2826, 0.28), True, "Admission-limited"),
    ("queue_buildup", "one scrape", "metrics", scrape(162, 0, 0.28), False, ""),
    # request_outcomes: one scrape's answer counters (a third answered 400: longer than the context), or all 200
    ("request_outcomes", "one scrape", "metrics", scrape(2, 0, 0.01, extra="# TYPE sglang:http_responses_total counter\n"
     'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 48.0\n'
     'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="400"} 24.0\n'), True, "400"),
    ("request_outcomes", "one scrape", "metrics", scrape(2, 0, 0.01, extra="# TYPE sglang:http_responses_total counter\n"
     'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 48.0\n'), False, ""),
    # low_batch_occupancy / client_bound: one request running, nothing waiting, an empty pool
    ("low_batch_occupancy", "one line", "log", dec(run=1, tok=300, use=0.0), True, "low"),
    ("low_batch_occupancy", "one line", "log", dec(run=40, tok=80000, use=0.4), False, ""),
    ("client_bound", "three lines", "log", "\n".join(dec(i, run=1, tok=200 + 40 * i, use=0.0) for i in range(3)), True, "medium"),
    ("client_bound", "three lines", "log", "\n".join(dec(i, run=1, tok=200 + 40 * i, use=0.0, q=5) for i in range(3)), False, ""),
    # prefill_stall: one chunk-sized batch with a backlog and an empty pool; a prompt-sized batch does not say so
    ("prefill_stall", "one line", "log", pre(new=8192, q=40, pend=300000, use=0.05), True, "low"),
    ("prefill_stall", "one line", "log", pre(new=3000, q=40, pend=300000, use=0.05), False, ""),
    ("prefill_stall", "three lines", "log", "\n".join(pre(i, seq=6, new=15360, q=238, pend=595000, use=0.01, run=116) for i in range(3)), True, "prefill budget"),
    # max_running_requests_cap: the start-up line of a hybrid model; runtime at the cap
    ("max_running_requests_cap", "startup only", "log", "[2026-05-01 10:00:00] max_running_requests is capped to 9 by the mamba state cache (max_mamba_cache_size=47, 5 state slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.", True, "mamba state cache"),
    ("max_running_requests_cap", "startup only", "log", summary(), False, ""),
    ("max_running_requests_cap", "three lines", "log", summary(cap=16) + "\n" + "\n".join(dec(i, run=16, tok=8000, use=0.05, q=40) for i in range(2)), True, "the cap"),
    ("max_running_requests_cap", "three lines", "log", summary(cap=16) + "\n" + "\n".join(dec(i, run=9, tok=8000, use=0.05, q=0) for i in range(2)), False, ""),
    # cuda_graph_disabled_or_exceeded: graphs captured up to 32 against 4096 slots and a 1.7M pool
    ("cuda_graph_disabled_or_exceeded", "startup only", "log", summary() + "\n[2026-03-01 09:58:00 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]", True, "captured only up to batch 32"),
    ("cuda_graph_disabled_or_exceeded", "startup only", "log", summary(cap=256) + "\n[2026-03-01 09:58:00 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 32, 64, 128, 256]", False, ""),
    ("cuda_graph_disabled_or_exceeded", "three lines", "log", dec(0, run=20, graph="True") + "\n" + dec(1, run=20, graph="True") + "\n" + dec(2, run=300, graph="False"), True, "captured maximum"),
    ("cuda_graph_disabled_or_exceeded", "three lines", "log", "\n".join(dec(i, run=20, graph="True") for i in range(3)), False, ""),
    # low_spec_acceptance: one decode line of a speculative run
    ("low_spec_acceptance", "one line", "log", "[2026-03-01 10:00:00 TP0] Decode batch, #running-req: 8, #token: 9000, token usage: 0.10, accept len: 1.60, accept rate: 0.40, cuda graph: True, gen throughput (token/s): 400.00, #queue-req: 0", True, "low"),
    ("low_spec_acceptance", "one line", "log", "[2026-03-01 10:00:00 TP0] Decode batch, #running-req: 8, #token: 9000, token usage: 0.10, accept len: 3.50, accept rate: 0.85, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0", False, ""),
    # dp_imbalance: one scrape with dp_rank labels; three DP-prefixed lines
    ("dp_imbalance", "one scrape", "metrics", dp_scrape([60, 5, 5, 5], [30, 0, 0, 0]), True, "low"),
    ("dp_imbalance", "one scrape", "metrics", dp_scrape([20, 21, 19, 20], [0, 0, 0, 0]), False, ""),
    ("dp_imbalance", "three lines", "log", "\n".join(f"[2025-11-03 14:31:10 DP{i} TP{i} EP{i}] Decode batch, #running-req: {r}, #token: 9000, token usage: 0.10, cuda graph: True, gen throughput (token/s): 400.00, #queue-req: 0, "
                                                    for i, r in enumerate((64, 8, 8))), True, "low"),
    # prefill_decode_interference: three large prefills back to back while requests run
    ("prefill_decode_interference", "three lines", "log", "\n".join(pre(i, seq=2, new=16384, run=40, q=2, pend=40000) for i in range(3)), True, "back to back"),
    ("prefill_decode_interference", "three lines", "log", pre(0, seq=2, new=16384, run=40, q=2) + "\n" + dec(1, run=40) + "\n" + pre(2, seq=2, new=16384, run=40, q=2), False, ""),
    # pd_transfer: one PD prefill line with hundreds waiting for bootstrap; one bootstrap failure
    ("pd_transfer", "one line", "log", "[2025-05-18 08:57:07 DP14 TP14] Prefill batch. #new-seq: 7, #new-token: 200, #cached-token: 0, token usage: 0.07, #running-req: 0, #unbootstrapped-req: 341, #queue-req: 0, #transferring-req: 155 ", True, "hand-over"),
    ("pd_transfer", "one line", "log", "[2025-05-18 08:57:07 DP14 TP14] Prefill batch. #new-seq: 7, #new-token: 200, #cached-token: 0, token usage: 0.07, #running-req: 30, #unbootstrapped-req: 0, #queue-req: 4, #transferring-req: 3 ", False, ""),
    ("pd_transfer", "one line", "log", "[2025-08-26 01:43:25 TP12] Prefill bootstrap failed for request rank=12 req.rid='5e5f' req.bootstrap_room=1609 with exception KVTransferError(bootstrap_room=1609): Request 1609 timed out after 300.0s in KVPoll.Bootstrapping", True, "timed out"),
    # oom: the allocator's line, a device OOM with its frames, the start-up failure
    ("oom", "one line", "log", "[2025-09-20 08:14:33 TP0] Prefill out of memory. Try to lower your batch size.", True, "prefill"),
    ("oom", "three lines", "log", 'Traceback (most recent call last):\n  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1800, in forward_extend\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.', True, "device (prefill)"),
    ("oom", "one line", "log", dec(), False, ""),
    # engine_crash: the notice alone (truncated), an exception under engine frames; a benign traceback is not one
    ("engine_crash", "one line", "log", "[2025-06-26 02:16:20 TP0] Scheduler hit an exception: Traceback (most recent call last):", True, "Scheduler process crashed"),
    ("engine_crash", "three lines", "log", '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2050, in run_batch\n  File "/sgl/python/sglang/srt/managers/tp_worker.py", line 240, in forward_batch_generation\nRuntimeError: CUDA error: an illegal memory access was encountered', True, "illegal memory access"),
    ("engine_crash", "three lines", "log", 'Traceback (most recent call last):\n  File "venv/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", line 2561, in _freeze_gc_after_server_warmup\nrequests.exceptions.ConnectionError: HTTPConnectionPool(host=\'127.0.0.1\', port=30000): Max retries exceeded', False, ""),
    # engine_leak: the scheduler's idle self-check (formats of scheduler.py check_memory)
    ("engine_leak", "one line", "log", "[2026-02-10 14:03:15 TP0] token_to_kv_pool_allocator memory leak detected! available_size=581120, evictable_size=0, max_total_num_tokens=582064", True, "not given back"),
    ("engine_leak", "one line", "log", "[2024-12-10 14:03:15 TP0] KV cache pool leak detected!", True, "KV token slots"),
    ("engine_leak", "one line", "log", dec(run=0, tok=0, use=0.0), False, ""),
    # engine_crash: a failed health check alone (the server stopped answering)
    ("engine_crash", "one line", "log", "[2026-02-10 14:03:15] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.", True, "stopped answering"),
    # runaway_generation: two requests holding 150k tokens each while the pool is half used
    ("runaway_generation", "three lines", "log", "\n".join(dec(i, run=2, tok=300000 + 80 * i, use=0.5) for i in range(3)), True, "150,040 KV tokens each"),
    ("runaway_generation", "three lines", "log", "\n".join(dec(i, run=2, tok=4000 + 80 * i, use=0.01) for i in range(3)), False, ""),
]
CONF = {"low": 0, "medium": 1, "high": 2}


@pytest.mark.parametrize(("rule", "shape", "kind", "text", "fires", "say"), CASES, ids=[f"{c[0]}-{c[1]}-{'fires' if c[4] else 'silent'}-{i}" for i, c in enumerate(CASES)])
def test_short_input(tmp_path: Path, rule: str, shape: str, kind: str, text: str, fires: bool, say: str) -> None:
    rc, doc = diagnose(tmp_path, text, kind)
    assert rc in (0, 1), doc
    got = by_rule(doc)
    if not fires:
        assert rule not in got, f"{rule} should stay silent on this {shape}: {got[rule]['summary']}"
        return
    assert rule in got, f"{rule} missed on this {shape}; got {[(f['rule'], f['summary'][:80]) for f in doc['findings']]}"
    f = got[rule]
    assert f["basis"], f"{rule}: the finding says what it stands on"
    if say in CONF:  # the most confidence a snapshot allows
        assert CONF[f["confidence"]] <= CONF[say], (f["confidence"], f["basis"])
    else:
        assert say in f["summary"] or any(say in n for n in f["notes"]), f["summary"]
    if "readings" in f["basis"] and not f["basis"].get("uncapped"):
        n = f["basis"]["readings"]
        assert CONF[f["confidence"]] <= (0 if n <= 1 else 1 if n < 5 else 2)


def ttft_hist(counts: list[int]) -> str:
    """SGLang's TTFT histogram with these cumulative bucket counts (le 0.1 … 30 s, then +Inf)."""
    out = ["# TYPE sglang:time_to_first_token_seconds histogram"]
    out += [f'sglang:time_to_first_token_seconds_bucket{{le="{le}"}} {c}' for le, c in zip((0.1, 0.5, 1, 2, 5, 10, 30), counts, strict=True)]
    out += [f'sglang:time_to_first_token_seconds_bucket{{le="+Inf"}} {counts[-1]}', f"sglang:time_to_first_token_seconds_count {counts[-1]}",
            "sglang:time_to_first_token_seconds_sum 0"]
    return "\n".join(out) + "\n"


# rules whose shortest input is two scrapes: a latency histogram judged over the window between them (one
# scrape's cumulative histogram covers the server's whole life, not the window)
TWO_SCRAPES: list[tuple[str, tuple[str, str], bool]] = [
    ("high_latency", (scrape(10, 0, 0.3, extra=ttft_hist([0, 0, 0, 0, 0, 0, 0])),
                      scrape(10, 0, 0.3, extra=ttft_hist([0, 0, 5, 10, 60, 100, 100]))), True),
    ("high_latency", (scrape(10, 0, 0.3, extra=ttft_hist([0, 0, 0, 0, 0, 0, 0])),
                      scrape(10, 0, 0.3, extra=ttft_hist([60, 95, 100, 100, 100, 100, 100]))), False),
]


@pytest.mark.parametrize(("rule", "texts", "fires"), TWO_SCRAPES, ids=[f"{c[0]}-two-scrapes-{'fires' if c[2] else 'silent'}" for c in TWO_SCRAPES])
def test_two_scrapes(tmp_path: Path, rule: str, texts: tuple[str, str], fires: bool) -> None:
    paths = []
    for i, text in enumerate(texts):
        paths += ["--metrics-file", str(tmp_path / f"m{i}.txt")]
        (tmp_path / f"m{i}.txt").write_text(text)
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["--once", "--format", "json", *paths])
    assert rc in (0, 1)
    got = by_rule(json.loads(buf.getvalue()))
    assert (rule in got) == fires, got.get(rule) or sorted(got)


def test_every_target_rule_has_short_inputs_both_ways() -> None:
    fires = {c[0] for c in CASES if c[4]}
    silent = {c[0] for c in CASES if not c[4]}
    input_rules = {"source_unreachable", "metrics_disabled", "insufficient_data", "low_cache_hit"}  # tested on their own inputs
    fires |= {c[0] for c in TWO_SCRAPES if c[2]}
    silent |= {c[0] for c in TWO_SCRAPES if not c[2]}
    for r in REGISTRY:
        if r.scope == "target" and r.name not in input_rules:
            assert r.name in fires and r.name in silent, f"{r.name} has no short input that fires or none that stays silent"


def test_a_note_alone_never_makes_exit_1(tmp_path: Path) -> None:
    """insufficient_data is info and a note: a startup line with nothing else exits 0, even with --fail-on info."""
    rc, doc = diagnose(tmp_path, "[2026-03-01 10:00:00] The server is fired up and ready to roll!", "log", "--fail-on", "info")
    assert [f["rule"] for f in doc["findings"]] == ["insufficient_data"] and doc["findings"][0]["severity"] == "info"
    assert rc == 0 and doc["status"] == "ok"
    rc, doc = diagnose(tmp_path, dec(run=1, tok=200, use=0.0), "log", "--fail-on", "info")
    assert rc == 1  # an info finding of a rule that judges (client_bound) still counts for --fail-on info


def test_nothing_recognised_is_still_exit_2(tmp_path: Path) -> None:
    rc, doc = diagnose(tmp_path, "hello\nworld")
    assert rc == 2 and doc["status"] == "error"


def test_the_text_report_says_what_each_finding_stands_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "server.log"
    p.write_text("Decode batch. #running-req: 1010, #token: 55006, token usage: 0.93, gen throughput (token/s): 1397, #queue-req: 12279\n")
    assert cli_main(["--once", "--log", str(p)]) == 1
    out = capsys.readouterr().out  # the short report: the top cause with what it stands on
    assert "WARN top cause: kv_saturation (low confidence, on 1 reading)" in out
    assert "info insufficient_data" in out and "WARN insufficient_data" not in out
    assert cli_main(["--once", "--log", str(p), "--verbose"]) == 1
    out = capsys.readouterr().out  # --verbose: every finding with its basis
    assert "[WARN] kv_saturation (low confidence, on 1 reading)" in out
    assert "[info] insufficient_data (high confidence, on 1 reading)" in out and "[WARN] insufficient_data" not in out


def test_one_real_scrape_of_sglangs_own_collector(capsys: pytest.CaptureFixture[str]) -> None:
    """The exposition of SGLang 0.5.23's collector classes, read as one --metrics-file: a full pool with
    37 waiting is kv_saturation from one reading, at low confidence."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["--once", "--format", "json", "--metrics-file", str(DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom")])
    doc = json.loads(buf.getvalue())
    f = by_rule(doc)["kv_saturation"]
    assert rc == 1 and f["confidence"] == "low" and f["basis"]["readings"] == 1 and doc["version"] == ">=0.5.23"
    assert doc["inputs"][0]["kind"] == "metrics" and doc["inputs"][0]["scrapes"] == 1


def test_metrics_file_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["--once", "--metrics-file", str(tmp_path / "missing.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot read the metrics file" in err and "Traceback" not in err
    (tmp_path / "x.txt").write_text("<html>login</html>\n")
    rc = cli_main(["--once", "--metrics-file", str(tmp_path / "x.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and "HTML page" in err
    rc = cli_main(["--once", "--metrics-file", "m.txt", "--url", "http://127.0.0.1:9"])
    assert rc == 2 and "without --url" in capsys.readouterr().err


def test_snapshots_of_normal_work_are_not_warnings(tmp_path: Path) -> None:
    """What a healthy server prints now and then: a long prompt chunked while a few wait, speculative
    decoding's own cap of 48, a client that disconnected mid-stream. Found as info, or not at all."""
    _, doc = diagnose(tmp_path, pre(new=8192, q=3, pend=20000, use=0.3, run=60))
    f = by_rule(doc).get("prefill_stall")
    assert f is not None and f["severity"] == "info"
    _, doc = diagnose(tmp_path, "[2026-03-01 10:00:00] Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.")
    assert by_rule(doc)["max_running_requests_cap"]["severity"] == "info"
    _, doc = diagnose(tmp_path, 'Traceback (most recent call last):\n  File "/sgl/python/sglang/srt/managers/tokenizer_manager.py", line 900, in _wait_one_response\nasyncio.exceptions.CancelledError')
    assert "engine_crash" not in by_rule(doc)
    loud = [f for f in doc["findings"] if f["severity"] != "info"]
    assert not loud, loud


def test_a_metrics_dump_passed_as_log_is_read_as_one_scrape(tmp_path: Path) -> None:
    """People pass a saved /metrics dump with --log: it is read as the exposition it is, and said so."""
    rc, doc = diagnose(tmp_path, scrape(40, 25, 0.96))  # written as server.log, passed with --log
    assert rc == 1 and "kv_saturation" in by_rule(doc)
    (inp,) = [i for i in doc["inputs"] if i["kind"] == "metrics"]
    assert inp["scrapes"] == 1 and any("read as one scrape" in m for m in inp["messages"])


def test_a_running_count_pinned_with_a_queue_implies_a_cap(tmp_path: Path) -> None:
    """No summary line: 32 running in every line while 200 wait and KV is at 0.3 is a cap (inferred)."""
    rc, doc = diagnose(tmp_path, "\n".join(dec(i, run=32, tok=30000 + 40 * i, use=0.3, q=200) for i in range(4)))
    f = by_rule(doc)["max_running_requests_cap"]
    assert f["confidence"] == "low" and "inferred" in f["summary"]
    assert f["suggestions"][0]["flag"] == "--max-running-requests"
    # a running count that moves with the load is not a cap
    _, doc = diagnose(tmp_path, "\n".join(dec(i, run=30 + i, tok=30000, use=0.3, q=200) for i in range(4)))
    assert "max_running_requests_cap" not in by_rule(doc)


def test_a_running_count_held_by_whole_prefill_chunks_is_not_a_slot_cap(tmp_path: Path) -> None:
    """Three Prefill lines each computing a whole 8,192-token chunk of a long prompt while 30 wait and 3 run:
    admission waits on the prefill budget (prefill_stall), not on max_running_requests."""
    text = "\n".join(pre(i, new=8192, use=0.05 + 0.01 * i, run=3, q=30 + i) for i in range(3))
    _, doc = diagnose(tmp_path, text)
    found = by_rule(doc)
    assert "prefill_stall" in found and "max_running_requests_cap" not in found, sorted(found)
    assert [t["rule"] for t in doc["top"].values()] == ["prefill_stall"], doc["top"]


def test_a_pool_shorter_than_the_context_counts_requests_at_the_size_they_run(tmp_path: Path) -> None:
    """kv_pool_too_small beside a few Decode lines: the requests that fit are counted at the tokens a running
    request holds there (#token / #running-req), and the finding stands on those readings, not on
    'startup lines alone'."""
    text = "\n".join([summary(pool=116_171, cap=2048, ctx=262_144)] + [dec(i, run=52, tok=115_000, use=0.99, q=96) for i in range(3)])
    _, doc = diagnose(tmp_path, text)
    f = by_rule(doc)["kv_pool_too_small"]
    assert "2,212 tokens a running request holds" in f["summary"] and "about 47 requests fit" in f["summary"], f["summary"]
    assert f["basis"].get("readings") == 3 and not f["basis"].get("startup"), f["basis"]
    # from the start-up line alone the count is an example, said as such
    _, doc = diagnose(tmp_path, summary(pool=116_171, cap=2048, ctx=262_144))
    f = by_rule(doc)["kv_pool_too_small"]
    assert "1,000 tokens per request (an example" in f["summary"] and f["basis"].get("startup"), f


def test_a_pool_derived_from_one_line_is_said_to_be_derived(tmp_path: Path) -> None:
    """The issue's one line (no pool printed): the pool is read as #token / token usage, good to about 1 %,
    and the summary says so ("about"); one running count reads as one number, not "1010–1010"."""
    line = ("[2025-01-05 10:00:00 TP0] Decode batch. #running-req: 1010, #token: 55006, token usage: 0.93, "
            "gen throughput (token/s): 1397, #queue-req: 12279")
    rc, doc = diagnose(tmp_path, line, "log")
    f = by_rule(doc)["kv_saturation"]
    assert rc == 1 and "pool about 59,100 tokens (#token / token usage)" in f["summary"], f["summary"]
    assert "1010 ran" in f["summary"] and "1010–1010" not in f["summary"]
    log = tmp_path / "startup.log"  # with the pool printed, it is the engine's own number
    log.write_text(SUMMARY.format(pool=59146, cap=2048, ctx=32768) + "\n" + line + "\n")
    rc, doc = diagnose(tmp_path, log.read_text(), "log")
    assert "pool 59,146 tokens" in by_rule(doc)["kv_saturation"]["summary"]
