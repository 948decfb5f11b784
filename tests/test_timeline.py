"""Timeline statistics agree with pandas (the library as reference) on real signals, and rank
aggregation follows each signal's rule."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import SIGNALS, Timeline, summarize
from tests.conftest import DATA

RUNS = ["kv-full-retract", "long-queue", "prefill-capped"]


def real_timeline(run: str) -> Timeline:
    t = MetricsTarget("http://127.0.0.1:1", ADAPTER)
    tl = Timeline(target=run)
    for p in sorted((DATA / "sglang-cpu-real" / run / "metrics").glob("metrics_*.prom")):
        assert t.ingest_text(p.read_text(), float(p.stem.rsplit("_", 1)[1]), tl)
    finalize(tl, t.state.version)
    return tl


@pytest.mark.parametrize("run", RUNS)
def test_stats_agree_with_pandas(run: str, data_dir: Path) -> None:
    tl = real_timeline(run)
    df = tl.to_frame()
    assert len(df) == sum(len(s) for s in tl.series.values())
    checked = 0
    for signal, rank in tl.series:
        ours = tl.stats(signal, rank)
        vals = df[(df["signal"] == signal) & (df["rank"] == rank)].sort_values("ts", kind="stable")["value"].dropna()
        assert ours["n"] == len(vals)
        if not len(vals):
            continue
        assert ours["last"] == pytest.approx(vals.iloc[-1])
        assert ours["mean"] == pytest.approx(vals.mean())
        assert ours["min"] == vals.min() and ours["max"] == vals.max()
        assert ours["p50"] == pytest.approx(vals.quantile(0.5))
        assert ours["p95"] == pytest.approx(vals.quantile(0.95))
        checked += 1
    assert checked >= 25


def test_window_and_wide_view(data_dir: Path) -> None:
    tl = real_timeline("kv-full-retract")
    start, end = tl.span()
    assert start is not None and end is not None and end - start == pytest.approx(39.373, abs=0.01)
    half = tl.window(start + 10, start + 20)
    s = half.get("running_reqs")
    assert s is not None and all(start + 10 <= t <= start + 20 for t in s.ts) and len(s) == 5
    assert half.config == tl.config
    wide = tl.wide()
    assert wide["running_reqs"].max() == 7 and wide["queue_reqs"].max() == 35


def test_aggregate_rules_sum_counts_never_ratios() -> None:
    tl = Timeline(target="t")
    for ts, (r0, r1, u0, u1) in enumerate([(10, 30, 0.5, 0.9), (12, 28, 0.6, 0.7)]):
        tl.add("running_reqs", float(ts), r0, "x", "dp0")
        tl.add("running_reqs", float(ts), r1, "x", "dp1")
        tl.add("token_usage", float(ts), u0, "x", "dp0")
        tl.add("token_usage", float(ts), u1, "x", "dp1")
        tl.add("cache_hit_rate", float(ts), u0, "x", "dp0")
        tl.add("cache_hit_rate", float(ts), u1, "x", "dp1")
    tl.add("running_reqs", 0.0, 99, "x", "pp1")  # a later pipeline stage: shown apart, never added
    tl.aggregate_ranks()
    assert tl.get("running_reqs").values.tolist() == [40, 40]
    assert tl.get("token_usage").values.tolist() == [0.9, 0.7]
    assert tl.get("cache_hit_rate").values.tolist() == pytest.approx([0.7, 0.65])
    assert tl.get("running_reqs", "pp1").values.tolist() == [99]
    assert SIGNALS["token_usage"][1] == "max" and SIGNALS["running_reqs"][1] == "sum"


def test_summarize_ignores_nan_and_empty() -> None:
    assert summarize([])["n"] == 0 and summarize([])["last"] is None
    st = summarize([1.0, float("nan"), 3.0])
    assert st["n"] == 2 and st["mean"] == 2.0 and st["last"] == 3.0
    ref = pd.Series([1.0, 3.0])
    assert st["p95"] == pytest.approx(ref.quantile(0.95))
