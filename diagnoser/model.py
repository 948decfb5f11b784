"""The data model shared by every layer: plain frozen dataclasses, no I/O, no imports from the package.

Layers (each imports only the ones before it):
    model → engines (adapters) → sources → timeline → rules → engine (evaluation) → capacity → outputs/web/cli
"""

from __future__ import annotations

import enum
import math
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}; use one of info, warning, critical") from None


CONFIDENCE_LEVELS = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class Evidence:
    """One number that supports a finding, traceable to where it was read."""

    signal: str
    observed: Any
    threshold: Any = None
    window: str = ""
    source: str = ""  # "server.log:1842" or "scrape@2026-11-29T10:00:02Z sglang:num_queue_reqs"
    bound: str = ""  # a quantile known only as more than ``observed``: its range ("> 100 s"), shown instead

    def to_dict(self) -> dict[str, Any]:
        scalars = _SCALARS
        if (type(self.observed) in scalars and type(self.threshold) in scalars and type(self.signal) in scalars
                and type(self.window) in scalars and type(self.source) in scalars and type(self.bound) in scalars):
            # the common case (scalars only): what asdict gives, without its deep copy
            d = {"signal": self.signal, "observed": self.observed, "threshold": self.threshold, "window": self.window,
                 "source": self.source, "bound": self.bound}
        else:
            d = asdict(self)  # (containers are deep-copied)
        if not self.bound:
            del d["bound"]
        return d

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as a constructor call (a worker's findings, diagnoser/forkmap.py)
        return Evidence, (self.signal, self.observed, self.threshold, self.window, self.source, self.bound)


_SCALARS = frozenset((str, int, float, bool, type(None)))
_OWN_DEPTH = 80  # deeper than any output keeps (redact.MAX_DEPTH cuts there)


def owned(value: Any, depth: int = 0) -> Any:
    """``value`` as a document's own: a scalar as it is, a container copied (deeply), so that the document
    shares nothing that can change with the object it was read from (the report door returns what it
    leaves unchanged as it is: tests/test_report_fast.py)."""
    t = type(value)
    if t in _SCALARS:
        return value
    if depth > _OWN_DEPTH:  # (a cycle, or a depth no output keeps)
        return value
    if t is dict:
        if _SCALARS.issuperset(map(type, value.values())):  # (labels: strings)
            return dict(value)
        return {k: owned(v, depth + 1) for k, v in value.items()}
    if t is list:
        if _SCALARS.issuperset(map(type, value)):
            return list(value)
        return [owned(v, depth + 1) for v in value]
    if t is tuple:
        return tuple([owned(v, depth + 1) for v in value])
    try:
        return deepcopy(value)
    except Exception:  # (what cannot be copied is passed on, as every output door does)
        return value


@dataclass(frozen=True, slots=True)
class Suggestion:
    """A concrete flag change: current → proposed, why, and what it should buy."""

    flag: str
    current: Any
    proposed: Any
    why: str
    effect: str = ""
    assumptions: tuple[str, ...] = ()
    gain: float | None = None  # expected relative gain (0.3 = +30 % gen throughput); used for ranking
    projection: dict[str, Any] | None = None  # numbers from the capacity model, when it has them

    def to_dict(self) -> dict[str, Any]:
        scalars = _SCALARS
        if (self.projection is None and type(self.flag) in scalars and type(self.current) in scalars
                and type(self.proposed) in scalars and type(self.why) in scalars and type(self.effect) in scalars
                and type(self.gain) in scalars):  # the common case: what asdict gives, without its deep copy
            return {"flag": self.flag, "current": self.current, "proposed": self.proposed, "why": self.why,
                    "effect": self.effect, "assumptions": _own_items(self.assumptions), "gain": self.gain, "projection": None}
        d = asdict(self)
        d["assumptions"] = _own_items(self.assumptions)
        return d

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as a constructor call (diagnoser/forkmap.py)
        return Suggestion, (self.flag, self.current, self.proposed, self.why, self.effect, self.assumptions, self.gain, self.projection)


def _own_dict(d: Any) -> dict[Any, Any]:
    """A fresh dict of ``d``'s items (numbers and strings, usually), each value :func:`owned`."""
    out = dict(d)
    return out if _SCALARS.issuperset(map(type, out.values())) else {k: owned(v) for k, v in out.items()}


def _own_items(items: Any) -> list[Any]:
    """A fresh list of ``items`` (strings, usually), each :func:`owned`."""
    out = list(items)
    return out if all(type(x) is str for x in out) else [owned(x) for x in out]


@dataclass(slots=True)
class Finding:
    rule: str
    severity: Severity
    confidence: str
    target: str
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    suggestions: list[Suggestion] = field(default_factory=list)
    docs: str = ""
    state: str = "firing"  # pending / firing / resolved (hysteresis in live mode)
    notes: list[str] = field(default_factory=list)
    # what the finding stands on: {"readings": n, "span_s": s, "signal": name} for readings of a signal,
    # {"events": n, "kind": kind} for log events, {"startup": True} for startup lines / config alone
    basis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity.label,
            "confidence": self.confidence,
            "target": self.target,
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "docs": self.docs,
            "state": self.state,
            "notes": _own_items(self.notes),
            "basis": _own_dict(self.basis),
        }

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as a constructor call (diagnoser/forkmap.py)
        return Finding, (self.rule, self.severity, self.confidence, self.target, self.summary, self.evidence, self.suggestions,
                         self.docs, self.state, self.notes, self.basis)


def basis_text(basis: dict[str, Any]) -> str:
    """``on 1 reading``, ``on 8 readings over 9 s``, ``on 2 log events``, ``on startup lines alone``."""
    if not basis:
        return ""
    if "readings" in basis:
        n = int(basis["readings"])
        span = basis.get("span_s")
        text = f"on {n} reading{'' if n == 1 else 's'}"
        if n > 1 and isinstance(span, int | float) and span > 0:
            text += f" over {span:.0f} s" if span < 600 else f" over {span / 60:.0f} min"
        return text
    if "events" in basis:
        n = int(basis["events"])
        return f"on {n} log event{'' if n == 1 else 's'}" + (f" ({basis['kind']})" if basis.get("kind") else "")
    if basis.get("startup"):
        return "on startup lines and configuration alone (no load readings)"
    return ""


@dataclass(frozen=True, slots=True)
class ConfigFact:
    """A configuration value and where it came from (server_info, log line, metric, CLI)."""

    value: Any
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass(slots=True)
class InputReport:
    """What one input delivered: counts of what was read, recognised and skipped."""

    kind: str  # "metrics" | "log" | "server_info" | "replay" | "prometheus"
    source: str
    scrapes: int = 0
    lines_read: int = 0
    lines_recognized: int = 0
    errors: int = 0
    messages: list[str] = field(default_factory=list)
    window: dict[str, Any] | None = None  # a log read to a window: what was judged, what only counted

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "source": self.source}
        if self.kind == "log":
            d["lines_read"] = self.lines_read
        else:
            d["scrapes"] = self.scrapes
        if self.kind == "replay":  # a recording: what it held (each input below says what was recognised)
            d["lines_read"] = self.lines_read
        d["lines_recognized"] = self.lines_recognized
        d["errors"] = self.errors
        if self.messages:
            d["messages"] = list(self.messages)
        if self.window is not None:
            d["window"] = owned(self.window)
        return d


@dataclass(frozen=True, slots=True)
class LogEvent:
    """A discrete event read from a log: retraction, OOM, startup notice, access-log line…"""

    kind: str
    ts: float
    line_no: int
    source: str
    fields: dict[str, Any]
    rank: str = ""


class BadLine(ValueError):
    """A line that is an error on its own (e.g. a timestamp no calendar has): a parser raises it, the
    reader counts the line as unreadable (with ``reason``) and goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SignalSink(Protocol):
    """Where sources write what they read. :class:`diagnoser.timeline.Timeline` implements it."""

    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None: ...

    def add_event(self, event: LogEvent) -> None: ...

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None: ...


def iso(ts: float | None) -> str | None:
    """Epoch seconds → ``2026-11-29T10:00:00Z`` (``None`` for a missing, non-finite or unshowable time)."""
    if ts is None:
        return None
    try:
        f = float(ts)
        if not math.isfinite(f):
            return None
        return datetime.fromtimestamp(f, tz=UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError, TypeError):  # a time no calendar can show (year < 1 or > 9999)
        return None
