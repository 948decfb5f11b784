"""high_latency: TTFT or time-between-tokens p95 at or above its threshold is an info finding, on both engines."""

from __future__ import annotations

import json

from diagnoser.cli import main as cli_main
from diagnoser.model import Severity
from diagnoser.rules.lt01_high_latency import HighLatency
from tests.conftest import DATA
from tests.rules.helpers import run, window


def test_thresholds_on_the_p95_readings() -> None:
    # the median of the per-interval p95s judges: one slow interval alone does not fire it
    assert run(HighLatency, window(ttft_seconds_p95=[0.3, 0.4, 9.0], itl_seconds_p95=[0.02] * 3)) is None
    f = run(HighLatency, window(ttft_seconds_p95=[2.5, 3.0, 2.8], itl_seconds_p95=[0.02] * 3))
    assert f is not None and f.severity == Severity.INFO
    assert "first token p95 2.80 s" in f.summary and "between tokens" not in f.summary
    assert {e.signal for e in f.evidence} == {"ttft_seconds_p95", "itl_seconds_p95"}
    f = run(HighLatency, window(itl_seconds_p95=[0.25, 0.3, 0.3]))
    assert f is not None and "300 ms" in f.summary and not f.suggestions
    # a user's own objective
    assert run(HighLatency, window(ttft_seconds_p95=[2.5, 3.0, 2.8]), ttft_high_s=5.0) is None
    assert run(HighLatency, window(token_usage=[0.5] * 3)) is None  # no latency histogram: nothing to judge


def _once(path: str) -> dict:
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--once", "--replay", str(DATA / path), "--format", "json"])
    return json.loads(buf.getvalue())


def test_real_recordings_both_engines() -> None:
    # vLLM 0.32 CPU, KV full with preemption: TTFT p95 over the window about 2.8 s
    doc = _once("vllm-cpu-real/kv-full-preemption")
    (f,) = [f for f in doc["findings"] if f["rule"] == "high_latency"]
    assert f["severity"] == "info" and "first token" in f["summary"]
    # SGLang 0.5.23 CPU, a queue behind a 4-request cap: TTFT p95 about 5.9 s
    doc = _once("sglang-cpu-real/long-queue")
    assert any(f["rule"] == "high_latency" for f in doc["findings"])
    # the healthy vLLM run (2 clients): silent
    doc = _once("vllm-cpu-real/client-bound")
    assert not any(f["rule"] == "high_latency" for f in doc["findings"])
