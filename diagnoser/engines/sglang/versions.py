"""SGLang versions: parsing, comparison, and a range narrowed by what the inputs show.

The releases in ``../shared/reference/sglang.md`` (0.3.0 … 0.5.23; there is no 0.5.0). A hint such as
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
