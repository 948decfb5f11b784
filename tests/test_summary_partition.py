"""``summarize`` reads its order statistics from a partition of a numpy column instead of a stable sort;
both give the same summary to the bit (and the list path's), on random columns with ties, zeros of both
signs, infinities and NaNs, and on every series of the real windows."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from diagnoser.timeline import quantile, summarize
from tests.test_capacity_joins import _windows


def _sorted_summary(values: np.ndarray) -> dict:  # the previous numpy path, the reference
    arr = values[~np.isnan(values)]
    n = len(arr)
    if not n:
        return summarize([])
    s = np.sort(arr, kind="stable")
    return {"last": float(arr[-1]), "mean": sum(arr.tolist()) / n, "min": float(s[0]), "max": float(s[-1]),
            "p50": float(quantile(s, 0.5)), "p95": float(quantile(s, 0.95)), "n": n}


def _bits(x: object) -> object:
    """A float by its bits (-0.0 is not 0.0, NaN is NaN), anything else as it is."""
    return ("nan" if math.isnan(x) else (x, math.copysign(1, x))) if isinstance(x, float) else x


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(_bits(a[k]) == _bits(b[k]) for k in a)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf in a quantile, both paths
def test_partition_summary_equals_the_sorted_one_on_random_columns() -> None:
    rnd = random.Random(19)
    pools = [[0.0, -0.0, 1.0], [0.0, 1.5, 2.5, 1e300], [-0.0, -1.0, 3.0], [float("inf"), float("-inf"), 2.0, float("nan")],
             [0.25, 0.5, 0.75, 1.0]]
    for trial in range(600):
        n = rnd.choice([64, 65, 100, 257, 1000, 4099])
        if trial % 3 == 0:
            col = [rnd.choice(rnd.choice(pools)) for _ in range(n)]
        elif trial % 3 == 1:
            col = [round(rnd.gauss(0, 3), rnd.choice([0, 1, 2])) for _ in range(n)]
        else:
            col = [rnd.random() for _ in range(n)]
        arr = np.array(col, dtype=np.float64)
        got, want = summarize(arr), _sorted_summary(arr)
        assert _same(got, want), (trial, got, want)
        ref = summarize(col)  # the list path
        if not np.isnan(arr).all():
            assert all(_bits(got[k]) == _bits(ref[k]) for k in ("min", "max", "p50", "p95", "n")), (trial, got, ref)


def test_partition_summary_on_real_series(data_dir: Path) -> None:
    checked = 0
    for tl in _windows(data_dir):
        for s in tl.series.values():
            if len(s) >= 64:
                assert _same(summarize(s.values), _sorted_summary(s.values))
                checked += 1
    assert checked > 50
