"""Decode throughput vs batch size: fitted from the window where the batch varied, else a stated fallback.

Each ``Decode batch`` line (or scrape) gives the running batch B and gen throughput X; the decode step
time is ``t = B / X`` (reference §3.3: the throughput covers the last 40 steps, prefill time included).
We fit ``t(B) = a + b·B`` by weighted least squares (numpy) on each batch size's median step time. Projected throughput at another batch is
``B' / t(B')``. Where the batch did not vary enough, the fallback keeps the step time constant (throughput
proportional to the batch), an upper bound marked low-confidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diagnoser.timeline import Timeline

MIN_POINTS = 6
MIN_SPREAD = 1.12  # max batch / min batch needed to fit a slope


def median(values: Iterable[float]) -> float:
    """``statistics.median`` (same algorithm, same result; tested against it): importing ``statistics``
    pulls in fractions, decimal and random, ~5 ms of ``diagnose --once`` start-up (bench/bench_startup.py)."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        raise ValueError("no median for empty data")
    i = n // 2
    return data[i] if n % 2 == 1 else (data[i - 1] + data[i]) / 2


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    a: float  # seconds per step at batch 0
    b: float  # seconds per step per extra request
    n: int
    batch_min: float
    batch_max: float
    batch_mean: float
    tps_mean: float
    r2: float | None
    method: str  # "fit" | "constant-step" | "none"
    note: str

    def step_time(self, batch: float) -> float:
        return self.a + self.b * batch

    def tps(self, batch: float) -> float:
        t = self.step_time(batch)
        return batch / t if t > 0 else 0.0

    def confidence(self, batch: float) -> str:
        if self.method != "fit":
            return "low"
        lo, hi = 0.67 * self.batch_min, 1.5 * self.batch_max
        if not lo <= batch <= hi:
            return "low"
        return "high" if (self.r2 or 0) >= 0.8 and self.batch_min <= batch <= self.batch_max else "medium"

    def describe(self) -> str:
        if self.method == "fit":
            return (f"decode step time fitted as {self.a * 1000:.1f} ms + {self.b * 1000:.3f} ms × batch from {self.n} points "
                    f"with batch {self.batch_min:.0f}–{self.batch_max:.0f} (R² {self.r2:.2f})")
        return self.note


def fit(running: list[float], tps: list[float]) -> ThroughputModel | None:
    """Fit step time vs batch; None when there is no decode point with a batch and a throughput.

    Points are grouped by batch size and each group's median step time is fitted, weighted by the group's
    size: a log line's throughput covers 40 steps whose batch may have moved, and idle gaps make outliers.
    """
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
        import numpy as np

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


def single_point(running: float, tps: float) -> ThroughputModel:
    """Plan mode with one observation (--gen-throughput X --running R): constant step time, low confidence."""
    note = (f"one observation ({tps:.0f} tok/s at {running:.0f} running): the step time is held constant, "
            "so throughput scales with the batch — an upper bound")
    return ThroughputModel(running / tps, 0.0, 1, running, running, running, tps, None, "constant-step", note)


def decode_points(tl: Timeline, rank: str = "") -> tuple[list[float], list[float]]:
    """(batch, throughput) pairs read at the same moment from the same line or scrape."""
    run = tl.get("running_reqs", rank)
    gen = tl.get("gen_throughput_tps", rank)
    if run is None or gen is None:
        return [], []
    rv = run.values.tolist()
    by_src = {s: v for s, v in zip(run.sources.tolist(), rv, strict=True) if ":" in s and "@" not in s}
    by_ts = dict(zip(run.ts.tolist(), rv, strict=True))
    bs: list[float] = []
    xs: list[float] = []
    for t, x, s in zip(gen.ts.tolist(), gen.values.tolist(), gen.sources.tolist(), strict=True):
        b = by_src.get(s)
        if b is None:
            b = by_ts.get(t)
        if b is None or x != x or b != b:
            continue
        bs.append(b)
        xs.append(x)
    return bs, xs


def from_timeline(tl: Timeline) -> ThroughputModel | None:
    bs, xs = decode_points(tl)
    return fit(bs, xs)
