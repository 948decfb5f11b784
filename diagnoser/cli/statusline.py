"""A progress line on the terminal: one line on stderr, rewritten in place, silent when stderr is not a TTY.

``diagnose --once --url … --duration 2m`` waits for minutes before it prints its report; on a terminal the
line shows how far the sampling is, how long is left and whether a target stops answering. Piped or
redirected (CI logs, ``2> file``) nothing is written, so the output stays clean. ``TERM=dumb`` (no cursor
control) also turns it off.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

BAR = 12


def is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # closed or not a file
        return False


class StatusLine:
    """``update(text)`` redraws the line (at most every ``min_interval`` seconds unless ``force``); ``clear()``
    erases it before the report is printed."""

    def __init__(self, stream: IO[str] | None = None, min_interval: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_tty(self.stream)
        self.min_interval = min_interval
        self._last = -1.0
        self._shown = False

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and self._shown and now - self._last < self.min_interval:
            return
        self._last = now
        width = self.width()
        if len(text) >= width:  # a wrapped line cannot be rewritten in place
            text = text[: max(1, width - 2)] + "…"
        from diagnoser.outputs.termsafe import term_safe_line

        self.stream.write("\r" + term_safe_line(text) + "\x1b[K")  # carriage return, text, erase the rest of the line
        self.stream.flush()
        self._shown = True

    def width(self) -> int:
        try:  # the terminal stderr is on (stdout may be redirected to a file)
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            import shutil

            return shutil.get_terminal_size((80, 24)).columns

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def _secs(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s} s"


def sampling_progress(line: StatusLine) -> Any:
    """The ``progress`` callback of :func:`diagnoser.collect.collect_once` drawing on ``line``: every new
    round of scrapes is drawn at once, the seconds in between at most every ``line.min_interval``."""
    last = [-1]

    def progress(p: dict[str, Any]) -> None:
        line.update(sampling_text(p), force=p.get("scrapes") != last[0])
        last[0] = p.get("scrapes", 0)

    return progress


def sampling_text(p: dict[str, Any]) -> str:
    """``sampling 2 targets ▕██████      ▏ 6 s of 12 s · scrape 4/7 · 6 s left`` (+ ``· 1 not answering``)."""
    dur = float(p.get("duration_s") or 0.0)
    el = min(float(p.get("elapsed_s") or 0.0), dur) if dur else float(p.get("elapsed_s") or 0.0)
    frac = el / dur if dur > 0 else 1.0
    fill = int(round(frac * BAR))
    n = int(p.get("targets") or 1)
    parts = [f"sampling {n} target{'s' if n != 1 else ''} ▕{'█' * fill}{' ' * (BAR - fill)}▏ {_secs(el)} of {_secs(dur)}",
             f"scrape {p.get('scrapes', 0)}/{p.get('of', 0)}"]
    done = int(p.get("scrapes") or 0) >= int(p.get("of") or 0)
    parts.append("judging" if done else f"{_secs(dur - el)} left")
    failing = int(p.get("failing") or 0)
    if failing:
        parts.append(f"{failing} not answering" if n > 1 else "not answering")
    return " · ".join(parts)
