"""Quantiles known only as a lower bound ("> 100 s").

When a histogram quantile's interpolation passes the time elapsed since the server was last idle (or
falls in the ``+Inf`` bucket) the engine adapter keeps the bucket's lower bound as the value and marks it:
a window quantile is a :class:`Floor`, a per-interval point carries :data:`MARK` in its source. Every
output that shows such a number says the range (``> 100 s``), never the floor as if it were the value.
"""

from __future__ import annotations

from typing import Any

MARK = " (> "  # the start of the note a bounded point's source carries: "… histogram (> 100 s: in the …)"


class Floor(float):
    """A quantile that is more than this value (its bucket's lower bound); ``hi`` is the bucket's upper bound."""

    hi: float

    def __new__(cls, lo: float, hi: float = float("inf")) -> Floor:
        self = super().__new__(cls, lo)
        self.hi = hi
        return self

    def __reduce__(self) -> Any:  # pickles (bundles, worker processes) keep the mark
        return (Floor, (float(self), self.hi))


def is_floor(value: Any = None, source: str | None = None) -> bool:
    """True when the value is a :class:`Floor` or the point's source says it is a lower bound."""
    return isinstance(value, Floor) or (source is not None and MARK in source and " s:" in source.split(MARK, 1)[1][:40])


def above(text: str, floor: bool) -> str:
    """``"> 100.00"`` for a lower bound, the text unchanged otherwise."""
    return f"> {text}" if floor else text
