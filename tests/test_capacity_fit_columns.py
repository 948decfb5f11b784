"""``throughput.fit`` groups its points with numpy; the list version it replaced is kept here as the
reference. Both give the same model to the bit on every real window and on random inputs (ties, one
point per group, even and odd groups, batches at .5, zeros and NaNs)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from diagnoser.capacity.throughput import MIN_POINTS, MIN_SPREAD, ThroughputModel, decode_points, fit, median
from tests.test_capacity_joins import _windows


def _ref_fit(running: list[float], tps: list[float]) -> ThroughputModel | None:
    pts = [(b, x) for b, x in zip(running, tps, strict=False) if b > 0 and x > 0]
    if not pts:
        return None
    bs = [p[0] for p in pts]
    xs = [p[1] for p in pts]
    n = len(pts)
    bmin, bmax, bmean = min(bs), max(bs), sum(bs) / n
    tmean = sum(xs) / n
    groups: dict[float, list[float]] = {}
    for b, x in pts:
        groups.setdefault(round(b), []).append(b / x)
    if n >= MIN_POINTS and bmax / bmin >= MIN_SPREAD and len(groups) >= 3:
        gb = np.array(sorted(groups), dtype=float)
        gy = np.array([median(groups[k]) for k in sorted(groups)])
        w = np.sqrt(np.array([len(groups[k]) for k in sorted(groups)], dtype=float))
        A = np.column_stack([np.ones(len(gb)), gb])
        coef, *_ = np.linalg.lstsq(A * w[:, None], gy * w, rcond=None)
        a, b = float(coef[0]), float(coef[1])
        pred = A @ coef
        wm = float((gy * w**2).sum() / (w**2).sum())
        ss_res = float((w**2 * (gy - pred) ** 2).sum())
        ss_tot = float((w**2 * (gy - wm) ** 2).sum())
        r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 0.0
        if b >= 0 and a > 0:
            return ThroughputModel(a, b, n, bmin, bmax, bmean, tmean, r2, "fit", "")
        note = "the fitted step time fell with batch size (noise), so the step time is held constant — low confidence"
    else:
        note = (f"the batch did not vary enough to fit (batch {bmin:.0f}–{bmax:.0f}, {n} points): "
                "the step time is held constant, so throughput scales with the batch — an upper bound, low confidence")
    step = median(b / x for b, x in pts)
    return ThroughputModel(step, 0.0, n, bmin, bmax, bmean, tmean, None, "constant-step", note)


def test_fit_matches_the_list_version_on_real_windows(data_dir: Path) -> None:
    fitted = 0
    for tl in _windows(data_dir):
        for rank in ["", *tl.ranks("running_reqs")]:
            pts = decode_points(tl, rank)
            got, want = fit(*pts), _ref_fit(*pts)
            assert got == want, (tl.target, rank)
            fitted += got is not None and got.method == "fit"
    assert fitted >= 3


def test_fit_matches_the_list_version_on_random_points() -> None:
    rnd = random.Random(19)
    methods = set()
    for trial in range(400):
        n = rnd.choice([0, 1, 2, 5, 6, 7, 30, 500])
        spread = rnd.choice([1.0, 1.1, 3.0, 200.0])
        bs = [rnd.choice([rnd.uniform(1, spread), float(rnd.randint(1, int(spread) + 1)), rnd.randint(1, 8) + 0.5, 0.0]) for _ in range(n)]
        xs = [rnd.choice([rnd.uniform(10, 5000), 0.0, float("nan"), 100.0]) for _ in range(n)]
        got, want = fit(bs, xs), _ref_fit(bs, xs)
        assert got == want, (trial, bs, xs)
        if got is not None:
            methods.add((got.method, bool(got.note)))
    assert methods >= {("fit", False), ("constant-step", True)}
