"""Keep a log's timeline to the window a one-shot run judges, while the log is being read.

``diagnose --once --log`` judges the newest part of a log that holds at most :data:`MAX_POINTS` points
(a log with fewer points, such as every real log in tests/data, is judged whole, as before), or the
last ``--last`` seconds when that is given. What is older than the window is dropped from the
timeline chunk by chunk as the bulk reader applies them, so memory is bounded by the window, not by
the file, and the rules, the advice and the report only ever look at the window. The part dropped is
kept as compact aggregates (:class:`Before`): its time range, its points and events counted by signal
and by kind, each signal's min, max and mean. The report states what was judged and what was only
counted.

The window is a time: the points and events at or after :attr:`LogWindow.cut` are kept, exactly those
that :meth:`Timeline.window` with that start would keep from the whole log (``tests/test_log_window.py``
compares both). Config facts and the version (startup lines, hints) describe the server, not a moment,
and are kept whole, as ``--last`` keeps them; so is the access-log summary event (a whole-log count),
unless the last access line came before the window.

With a point budget the cut is placed at a chunk boundary: the kept chunks are the newest ones whose
points add up to at most the budget (at least the newest chunk), and the cut is just after the newest
time read before the first of them (points of that first chunk stamped with the same second as the
chunk before go too). A chunk is about 8 MB of log, so the window holds a little less than the budget,
never more unless the newest chunk alone does. Trimming is amortised: the window is trimmed when it
has grown by a quarter since the last trim (and once at the end), so it briefly holds up to a quarter
more than its bound while the log is read.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnoser.model import iso
from diagnoser.timeline import Timeline

MAX_POINTS = 4_000_000  # about 100 MB of columns; the bench's busy mix logs this in 3 hours
# events that summarise the whole log by nature: kept whatever their time
WHOLE_LOG_EVENTS = frozenset({"access_summary"})


@dataclass(slots=True)
class Before:
    """What was read before the window and dropped: counts and extremes only."""

    start: float | None = None  # time of the oldest point or event dropped
    end: float | None = None  # the window's start (everything dropped is older)
    points: int = 0
    events: Counter[str] = field(default_factory=Counter)
    # (signal, rank) -> [n, min, max, sum] of the values dropped (NaNs not counted)
    signals: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add_values(self, key: tuple[str, str], ts: np.ndarray, values: np.ndarray) -> None:
        self.points += len(values)
        if len(ts):
            t0 = float(ts[0])
            self.start = t0 if self.start is None else min(self.start, t0)
        v = values[~np.isnan(values)]
        if not len(v):
            return
        agg = self.signals.get(key)
        n, lo, hi, total = len(v), float(v.min()), float(v.max()), float(np.add.reduce(v))
        if agg is None:
            self.signals[key] = [n, lo, hi, total]
        else:
            agg[0] += n
            agg[1] = min(agg[1], lo)
            agg[2] = max(agg[2], hi)
            agg[3] += total

    def to_dict(self) -> dict[str, Any]:
        sig: dict[str, dict[str, Any]] = {}
        for (name, rank), (n, lo, hi, total) in sorted(self.signals.items()):
            sig[f"{name}[{rank}]" if rank else name] = {"n": int(n), "min": lo, "max": hi, "mean": total / n, "sum": total}
        return {"start": iso(self.start) if self.start is not None else None, "end": iso(self.end) if self.end is not None else None,
                "seconds": (self.end - self.start) if self.start is not None and self.end is not None else None,
                "points": self.points, "events": dict(sorted(self.events.items())), "signals": sig}


class LogWindow:
    """Trims one timeline to its judged window while a log is read into it.

    Pass :meth:`observe` as the reader's observer (``read_log(..., observer=w.observe)``): it is called
    after each chunk. Call :meth:`finish` once the read is over. ``max_points`` bounds the window by
    size (None: no bound); ``last_s`` bounds it by time (the last ``last_s`` seconds before the newest
    point, as ``--last`` judges them) and then no point budget applies.
    """

    def __init__(self, tl: Timeline, max_points: int | None = MAX_POINTS, last_s: float | None = None) -> None:
        self.tl = tl
        self.max_points = None if last_s is not None else max_points
        self.last_s = last_s
        self.cut = -math.inf  # points and events older than this are dropped
        self.before = Before()
        self._chunks: deque[tuple[int, float]] = deque()  # per chunk: (points it added, newest time after it)
        self._lens = {key: len(s) for key, s in tl.series.items()}  # series lengths after the last call
        self._events = len(tl.events)
        self._held = sum(self._lens.values())  # points in the timeline after the last call
        self._newest = -math.inf  # the newest time the log has given so far
        self._after_trim = 0  # points held after the last trim

    # -- reading -------------------------------------------------------------------------------
    def _count(self) -> int:
        return sum(len(s) for s in self.tl.series.values())

    def _note(self) -> int:
        """Points added since the last call; moves :attr:`_newest` to the newest time they (and the new
        events) have. Series the log did not write to (a scrape merged into the same timeline) do not
        move it."""
        added = 0
        newest = self._newest
        lens = self._lens
        for key, s in self.tl.series.items():
            n = len(s)
            grew = n - lens.get(key, 0)
            if grew:
                lens[key] = n
                added += grew
                last = s.bounds()[1]  # type: ignore[index]
                if last > newest:
                    newest = last
        events = self.tl.events
        for e in events[self._events:] if len(events) > self._events else ():
            if e.ts > newest:
                newest = e.ts
        self._events = len(events)
        self._newest = newest
        self._held += added
        return added

    def observe(self, reader: Any) -> None:
        """After a chunk: note what it added; trim when the window is a quarter over its bound (or, with
        ``last_s``, when the cut has moved)."""
        added = self._note()
        if added or not self._chunks:
            self._chunks.append((added, self._newest))
        else:  # nothing new (events alone, or the reader's last call): the chunk before reaches this far
            self._chunks[-1] = (self._chunks[-1][0], self._newest)
        # trims are amortised: each walks the window, so one comes only after it grew by a quarter
        if self._held <= self._after_trim + self._after_trim // 4 + 1024:
            return
        if self.last_s is not None:
            if self._newest - self.last_s > self.cut:
                self._trim(self._newest - self.last_s)
        elif self.max_points is not None and self._held > self.max_points:
            self._trim_to_budget()

    def finish(self) -> None:
        """After the read and the parser's end-of-log summary: the last trim (to the budget itself).
        A whole-log summary event stamped before the window (the last access line came before it) is
        dropped, so that the window's time span stays the window's: its counts are in the input
        report's own message."""
        if self.max_points is not None and self._held > self.max_points:
            self._trim_to_budget()
        elif self.last_s is not None and self._newest - self.last_s > self.cut:
            self._trim(self._newest - self.last_s)
        if self.trimmed and any(e.ts < self.cut for e in self.tl.events):
            self.tl.events[:] = [e for e in self.tl.events if e.ts >= self.cut]

    def _trim_to_budget(self) -> None:
        assert self.max_points is not None
        chunks = self._chunks
        kept = 0
        i = len(chunks)
        while i > 0 and kept + chunks[i - 1][0] <= self.max_points:  # the newest chunks that fit
            i -= 1
            kept += chunks[i][0]
        if i == len(chunks):  # the newest chunk alone is over the budget: keep it whole
            i -= 1
        if i <= 0:  # all of them fit
            return
        # just after the newest time read before the first chunk kept: every point of the chunks before
        # it is dropped, so the window holds at most what the kept chunks added
        cut = float(np.nextafter(chunks[i - 1][1], math.inf))
        for _ in range(i):
            chunks.popleft()
        if cut > self.cut:
            self._trim(cut)

    def _trim(self, cut: float) -> None:
        """Drop every point and event older than ``cut`` (they go into :attr:`before`)."""
        self.cut = cut
        self.before.end = cut
        tl = self.tl
        for key in list(tl.series):
            s = tl.series[key]
            k = s.search(cut, "left")  # points before the cut (the series are in time order)
            if k <= 0:
                continue
            self.before.add_values(key, s.ts[:k], s.values[:k])
            if k >= len(s):
                del tl.series[key]
            else:
                s.drop_before(k)
        if tl.events:  # in file order, which is not quite time order (untimed lines run ahead)
            keep = []
            for e in tl.events:
                if e.ts >= cut or e.kind in WHOLE_LOG_EVENTS:
                    keep.append(e)
                else:
                    self.before.events[e.kind] += 1
                    self.before.start = e.ts if self.before.start is None else min(self.before.start, e.ts)
            tl.events[:] = keep
        self._lens = {key: len(s) for key, s in tl.series.items()}
        self._events = len(tl.events)
        self._held = self._after_trim = sum(self._lens.values())

    # -- what it was ---------------------------------------------------------------------------
    @property
    def trimmed(self) -> bool:
        return self.before.points > 0 or sum(self.before.events.values()) > 0

    def first_line(self) -> int | None:
        """The first line number the window holds a point or an event of (None when it holds none)."""
        best: int | None = None
        for s in self.tl.series.values():
            line = s.sources.parts()[2]
            if len(line):
                pos = line[line >= 0]
                if len(pos):
                    m = int(pos.min())
                    best = m if best is None or m < best else best
        for e in self.tl.events:
            if e.kind not in WHOLE_LOG_EVENTS and e.line_no > 0 and (best is None or e.line_no < best):
                best = e.line_no
        return best

    def summary(self) -> dict[str, Any]:
        """The window as the report's JSON gives it (``inputs[].window``)."""
        start, end = self.tl.span()
        return {
            "judged": "last" if self.last_s is not None else "newest",
            "max_points": self.max_points,
            "last_seconds": self.last_s,
            "start": iso(start) if start is not None else None,  # the first point or event judged
            "end": iso(end) if end is not None else None,
            "cut": self.cut if self.trimmed else None,  # epoch seconds: what is older was dropped
            "first_line": self.first_line(),
            "points": self._count(),
            "before": self.before.to_dict() if self.trimmed else None,
        }

    def message(self, name: str) -> str | None:
        """One sentence for the input report when the window left something out, else None."""
        if not self.trimmed:
            return None
        b = self.before
        start, end = self.tl.span()
        first = self.first_line()
        where = (f" (from {iso(start)}" + (f", line {first:,} on" if first else "")) if start is not None else " ("
        if self.last_s is not None:
            head = f"Judged the last {duration_text(self.last_s)} of {name}, as --last asks{where})."
        else:
            held = duration_text(end - start) if start is not None and end is not None else "part"
            head = (f"Judged the newest {held} of {name}{where}: {self._count():,} points; "
                    f"one judgement keeps at most {self.max_points:,}).")
        before = duration_text(b.end - b.start) if b.start is not None and b.end is not None else "part"
        counted = [f"{n:,} {kind.replace('_', ' ')} event(s)" for kind, n in b.events.most_common(4)]
        for signal, label, fmt in (("token_usage", "KV usage", "{:.2f}"), ("queue_reqs", "queue", "{:,.0f}"), ("running_reqs", "running", "{:,.0f}")):
            agg = b.signals.get((signal, ""))
            if agg is not None:
                counted.append(f"{label} up to {fmt.format(agg[2])}")
                continue
            ranked = [v[2] for (sig, rank), v in b.signals.items() if sig == signal and rank]
            if ranked:  # a DP log: its rank-"" series is derived after the read
                counted.append(f"{label} up to {fmt.format(max(ranked))} on one rank")
        lines = f" (lines 1–{first - 1:,})" if first and first > 1 else ""
        tail = f": {', '.join(counted)}" if counted else ""
        whole = ""
        if self.last_s is None and b.start is not None and end is not None:
            whole = f" Pass --last {math.ceil((end - b.start) / 3600 + 1e-9)}h to judge all of it (it takes more memory and time)."
        return f"{head} The {before} before it{lines} are counted, not judged{tail}.{whole}"


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.2 h``, ``2.1 d``."""
    s = max(0.0, float(seconds))
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
