"""Histogram quantiles computed here from one answer of bucket rates, as Prometheus computes them.

The plan's quantile queries are ``histogram_quantile(q, sum by (le, job, instance, model_name, name)
(rate(NAME_bucket[w])))``, one per quantile: Prometheus evaluates the rates and the ``sum by`` again for
each (at 10,000 targets the two TTFT queries cost it 9.4 s of CPU, 4.3-4.9 s each; the bare ``rate`` it
shares, 2.8 s; bench/README.md). Here the bare ``rate(NAME_bucket[w])`` is asked once per histogram (same
range and step) and the ``sum by`` and ``histogram_quantile`` of every quantile are done on its answer,
with the same float operations in the same order, so each point is the float Prometheus would send:

- ``sum by``: the rates of one (group, ``le``, step) added in the answer's order (the first value, then
  ``+=``: Prometheus' aggregation; its series order is the answer's, both sorted by labels);
- ``histogram_quantile`` (Prometheus 2.42 ``promql/quantile.go`` ``bucketQuantile``): the buckets sorted
  by bound, ``NaN`` without a ``+Inf`` bucket, fewer than two buckets or no observation; counts made
  monotonic (a running maximum); ``rank = q * observations``; the first bucket whose count reaches the rank
  (searched among all but the last); the last finite bound when that is the ``+Inf`` bucket; the first
  bound when that bucket is the first and its bound is not positive; else
  ``start + (end - start) * (rank / count)`` within the bucket.

Points exist where the group has a rate at that step, as Prometheus answers them (``NaN`` included). The
result rows have the labels Prometheus' answer has (the non-empty ``job``, ``instance``, ``model_name``,
``name``), so they go through the same ingestion. Anything not plain — a ``le`` that is not a decimal
number or ``+Inf`` as Go's ``ParseFloat`` reads it, two bounds of one group equal as floats, a rate that
is not finite, a result that is not ``{"metric": {…}, "values": […]}`` — makes :func:`quantile_rows`
return None, and the pass asks Prometheus for the quantiles itself (tests/test_fleet_local_quantiles.py
holds both to the real Prometheus' answers).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import itemgetter, ne
from typing import Any

import numpy as np

_metric = itemgetter("metric")
_values_of = itemgetter("values")

MAX_CELLS = 20_000_000  # groups x bounds x steps held at once (160 MB of float64); past it Prometheus computes them
GROUP_LABELS = ("job", "instance", "model_name", "name")  # the plan's ``sum by`` less ``le`` (queries.HIST_GROUP)
# what Go's strconv.ParseFloat reads as a decimal number (no hex, no underscores), and the infinities
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INF = re.compile(r"[+-]?(?:inf|infinity)", re.I)


def parse_le(text: Any) -> float | None:
    """A bucket bound as Prometheus reads it, or None where this module declines (NaN, out of range, any
    syntax beyond plain decimals and infinities)."""
    if not isinstance(text, str):
        return None
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if not _DECIMAL.fullmatch(text):
        return None
    x = float(text)
    if math.isinf(x) or (x == 0.0 and re.search(r"[1-9]", text.split("e")[0].split("E")[0])):
        return None  # ParseFloat's range error (Prometheus skips such a bucket): not handled here
    return x


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus 2.42 ``bucketQuantile`` on (bound, count) pairs of distinct bounds (the scalar reference)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    b = sorted(buckets)
    if not b or not math.isinf(b[-1][0]) or b[-1][0] < 0:
        return math.nan
    counts = [c for _ub, c in b]
    top = -math.inf
    for i, c in enumerate(counts):  # ensureMonotonic
        if c > top:
            top = c
        elif c < top:
            counts[i] = top
    if len(b) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    k = next((i for i in range(len(b) - 1) if counts[i] >= rank), len(b) - 1)
    if k == len(b) - 1:
        return b[-2][0]
    if k == 0 and b[0][0] <= 0:
        return b[0][0]
    start, end, count = 0.0, b[k][0], counts[k]
    if k > 0:
        start = b[k - 1][0]
        count -= counts[k - 1]
        rank -= counts[k - 1]
    return start + (end - start) * _div(rank, count)


def _div(a: float, b: float) -> float:
    """``a / b`` as Go (IEEE 754) divides: ±Inf or NaN where Python raises (q = 0 in an empty first bucket)."""
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _quantiles_dense(q: float, bounds: np.ndarray, c: np.ndarray) -> np.ndarray:
    """:func:`bucket_quantile` for every row of ``c`` (rows: group-steps; columns: the sorted, distinct
    ``bounds``, the last ``+Inf``), the same operations elementwise."""
    n, nb = c.shape
    out = np.full(n, np.nan)
    if q < 0 or q > 1:  # (before any bucket is looked at, as in bucketQuantile)
        return np.full(n, -np.inf if q < 0 else np.inf)
    if nb < 2 or not (math.isinf(bounds[-1]) and bounds[-1] > 0) or math.isnan(q):
        return out
    c = np.maximum.accumulate(c, axis=1)  # ensureMonotonic
    obs = c[:, -1]
    rank = q * obs
    reach = c[:, : nb - 1] >= rank[:, None]
    k = np.where(reach.any(axis=1), reach.argmax(axis=1), nb - 1)
    rows = np.arange(n)
    last = k == nb - 1
    first_nonpos = (k == 0) & (bounds[0] <= 0)
    inner = ~last & ~first_nonpos
    kk = np.minimum(k, nb - 2)
    prev = np.maximum(kk - 1, 0)
    has_prev = kk > 0
    start = np.where(has_prev, bounds[prev], 0.0)
    end = bounds[kk]
    count = np.where(has_prev, c[rows, kk] - c[rows, prev], c[rows, kk])
    r = np.where(has_prev, rank - c[rows, prev], rank)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = start + (end - start) * (r / count)
    out = np.where(inner, val, out)
    out = np.where(last, bounds[nb - 2], out)
    out = np.where(first_nonpos & ~last, bounds[0], out)
    out[obs == 0] = np.nan
    return out


_group_key = itemgetter(*GROUP_LABELS[:3])
_le = itemgetter("le")


def _plain(result: list[Any]) -> tuple[list[dict[str, str]], list[Any], list[str], dict[str, float | None]] | None:
    """A bucket-rate answer's label sets, values, each series' ``le`` and each ``le``'s bound, when the
    answer is plain (dicts with a metric of string labels and values, every ``le`` a bound); else None."""
    if set(map(type, result)) != {dict}:
        return None
    try:
        metrics = list(map(_metric, result))
        series_vals = list(map(_values_of, result))
    except KeyError:
        return None
    if set(map(type, metrics)) != {dict} or not set(map(type, chain.from_iterable(map(dict.values, metrics)))) <= {str}:
        return None
    try:
        les_text: list[Any] = list(map(_le, metrics))
    except KeyError:
        les_text = list(map(dict.get, metrics, repeat("le")))
    bound_of: dict[str, float | None] = {}
    for le in set(les_text):
        if type(le) is not str:
            return None
        bound_of[le] = parse_le(le)
        if bound_of[le] is None:
            return None
    return metrics, series_vals, les_text, bound_of


def quantile_rows(result: list[Any], qs: tuple[float, ...]) -> dict[float, list[dict[str, Any]]] | None:
    """``{q: rows}``: the rows Prometheus answers for ``histogram_quantile(q, sum by (le, job, instance,
    model_name, name) (X))`` given ``result``, its answer for ``X`` (a matrix), for each ``q``; each row
    ``{"metric": {…}, "values": [[t, float], …]}``. None when the answer is not plain (see the module)."""
    if not result:
        return {q: [] for q in qs}
    plain = _plain(result)
    if plain is None:
        return None
    metrics, series_vals, les_text, bound_of = plain
    groups: dict[tuple[str, ...], int] = {}
    g_idx = [groups.setdefault(k, len(groups)) for k in
             [(m.get("job", ""), m.get("instance", ""), m.get("model_name", ""), m.get("name", "")) for m in metrics]]
    les = [bound_of[le] for le in les_text]
    if not groups:
        return {q: [] for q in qs}
    summed = _sum_answer(g_idx, les, len(groups), series_vals, bound_of, qs)
    if summed is None:
        return None
    all_ts, gs, ss, per_q = summed
    keys = list(groups)
    out: dict[float, list[dict[str, Any]]] = {}
    starts = np.searchsorted(gs, np.arange(len(groups) + 1))
    tsl = all_ts.tolist()
    ssl = ss.tolist()
    for q in qs:
        rows: list[dict[str, Any]] = []
        vl = per_q[q].tolist()
        for g in range(len(groups)):
            a, b = int(starts[g]), int(starts[g + 1])
            if a == b:
                continue
            metric = {k: v for k, v in zip(GROUP_LABELS, keys[g], strict=True) if v}
            rows.append({"metric": metric, "values": [[tsl[ssl[j]], vl[j]] for j in range(a, b)]})
        out[q] = rows
    return out


@dataclass(slots=True)
class Columns:
    """One quantile's answer as :func:`quantile_columns` gives it: the label set of each group that has a
    point (in :func:`quantile_rows`' order) and their points as flat columns (``ts``, ``vs``; group ``i``'s
    end at ``ends[i]``, as :func:`diagnoser.fleet.source._values_flat` gives an answer's)."""

    metrics: list[dict[str, str]]
    ts: np.ndarray
    vs: np.ndarray
    ends: np.ndarray

    def rows(self) -> list[dict[str, Any]]:
        """The same as :func:`quantile_rows`' rows."""
        out, a = [], 0
        for m, b in zip(self.metrics, self.ends.tolist(), strict=True):
            out.append({"metric": m, "values": [list(p) for p in zip(self.ts[a:b].tolist(), self.vs[a:b].tolist(), strict=True)]})
            a = b
        return out


def quantile_columns(result: list[Any], qs: tuple[float, ...]) -> dict[float, Columns] | None:
    """:func:`quantile_rows` as flat columns: the same groups, times and floats, without a Python list per
    point (tests/test_fleet_speed.py holds the two equal); the labels read a column at a time."""
    if not result:
        return {q: Columns([], np.zeros(0), np.zeros(0), np.zeros(0, np.int64)) for q in qs}
    plain = _plain(result)
    if plain is None:
        return None
    metrics, series_vals, les_text, bound_of = plain
    try:  # (job, instance, model_name): in every label set, and `name` in none (the usual case)
        keys: list[tuple[str, ...]] = list(map(_group_key, metrics))
        if any(map(dict.__contains__, metrics, repeat("name"))):
            raise KeyError
    except KeyError:  # (job, instance, model_name, name), "" for a missing one
        keys = list(zip(*(map(dict.get, metrics, repeat(k), repeat("")) for k in GROUP_LABELS), strict=True))
    # each group's index, in order of appearance: the series of one group are next to each other in an
    # answer (sorted by labels), so only the first of each run is looked up
    new_run = list(map(ne, keys[1:], keys[:-1]))
    heads = [keys[0], *compress(keys[1:], new_run)]
    if len(set(heads)) == len(heads):
        groups = dict(zip(heads, range(len(heads)), strict=True))
        g_idx: Any = np.cumsum([0, *new_run])
    else:
        groups = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        g_idx = list(map(groups.__getitem__, keys))
    les = list(map(bound_of.__getitem__, les_text))
    summed = _sum_answer(g_idx, les, len(groups), series_vals, bound_of, qs)
    if summed is None:
        return None
    all_ts, gs, ss, per_q = summed
    starts = np.searchsorted(gs, np.arange(len(groups) + 1))
    counts = np.diff(starts)
    keys_l = list(groups)
    if len(keys_l[0]) == 3 and all(map(all, keys_l)):  # (job, instance, model_name), none empty: every label kept
        metrics_out = list(map(dict, map(zip, repeat(GROUP_LABELS[:3]), map(keys_l.__getitem__, np.flatnonzero(counts).tolist()))))
    else:
        metrics_out = [{k: v for k, v in zip(GROUP_LABELS, keys_l[g], strict=False) if v} for g in np.flatnonzero(counts).tolist()]
    ends = np.cumsum(counts[counts > 0], dtype=np.int64)
    ts = all_ts[ss]
    return {q: Columns(metrics_out, ts, per_q[q], ends) for q in qs}


def _sum_answer(g_idx: Any, les: list[Any], n_g: int, series_vals: list[Any], bound_of: dict[str, float | None],
                qs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[float, np.ndarray]] | None:
    """:func:`_sum_by_group` of an answer's ``values`` lists, converted as every answer is; None when two
    spellings name one bound or a value is not plain."""
    if len(set(bound_of.values())) != len(bound_of):
        return None  # two spellings of one bound ("1", "1.0"): Prometheus would coalesce them
    from diagnoser.fleet.source import _values_flat  # (the same conversion as every answer)

    got = _values_flat(series_vals)
    return None if got is None else _sum_by_group(g_idx, les, n_g, got, qs)


def _sum_by_group(g_idx: list[int], les: list[float], n_g: int, got: tuple[np.ndarray, np.ndarray, np.ndarray],
                  qs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[float, np.ndarray]] | None:
    """The ``sum by`` and ``histogram_quantile`` of :func:`quantile_rows` once each series' group and bound
    are known: (every time, the (group, time) of each point in order, its quantile for each ``q``)."""
    ts, vals, ends = got
    all_ts = np.unique(ts)
    bounds = np.array(sorted(set(les)))
    n_b, n_s = len(bounds), len(all_ts)
    if n_g * n_b * n_s > MAX_CELLS:
        return None
    gi = np.array(g_idx, dtype=np.int64)
    bi = np.searchsorted(bounds, np.array(les))
    _u, per_pair = np.unique(gi * n_b + bi, return_counts=True)
    if len(per_pair) and int(per_pair.max()) > 2:
        return None  # three or more series to add: their order would matter (two add alike either way)
    which = np.repeat(np.arange(len(ends)), np.diff(ends, prepend=0))
    at = (gi[which], bi[which], np.searchsorted(all_ts, ts))
    total = np.zeros((n_g, n_b, n_s))
    have = np.zeros((n_g, n_b, n_s), dtype=bool)
    if int(per_pair.max()) > 1:
        np.add.at(total, at, vals)  # 0 + a + b: a + b
    else:
        total[at] = vals
    have[at] = True
    present = have.any(axis=1)  # (group, step): Prometheus has a point there
    full = have.all(axis=1)
    gs, ss = np.nonzero(present)
    dense = full[gs, ss]
    counts = total[gs[dense], :, ss[dense]] if dense.any() else None  # (the same buckets for every q)
    out: dict[float, np.ndarray] = {}
    for q in qs:
        vals_q = np.full(len(gs), np.nan)
        if counts is not None:
            vals_q[dense] = _quantiles_dense(q, bounds, counts)
        for j in np.nonzero(~dense)[0].tolist():
            g, s = int(gs[j]), int(ss[j])
            bk = [(float(bounds[b]), float(total[g, b, s])) for b in range(n_b) if have[g, b, s]]
            vals_q[j] = bucket_quantile(q, bk)
        out[q] = vals_q
    return all_ts, gs, ss, out
