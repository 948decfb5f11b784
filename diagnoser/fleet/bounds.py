"""Honest quantiles on the ``--prometheus`` path: the direct path's bound, applied to Prometheus' answers.

Prometheus' ``histogram_quantile`` interpolates inside a bucket; a value past the time since the target
was last idle (nothing running or waiting at a step) is more than any request there could have waited, or
taken between two tokens, or spent in the queue: every latency histogram the fleet queries (TTFT, ITL/TPOT,
e2e, queue time) observes a span that began after that idle step. As on the direct path
(``engines/sglang/metrics.py`` ``_bounded``), such a point becomes the lower bound of the bucket it fell in
and its source says so (``… (> 100 s: …)``, :mod:`diagnoser.floor`), so every output shows ``> 100 s``.
A quantile in the ``+Inf`` bucket, which Prometheus answers with the largest finite bound, is likewise
``> that bound``.

The bucket bounds are read from Prometheus: one ``count by (__name__, le)`` over the histograms' bucket
series (:func:`bucket_query`). A histogram whose bounds all targets share (every ``le`` counted as often)
uses them; one whose targets disagree (``--bucket-*`` overrides on some) gives no bucket, and its points
keep Prometheus' value, except the TTFT quantiles, which then fall back to SGLang's default TTFT buckets of
the detected release (``metric_names.TTFT_BUCKETS``, overridable from 0.4.7: the source says it assumed
them) as before.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from typing import Any

import numpy as np

from diagnoser.engines.sglang.metric_names import HISTOGRAM_QUANTILES, HISTOGRAMS, TTFT_BUCKETS
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
    if _FAST:
        ts = run.ts
        if len(ts) == len(queue) and np.array_equal(ts, queue.ts) and bool((ts[1:] > ts[:-1]).all()):
            return ts[(run.values == 0) & (queue.values == 0)]  # one time grid (a fleet's): the loop's points, in order
    return _idle_times_reference(run, queue)


def _idle_times_reference(run: Any, queue: Any) -> np.ndarray:
    q_at = dict(zip(queue.ts.tolist(), queue.values.tolist(), strict=True))
    return np.array(sorted(t for t, v in zip(run.ts.tolist(), run.values.tolist(), strict=True) if v == 0 and q_at.get(t) == 0))


def bucket_query(matchers: str) -> str:
    """The one query that reads the bucket bounds of every histogram the fleet takes quantiles of."""
    from diagnoser.fleet.queries import name_selector

    return f"count by (__name__, le) ({name_selector(list(HISTOGRAMS), matchers, '_bucket')})"


def shared_bounds(answer: list[dict[str, Any]]) -> dict[str, tuple[float, ...]]:
    """``{histogram base name: finite bucket bounds}`` from :func:`bucket_query`'s answer (a range result),
    for the histograms whose ``le`` values were all counted as often (every target exports the same bounds)."""
    counts: dict[str, dict[float, float]] = {}
    for row in answer or []:
        metric = row.get("metric", {})
        name, le = str(metric.get("__name__", "")), metric.get("le")
        base = re.sub(r"^sglang[:_]", "", name).removesuffix("_bucket")
        try:
            b = float(le)  # type: ignore[arg-type]
            n = max(float(v[1]) for v in row.get("values", [])) if row.get("values") else float(row.get("value", [0, 0])[1])
        except (TypeError, ValueError):
            continue
        if base in HISTOGRAMS and not math.isnan(b):
            counts.setdefault(base, {})[b] = max(n, counts.get(base, {}).get(b, 0.0))
    out = {}
    for base, by_le in counts.items():
        if len(set(by_le.values())) == 1 and math.inf in by_le and len(by_le) >= 2:
            out[base] = tuple(sorted(b for b in by_le if not math.isinf(b)))
    return out


_BASE = re.compile(r"sglang:(\w+)\[")


_FAST = True  # bound_quantiles skips the series none of whose points change (_unchanged)


_STEMS: dict[str, str | None] = {}
_BASES: dict[str, str | None] = {}


def _quantile_stem(name: str) -> str | None:
    """``ttft_seconds_p95`` → ``ttft_seconds`` for a histogram the fleet takes quantiles of, else None."""
    hit = _STEMS.get(name, "")
    if hit == "":
        stem = name.rsplit("_p", 1)[0] if re.fullmatch(r"(.+)_p\d+", name) else None
        hit = stem if stem in HISTOGRAM_QUANTILES else None
        if len(_STEMS) > 4096:
            _STEMS.clear()
        _STEMS[name] = hit
    return hit


def _base_of(src: str) -> str | None:
    """The histogram's base name in a quantile point's source (``… sglang:NAME[…``), memoised."""
    hit = _BASES.get(src, "")
    if hit == "":
        m = _BASE.search(src)
        hit = m.group(1) if m else None
        if len(_BASES) > 4096:
            _BASES.clear()
        _BASES[src] = hit
    return hit


_RISING: dict[tuple[float, ...], bool] = {}


def _increasing(bounds: tuple[float, ...]) -> bool:
    """No bound at or below the one before (memoised: a pass asks it of every target's few bucket lists)."""
    hit = _RISING.get(bounds)
    if hit is None:
        hit = not any(y <= x for x, y in zip(bounds, bounds[1:], strict=False))
        if len(_RISING) > 64:
            _RISING.clear()
        _RISING[bounds] = hit
    return hit


def _unchanged(s: Any, stem: str, vr: VersionRange | None, buckets: dict[str, tuple[float, ...]], idle: np.ndarray) -> bool:
    """True when :func:`bound_quantiles` would change no point of ``s`` (its loop's comparisons, without
    building the new points and sources); False when some point changes or the series is not plain (its points'
    sources name more than one histogram, or unsorted bounds): the loop then decides."""
    # the histograms its points' sources name: one per label in use (a source is a label, or a label and a
    # line number, which adds no "[": the same histogram)
    labels, lab, _line = s.sources.parts()
    bases = {_base_of(labels[i]) for i in set(lab.tolist())}
    if len(bases) != 1:
        return False
    base = next(iter(bases))
    bounds, read = (buckets[base], True) if base is not None and base in buckets else ((), False)
    if not bounds and stem == "ttft_seconds":
        bounds = default_ttft_bounds(vr)
    if not bounds:
        return True
    if not _increasing(bounds):
        return False
    # the loop's comparisons, on plain floats (a quantile series holds a few points: numpy's calls cost more)
    idle_l = idle.tolist()
    top = bounds[-1]
    nb = len(bounds)
    for t, x in zip(s.ts.tolist(), s.values.tolist(), strict=True):
        if x != x:
            continue
        if read and x >= top:
            return False
        i = bisect_left(bounds, x)  # bounds[i - 1] < x <= bounds[i]: the loop's lo and hi
        k = bisect_left(idle_l, t) - 1  # the last idle step before this one
        if i > 0 and k >= 0:
            elapsed = t - idle_l[k]
            if x > elapsed and (bounds[i] if i < nb else math.inf) > elapsed:
                return False
    return True


def quiet_targets(timelines: list[Timeline], rows: dict[str, list[tuple[list[Timeline], list[Any], np.ndarray, np.ndarray]]],
                  versions: dict[int, VersionRange | None], buckets: dict[str, tuple[float, ...]] | None = None) -> set[int]:
    """For :func:`bound_quantiles`, a whole fleet at once: the ids of the ``timelines`` it would leave as they
    are, every quantile series of which was written a time grid at a time (``rows``: signal → (timelines,
    their series, the grid's times, their values a row each), rank "") and passes the test of
    :func:`_unchanged`, done on every row at once (the idle steps from the running and queued requests
    written so on one grid). ``versions``: each timeline's version range (the TTFT buckets assumed when
    none were read). A target not in the set may change (or was not written so): the caller bounds it."""
    out = _still_rows(rows, versions, buckets or {})
    if len(_QUANTILE_KEYS) > 4096:
        _QUANTILE_KEYS.clear()
    return {id(tl) for tl in timelines if out.get(id(tl), 0) == sum(map(_QUANTILE_KEYS.__getitem__, tl.series))}


class _QuantileKeys(dict[tuple[str, str], bool]):
    """(signal, rank) → whether :func:`bound_quantiles` looks at that series (rank "", a quantile's name), memoised."""

    def __missing__(self, key: tuple[str, str]) -> bool:
        hit = self[key] = key[1] == "" and _quantile_stem(key[0]) is not None
        return hit


_QUANTILE_KEYS = _QuantileKeys()


def _still_rows(rows: dict[str, list[tuple[list[Timeline], list[Any], np.ndarray, np.ndarray]]], versions: dict[int, VersionRange | None],
                buckets: dict[str, tuple[float, ...]]) -> dict[int, int]:
    """:func:`quiet_targets`' count: per timeline, its quantile series in ``rows`` no point of which changes."""
    out: dict[int, int] = {}
    where: dict[str, dict[int, tuple[int, int, Any]]] = {}  # running / queued requests: timeline → (grid, row, series)
    for sig in ("running_reqs", "queue_reqs"):
        where[sig] = {id(tl): (e, j, s) for e, (tls, series, _t, _v) in enumerate(rows.get(sig, ())) for j, (tl, s) in enumerate(zip(tls, series, strict=True))}
    for name, entries in rows.items():
        stem = _quantile_stem(name)
        if stem is None:
            continue
        for tls, series, times, vals in entries:
            labels, lab, _line = series[0].sources.parts()  # (one grid: its series share the sources)
            bases = {_base_of(labels[i]) for i in set(lab.tolist())}
            if len(bases) != 1:
                continue
            base = next(iter(bases))
            # the members this can judge, by the grids of their running and queued requests and their buckets
            groups: dict[tuple[Any, ...], list[int]] = {}
            for j, (tl, s) in enumerate(zip(tls, series, strict=True)):
                if tl.series.get((name, "")) is not s:
                    continue  # (since replaced)
                run, queue = where["running_reqs"].get(id(tl)), where["queue_reqs"].get(id(tl))
                if run is None or queue is None or tl.series.get(("running_reqs", "")) is not run[2] or tl.series.get(("queue_reqs", "")) is not queue[2]:
                    continue
                bounds, read = (buckets[base], True) if base is not None and base in buckets else ((), False)
                if not bounds and stem == "ttft_seconds":
                    bounds = default_ttft_bounds(versions.get(id(tl)))
                groups.setdefault((run[0], queue[0], bounds, read), []).append(j)
            for (re_, qe, bounds, read), members in groups.items():
                if not bounds:
                    still = members
                elif not _increasing(bounds):
                    continue
                else:
                    still = _still(members, [where["running_reqs"][id(tls[j])][1] for j in members],
                                   [where["queue_reqs"][id(tls[j])][1] for j in members],
                                   rows["running_reqs"][re_], rows["queue_reqs"][qe], times, vals, bounds, read)
                for j in still:
                    out[id(tls[j])] = out.get(id(tls[j]), 0) + 1
    return out


def _still(members: list[int], run_rows: list[int], queue_rows: list[int], run: tuple[Any, ...], queue: tuple[Any, ...],
           times: np.ndarray, vals: np.ndarray, bounds: tuple[float, ...], read: bool) -> list[int]:
    """The ``members`` (rows of ``vals``, on ``times``) no point of which :func:`_unchanged` would see change,
    their idle steps where the rows ``run_rows`` of ``run`` and ``queue_rows`` of ``queue`` (grids as
    :func:`quiet_targets` takes them) are both 0; none when those two are not on one rising grid."""
    grid = run[2]
    if not np.array_equal(grid, queue[2]) or not bool((grid[1:] > grid[:-1]).all()):
        return []
    x = vals[members]
    idle = (run[3][run_rows] == 0) & (queue[3][queue_rows] == 0)
    last = np.maximum.accumulate(np.where(idle, np.arange(len(grid)), -1), axis=1)  # the last idle step at or before each
    before = np.searchsorted(grid, times, "left") - 1  # the last step before each point's time
    k = np.where(before >= 0, last[:, np.maximum(before, 0)], -1)
    with np.errstate(invalid="ignore"):
        elapsed = times - grid[np.maximum(k, 0)]
        b = np.array(bounds)
        i = np.searchsorted(b, x, "left")  # bisect_left: bounds[i - 1] < x <= bounds[i]
        hi = np.append(b, math.inf)[np.minimum(i, len(b))]
        change = ~np.isnan(x) & (((x >= b[-1]) & read) | ((i > 0) & (k >= 0) & (x > elapsed) & (hi > elapsed)))
    return [j for j, c in zip(members, change.any(axis=1).tolist(), strict=True) if not c]


def bound_quantiles(tl: Timeline, vr: VersionRange | None, buckets: dict[str, tuple[float, ...]] | None = None) -> int:
    """Rewrite the histogram quantile points that pass the clock, or sit in the ``+Inf`` bucket, as their
    bucket's floor; ``buckets`` are the bounds read from Prometheus (:func:`shared_bounds`). Returns how many."""
    idle = idle_times(tl)
    buckets = buckets or {}
    stems = tuple(HISTOGRAM_QUANTILES)
    changed = 0
    for name in [n for (n, rank) in tl.series if rank == "" and (_quantile_stem(n) if _FAST else re.fullmatch(r"(.+)_p\d+", n))]:
        stem = name.rsplit("_p", 1)[0]
        if stem not in stems:
            continue
        s = tl.series[(name, "")]
        if _FAST and _unchanged(s, stem, vr, buckets, idle):
            continue
        ts, vals, srcs = s.ts.tolist(), s.values.tolist(), s.sources.tolist()
        out_v, out_s = [], []
        before = changed
        for t, v, src in zip(ts, vals, srcs, strict=True):
            m = _BASE.search(src)
            bounds, read = (buckets[m.group(1)], True) if m and m.group(1) in buckets else ((), False)
            if not bounds and stem == "ttft_seconds":
                bounds = default_ttft_bounds(vr)
            k = int(np.searchsorted(idle, t, "left")) - 1 if len(idle) else -1  # the last idle step before this one
            elapsed = t - float(idle[k]) if k >= 0 else None
            if bounds and v == v:
                lo = max((b for b in bounds if b < v), default=None)
                hi = min((b for b in bounds if b >= v), default=float("inf"))
                what = "read from Prometheus" if read else "SGLang's default TTFT buckets, assumed"
                if elapsed is not None and v > elapsed and hi > elapsed and lo is not None:
                    v = lo
                    src = (f"{src} (> {lo:g} s: in the {lo:g}-{hi:g} s bucket ({what}), and only "
                           f"{elapsed:.0f} s passed since the target was last idle)")
                    changed += 1
                elif read and v >= bounds[-1]:  # the +Inf bucket: Prometheus answers with the largest finite bound
                    v = bounds[-1]
                    src = f"{src} (> {v:g} s: the last finite bucket, {what})"
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
    changed = 0
    for name, rank in [key for key in tl.series if key[0] in signals]:
        s = tl.series[(name, rank)]
        if not len(s):
            continue
        k = run.search(s.first_ts(), "left") - 1  # (numpy.searchsorted over its times)
        if k < 0:
            continue
        t0 = float(run.ts[k])
        ts = [t0, *s.ts.tolist()]
        vals = [0.0, *s.values.tolist()]
        srcs = [f"{s.sources[0]} (not exported yet: 0)", *s.sources.tolist()]
        del tl.series[(name, rank)]
        tl.add_many(name, ts, vals, srcs, rank)
        changed += 1
    return changed
