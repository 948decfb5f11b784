"""SGLang versions: parsing, comparison, and a range narrowed by what the inputs show.

The releases diagnoser knows (0.3.0 … 0.5.23; there is no 0.5.0; docs/sglang.md#versions). A hint such as
"this log prints ``#pending-token``" means ``>= 0.5.11``; hints are intersected into one range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

OLDEST: Version = (0, 1, 0)
NEWEST_KNOWN: Version = (0, 5, 23)

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> Version | None:
    if not text:
        return None
    m = _VERSION_RE.search(str(text))
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


# PyPI release dates of the sglang package (wheel upload days), for the bound a log's own date puts on
# its version: a line stamped on day D was printed by a release published by D, or by a development
# build of the next one
RELEASES: tuple[tuple[Version, str], ...] = (
    ((0, 3, 5), "2024-11-13"), ((0, 3, 6), "2024-11-22"), ((0, 4, 0), "2024-12-03"), ((0, 4, 1), "2024-12-25"),
    ((0, 4, 2), "2025-01-27"), ((0, 4, 3), "2025-02-14"), ((0, 4, 4), "2025-03-13"), ((0, 4, 5), "2025-04-07"),
    ((0, 4, 6), "2025-04-27"), ((0, 4, 7), "2025-06-10"), ((0, 4, 8), "2025-06-24"), ((0, 4, 9), "2025-07-06"),
    ((0, 4, 10), "2025-07-31"), ((0, 5, 1), "2025-08-23"), ((0, 5, 2), "2025-09-11"), ((0, 5, 3), "2025-10-06"),
    ((0, 5, 4), "2025-10-24"), ((0, 5, 5), "2025-11-06"), ((0, 5, 6), "2025-12-03"), ((0, 5, 7), "2026-01-01"),
    ((0, 5, 8), "2026-01-23"), ((0, 5, 9), "2026-02-23"), ((0, 5, 10), "2026-04-05"), ((0, 5, 11), "2026-05-07"),
    ((0, 5, 12), "2026-05-16"), ((0, 5, 13), "2026-06-11"), ((0, 5, 14), "2026-06-26"), ((0, 5, 15), "2026-07-10"),
    ((0, 5, 16), "2026-07-25"), ((0, 5, 17), "2026-08-08"), ((0, 5, 18), "2026-08-21"), ((0, 5, 19), "2026-09-04"),
    ((0, 5, 20), "2026-09-18"), ((0, 5, 21), "2026-10-01"), ((0, 5, 22), "2026-10-15"), ((0, 5, 23), "2026-10-30"),
)
FIRST_RELEASE_DAY = "2024-01-01"  # earlier stamps are a wrong clock, not an old SGLang


def newest_on(day: str) -> tuple[Version, str] | None:
    """The newest version a line stamped ``day`` (``YYYY-MM-DD``) can come from: the first release after
    that day (a development build between releases is at most the next one), with its date; None when
    the day is after the last known release or before SGLang existed (a wrong clock)."""
    if day < FIRST_RELEASE_DAY:
        return None
    for v, when in RELEASES:
        if when > day:
            return v, when
    return None


def fmt(v: Version) -> str:
    return f"{v[0]}.{v[1]}.{v[2]}"


@dataclass(slots=True)
class VersionRange:
    low: Version = OLDEST
    high: Version = (99, 0, 0)
    exact: Version | None = None
    reasons: list[str] | None = None
    conflicts: list[str] | None = None  # hints that contradicted earlier (stronger) ones and were ignored

    def at_least(self, v: Version, why: str) -> None:
        if v > self.high:
            self._conflict(f">= {fmt(v)}: {why}")
            return
        if v > self.low:
            self.low = v
            self._why(f">= {fmt(v)}: {why}")

    def at_most(self, v: Version, why: str) -> None:
        if v < self.low:
            self._conflict(f"<= {fmt(v)}: {why}")
            return
        if v < self.high:
            self.high = v
            self._why(f"<= {fmt(v)}: {why}")

    def _conflict(self, text: str) -> None:
        if self.conflicts is None:
            self.conflicts = []
        if text not in self.conflicts:
            self.conflicts.append(text)

    def set_exact(self, v: Version, why: str) -> None:
        self.exact = v
        self._why(f"= {fmt(v)}: {why}")

    def _why(self, text: str) -> None:
        if self.reasons is None:
            self.reasons = []
        if text not in self.reasons:
            self.reasons.append(text)

    @property
    def known(self) -> bool:
        return self.exact is not None or self.low != OLDEST or self.high != (99, 0, 0)

    def best(self) -> Version:
        """The version to pick spellings for: the exact one, else the newest the range allows."""
        if self.exact:
            return self.exact
        if self.high != (99, 0, 0):
            return self.high
        return max(self.low, NEWEST_KNOWN) if self.low <= NEWEST_KNOWN else self.low

    def text(self) -> str | None:
        if self.exact:
            return fmt(self.exact)
        if not self.known:
            return None
        lo = fmt(self.low) if self.low != OLDEST else None
        hi = fmt(self.high) if self.high != (99, 0, 0) else None
        if lo and hi:
            return lo if lo == hi else f">={lo},<={hi}"
        return f">={lo}" if lo else f"<={hi}"

    def merge(self, other: VersionRange) -> None:
        if other.exact:
            self.exact = other.exact
        if other.low > self.low and other.low <= self.high:
            self.low = other.low
        if other.high < self.high and other.high >= self.low:
            self.high = other.high
        for r in other.reasons or []:
            self._why(r)
        for c in other.conflicts or []:
            self._conflict(c)


def at_least(version: Version | None, v: tuple[int, int, int]) -> bool:
    """True when the version is known and >= v. Unknown versions count as the newest known."""
    return (version or NEWEST_KNOWN) >= v
