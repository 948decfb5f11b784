"""Play a recording in (scaled) wall time: the records due by now."""

from __future__ import annotations

import time
from typing import Any

from diagnoser.replay.source import ReplaySource, load_source


class ReplayFeed:
    """Plays a recording in (scaled) wall time.

    Usage::

        feed = ReplayFeed("run.dgb", speed=10, loop=True)   # or a run directory
        ing = ReplayIngest(adapter, feed.source)             # optional: same ingestion as --once
        while not feed.finished:
            for rec in feed.due():                           # records whose time has come
                ing.apply(rec)
            col = ing.collection()                           # evaluate / render this
            time.sleep(1)

    ``due(now=None)`` returns, in time order, the records whose recorded time ``t`` satisfies
    ``(t - t0) / speed <= now - started`` (``t0`` is the first record's time; ``started`` is the first
    call's wall time unless :meth:`start` set it). Each is a shallow copy of the bundle's record dict
    (kinds ``config``, ``scrape``, ``log``; see docs/bundle-format.md). With ``loop=True`` the recording
    restarts after its last record plus one scrape interval; later passes shift ``t`` forward by
    whole periods (so series keep moving forward; log *text* keeps its original stamps) and repeat
    only scrapes and log lines (config is sent once). ``finished`` becomes True after the last record
    when not looping. ``position()`` gives ``(pass, seconds into the recording)``.
    """

    def __init__(self, path: str | ReplaySource, speed: float = 1.0, loop: bool = False) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.source = path if isinstance(path, ReplaySource) else load_source(path)
        self.speed = float(speed)
        self.loop = loop
        self.records = self.source.records
        t0, t1 = self.source.span()
        self.t0 = t0
        self.period = max((t1 - t0) + self.source.interval(), 1e-3)
        self.started: float | None = None
        self._pass = 0
        self._i = 0
        self.finished = not self.records

    def start(self, now: float | None = None) -> None:
        self.started = time.time() if now is None else now

    def position(self, now: float | None = None) -> tuple[int, float]:
        now = time.time() if now is None else now
        if self.started is None:
            return 0, 0.0
        elapsed = (now - self.started) * self.speed
        if self.loop:
            return int(elapsed // self.period), elapsed % self.period
        return 0, elapsed

    def due(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        if self.started is None:
            self.start(now)
        assert self.started is not None
        elapsed = (now - self.started) * self.speed
        out: list[dict[str, Any]] = []
        while not self.finished:
            if self._i >= len(self.records):
                if not self.loop:
                    self.finished = True
                    break
                self._pass += 1
                self._i = 0
                continue
            rec = self.records[self._i]
            offset = self._pass * self.period
            rel = float(rec.get("t") or self.t0) - self.t0 + offset
            if rel > elapsed:
                break
            self._i += 1
            if self._pass and rec.get("kind") == "config":
                continue
            r = dict(rec)
            if self._pass:
                r["t"] = float(rec.get("t") or self.t0) + offset
                r["pass"] = self._pass
            out.append(r)
        return out

