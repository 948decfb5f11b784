"""The storage of one signal: :class:`Series` (numpy columns of times and values, in time order) and
:class:`Sources` (where each point was read, as label ids and line numbers). See :mod:`diagnoser.timeline`."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

_FLOAT = np.dtype(np.float64)
_MIN_CAP = 16
_I32_MAX = 2**31 - 1


def _capacity(n: int) -> int:
    """Buffer size for n points: an eighth more as room to grow (at least 16), as CPython's lists do."""
    return n + max(_MIN_CAP, n // 8)


def _narrow(line: np.ndarray) -> np.ndarray:
    """Line numbers as int32 when they fit (4 bytes a point saved), else int64."""
    if line.dtype == np.int32:
        return line
    if not len(line) or (int(line.max()) <= _I32_MAX and int(line.min()) >= -1):
        return line.astype(np.int32)
    return line.astype(np.int64)


def _encode(src: str) -> tuple[str, int]:
    """``"server.log:1842"`` → ``("server.log", 1842)``; anything whose text would not come back
    exactly from ``f"{label}:{line}"`` (no suffix, a leading zero, a sign, non-ASCII digits) → ``(src, -1)``."""
    label, sep, num = src.rpartition(":")
    if sep and num.isdecimal() and num.isascii() and (num[0] != "0" or len(num) == 1) and len(num) < 19:
        return label, int(num)
    return src, -1


class Sources(Sequence[str]):
    """The sources of a series' points, read-only: a label table plus, per point, an int32 label id and
    a line number (-1: no ``:N`` suffix; int32, widened to int64 past 2**31). ``"server.log:1842"`` is stored as label
    ``"server.log"`` and line 1842 and formatted only when read, so no str is kept per log point."""

    __slots__ = ("_labels", "_lab", "_line")

    def __init__(self, labels: list[str], lab: np.ndarray, line: np.ndarray) -> None:
        self._labels = labels
        self._lab = lab
        self._line = line

    def __len__(self) -> int:
        return len(self._lab)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sources: ...

    def __getitem__(self, i: int | slice) -> str | Sources:
        if isinstance(i, slice):
            return Sources(self._labels, self._lab[i], self._line[i])
        k = operator.index(i)
        label = self._labels[self._lab[k]]
        n = int(self._line[k])
        return label if n < 0 else f"{label}:{n}"

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def parts(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(label table, label id per point, line number per point or -1): the stored form, read-only,
        for vectorised reads (point i's source is ``f"{labels[lab[i]]}:{line[i]}"``, or the label alone
        where the line is -1). The table may hold labels no point uses."""
        return self._labels, self._lab, self._line

    def tolist(self) -> list[str]:
        labels = self._labels
        return [labels[a] if n < 0 else f"{labels[a]}:{n}" for a, n in zip(self._lab.tolist(), self._line.tolist(), strict=True)]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sources):
            return self.tolist() == other.tolist()
        if isinstance(other, list | tuple):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Sources({self.tolist()!r})"


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)  # (what ``a.flags.writeable = False`` does, without building the flags object)
    return a


class Series:
    """One signal's points in time order: float64 columns ``ts`` and ``values`` and their ``sources``.

    The columns live in numpy buffers with amortised growth: appending in time order writes in place
    past the filled part, so the read-only views handed out earlier (``ts``, ``values``, ``sources``,
    :meth:`slice`) never change under their holders. A point older than the last is appended too and the
    series is sorted before it is next read (in place, or into new buffers when views are out); merges,
    :meth:`thin` and a shrink build new buffers. Only :meth:`blank_sources` writes in place (it blanks the
    source text of old points, which views of those points then show blank too)."""

    __slots__ = ("_t", "_v", "_lab", "_line", "_lo", "_hi", "_labels", "_ids", "_owner", "_views", "_exposed", "_live_labels", "_unsorted")

    def __init__(self, ts: Any = None, values: Any = None, sources: Any = None) -> None:
        t = np.array(ts if ts is not None else (), dtype=_FLOAT)
        v = np.array(values if values is not None else (), dtype=_FLOAT)
        if t.ndim != 1 or v.shape != t.shape:
            raise ValueError(f"a series needs as many values as times (got {v.size} and {t.size})")
        self._labels: list[str] = []
        self._ids: dict[str, int] = {}
        lab, line = self._encode_many(sources if sources is not None else [""] * len(t), len(t))
        self._t, self._v, self._lab, self._line = t, v, lab, line
        self._lo, self._hi = 0, len(t)
        self._owner = True
        self._views: list[Any] | None = None  # [ts, values, sources, memo] (_view)
        self._exposed = False  # views of the current buffers were handed out: never shift them in place
        self._live_labels = 0  # labels in use at the last clean-up of the label table (_gc_labels)
        self._unsorted = False  # an appended point is older than one before it: sorted on the next read

    def __getstate__(self) -> dict[str, Any]:
        """The points and their sources, without the read views and their memo (rebuilt on the next read)."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "_views"}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # pickled before __getstate__: (None, the slots)
            state = state[1]
        for k in self.__slots__:
            if k != "_views":
                setattr(self, k, state[k])
        self._views = None

    # -- reading -------------------------------------------------------------------------------
    def _view(self) -> list[Any]:
        """What reading the current points has built: ``[ts, values, sources, memo]``, each made when first
        read (a fleet target reads the sources of few series). Every write drops it all (``_views = None``)."""
        hit = self._views
        if hit is None:
            if self._unsorted:
                self._settle()
            hit = self._views = [None, None, None, None]
        return hit

    def memo(self) -> dict[str, Any]:
        """Numbers derived from the points' times and values that several readers share (the window's
        summary, :meth:`Timeline.stats`; a counter's rate, :func:`diagnoser.timeline.derived.window_rate`).
        The dict lives with the read views, and every write drops the views (``_views = None``), so a
        cached number never outlives the points it was computed from. Its keys are a fixed set of names
        (bounded). Nothing read from the sources belongs here: :meth:`blank_sources` rewrites those in
        place under the views of slices that share the buffers."""
        v = self._view()
        got = v[3]
        if got is None:
            got = v[3] = {}
        return got  # type: ignore[no-any-return]

    @property
    def ts(self) -> np.ndarray:
        v = self._views or self._view()
        got = v[0]
        if got is None:
            self._exposed = True
            got = v[0] = _readonly(self._t[self._lo:self._hi])
        return got  # type: ignore[no-any-return]

    @property
    def values(self) -> np.ndarray:
        v = self._views or self._view()
        got = v[1]
        if got is None:
            self._exposed = True
            got = v[1] = _readonly(self._v[self._lo:self._hi])
        return got  # type: ignore[no-any-return]

    @property
    def sources(self) -> Sources:
        v = self._views or self._view()
        got = v[2]
        if got is None:
            self._exposed = True
            lo, hi = self._lo, self._hi
            got = v[2] = Sources(self._labels, _readonly(self._lab[lo:hi]), _readonly(self._line[lo:hi]))
        return got  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self._hi - self._lo

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return (np.array_equal(self.ts, other.ts) and np.array_equal(self.values, other.values, equal_nan=True)
                and self.sources == other.sources)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Series(ts={self.ts.tolist()!r}, values={self.values.tolist()!r}, sources={self.sources.tolist()!r})"

    def slice(self, start: float | None, end: float | None) -> Series:
        """The points in ``[start, end]``: a view (no copy) on this series' buffers."""
        n = len(self)
        lo = 0 if start is None else self.search(start, "left")
        hi = n if end is None else self.search(end, "right")
        if lo == 0 and hi == n:
            lo_abs, hi_abs = self._lo, self._hi
        else:
            lo_abs, hi_abs = self._lo + lo, self._lo + max(lo, hi)
        out = Series.__new__(Series)
        out._t, out._v, out._lab, out._line = self._t, self._v, self._lab, self._line
        out._lo, out._hi = lo_abs, hi_abs
        out._labels, out._ids = self._labels, self._ids
        out._owner = False  # writing to it first copies (it must never write into this series' buffers)
        out._views = None
        out._exposed = True
        out._live_labels = self._live_labels
        out._unsorted = False
        self._exposed = True
        return out

    def has_line_numbers(self) -> bool:
        """Whether any point's source carries a line number (``server.log:1842``; a scrape's or a Prometheus
        step's does not), read from the stored column without building the sources view."""
        return bool(np.count_nonzero(self._line[self._lo:self._hi] >= 0))

    def first_ts(self) -> float:
        if self._unsorted:
            self._settle()
        return self._t.item(self._lo)  # type: ignore[no-any-return]

    def last_ts(self) -> float:
        if self._unsorted:
            self._settle()
        return self._t.item(self._hi - 1)  # type: ignore[no-any-return]

    def bounds(self) -> tuple[float, float] | None:
        """(first time, last time), or None when the series is empty: both ends in one call."""
        if self._hi == self._lo:
            return None
        if self._unsorted:
            self._settle()
        t = self._t
        return t.item(self._lo), t.item(self._hi - 1)

    def last_value(self) -> float:
        if self._unsorted:
            self._settle()
        return self._v.item(self._hi - 1)  # type: ignore[no-any-return]

    def search(self, t: float, side: str = "left") -> int:
        """Where ``t`` falls among the times (``numpy.searchsorted``), without building the read views:
        the live loop asks this of every series on every tick, right after new points came in. A time
        before the first point or after the last (the usual case there) is answered without a search."""
        if self._unsorted:
            self._settle()
        lo, hi = self._lo, self._hi
        if hi == lo:
            return 0
        first, last = self._t.item(lo), self._t.item(hi - 1)
        if t < first or (t == first and side == "left"):
            return 0
        if t > last or (t == last and side == "right"):
            return hi - lo
        return int(self._t[lo:hi].searchsorted(t, side))  # type: ignore[call-overload]

    def search_many(self, ts: list[float]) -> list[int]:
        """:meth:`search` (left side) of several times in one numpy call."""
        if self._unsorted:
            self._settle()
        return self._t[self._lo:self._hi].searchsorted(ts).tolist()  # type: ignore[no-any-return]

    def times(self, lo: int, hi: int) -> list[float]:
        """The times of points ``[lo, hi)`` as floats (no read views built)."""
        if self._unsorted:
            self._settle()
        return self._t[self._lo + lo:self._lo + hi].tolist()  # type: ignore[no-any-return]

    def with_values(self, values: Any) -> Series:
        """A series of these times and sources with other ``values`` (as many): the times and sources are
        shared read-only, like a :meth:`slice`'s, and copied on the first write. Many series on one time
        grid (a fleet's range query: one per target) then cost one values column each."""
        v = np.asarray(values, dtype=_FLOAT)
        lo, hi = self._lo, self._hi
        if v.shape != (hi - lo,):
            raise ValueError(f"a series needs as many values as times (got {v.size} and {hi - lo})")
        if self._unsorted:
            self._settle()
            lo, hi = self._lo, self._hi
        out = Series.__new__(Series)
        out._t, out._lab, out._line = self._t, self._lab, self._line
        out._v = np.empty(len(self._t), _FLOAT)
        out._v[lo:hi] = v
        out._lo, out._hi = lo, hi
        out._labels, out._ids = self._labels, self._ids
        out._owner = False  # writing to it first copies (it must never write into the shared buffers)
        out._views = None
        out._exposed = True
        out._live_labels = self._live_labels
        out._unsorted = False
        return out

    def with_rows(self, rows: np.ndarray) -> list[Series]:
        """:meth:`with_values` for each row of ``rows`` (2-D, a row per series, as many columns as points):
        a fleet's range query writes a whole time grid of series at once. Each series gets its own copy of
        its row (a view would keep the whole matrix alive as long as any one of them is: a target that
        leaves a fleet keeps its last timeline in ``serve``)."""
        rows = np.asarray(rows, dtype=_FLOAT)
        lo, hi = self._lo, self._hi
        if rows.ndim != 2 or rows.shape[1] != hi - lo:
            raise ValueError(f"a series needs as many values as times (got rows of {rows.shape[1:]} and {hi - lo})")
        if self._unsorted or lo != 0 or hi != len(self._t):
            return [self.with_values(v) for v in rows]
        t, lab, line, labels, ids, live = self._t, self._lab, self._line, self._labels, self._ids, self._live_labels
        new = Series.__new__
        out = []
        for v in rows:
            s = new(Series)
            s._t, s._v, s._lab, s._line = t, v.copy(), lab, line
            s._lo, s._hi = 0, hi
            s._labels, s._ids = labels, ids
            s._owner = False  # writing to it first copies (it must never write into the shared buffers)
            s._views = None
            s._exposed = True
            s._live_labels = live
            s._unsorted = False
            out.append(s)
        return out

    @classmethod
    def _from_columns(cls, ts: np.ndarray, values: np.ndarray, labels: list[str], lab: np.ndarray, line: np.ndarray) -> Series:
        """A series owning these columns (``lab`` indexes ``labels``)."""
        out = cls()
        out._t, out._v = ts, values
        out._lab, out._line = np.asarray(lab, dtype=np.int32), _narrow(np.asarray(line, dtype=np.int64))
        out._labels = list(labels)
        out._ids = {}
        for i, label in enumerate(out._labels):
            out._ids.setdefault(label, i)
        out._lo, out._hi = 0, len(ts)
        return out

    def finite(self) -> np.ndarray:
        v = self.values
        return v[~np.isnan(v)]

    def last_source(self) -> str:
        return self.source_at(-1) if len(self) else ""

    def source_at(self, i: int) -> str:
        """``sources[i]``, formatted from the stored columns without building the sources view (a finding
        cites one or two points of a series)."""
        n = self._hi - self._lo
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"point {i} of a series of {n}")
        if self._unsorted:
            self._settle()
        k += self._lo
        label = self._labels[self._lab.item(k)]
        line = self._line.item(k)
        return label if line < 0 else f"{label}:{line}"

    def argmax(self) -> int:
        """Index of the first largest value, NaNs skipped; -1 when there is none."""
        return self._arg(np.nanargmax)

    def argmin(self) -> int:
        return self._arg(np.nanargmin)

    def _arg(self, fn: Any) -> int:
        v = self.values
        if not len(v) or np.isnan(v).all():
            return -1
        return int(fn(v))

    # -- writing -------------------------------------------------------------------------------
    def _intern(self, label: str) -> int:
        i = self._ids.get(label)
        if i is None:
            i = self._ids[label] = len(self._labels)
            self._labels.append(label)
        return i

    def _encode_many(self, sources: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(sources) != n:
            raise ValueError(f"a series needs as many sources as times (got {len(sources)} and {n})")
        if isinstance(sources, Sources):
            remap = np.fromiter(map(self._intern, sources._labels), dtype=np.int32, count=len(sources._labels))
            return (remap[sources._lab] if n else np.zeros(0, np.int32)), _narrow(np.array(sources._line))
        ids, labels = self._ids, self._labels
        lab: list[int] = []
        line: list[int] = []
        for src in sources:
            label, sep, num = src.rpartition(":")
            if sep and num.isdecimal() and num.isascii() and (num[0] != "0" or len(num) == 1) and len(num) < 19:
                line.append(int(num))
            else:
                label = src
                line.append(-1)
            i = ids.get(label)
            if i is None:
                i = ids[label] = len(labels)
                labels.append(label)
            lab.append(i)
        return np.array(lab, dtype=np.int32), _narrow(np.array(line, dtype=np.int64))

    def _realloc(self, extra: int, bulk: bool = False) -> None:
        """New buffers holding the filled part with room for ``extra`` more points plus an eighth of the
        total as slack (amortised O(1) appends; a long-lived series holds at most ~1.125x its points).
        Whole columns (``bulk``: a log backfill) get half of the total as slack: every growth copies the
        whole series, and with an eighth a 1 GB backfill spent more time copying than reading."""
        lo, hi = self._lo, self._hi
        n = hi - lo
        cap = _capacity(n + extra) if not bulk else n + extra + max(_MIN_CAP, (n + extra) // 2)
        cols = []
        for old in (self._t, self._v, self._lab, self._line):
            new = np.empty(cap, old.dtype)
            new[:n] = old[lo:hi]
            cols.append(new)
        self._adopt(cols, n)
        self._views = None

    def _gc_labels(self) -> None:
        """Drop the labels no point uses any more (e.g. the scrape sources of points since dropped,
        thinned or blanked) once the table has grown by a quarter since the last clean-up: amortised O(1) per label.
        The label column is rebuilt into a new array, so views handed out earlier keep their labels. Only
        called where no label id is pending (label ids encoded before a write would point at the old table)."""
        if len(self._labels) <= self._live_labels + self._live_labels // 4 + 16:
            return
        lo, hi = self._lo, self._hi
        used, inv = np.unique(self._lab[lo:hi], return_inverse=True)
        labels = [self._labels[i] for i in used.tolist()]
        lab = np.empty(len(self._lab), np.int32)
        lab[lo:hi] = inv
        self._lab, self._labels = lab, labels
        self._ids = {label: i for i, label in enumerate(labels)}
        self._live_labels = len(labels)
        self._views = None

    def _settle(self) -> None:
        """Sort the points appended out of time order: a stable sort by time of the points in arrival
        order is what inserting each after the points at or before its time gives. In place, or into
        new buffers when views of these are out."""
        lo, hi = self._lo, self._hi
        order = np.argsort(self._t[lo:hi], kind="stable")
        if self._exposed or not self._owner:
            n = hi - lo
            cols = []
            for old in (self._t, self._v, self._lab, self._line):
                new = np.empty(_capacity(n), old.dtype)
                new[:n] = old[lo:hi][order]
                cols.append(new)
            self._adopt(cols, n)
        else:
            for col in (self._t, self._v, self._lab, self._line):
                col[lo:hi] = col[lo:hi][order]
        self._unsorted = False
        self._views = None

    def _adopt(self, cols: list[np.ndarray], n: int) -> None:
        """Take new buffers (ts, values, label ids, line numbers) holding ``n`` points from 0: nothing
        handed out views them yet, and the label table becomes this series' own."""
        self._t, self._v, self._lab, self._line = cols
        self._lo, self._hi = 0, n
        if not self._owner:
            self._labels, self._ids = list(self._labels), dict(self._ids)
            self._owner = True
        self._exposed = False

    def _room(self, k: int, bulk: bool = False) -> None:
        if not self._owner or self._hi + k > len(self._t):
            self._realloc(k, bulk)

    def append(self, ts: float, value: float, source: str) -> None:
        hi = self._hi
        t = self._t
        if hi == len(t) or not self._owner:
            self._realloc(1)
            hi, t = self._hi, self._t
        label, sep, num = source.rpartition(":")  # _encode, inlined (the per-point scrape and line path)
        if sep and num.isdecimal() and num.isascii() and (num[0] != "0" or len(num) == 1) and len(num) < 19:
            line = int(num)
        else:
            label, line = source, -1
        if line > _I32_MAX and self._line.dtype != np.int64:
            self._line = self._line.astype(np.int64)  # new buffer: views handed out keep theirs
        i = self._ids.get(label)
        if i is None:
            i = self._intern(label)
        if not self._unsorted and hi > self._lo and ts < t.item(hi - 1):
            # an out-of-order point (multi-source): appended all the same, and the series is sorted
            # (stably, by time) before it is next read, which puts each point after the points at or
            # before its time, as inserting it now would
            self._unsorted = True
        self._hi = hi + 1
        t[hi] = ts
        self._v[hi] = value
        self._lab[hi] = i
        self._line[hi] = line
        self._views = None

    def merge_columns(self, ts: np.ndarray, values: np.ndarray, lab: np.ndarray, line: np.ndarray) -> None:
        """Add columns (label ids from this series' table): written in place when they are in time order
        after the series' last point, else merged (:meth:`_insert`)."""
        k = len(ts)
        if not k:
            return
        if self._unsorted:
            self._settle()
        if line.dtype.itemsize > self._line.dtype.itemsize:
            self._line = self._line.astype(line.dtype)  # line numbers past 2**31: a wider column (new buffer)
        if (self._hi > self._lo and ts[0] < self._t[self._hi - 1]) or (k > 1 and not (ts[1:] >= ts[:-1]).all()):
            self._insert(ts, values, lab, line)
            return
        self._room(k, bulk=True)
        hi = self._hi
        self._t[hi:hi + k] = ts
        self._v[hi:hi + k] = values
        self._lab[hi:hi + k] = lab
        self._line[hi:hi + k] = line
        self._hi = hi + k
        self._views = None

    def _insert(self, ts: np.ndarray, values: np.ndarray, lab: np.ndarray, line: np.ndarray) -> None:
        """Merge points into new buffers, as inserting them one by one after every point at or before
        their time would (a stable sort of the old points followed by the new ones)."""
        lo, hi = self._lo, self._hi
        t = np.concatenate((self._t[lo:hi], ts))
        order = np.argsort(t, kind="stable")
        self._t = t[order]
        self._v = np.concatenate((self._v[lo:hi], values))[order]
        self._lab = np.concatenate((self._lab[lo:hi], lab))[order]
        self._line = np.concatenate((self._line[lo:hi], line))[order]
        self._lo, self._hi = 0, len(t)
        if not self._owner:
            self._labels, self._ids = list(self._labels), dict(self._ids)
            self._owner = True
        self._views = None
        self._exposed = False

    def drop_before(self, i: int) -> None:
        """Drop the first ``i`` points (earlier views keep them); the buffers shrink when mostly dead."""
        if i <= 0:
            return
        if self._unsorted:
            self._settle()
        self._lo = min(self._lo + i, self._hi)
        self._views = None
        n = self._hi - self._lo
        if self._lo > n + _MIN_CAP or 4 * n + _MIN_CAP < len(self._t):
            self._realloc(0)
        self._gc_labels()

    def thin(self, lo: int, hi: int, keep: np.ndarray) -> None:
        """Keep only the points at positions ``keep`` (sorted, within ``[lo, hi)``) of the range
        ``[lo, hi)``, with their sources blanked (new buffers)."""
        if self._unsorted:
            self._settle()
        a, b = self._lo + lo, self._lo + hi
        k = self._lo + np.asarray(keep, dtype=np.intp)
        blank = self._intern("")
        head, mid, tail = a - self._lo, len(k), self._hi - b
        n = head + mid + tail
        cols = []
        for old, fill in ((self._t, None), (self._v, None), (self._lab, blank), (self._line, -1)):
            new = np.empty(_capacity(n), old.dtype)  # with slack: the live loop appends right after
            new[:head] = old[self._lo:a]
            new[head:head + mid] = old[k] if fill is None else fill
            new[head + mid:n] = old[b:self._hi]
            cols.append(new)
        self._adopt(cols, n)
        self._views = None
        self._gc_labels()

    def blank_sources(self, lo: int, hi: int) -> None:
        """Blank the source text of points ``[lo, hi)`` in place (old points no rule cites any more)."""
        if hi <= lo:
            return
        if self._unsorted:
            self._settle()
        if not self._owner:
            self._realloc(0)
        blank = self._intern("")
        self._lab[self._lo + lo:self._lo + hi] = blank
        self._line[self._lo + lo:self._lo + hi] = -1
        self._views = None
        self._gc_labels()
