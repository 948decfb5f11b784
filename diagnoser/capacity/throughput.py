"""Decode throughput vs batch size: fitted from the window where the batch varied, else a stated fallback.

Each ``Decode batch`` line (or scrape) gives the running batch B and gen throughput X; the decode step
time is ``t = B / X`` (docs/sglang.md#decode-line: the throughput covers the last 40 steps, prefill time included).
We fit ``t(B) = a + b·B`` by weighted least squares (numpy) on each batch size's median step time. Projected throughput at another batch is
``B' / t(B')``. Where the batch did not vary enough, the fallback keeps the step time constant (throughput
proportional to the batch), an upper bound marked low-confidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from diagnoser.timeline import Series, Timeline

MIN_POINTS = 6
MIN_SPREAD = 1.12  # max batch / min batch needed to fit a slope
MIN_R2 = 0.5  # a fit that explains less of the step-time variation than this gives no throughput number
NO_PROJECTION = "not enough variation in batch size to project gen throughput"


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

    @property
    def projectable(self) -> bool:
        """Whether the model may give a throughput number: a fit whose R² reaches :data:`MIN_R2`."""
        return self.method == "fit" and (self.r2 or 0.0) >= MIN_R2

    def why_not(self) -> str:
        """Why no throughput number is projected (empty when one is)."""
        if self.projectable:
            return ""
        if self.method == "fit":
            return (f"{NO_PROJECTION}: the step-time fit over batch {self.batch_min:.0f}–{self.batch_max:.0f} explains "
                    f"R² {self.r2 or 0.0:.2f} of it (at least {MIN_R2:g} needed)")
        return f"{NO_PROJECTION}: batch {self.batch_min:.0f}–{self.batch_max:.0f} over {self.n} decode readings, no step-time fit"

    def quality(self) -> dict[str, object]:
        """The fit's quality, carried by every projection."""
        return {"method": self.method, "r2": None if self.r2 is None else round(self.r2, 3), "points": self.n,
                "batch_min": self.batch_min, "batch_max": self.batch_max, "min_r2": MIN_R2, "projectable": self.projectable}

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
    n_all = min(len(running), len(tps))
    b_all = np.asarray(running[:n_all], dtype=float)
    x_all = np.asarray(tps[:n_all], dtype=float)
    ok = (b_all > 0) & (x_all > 0)
    bs_np, xs_np = b_all[ok], x_all[ok]
    n = len(bs_np)
    if not n:
        return None
    bs, xs = bs_np.tolist(), xs_np.tolist()
    bmin, bmax, bmean = min(bs), max(bs), sum(bs) / n  # Python's sums, left to right
    tmean = sum(xs) / n
    steps = bs_np / xs_np
    # the points grouped by batch size (rounded half to even, as round() does): sorted by group, then
    # step time, so that each group's median is read at its middle
    keys = np.round(bs_np)
    order = np.lexsort((steps, keys))
    k_sorted, y_sorted = keys[order], steps[order]
    starts = np.flatnonzero(np.concatenate(([True], k_sorted[1:] != k_sorted[:-1])))
    counts = np.diff(np.append(starts, n))
    if n >= MIN_POINTS and bmax / bmin >= MIN_SPREAD and len(starts) >= 3:
        gb = k_sorted[starts]
        mid = starts + counts // 2
        odd = counts % 2 == 1
        gy = np.where(odd, y_sorted[mid], (y_sorted[np.maximum(mid - 1, starts)] + y_sorted[mid]) / 2)
        w = np.sqrt(counts.astype(float))
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
    step = median(steps.tolist())
    return ThroughputModel(step, 0.0, n, bmin, bmax, bmean, tmean, None, "constant-step", note)


def single_point(running: float, tps: float) -> ThroughputModel:
    """Plan mode with one observation (--gen-throughput X --running R): constant step time, low confidence."""
    note = (f"one observation ({tps:.0f} tok/s at {running:.0f} running): the step time is held constant, "
            "so throughput scales with the batch — an upper bound")
    return ThroughputModel(running / tps, 0.0, 1, running, running, running, tps, None, "constant-step", note)


def source_keys(*series: Series) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each series, per point: an int key standing for its source text, without formatting it (equal
    keys, equal texts: the label and the line number), and whether that text names a log line (has a
    ``:`` and no ``@``). A scrape's points (a label with ``@``) get key -1: they are joined by time."""
    ids: dict[str, int] = {}
    out = []
    for s in series:
        labels, lab, line = s.sources.parts()
        if not len(lab):
            out.append((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)))
            continue
        gid = np.array([ids.setdefault(label, len(ids)) for label in labels], dtype=np.int64)
        scrape = np.array(["@" in label for label in labels], dtype=bool)[lab]
        colon = np.array([":" in label for label in labels], dtype=bool)[lab]
        line = line.astype(np.int64)
        key = gid[lab] * (1 << 32) + (line + 1)  # line -1 (a label alone) → 0
        key[scrape] = -1
        out.append((key, ~scrape & ((line >= 0) | colon)))
    return out


def same_points(ts_a: np.ndarray, key_a: np.ndarray, ts_b: np.ndarray, key_b: np.ndarray) -> bool:
    """Whether two series were read at the same points, in the same order (equal times and source keys),
    each (time, key) once: a join of them is then position by position."""
    if len(ts_a) != len(ts_b) or ts_a.tobytes() != ts_b.tobytes() or key_a.tobytes() != key_b.tobytes():
        return False
    if np.isnan(ts_a).any():  # a NaN time matches nothing in the joins by time (as in a dict)
        return False
    order = np.lexsort((key_a, ts_a))
    ts_s, key_s = ts_a[order], key_a[order]
    return not bool(((ts_s[1:] == ts_s[:-1]) & (key_s[1:] == key_s[:-1])).any())


def last_of(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct key (sorted) and the value of its last point: what ``dict(zip(keys, vals))`` keeps."""
    rev = keys[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    return uniq, vals[::-1][first_in_rev]


def lookup(uniq: np.ndarray, vals: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found, value) per wanted key in the sorted ``uniq`` (value NaN where not found)."""
    if not len(uniq):
        return np.zeros(len(want), dtype=bool), np.full(len(want), np.nan)
    pos = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
    found = uniq[pos] == want
    return found, np.where(found, vals[pos], np.nan)


def decode_points(tl: Timeline, rank: str = "") -> tuple[list[float], list[float]]:
    """(batch, throughput) pairs read at the same moment from the same line or scrape: the running count
    of the same log line, else the last one read at the same time (as dicts keyed by source and by time
    would join them; columns here)."""
    run = tl.get("running_reqs", rank)
    gen = tl.get("gen_throughput_tps", rank)
    if run is None or gen is None:
        return [], []
    (kr, named_r), (kg, _) = source_keys(run, gen)
    rvals = run.values
    src_keys, src_vals = last_of(kr[named_r], rvals[named_r])
    found, b = lookup(src_keys, src_vals, kg)  # only named sources are keys there
    if not found.all():
        rts = run.ts
        ok_t = ~np.isnan(rts)  # a NaN time matches nothing (as in a dict)
        ts_keys, ts_vals = last_of(rts[ok_t], rvals[ok_t])
        by_t_found, by_t = lookup(ts_keys, ts_vals, gen.ts)
        miss = ~found
        found = found | by_t_found
        b = np.where(miss, by_t, b)
    x = gen.values
    keep = found & ~np.isnan(x) & ~np.isnan(b)
    return b[keep].tolist(), x[keep].tolist()
