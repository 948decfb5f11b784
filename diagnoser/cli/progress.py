"""A progress line on stderr for long log reads: lines, MB/s and the time left, redrawn in place.

Only when stderr is a terminal (:func:`log_progress` returns None otherwise: nothing is printed into a
pipe, a file or a CI log), and only once a read has gone on for :data:`DELAY_S` (a small log prints
nothing). The line is rewritten at most every :data:`EVERY_S` and cleared before the report is written.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

DELAY_S = 0.5  # a read shorter than this shows no progress
EVERY_S = 0.2


def _delay() -> float:
    """:data:`DELAY_S`, or ``$DIAGNOSER_PROGRESS_DELAY`` seconds (the tests set 0)."""
    try:
        return float(os.environ.get("DIAGNOSER_PROGRESS_DELAY", DELAY_S))
    except ValueError:
        return DELAY_S


class LogProgress:
    """Called with the log reader after each chunk it applies (``LogOptions.progress``)."""

    def __init__(self, stream: IO[str], clock: Any = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.delay = _delay()
        self._reader: Any = None
        self._start = 0.0
        self._last = -1.0
        self._width = 0

    def __call__(self, reader: Any) -> None:
        now = self.clock()
        if reader is not self._reader:  # a new log
            self._reader, self._last = reader, -1.0
            self._start = reader.started or now  # the bulk reader's start (monotonic clock)
        elapsed = now - self._start
        if elapsed < self.delay or (self._last >= 0 and now - self._last < EVERY_S):
            return
        self._last = now
        self._draw(line_text(reader, elapsed))

    def _draw(self, text: str) -> None:
        text = text[: self._columns() - 1]  # a wrapped line would not be redrawn in place
        pad = " " * max(0, self._width - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._width = len(text)

    def _columns(self) -> int:
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return 80
        return max(20, cols) if cols else 80  # 0: a terminal that does not say

    def clear(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def line_text(reader: Any, elapsed: float) -> str:
    """``  reading server.log: 3.10 M lines · 412 of 1,074 MB · 205 MB/s · 3 s left``."""
    name = os.path.basename(reader.report.source) if reader.report.source != "-" else "stdin"
    done = reader.bytes_read
    rate = done / elapsed if elapsed > 0 else 0.0
    lines = reader.line_no
    count = f"{lines / 1e6:.2f} M lines" if lines >= 1_000_000 else f"{lines:,} lines"
    size = reader.size
    parts = [f"  reading {name[:30]}: {count}"]
    if size:
        parts.append(f"{done / 1e6:,.0f} of {size / 1e6:,.0f} MB")
    else:
        parts.append(f"{done / 1e6:,.0f} MB")
    parts.append(f"{rate / 1e6:,.0f} MB/s")
    if size and rate > 0:
        parts.append(f"{max(0.0, (size - done) / rate):,.0f} s left")
    return " · ".join(parts)


def log_progress(stream: IO[str] | None = None) -> LogProgress | None:
    """A progress line on ``stream`` (stderr) when it is a terminal, else None."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return LogProgress(stream) if tty else None
