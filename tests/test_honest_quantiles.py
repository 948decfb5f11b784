"""Histogram quantiles never claim more than the buckets and the clock allow (issue 25, item 6)."""

from __future__ import annotations

from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.metrics import histogram_quantile, quantile_bucket
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline

BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 400)


def _expo(run: int, queue: int, counts: dict[float, int]) -> str:
    lines = [f'sglang:num_running_reqs{{model_name="m"}} {run}', f'sglang:num_queue_reqs{{model_name="m"}} {queue}']
    cum = 0
    for b in BOUNDS:
        cum += counts.get(b, 0)
        lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="{float(b)}",model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_count{{model_name="m"}} {cum}')
    lines.append(f'sglang:time_to_first_token_seconds_sum{{model_name="m"}} {cum * 50}')
    return "\n".join(lines) + "\n"


def test_quantile_bucket_and_the_clock() -> None:
    b = [(100.0, 10.0), (200.0, 100.0), (float("inf"), 100.0)]
    assert quantile_bucket(0.95, b) == (100.0, 200.0, 100.0 + 100.0 * (95 - 10) / 90)
    assert histogram_quantile(0.95, b) > 190  # the plain interpolation
    assert histogram_quantile(0.95, b, at_most=141.0) == 100.0  # no TTFT can be longer than 141 s: "> 100 s"
    assert histogram_quantile(0.95, b, at_most=500.0) > 190


def test_a_scraped_p95_past_the_elapsed_time_reads_as_the_bucket_floor() -> None:
    """The issue's case: p95 interpolated to 176 s in the 100-200 s bucket 141 s after the server was idle."""
    tl = Timeline(target="t")
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    t0 = 1_790_000_000.0
    mt.ingest_text(_expo(0, 0, {}), t0, tl)  # idle: nothing running or waiting
    mt.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl)
    mt.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl)
    s = tl.get("ttft_seconds_p95")
    assert s is not None and float(s.values[-1]) == 100.0
    assert "> 100 s" in s.sources[-1] and "141 s passed" in s.sources[-1]
    # with no idle moment seen, the clock gives no bound and the interpolation stands
    tl2 = Timeline(target="t")
    mt2 = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    mt2.ingest_text(_expo(8, 40, {50: 10}), t0 + 60, tl2)
    mt2.ingest_text(_expo(8, 40, {50: 10, 200: 90}), t0 + 141, tl2)
    s2 = tl2.get("ttft_seconds_p95")
    assert s2 is not None and float(s2.values[-1]) > 150
