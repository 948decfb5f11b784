"""Honest quantiles on the ``--prometheus`` path: the direct path's bound, applied to Prometheus' answers.

Prometheus' ``histogram_quantile`` interpolates inside a bucket; a value past the time since the target
was last idle (nothing running or waiting at a step) is more than any request there could have waited.
As on the direct path (``engines/sglang/metrics.py`` ``_bounded``), such a point becomes the lower bound
of the bucket it fell in and its source says so (``… (> 100 s: …)``, :mod:`diagnoser.floor`), so every
output shows ``> 100 s``. The fleet reads no bucket bounds; the TTFT quantiles use SGLang's default TTFT
buckets of the detected release (``metric_names.TTFT_BUCKETS``, overridable from 0.4.7: the source says it
assumed them), the other histograms keep Prometheus' value when it passes the clock (their buckets are not
known here).
"""

from __future__ import annotations

import numpy as np

from diagnoser.engines.sglang.metric_names import TTFT_BUCKETS
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.timeline import Timeline


def default_ttft_bounds(vr: VersionRange | None) -> tuple[float, ...]:
    """The default TTFT bucket bounds of the detected release (the newest list when it is not known)."""
    low = vr.low if vr is not None else None
    for bounds, lo, hi in TTFT_BUCKETS:
        if low is not None and lo <= low and (hi is None or low <= hi):
            return bounds
    return TTFT_BUCKETS[-1][0]


def idle_times(tl: Timeline) -> np.ndarray:
    """Sorted times at which the target had nothing running and nothing waiting."""
    run, queue = tl.get("running_reqs"), tl.get("queue_reqs")
    if run is None or queue is None or not len(run) or not len(queue):
        return np.empty(0)
    q_at = dict(zip(queue.ts.tolist(), queue.values.tolist(), strict=True))
    return np.array(sorted(t for t, v in zip(run.ts.tolist(), run.values.tolist(), strict=True) if v == 0 and q_at.get(t) == 0))


def bound_quantiles(tl: Timeline, vr: VersionRange | None) -> int:
    """Rewrite the TTFT quantile points that pass the clock as their bucket's floor; returns how many."""
    idle = idle_times(tl)
    if not len(idle):
        return 0
    bounds = default_ttft_bounds(vr)
    changed = 0
    for name in [n for (n, rank) in tl.series if n.startswith("ttft_seconds_p") and rank == ""]:
        s = tl.series[(name, "")]
        ts, vals, srcs = s.ts.tolist(), s.values.tolist(), s.sources.tolist()
        out_v, out_s = [], []
        before = changed
        for t, v, src in zip(ts, vals, srcs, strict=True):
            k = int(np.searchsorted(idle, t, "left")) - 1  # the last idle step before this one
            elapsed = t - float(idle[k]) if k >= 0 else None
            lo = max((b for b in bounds if b < v), default=None)
            hi = min((b for b in bounds if b >= v), default=float("inf"))
            if elapsed is not None and v == v and v > elapsed and hi > elapsed and lo is not None:
                v = lo
                src = (f"{src} (> {lo:g} s: in the {lo:g}-{hi:g} s bucket of SGLang's default TTFT buckets, assumed, and only "
                       f"{elapsed:.0f} s passed since the target was last idle)")
                changed += 1
            out_v.append(v)
            out_s.append(src)
        if changed > before:
            del tl.series[(name, "")]
            tl.add_many(name, ts, out_v, out_s)
    return changed


def totals_from_zero(tl: Timeline, signals: set[str] | frozenset[str]) -> int:
    """A labelled counter is exported from its first increment on (prometheus_client creates the child
    then): a total whose series starts after the target's core gauges did was 0 before, so a 0 is put at
    the step before its first point, as the direct path does between scrapes. Returns the series changed."""
    run = tl.get("running_reqs")
    if run is None or not len(run):
        return 0
    steps = run.ts
    changed = 0
    for (name, rank), s in list(tl.series.items()):
        if name not in signals or not len(s):
            continue
        k = int(np.searchsorted(steps, float(s.ts[0]), "left")) - 1
        if k < 0:
            continue
        t0 = float(steps[k])
        ts = [t0, *s.ts.tolist()]
        vals = [0.0, *s.values.tolist()]
        srcs = [f"{s.sources[0]} (not exported yet: 0)", *s.sources.tolist()]
        del tl.series[(name, rank)]
        tl.add_many(name, ts, vals, srcs, rank)
        changed += 1
    return changed
