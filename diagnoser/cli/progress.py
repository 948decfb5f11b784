"""A progress line on stderr for long log reads: lines, MB/s and the time left, redrawn in place.

Drawn on the terminal's status line (:class:`diagnoser.cli.statusline.StatusLine`, which also shows
``--duration`` sampling): only when stderr is a terminal (:func:`log_progress` returns None otherwise:
nothing is printed into a pipe, a file or a CI log, nor with ``TERM=dumb``), and only once a read has
gone on for :data:`DELAY_S` (a small log prints nothing). The line is rewritten at most every 0.2 s,
cut to the terminal's width, and erased before the report is written.
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

DELAY_S = 0.5  # a read shorter than this shows no progress


def _delay() -> float:
    """:data:`DELAY_S`, or ``$DIAGNOSER_PROGRESS_DELAY`` seconds (the tests set 0)."""
    try:
        return float(os.environ.get("DIAGNOSER_PROGRESS_DELAY", DELAY_S))
    except ValueError:
        return DELAY_S


class LogProgress:
    """Called with the log reader after each chunk it applies (``LogOptions.progress``); draws on ``line``
    (a :class:`~diagnoser.cli.statusline.StatusLine`, or anything with ``update(text)`` and ``clear()``)."""

    def __init__(self, line: Any, clock: Any = time.monotonic) -> None:
        self.line = line
        self.clock = clock
        self.delay = _delay()
        self._reader: Any = None
        self._start = 0.0

    def __call__(self, reader: Any) -> None:
        now = self.clock()
        if reader is not self._reader:  # a new log
            self._reader = reader
            self._start = reader.started or now  # the bulk reader's start (monotonic clock)
        elapsed = now - self._start
        if elapsed >= self.delay:
            self.line.update(line_text(reader, elapsed))

    def clear(self) -> None:
        self.line.clear()


def line_text(reader: Any, elapsed: float) -> str:
    """``reading server.log: 3.10 M lines · 412 of 1,074 MB · 205 MB/s · 3 s left``."""
    name = os.path.basename(reader.report.source) if reader.report.source != "-" else "stdin"
    done = reader.bytes_read
    rate = done / elapsed if elapsed > 0 else 0.0
    lines = reader.line_no
    count = f"{lines / 1e6:.2f} M lines" if lines >= 1_000_000 else f"{lines:,} lines"
    size = reader.size
    parts = [f"reading {name[:30]}: {count}"]
    if size:
        parts.append(f"{done / 1e6:,.0f} of {size / 1e6:,.0f} MB")
    else:
        parts.append(f"{done / 1e6:,.0f} MB")
    parts.append(f"{rate / 1e6:,.0f} MB/s")
    if size and rate > 0:
        parts.append(f"{max(0.0, (size - done) / rate):,.0f} s left")
    return " · ".join(parts)


def log_progress(line: Any = None, stream: IO[str] | None = None) -> LogProgress | None:
    """A log-reading progress line on ``line`` (the status line of the run, when there is one), else on
    a new status line on ``stream`` (stderr); None when that is not a terminal."""
    if line is None:
        from diagnoser.cli.statusline import StatusLine

        line = StatusLine(stream)
    return LogProgress(line) if line.enabled else None
