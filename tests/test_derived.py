"""Signals derived the same way from every input (diagnoser/timeline/derived.py): issue 16's "tokens
per request about 2x too high" and "out tok/s 20x the real rate", on real engine data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from diagnoser.timeline.derived import decode_tokens_per_request, prefill_per_pass, window_rate

RUNS = Path(__file__).parent / "data" / "sglang-cpu-real"
ADAPTER = get_adapter("sglang")


def scrapes(run: Path) -> Timeline:
    tl = Timeline(target="t")
    target = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    for f in sorted((run / "metrics").glob("*.prom")):
        assert target.ingest_text(f.read_text(), float(f.stem.split("_")[-1]), tl)
    tl.aggregate_ranks()
    return tl


def test_tokens_per_request_reads_decode_lines_only() -> None:
    """prefill-capped: 1,515-token prompts chunked by 128. The Decode lines show 24,327 / 16 = 1,520 per
    request; joining the running count of the Prefill lines of the same second (often 0-8) read 8,146."""
    tl = collect_logs(ADAPTER, [str(RUNS / "prefill-capped" / "server.log")]).timelines[0]
    d = decode_tokens_per_request(tl)
    assert d.value is not None and 1450 < d.value < 1600 and "Decode batch lines" in d.how
    assert d.n == 10  # the ten Decode lines of the run


def test_out_tokens_per_second_is_the_window_rate_not_a_mean_of_bursts() -> None:
    """A non-streaming completion adds its whole output to generation_tokens_total at once: a short
    interval holding one reads as a huge rate. The window's rate is the increases over the time they
    cover; tokens decoded come from the realtime counter, which counts them as they are generated."""
    tl = Timeline(target="t")
    # 20 s of scrapes every 2 s, plus one 0.1 s apart right when 40 requests x 256 tokens completed
    pts = [(2.0 * i, 0.0) for i in range(1, 11)] + [(20.1, 40 * 256 / 0.1)]
    for t, rate in pts:
        tl.add("output_tps", t, rate, f"scrape@{t} sglang:generation_tokens_total")
    mean = sum(r for _t, r in pts) / len(pts)
    got = window_rate(tl, "output_tps").value
    assert got == pytest.approx(40 * 256 / (20.1 - 2.0))
    assert mean > 15 * got  # the per-interval mean: the "out tok/s 20x the real rate"
    # the real kv-full-retract scrapes: tokens decoded over the window match what the load generator got back
    real = scrapes(RUNS / "kv-full-retract")
    dec = real.get("decode_tokens")
    done = json.loads((RUNS / "kv-full-retract" / "load_summary.json").read_text())["completion_tokens_total"]
    assert dec is not None and float(dec.values.sum()) == pytest.approx(done, rel=0.01)
    w = window_rate(real, "output_tps")
    assert w.value == pytest.approx(float(dec.values[1:].sum()) / float(dec.ts[-1] - dec.ts[0])) and "realtime" in w.how


def test_prefill_batch_per_forward_pass_from_scrapes() -> None:
    """prefill-capped scrapes: an interval's prefill tokens over its prefill passes is the batch size the
    log prints per line (128, the chunk)."""
    tl = scrapes(RUNS / "prefill-capped")
    per = prefill_per_pass(tl)
    assert per is not None
    busy = per[per == per]
    assert len(busy) >= 10 and all(125 <= v <= 128 for v in busy.tolist())
