"""KV01 (kv_saturation) on vLLM, judged by vLLM's own admission mechanism (engines/vllm/scheduler_model.py).

The inputs are instances of vLLM's own templates, formatted here with Python's logging the way vLLM does:

* the log head, ``vllm/logger.py`` ``_FORMAT`` / ``_DATE_FORMAT`` (v0.2.7: ``%(filename)s:%(lineno)d]``;
  v0.10.2: ``[%(fileinfo)s:%(lineno)d]``);
* the V1 stats line, ``vllm/v1/metrics/loggers.py`` ``LoggingStatLogger.log`` at v0.10.2;
* the V0 stats line, ``vllm/engine/metrics.py`` ``LoggingStatLogger.log`` at v0.10.2 and
  ``vllm/engine/llm_engine.py`` ``_log_system_stats`` at v0.2.7;
* the start-up lines ``Model loading took %.4f GiB and %.6f seconds`` (``v1/worker/gpu_model_runner.py``),
  ``Available KV cache memory: %.2f GiB`` (``v1/worker/gpu_worker.py``), ``GPU KV cache size: %s tokens``
  (``v1/core/kv_cache_utils.py``) and ``non-default args: %s`` (``entrypoints/utils.py``), at v0.10.2;
* /metrics series as vLLM names them (``vllm/v1/metrics/loggers.py`` with its ``model_name`` / ``engine``
  labels at v0.10.2; ``vllm/engine/metrics.py`` at v0.6.6 for V0's ``num_requests_swapped``).

The expected answers are computed from the numbers put in, by the admission arithmetic of vLLM's code
(V0 ``BlockSpaceManager.can_allocate``: ``free - required >= int(0.01 x blocks)``; V1
``KVCacheManager.allocate_slots``: ``required <= free``), not copied from a run.
"""

from __future__ import annotations

import io
import json
import logging
import math
from contextlib import redirect_stdout
from pathlib import Path
from statistics import median_low
from typing import Any

import numpy as np
import pytest

from diagnoser.cli import main as cli_main
from diagnoser.engines.vllm.scheduler_model import MECHANISM, engine_core_of, refusal
from diagnoser.mechanism import KVInputs
from diagnoser.model import Severity

T0 = 1_785_000_000.0  # 2026-07-25
# vllm/logger.py
FMT_0_10 = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
FMT_0_2 = "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"
DATEFMT = "%m-%d %H:%M:%S"
# vllm/v1/metrics/loggers.py at v0.10.2 (log_fn("Engine %03d: " ...))
V1_STATS = ("Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%")
# vllm/engine/metrics.py at v0.10.2
V0_STATS = ("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, "
            "Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%.")
# vllm/engine/llm_engine.py at v0.2.7 (an f-string; the same fields, no trailing period)
V0_STATS_0_2 = ("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, "
                "Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%")


def line(fmt: str, ts: float, file: str, lineno: int, msg: str, *args: Any, level: int = logging.INFO) -> str:
    """One log line as vLLM's logger formats it."""
    rec = logging.LogRecord("vllm", level, file, lineno, msg, args, None)
    rec.created = ts
    rec.fileinfo = file
    rec.filename = file
    f = logging.Formatter(fmt, DATEFMT)
    f.converter = __import__("time").gmtime  # type: ignore[assignment]
    return f.format(rec)


def v1_log(rows: list[tuple[int, int, float]], step: float = 10.0, gen: float = 240.0, head: list[str] | None = None) -> str:
    """(running, waiting, usage 0-1) per stats line, V1 shape."""
    out = list(head or [])
    for i, (r, w, u) in enumerate(rows):
        out.append(line(FMT_0_10, T0 + 60 + i * step, "loggers.py", 123, V1_STATS, 0, 0.0, gen, r, w, u * 100, 0.0))
    return "\n".join(out) + "\n"


def v0_log(rows: list[tuple[int, int, float]], step: float = 5.0, old: bool = False) -> str:
    """(running, pending, usage 0-1) per stats line, V0 shape (0.10.2's metrics.py, or 0.2.7's llm_engine.py)."""
    fmt, file, no, tpl = (FMT_0_2, "llm_engine.py", 706, V0_STATS_0_2) if old else (FMT_0_10, "metrics.py", 398, V0_STATS)
    return "\n".join(line(fmt, T0 + i * step, file, no, tpl, 1000.0, 300.0, r, 0, w, u * 100, 0.0) for i, (r, w, u) in enumerate(rows)) + "\n"


def diagnose(tmp_path: Path, text: str, name: str = "server.log", kind: str = "--log") -> dict[str, Any]:
    p = tmp_path / name
    p.write_text(text)
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main([kind, str(p), "--once", "--format", "json"])
    doc: dict[str, Any] = json.loads(buf.getvalue())
    assert doc["engine"] == "vllm"
    return doc


def by_rule(doc: dict[str, Any]) -> dict[str, Any]:
    return {f["rule"]: f for f in doc["findings"]}


def loud(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["rule"], f["severity"]) for f in doc["findings"] if Severity.parse(f["severity"]) >= Severity.WARNING]


def core_of(doc: dict[str, Any]) -> Any:
    cfg = doc["config"][next(iter(doc["config"]))]
    return cfg.get("vllm_engine", {}).get("value")


# -- the mechanism against vLLM's own arithmetic -------------------------------------------------------
def v0_can_allocate(blocks: int, used: int, required: int, watermark: float = 0.01) -> bool:
    """vllm/core/block_manager.py can_allocate (v0.2.7, v0.10.2): OK when free - required >= watermark blocks."""
    return (blocks - used) - required >= int(watermark * blocks)


def v1_allocate_slots(blocks: int, used: int, required: int) -> bool:
    """vllm/v1/core/kv_cache_manager.py allocate_slots (v0.10.2): refused when required > free."""
    return not required > blocks - used


@pytest.mark.parametrize("blocks,bs,used,running", [(1000, 16, 985, 100), (1000, 16, 950, 10), (1000, 16, 920, 400),
                                                     (2048, 16, 1900, 50), (512, 128, 509, 40), (8, 128, 8, 4), (8, 128, 7, 4)])
def test_refusal_is_vllms_allocation_test_for_one_more_running_sized_request(blocks: int, bs: int, used: int, running: int) -> None:
    u = used / blocks
    need = math.ceil(used / running)  # one more request of the running ones' mean size, in blocks
    for core, fits in (("V0", v0_can_allocate), ("V1", v1_allocate_slots)):
        got = refusal(np.array([u]), np.array([running]), core=core, pool=blocks * bs, block_size=bs)[0]
        want = "" if fits(blocks, used, need) or u < 0.9 else ("kv_full" if need > blocks - used else "kv_watermark")
        assert got == want, (core, blocks, used, running, got, want)
    # without the pool's size the same test runs on shares of the pool
    share = refusal(np.array([u]), np.array([running]), core="V1")[0]
    assert (share != "") == (u >= 0.9 and u / running > 1 - u)


def test_watermark_holds_on_v0_only() -> None:
    """The case the two cores differ on: the request's 10 blocks are free (15), but V0 keeps 10 of 1,000 free."""
    args = (np.array([0.985]), np.array([100]))
    assert refusal(*args, core="V0", pool=16000, block_size=16)[0] == "kv_watermark"
    assert refusal(*args, core="V1", pool=16000, block_size=16)[0] == ""
    assert MECHANISM.queues_at_full_pool("V0") and not MECHANISM.queues_at_full_pool("V1")
    got = MECHANISM.kv_refusal(KVInputs(pool=0, usage=np.array([0.5, np.nan, 0.99]), running=np.array([2, 3, 0]), prompt=None, output=None, core="V1"))
    assert got.tolist() == ["", "", ""]  # below 0.9, unread, nothing running: no refusal


def test_engine_core_from_facts_and_version() -> None:
    facts = {"vllm_engine": "V0"}
    assert engine_core_of(facts.get, (0, 10, 2)) == "V0"
    assert engine_core_of({}.get, (0, 6, 6)) == "V0" and engine_core_of({}.get, (0, 11, 0)) == "V1"
    assert engine_core_of({}.get, (0, 9, 2)) is None and engine_core_of({}.get, None) is None


# -- V1 logs ---------------------------------------------------------------------------------------------
def test_v1_full_pool_without_a_queue_is_found_and_sized(tmp_path: Path) -> None:
    """8 long requests decode with the pool at 0.93-0.97 and little waiting: V1 admitted them into it and
    preempts as they grow, so the finding needs no queue at >= 0.95 (the mechanism says the pool takes no
    ninth). The cut is what the pool holds at their size (running / usage, the median over the refused readings)."""
    rows = [(5, 3, 0.62), (6, 2, 0.75), (7, 1, 0.86), (8, 0, 0.93), (8, 0, 0.94), (8, 0, 0.95), (8, 0, 0.96), (8, 0, 0.97)]
    doc = diagnose(tmp_path, v1_log(rows))
    assert core_of(doc) == "V1"
    kv = by_rule(doc)["kv_saturation"]
    assert Severity.parse(kv["severity"]) >= Severity.WARNING
    assert "V1 admits" in kv["summary"] and "not as a queue" in kv["summary"]
    fits = median_low([r / u for r, _w, u in rows if u >= 0.9 and u / r > 1 - u])
    seqs = next(s for s in kv["suggestions"] if s["flag"] == "--max-num-seqs")
    assert seqs["current"] is None and seqs["proposed"] == int(fits)
    assert {"--gpu-memory-utilization", "--kv-cache-dtype"} <= {s["flag"] for s in kv["suggestions"]}


def test_v1_data_parallel_cut_is_per_engine(tmp_path: Path) -> None:
    """Two DP engines (``Engine 000`` / ``Engine 001``), each with its own pool and scheduler: --max-num-seqs
    is per engine, so the cut is what one engine's pool holds, not the two summed."""
    rows = [(8, 1, 0.93), (8, 1, 0.95), (8, 0, 0.96), (8, 1, 0.97)]
    out = []
    for i, (r, w, u) in enumerate(rows):
        for eng in (0, 1):
            out.append(line(FMT_0_10, T0 + i * 10.0, "loggers.py", 123, V1_STATS, eng, 0.0, 240.0, r, w, u * 100, 0.0))
    kv = by_rule(diagnose(tmp_path, "\n".join(out) + "\n"))["kv_saturation"]
    seqs = next(s for s in kv["suggestions"] if s["flag"] == "--max-num-seqs")
    assert seqs["proposed"] == int(median_low([r / u for r, _w, u in rows]))


def test_v1_many_small_requests_at_high_usage_are_not_full(tmp_path: Path) -> None:
    """200 requests at 0.92: each holds under 0.5 % of the pool and 8 % is free, so vLLM admits more; nothing waits."""
    doc = diagnose(tmp_path, v1_log([(200, 0, 0.92), (205, 0, 0.93), (210, 0, 0.92), (204, 0, 0.93), (200, 0, 0.92)]))
    assert "kv_saturation" not in by_rule(doc) and not loud(doc)


def test_v1_healthy_server_gets_nothing_loud(tmp_path: Path) -> None:
    doc = diagnose(tmp_path, v1_log([(4, 0, 0.12), (6, 0, 0.18), (5, 0, 0.15), (6, 0, 0.2), (4, 0, 0.1), (5, 0, 0.16)]))
    assert not loud(doc), loud(doc)


# -- V0 logs ---------------------------------------------------------------------------------------------
# a V0 pool of 2,000 blocks, each request holding 12 (it holds 166); prefill admits 15 a line, then 20, while
# arrivals outrun it: at the last line 165 run and 20 blocks are free, the next request's 12 fit but not beside
# the watermark's int(0.01 x 2,000) = 20 blocks
BLOCKS, PER_REQ = 2000, 12
FLOOD = [(r, w, r * PER_REQ / BLOCKS) for r, w in ((100, 120), (115, 150), (130, 180), (145, 210), (165, 240))]


@pytest.mark.parametrize("old", [False, True], ids=["v0.10.2-metrics.py", "v0.2.7-llm_engine.py"])
def test_v0_pool_filling_under_a_growing_queue(tmp_path: Path, old: bool) -> None:
    """The pool fills while the queue grows; at the last line the next request's blocks are free but not
    beside V0's watermark (LATER: it waits), and the requests in flight were more than the pool holds at the
    running ones' size in every line with a queue. The cut: what the pool holds at the refused line."""
    doc = diagnose(tmp_path, v0_log(FLOOD, old=old))
    assert core_of(doc) == "V0"
    kv = by_rule(doc)["kv_saturation"]
    assert Severity.parse(kv["severity"]) >= Severity.WARNING and "watermark" in kv["summary"]
    r, _w, u = FLOOD[-1]
    assert not v0_can_allocate(BLOCKS, r * PER_REQ, PER_REQ) and v1_allocate_slots(BLOCKS, r * PER_REQ, PER_REQ)
    seqs = next(s for s in kv["suggestions"] if s["flag"] == "--max-num-seqs")
    assert seqs["proposed"] == int(r / u) == BLOCKS // PER_REQ


def test_the_same_numbers_in_v1s_shape_are_not_a_watermark_refusal(tmp_path: Path) -> None:
    """V1 keeps no watermark: at the last line the next request's 12 blocks are among the 20 free, so V1
    admits it and the line is no refusal; the queue there is the step budget's, not the pool's."""
    doc = diagnose(tmp_path, v1_log(FLOOD, step=5.0))
    assert core_of(doc) == "V1"
    assert "kv_saturation" not in by_rule(doc)


def test_v0_healthy_server_gets_nothing_loud(tmp_path: Path) -> None:
    doc = diagnose(tmp_path, v0_log([(12, 0, 0.2), (14, 0, 0.25), (13, 0, 0.22), (15, 0, 0.27), (12, 0, 0.21)], old=True))
    assert core_of(doc) == "V0" and not loud(doc), loud(doc)


def test_v0_queue_with_room_in_the_pool_is_not_kv(tmp_path: Path) -> None:
    doc = diagnose(tmp_path, v0_log([(40, 30, 0.35), (48, 36, 0.41), (52, 40, 0.45), (56, 38, 0.5), (60, 35, 0.52)]))
    assert "kv_saturation" not in by_rule(doc)


# -- /metrics --------------------------------------------------------------------------------------------
def exposition(running: int, waiting: int, usage: float, v1: bool) -> str:
    lab = '{engine="0",model_name="m"}' if v1 else '{model_name="m"}'
    usage_name = "kv_cache_usage_perc" if v1 else "gpu_cache_usage_perc"
    rows = [("num_requests_running", running), ("num_requests_waiting", waiting), (usage_name, usage)]
    if not v1:
        rows.append(("num_requests_swapped", 0))
    return "".join(f"# TYPE vllm:{n} gauge\nvllm:{n}{lab} {float(v)}\n" for n, v in rows)


@pytest.mark.parametrize("v1", [True, False], ids=["V1", "V0"])
def test_engine_core_from_the_series(tmp_path: Path, v1: bool) -> None:
    doc = diagnose(tmp_path, exposition(8, 2, 0.97, v1), "m.prom", "--metrics-file")
    assert core_of(doc) == ("V1" if v1 else "V0")
    # one scrape: 8 running at 0.97 hold about 12 % of the pool each, 3 % is free -- refused on either core
    assert "kv_saturation" in by_rule(doc)


# -- --gpu-memory-utilization what-if --------------------------------------------------------------------
def startup(util: float, weights_gib: float, kv_gib: float, tokens: int, extra: str = "") -> list[str]:
    t = T0
    args = f"{{'model': 'm', 'gpu_memory_utilization': {util}{extra}}}"
    return [line(FMT_0_10, t, "utils.py", 328, "non-default args: %s", args),
            line(FMT_0_10, t + 20, "gpu_model_runner.py", 2392, "Model loading took %.4f GiB and %.6f seconds", weights_gib, 3.2),
            line(FMT_0_10, t + 30, "gpu_worker.py", 298, "Available KV cache memory: %.2f GiB", kv_gib),
            line(FMT_0_10, t + 31, "kv_cache_utils.py", 1028, "GPU KV cache size: %s tokens", f"{tokens:,}")]


FULL_V1 = [(6, 2, 0.80), (8, 1, 0.93), (8, 1, 0.95), (8, 0, 0.96), (8, 1, 0.97)]


def test_utilization_what_if_is_a_lower_bound_from_the_start_up_lines(tmp_path: Path) -> None:
    """0.85 → 0.9 on a server whose log gives the weights (15 GiB) and the KV budget (20 GiB for 163,840
    tokens): the device holds at least (15 + 20) / 0.85 GiB, so +0.05 gives the KV cache at least 0.05 x that."""
    w, kv_gib, tokens = 15.0, 20.0, 163_840
    doc = diagnose(tmp_path, v1_log(FULL_V1, head=startup(0.85, w, kv_gib, tokens)))
    s = next(s for s in by_rule(doc)["kv_saturation"]["suggestions"] if s["flag"] == "--gpu-memory-utilization")
    assert (s["current"], s["proposed"]) == (0.85, 0.9)
    weights_b = w * 1.073741824 * 1e9  # the parser keeps "took X GiB" in GB; StartupFacts reads GB x 1e9
    total = (weights_b + kv_gib * 2**30) / 0.85
    bpt = kv_gib * 2**30 / tokens
    gained_lo = 0.05 * total / bpt
    text = s["effect"]
    assert f"KV pool {tokens:,} → at least" in text and "lower bound" in text
    gained = int(text.split("(+", 1)[1].split(" ", 1)[0].rstrip(",").replace(",", ""))
    assert gained_lo - 16 * 2 <= gained <= gained_lo  # whole blocks of 16, rounded down
    assert any("total" in a or "memory is at least" in a for a in s["assumptions"])


def test_utilization_is_not_proposed_where_vllm_ignores_it(tmp_path: Path) -> None:
    """--kv-cache-memory-bytes sets the KV size: vLLM does not read the utilization."""
    head = startup(0.85, 15.0, 20.0, 163_840, extra=", 'kv_cache_memory_bytes': 21474836480")
    doc = diagnose(tmp_path, v1_log(FULL_V1, head=head))
    kv = by_rule(doc)["kv_saturation"]
    assert "--gpu-memory-utilization" not in {s["flag"] for s in kv["suggestions"]}


def test_utilization_vetting() -> None:
    from diagnoser.engines.vllm.scheduler_model import VLLMState

    assert MECHANISM.vet("--gpu-memory-utilization", 0.9, 1.2, VLLMState()).kind == "noop"  # CacheConfig: le=1
    v = MECHANISM.vet("--gpu-memory-utilization", 0.9, 0.98, VLLMState())
    assert (v.kind, v.proposed) == ("capped", 0.95)
    assert MECHANISM.vet("--gpu-memory-utilization", 0.9, 0.95, VLLMState(num_gpu_blocks_override=64)).kind == "noop"
    assert MECHANISM.vet("--gpu-memory-utilization", 0.9, 0.95, VLLMState()).ok
    assert MECHANISM.vet("--max-num-seqs", 256, 0, VLLMState()).kind == "noop"
