"""The columns a rule pass reads, and the joins between them, memoised for the pass in ``ctx.memo``.

A series' own read-only numpy columns are used as they are (nothing is converted); a time column equal
to one already used in the pass is that same array, so signals read from the same log lines or scrapes
join without a search (:func:`aligned`, :func:`pairs`); log points join by line first, as the capacity
model's decode points do (:func:`line_index`). :func:`joint` is the list form, for short series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from diagnoser.capacity.throughput import last_of, lookup, source_keys

if TYPE_CHECKING:
    from diagnoser.rules.base import RuleContext


def joint(ctx: RuleContext, a: str, b: str, rank: str = "") -> list[tuple[float, float, float, str]]:
    """Points where both signals were read at the same moment (same log line, else the same second, or
    the same scrape):
    (ts, value of a, value of b, source of a). Memoised for the pass; callers must not mutate it."""
    key = ("joint", a, b, rank)
    hit = ctx.memo.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    sa, sb = ctx.series(a, rank), ctx.series(b, rank)
    out: list[tuple[float, float, float, str]] = []
    if sa is not None and sb is not None:
        if len(sa) < 64 and len(sb) < 64 and line_index(ctx, a, b, rank) is None:  # scrapes: by time
            bmap = dict(zip(sb.ts.tolist(), sb.values.tolist(), strict=True))
            get = bmap.get
            out = [(t, v, w, src) for t, v, src in zip(sa.ts.tolist(), sa.values.tolist(), sa.sources.tolist(), strict=True)
                   if (w := get(t)) is not None and v == v and w == w]
        else:
            out = _joint_np(ctx, a, b, rank)
    ctx.memo[key] = out
    return out


def arrays(ctx: RuleContext, signal: str, rank: str = "") -> tuple[Any, Any] | None:
    """(ts, values) of a series as numpy arrays, NaNs dropped; memoised for the pass."""
    key = ("arrays", signal, rank)
    hit = ctx.memo.get(key, ctx)  # ctx: not computed yet (None is a result: no such series)
    if hit is ctx:
        if ctx.series(signal, rank) is None:
            hit = None
        else:
            ts, vs = raw_arrays(ctx, signal, rank)
            if _has_nan(ctx, vs):
                ok = ~np.isnan(vs)
                hit = (ts[ok], vs[ok])
            else:
                hit = (ts, vs)
        ctx.memo[key] = hit
    return hit  # type: ignore[no-any-return]


def argmax_source(ctx: RuleContext, signal: str, rank: str = "", at: str = "max") -> str:
    """The source of the series' largest (``at="min"``: smallest) value, the first such point; the
    vectorised :meth:`Series.argmax`/``argmin`` (NaNs skipped; the last point when all are NaN)."""
    s = ctx.series(signal, rank)
    if s is None:
        return ""

    vals = _column(ctx, signal, rank, "values")
    k = _arg_extreme(ctx, vals, at)
    return s.source_at(-1 if k is None else k)


def _arg_extreme(ctx: RuleContext, vals: Any, at: str) -> int | None:
    """numpy's nanargmax/nanargmin (the first extreme, NaNs skipped; None when all are NaN), without
    their copy when there is no NaN; memoised for the pass (several rules cite the same peak)."""
    key = ("arg_extreme", id(vals), at)  # vals is a column array held by the memo for the whole pass
    if key in ctx.memo:
        return ctx.memo[key]  # type: ignore[no-any-return]
    if not _has_nan(ctx, vals):
        if len(vals) < 256:
            k = int(vals.argmax() if at == "max" else vals.argmin()) if len(vals) else None
        else:  # the first point equal to the extreme is argmax/argmin's answer, without the copy they make of a read-only column
            k = int((vals == (np.maximum if at == "max" else np.minimum).reduce(vals)).argmax())
    elif np.isnan(vals).all():
        k = None
    else:
        k = int(np.nanargmax(vals) if at == "max" else np.nanargmin(vals))
    ctx.memo[key] = k
    return k


def raw_arrays(ctx: RuleContext, signal: str, rank: str = "") -> tuple[Any, Any]:
    """(ts, values) of a series as numpy arrays aligned with its sources (NaNs kept); memoised."""
    key = ("raw", signal, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        s = ctx.series(signal, rank)
        if s is None:
            hit = (_column(ctx, signal, rank, "ts"), _column(ctx, signal, rank, "values"))
        else:  # both columns at once, registered for _column too
            memo = ctx.memo
            ts = memo.get(("ts", signal, rank))
            if ts is None:
                ts = memo[("ts", signal, rank)] = _shared_ts(ctx, s.ts)
            vs = memo.get(("values", signal, rank))
            if vs is None:
                vs = memo[("values", signal, rank)] = s.values
            hit = (ts, vs)
        ctx.memo[key] = hit
    return hit  # type: ignore[no-any-return]


def _column(ctx: RuleContext, signal: str, rank: str, name: str) -> Any:
    """One column of a series: the timeline's own read-only numpy column (nothing is converted).

    Series read from the same log lines or scrapes carry equal time columns: a time column equal to
    one already used in this pass is that same array (read-only use), which lets :func:`aligned` join
    them without a search."""
    key = (name, signal, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        s = ctx.series(signal, rank)
        if s is None:
            hit = np.zeros(0)
        elif name == "ts":
            hit = _shared_ts(ctx, s.ts)
        else:
            hit = getattr(s, name)
        ctx.memo[key] = hit
    return hit


def _has_nan(ctx: RuleContext, arr: Any) -> bool:
    """Whether a column array of the pass holds a NaN, checked once per array: its sum is NaN when it
    does (or when it holds both infinities: only then are the values tested one by one)."""
    key = ("has_nan", id(arr))  # the array lives in the memo for the whole pass, so its id is stable
    hit = ctx.memo.get(key)
    if hit is None:
        total = _col_sum(ctx, arr) if len(arr) >= 64 else np.add.reduce(arr)  # (a short column's mean is not taken from it)
        hit = ctx.memo[key] = total != total and bool(np.isnan(arr).any())
    return hit  # type: ignore[no-any-return]


def _col_sum(ctx: RuleContext, arr: Any) -> Any:
    """``numpy.add.reduce`` of an array the memo holds for the pass (the NaN check and the mean share it)."""
    key = ("sum", id(arr))
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = np.add.reduce(arr)
    return hit


def _sorted(ctx: RuleContext, signal: str, rank: str) -> Any:
    """The series' values without NaNs, sorted; once per pass (its summary and its busy summary share it)."""
    key = ("sorted", signal, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        got = arrays(ctx, signal, rank)
        hit = ctx.memo[key] = np.sort(got[1]) if got is not None else np.zeros(0)
    return hit


def _shared_ts(ctx: RuleContext, col: Any) -> Any:
    """A time column, or the equal one (same length, ends and bytes) already used this pass."""
    n = len(col)
    same = ctx.memo.setdefault("ts_cols", {}).setdefault((n, col.item(0), col.item(-1)) if n else (0,), [])
    if same:
        raw = col.tobytes()  # one memcmp of two copies: cheaper than numpy's elementwise array_equal
        for i, (other, other_raw) in enumerate(same):
            if other_raw is None:
                other_raw = other.tobytes()
                same[i] = (other, other_raw)
            if other_raw == raw:
                return other
        same.append((col, raw))
    else:
        same.append((col, None))  # its bytes are taken when an equal-looking column comes
    return col


def aligned(ctx: RuleContext, base: str, other: str, rank: str = "") -> Any:
    """``other``'s value at each point of ``base`` (the last one read at that same time), NaN where none."""
    key = ("aligned", base, other, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = _align(ctx, base, other, rank)
    return hit[0]


def _align(ctx: RuleContext, base: str, other: str, rank: str) -> tuple[Any, bool]:
    """(:func:`aligned`, whether it holds a NaN). A series' times are in order, so the last reading of
    ``other`` at a time is the one just left of where the time would go (``searchsorted`` right - 1). The
    log prints many lines a second, so a long log column has few distinct times: each is searched once
    and the per-point result is one ``repeat``. Columns read at the same moments need no search. Log
    points are joined by line first (:func:`line_index`): within one second, the reading of the same line
    is the one read with it; the time join serves the points no line of ``other`` matches (and scrapes)."""
    ta, _ = raw_arrays(ctx, base, rank)
    tb, vb = raw_arrays(ctx, other, rank)
    if not len(tb) or not len(ta):
        return np.full(len(ta), np.nan), bool(len(ta))
    if ta is tb:  # read at the same moments (see _column)
        order, ends, counts = _time_runs(ctx, tb)
        if order == "increasing":
            return vb, _has_nan(ctx, vb)  # a read-only column of the timeline, shared as the time column is
    idx = line_index(ctx, base, other, rank)
    if idx is not None and len(idx) and int(idx.min()) >= 0:  # every point's partner read on its own line
        got = vb[idx]
        return got, bool(np.isnan(got).any())
    got, has_nan = _align_times(ctx, base, other, rank)
    if idx is not None and int(idx.max()) >= 0:  # the same line's reading where there is one, else the time's
        got = np.where(idx >= 0, vb[np.maximum(idx, 0)], got)
        has_nan = bool(np.isnan(got).any())
    return got, has_nan


def _align_times(ctx: RuleContext, base: str, other: str, rank: str) -> tuple[Any, bool]:
    """The join by time alone: the last reading of ``other`` at each point's time."""
    ta, _ = raw_arrays(ctx, base, rank)
    tb, vb = raw_arrays(ctx, other, rank)
    if ta is tb:  # read at the same moments, some sharing a time (increasing ones were served by _align)
        order, ends, counts = _time_runs(ctx, tb)
        if order == "ordered":  # the last reading of each run of equal times, for every point of the run
            last = vb[ends]
            return last.repeat(counts), bool(np.isnan(last).any())
    if not times_in_order(ctx, tb):  # NaN times (no order): the last reading at each distinct time, as a dict keeps it
        uniq, first_rev = np.unique(tb[::-1], return_index=True)
        uval = vb[len(tb) - 1 - first_rev]
        pos = np.minimum(np.searchsorted(uniq, ta), len(uniq) - 1)
        got = np.where(uniq[pos] == ta, uval[pos], np.nan)
        return got, bool(np.isnan(got).any())
    a_order, a_ends, a_counts = _time_runs(ctx, ta) if len(ta) > 64 else ("", None, None)
    ua = ta[a_ends] if a_order == "ordered" else ta  # search each distinct time of a once
    k = tb.searchsorted(ua, "right")
    k -= 1
    np.maximum(k, 0, out=k)  # a time before b's first: b's first point is later, so no match below
    got = np.where(tb[k] == ua, vb[k], np.nan)
    has_nan = bool(np.isnan(got).any())
    return (got.repeat(a_counts) if a_order == "ordered" else got), has_nan


def line_index(ctx: RuleContext, base: str, other: str, rank: str = "") -> Any:
    """For each point of ``base``, the position in ``other`` of the point read from the same log line
    (same source, same line number), -1 where ``other`` has none there; None when neither series has
    line numbers (scrapes: their points are told apart by time). A log stamps whole seconds, so the last
    reading of ``other`` within a point's second can come from a later line: a decode line's 5 running
    paired with the next prefill line's 33 waiting, where its own line said 35. Memoised for the pass."""
    key = ("line_index", base, other, rank)
    hit = ctx.memo.get(key, ctx)
    if hit is ctx:
        hit = ctx.memo[key] = _line_index(ctx.series(base, rank), ctx.series(other, rank))
    return hit


def _line_index(sa: Any, sb: Any) -> Any:
    """:func:`line_index` by the source keys decode_points joins on (capacity.throughput)."""
    if sa is None or sb is None or not len(sa) or not len(sb):
        return None
    line_a, line_b = sa.sources.parts()[2] >= 0, sb.sources.parts()[2] >= 0
    if not line_a.any() or not line_b.any():  # scrapes, or labels without a line: by time (no Python loop)
        return None
    (ka, named_a), (kb, named_b) = source_keys(sa, sb)
    named_a &= line_a  # a label without a line number is one key for all its points: never a line's partner
    named_b &= line_b
    where_b = np.flatnonzero(named_b)
    uniq, last = last_of(kb[where_b], where_b.astype(np.float64))  # a line's last reading, as a dict keeps it
    found, pos = lookup(uniq, last, ka)
    found &= named_a
    return np.where(found, np.nan_to_num(pos, nan=-1.0), -1.0).astype(np.int64)


def times_in_order(ctx: RuleContext, ts: Any) -> bool:
    """Whether a time column is in order without NaNs (every series is, unless a time is NaN); once per array."""
    hit = ctx.memo.get(("time_runs", id(ts)))
    if hit is not None:
        return hit[0] != "unordered"
    key = ("in_order", id(ts))
    got = ctx.memo.get(key)
    if got is None:
        got = ctx.memo[key] = len(ts) < 2 or bool(np.minimum.reduce(np.subtract(ts[1:], ts[:-1])) >= 0)  # NaN compares False
    return got  # type: ignore[no-any-return]


def _time_runs(ctx: RuleContext, ts: Any) -> tuple[str, Any, Any]:
    """How a time column is ordered, once per array for the pass: ``("increasing", None, None)``;
    ``("ordered", ends, counts)`` with equal times (``ends`` the position of the last point of each run
    of equal times, ``counts`` the length of each run); ``("unordered", None, None)``."""
    key = ("time_runs", id(ts))  # the array lives in the memo for the whole pass, so its id is stable
    hit = ctx.memo.get(key)
    if hit is None:
        # few numpy calls: on the short series of a small window their overhead is most of the cost
        step = np.subtract(ts[1:], ts[:-1]) if len(ts) >= 2 else None
        low = np.minimum.reduce(step) if step is not None else None  # NaN if any step is NaN
        if low is None or low > 0:
            hit = ("increasing", None, None)
        elif low >= 0:
            ends = np.concatenate(((step > 0).nonzero()[0], (len(ts) - 1,)))  # type: ignore[operator]
            counts = ends.copy()
            counts[0] += 1
            counts[1:] -= ends[:-1]
            hit = ("ordered", ends, counts)
        else:
            hit = ("unordered", None, None)
        ctx.memo[key] = hit
    return hit  # type: ignore[no-any-return]


@dataclass(slots=True)
class Pairs:
    """Points where two signals were read at the same moment, as numpy arrays: ``ts``, ``a``, ``b`` and
    ``idx`` (the positions in ``a``'s series, for :meth:`src`; None when every point of ``a`` joined)."""

    ts: Any
    a: Any
    b: Any
    idx: Any
    series: Any  # ``a``'s series (None without it): its sources are read only when a finding cites a point

    @property
    def sources(self) -> Any:
        return self.series.sources if self.series is not None else []

    def __len__(self) -> int:
        return len(self.a)

    def src(self, k: int) -> str:
        return self.sources[int(k) if self.idx is None else int(self.idx[k])]  # type: ignore[no-any-return]


def pairs(ctx: RuleContext, a: str, b: str, rank: str = "") -> Pairs:
    """The vectorised form of :func:`joint` (memoised): use it on series that can be long."""
    key = ("pairs", a, b, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        ta, va = raw_arrays(ctx, a, rank)
        s = ctx.series(a, rank)
        if not len(ta):
            hit = Pairs(ta, va, np.zeros(0), None, s)
        else:
            aligned(ctx, a, b, rank)
            w, w_nan = ctx.memo[("aligned", a, b, rank)]
            if not w_nan and not _has_nan(ctx, va):
                hit = Pairs(ta, va, w, None, s)  # every point joined: the arrays themselves (read-only use)
            else:
                idx = np.nonzero(~np.isnan(va) & ~np.isnan(w))[0]
                hit = Pairs(ta[idx], va[idx], w[idx], idx, s)
        ctx.memo[key] = hit
    return hit  # type: ignore[no-any-return]


def _joint_np(ctx: RuleContext, a: str, b: str, rank: str) -> list[tuple[float, float, float, str]]:
    """The same join with numpy: for each point of ``a`` the last point of ``b`` at the same time."""
    ta, va = raw_arrays(ctx, a, rank)
    w = aligned(ctx, a, b, rank)
    idx = np.nonzero(~np.isnan(va) & ~np.isnan(w))[0]
    srcs = ctx.series(a, rank).sources  # type: ignore[union-attr]
    return list(zip(ta[idx].tolist(), va[idx].tolist(), w[idx].tolist(), [srcs[i] for i in idx.tolist()], strict=True))
