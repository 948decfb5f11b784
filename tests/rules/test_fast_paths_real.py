"""The rule pass's fast paths against their references on the real cpu-real windows
(../shared/data/sglang-cpu-real, every scrape plus the whole log, as ``bench/bench_rules.py`` reads them).

* :func:`aligned` / :func:`pairs` (shared time arrays, joins searched once per distinct time) against a
  plain dict join (the last reading at each time wins), on every pair of the signals the rules join.
"""

from __future__ import annotations

import glob
import math
import os
import re
from itertools import permutations
from typing import Any

import numpy as np
import pytest

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.rules.base import RuleContext, _time_runs, aligned, pairs, raw_arrays
from diagnoser.sources.logs import read_log
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA, need_shared

JOINED = ("running_reqs", "queue_reqs", "token_usage", "used_tokens", "gen_throughput_tps", "prefill_new_tokens",
          "prefill_cached_tokens", "pending_tokens", "cuda_graph", "prompt_tps", "decode_sum_seq_lens")


def _read(path: str) -> Timeline:
    tl = Timeline(target=os.path.basename(path))
    vr = VersionRange()
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    for f in sorted(glob.glob(os.path.join(path, "metrics", "*.prom"))):
        ts = float(re.search(r"_(\d+\.\d+)\.prom$", f).group(1))  # type: ignore[union-attr]
        with open(f) as fh:
            mt.ingest_text(fh.read(), ts, tl)
    vr.merge(mt.state.version)
    reader = read_log(ADAPTER, tl, os.path.join(path, "server.log"))
    vr.merge(reader.parser.version)
    finalize(tl, vr)
    return tl


@pytest.fixture(scope="module")
def windows() -> list[Timeline]:
    need_shared()
    runs = sorted(glob.glob(os.path.join(DATA, "sglang-cpu-real", "*")))
    assert len(runs) == 5, runs
    return [_read(r) for r in runs]


def _ref_aligned(tl: Timeline, base: str, other: str) -> list[float]:
    last: dict[float, float] = {}
    sb = tl.get(other)
    assert sb is not None
    for t, v in zip(sb.ts.tolist(), sb.values.tolist(), strict=True):
        last[t] = v
    sa = tl.get(base)
    assert sa is not None
    return [last.get(t, math.nan) for t in sa.ts.tolist()]


def test_aligned_and_pairs_match_the_dict_join(windows: list[Timeline]) -> None:
    paths: dict[str, int] = {}
    for tl in windows:
        ctx = RuleContext(tl, {}, ADAPTER)
        present = [s for s in JOINED if tl.get(s) is not None]
        for a, b in permutations(present, 2):
            ref = _ref_aligned(tl, a, b)
            ta, va = raw_arrays(ctx, a)
            tb, _ = raw_arrays(ctx, b)
            kind = "same-times" if ta is tb else _time_runs(ctx, ta)[0]
            paths[kind] = paths.get(kind, 0) + 1
            got = aligned(ctx, a, b)
            assert np.array_equal(got, np.array(ref), equal_nan=True), (tl.target, a, b, kind)
            p = pairs(ctx, a, b)
            sa = tl.get(a)
            assert sa is not None
            want: list[Any] = [(t, v, w, src) for t, v, w, src in zip(sa.ts.tolist(), sa.values.tolist(), ref, sa.sources.tolist(), strict=True) if v == v and w == w]
            assert [(float(t), float(x), float(y), p.src(k)) for k, (t, x, y) in enumerate(zip(p.ts, p.a, p.b, strict=True))] == want
        assert ctx.span() == tl.span() and ctx.window_text() == f"{tl.span()[1] - tl.span()[0]:.0f} s"  # type: ignore[operator]
        assert tl.span() == _ref_span(tl)
    # the real windows exercise every path: series read on the same lines, log times repeating within a second
    assert paths.get("same-times", 0) >= 10 and paths.get("ordered", 0) >= 10, paths


def _ref_span(tl: Timeline) -> tuple[float | None, float | None]:
    """Timeline.span compared point by point, the reference for its built-in min/max version."""
    start = end = None
    for s in tl.series.values():
        if len(s):
            first, last = float(s.ts[0]), float(s.ts[-1])
            start = first if start is None else min(start, first)
            end = last if end is None else max(end, last)
    for e in tl.events:
        start = e.ts if start is None else min(start, e.ts)
        end = e.ts if end is None else max(end, e.ts)
    return start, end


def test_np_summary_is_numpy_on_every_real_series(windows: list[Timeline]) -> None:
    """The pass's summary (sum over n, sorted ends, quantiles on the sorted array) against numpy's
    mean/min/max/percentile, to the last bit, on every real series and its busy (> 0) part."""
    from diagnoser.rules.base import _np_summary

    n = 0
    for tl in windows:
        for s in tl.series.values():
            vals = np.fromiter(s.values, dtype=float, count=len(s))
            for arr in (vals, vals[vals > 0]):
                ok = arr[~np.isnan(arr)]
                got = _np_summary(arr)
                if not ok.size:
                    assert got["n"] == 0
                    continue
                want = {"last": float(ok[-1]), "mean": float(ok.mean()), "min": float(ok.min()), "max": float(ok.max()),
                        "p50": float(np.percentile(ok, 50)), "p95": float(np.percentile(ok, 95)), "n": int(ok.size)}
                assert got == want, (tl.target, s.sources[0])
                n += 1
    assert n > 200
    with_zero = np.array([0.0, -0.0, 3.0, math.nan] * 20)  # the sorted ends cannot tell 0.0 from -0.0
    assert math.copysign(1, _np_summary(with_zero)["min"]) == math.copysign(1, float(with_zero[~np.isnan(with_zero)].min()))
