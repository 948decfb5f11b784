"""The rule base class and the context a rule sees.

A rule is one small file with one class. Its docstring must carry the headings
``What it detects``, ``Why it matters``, ``Evidence``, ``Fix``, ``Known false positives`` and
``References``; a class without them fails at import. Thresholds are data (``defaults``), overridable
per rule from a TOML file or the CLI. The columns a rule reads, and the joins between them, are in
:mod:`diagnoser.rules.columns`.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from diagnoser.floor import MARK, is_floor
from diagnoser.mechanism import Mechanism, mechanism_of
from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.rules.columns import _arg_extreme, _col_sum, _column, _sorted, arrays, pairs
from diagnoser.timeline import Series, Timeline, series_summary, summarize
from diagnoser.timeline.derived import decode_tokens_per_request

DOC_HEADINGS = ("What it detects", "Why it matters", "Evidence", "Fix", "Known false positives", "References")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_CODE_RE = re.compile(r"^[A-Z]{2}\d{2}$")


_UNSET = object()


@dataclass(slots=True, weakref_slot=True)  # (the admission model refers back to its pass weakly: no cycle)
class RuleContext:
    """What a rule reads: the target's timeline window, its thresholds, the version and the adapter."""

    timeline: Timeline
    thresholds: dict[str, Any]
    adapter: Any
    version: tuple[int, int, int] | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. capacity model, job size, other findings
    memo: dict[Any, Any] = field(default_factory=dict)  # shared by the rules of one pass over one timeline
    # ``series(signal, rank="")`` and ``cfg(name, default=None)``: the timeline's own ``get`` and ``cfg``
    # (bound once; the rules call them a hundred times a pass)
    series: Callable[..., Series | None] = field(init=False, repr=False, compare=False)
    cfg: Callable[..., Any] = field(init=False, repr=False, compare=False)
    # the adapter whose mechanism ``mech`` holds (read again when the adapter changes)
    _mech_of: Any = field(default=_UNSET, init=False, repr=False, compare=False)
    _mech: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.series = self.timeline.get
        self.cfg = self.timeline.cfg

    @property
    def target(self) -> str:
        return self.timeline.target

    @property
    def mech(self) -> Mechanism:
        """The engine's mechanism (admission arithmetic, vetting, wording): the adapter's, never an engine
        import (the rules of a pass ask a few dozen times)."""
        adapter = self.adapter
        if adapter is not self._mech_of:
            self._mech_of, self._mech = adapter, mechanism_of(adapter)
        return self._mech  # type: ignore[no-any-return]

    def word(self, key: str) -> str:
        """The engine's word for a behaviour (``preemption`` on vLLM, ``retraction`` on SGLang)."""
        return self.mech.words.get(key, key)

    def flag(self, concept: str) -> str:
        return str(self.adapter.flag(concept, self.version))

    def stats(self, signal: str, rank: str = "") -> dict[str, Any]:
        key = ("stats", signal, rank)
        hit = self.memo.get(key)
        if hit is None:
            s = self.timeline.get(signal, rank)
            if s is None:
                hit = fast_summary([])
            elif len(s) < 64:
                hit = series_summary(s)  # the one Timeline.stats and the report read too
            else:  # the series' own column (NaNs dropped), its sum and its sorted values, shared with the pass
                vals = arrays(self, signal, rank)[1]  # type: ignore[index]
                hit = _np_summary(vals, _col_sum(self, vals), _sorted(self, signal, rank))
            self.memo[key] = hit
        return hit  # type: ignore[no-any-return]

    def span(self) -> tuple[float | None, float | None]:
        """:meth:`Timeline.span`, computed once for the pass."""
        hit = self.memo.get("span")
        if hit is None:
            hit = self.memo["span"] = self.timeline.span()
        return hit  # type: ignore[no-any-return]

    def ranks(self, signal: str) -> list[str]:
        """:meth:`Timeline.ranks`, from one walk over the series for the pass (callers must not mutate it)."""
        by_signal = self.memo.get("ranks")
        if by_signal is None:
            by_signal = self.memo["ranks"] = {}
            for name, rank in self.timeline.series:
                if rank:
                    by_signal.setdefault(name, []).append(rank)
            for ranks in by_signal.values():
                ranks.sort()
        return by_signal.get(signal, [])  # type: ignore[no-any-return]

    def events_of(self, *kinds: str) -> list[Any]:
        """:meth:`Timeline.events_of`, memoised for the pass (callers must not mutate the list)."""
        by_kind = self.memo.get("events_by_kind")
        if by_kind is None:
            by_kind = self.memo["events_by_kind"] = {}
            for e in self.timeline.events:  # one walk over the events for every rule of the pass
                by_kind.setdefault(e.kind, []).append(e)
        if len(kinds) == 1:
            return by_kind.get(kinds[0], [])  # type: ignore[no-any-return]
        present = [k for k in kinds if k in by_kind]
        if len(present) <= 1:
            return by_kind.get(present[0], []) if present else []  # type: ignore[no-any-return]
        return [e for e in self.timeline.events if e.kind in kinds]  # several kinds: keep their order

    def window_text(self) -> str:
        hit = self.memo.get("window_text")
        if hit is None:
            start, end = self.span()
            if start is None or end is None:
                hit = ""
            elif self.timeline.untimed:
                hit = "the lines read (no timestamps)"
            else:
                hit = f"{end - start:.0f} s"
            self.memo["window_text"] = hit
        return hit  # type: ignore[no-any-return]


WINDOW_READINGS = 5  # readings of a signal from which a finding stands on a window, not on a snapshot


def readings_confidence(n: int) -> str:
    """The most confidence readings allow: low for one, medium for a few, high for a window."""
    return "low" if n <= 1 else "medium" if n < WINDOW_READINGS else "high"


def min_confidence(a: str, b: str) -> str:
    order = {"low": 0, "medium": 1, "high": 2}
    return a if order.get(a, 0) <= order.get(b, 0) else b


def readings_basis(ctx: RuleContext, signal: str, rank: str = "") -> dict[str, Any]:
    """``{"readings": n, "span_s": s, "signal": signal}`` for one series of the window (empty when absent)."""
    s = ctx.series(signal, rank)
    if s is None:
        return {}
    n = len(s)
    b = s.bounds()
    span = None if b is None or ctx.timeline.untimed else round(float(b[1] - b[0]), 1)
    return {"readings": n, "span_s": span, "signal": signal if not rank else f"{signal}[{rank}]"}


def default_basis(ctx: RuleContext, signals: tuple[str, ...], kinds: tuple[str, ...] = ()) -> dict[str, Any]:
    """The basis of a finding: the readings of the most-read of ``signals``, else the log events of
    ``kinds``, else startup lines (the window has no load reading)."""
    best: dict[str, Any] = {}
    if not signals and not kinds:
        return best
    for name in signals:
        got = readings_basis(ctx, name)
        if got and got["readings"] > best.get("readings", 0):
            best = got
    if best:
        return best
    evs = [e for k in kinds for e in ctx.events_of(k)]
    if evs:
        return {"events": len(evs), "kind": kinds[0] if len(kinds) == 1 else ", ".join(sorted({e.kind for e in evs}))}
    if not any(ctx.series(s) is not None for s in ("running_reqs", "queue_reqs", "token_usage")):
        return {"startup": True}
    return {}


def fast_summary(values: list[float]) -> dict[str, Any]:
    """:func:`diagnoser.timeline.summarize` computed with numpy (same linear quantiles; tested equal)."""
    if len(values) < 64:
        return summarize(values)
    return _np_summary(np.asarray(values, dtype=float))


def _np_summary(arr: Any, total: Any = None, srt: Any = None) -> dict[str, Any]:
    """The summary of a numpy array; ``total`` (its ``numpy.add.reduce``) and ``srt`` (it sorted) may be
    given when the pass already has them, for an array without NaNs."""
    if total is None:
        total = np.add.reduce(arr)  # NaN when a NaN is in it (or both infinities): only then look for NaNs
    if total != total:
        nan = np.isnan(arr)
        if nan.any():
            arr = arr[~nan]
            total = np.add.reduce(arr)
            srt = None
    n = int(arr.size)
    if not n:
        return summarize([])
    if srt is None:
        srt = np.sort(arr)
    # ndarray.mean is this sum over n (same pairwise sum, same division); min and max are the sorted
    # ends, except for a zero (the ends do not say which of 0.0 and -0.0 min()/max() would give)
    lo, hi = srt.item(0), srt.item(-1)
    return {"last": arr.item(-1), "mean": float(total) / n,
            "min": lo if lo else float(arr.min()), "max": hi if hi else float(arr.max()),
            "p50": np_quantile(srt, 0.5), "p95": np_quantile(srt, 0.95), "n": n}


def np_quantile(sorted_arr: Any, q: float) -> float:
    """``numpy.percentile(arr, 100 * q)`` (the default linear method) on an already sorted array without
    NaNs, with numpy's own arithmetic (its ``_lerp``), so the result is the same to the last bit (tested
    against numpy) at a fraction of the call overhead."""
    n = len(sorted_arr)
    v = (n - 1) * q
    if v >= n - 1:
        return float(sorted_arr[-1])
    lo = math.floor(v)
    g = v - lo
    a, b = sorted_arr.item(lo), sorted_arr.item(lo + 1)
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g


class Rule:
    """Base class. Subclasses set the class attributes and implement :meth:`evaluate`."""

    name: ClassVar[str]
    code: ClassVar[str]
    title: ClassVar[str] = ""
    severity: ClassVar[Severity] = Severity.WARNING
    needs: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}
    threshold_help: ClassVar[dict[str, str]] = {}
    for_seconds: ClassVar[float] = 60.0  # live hysteresis: how long the condition must hold
    scope: ClassVar[str] = "target"  # "target" or "fleet"
    # the signals a finding judges (its basis: how many readings over how long) and the log events
    # it can stand on; a rule may also give its finding's basis itself
    reads: ClassVar[tuple[str, ...]] = ()
    events: ClassVar[tuple[str, ...]] = ()
    note: ClassVar[bool] = False  # a note about the inputs: never raises the exit status on its own

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if inspect.isabstract(cls) or cls.__dict__.get("_abstract", False):
            return
        if not _NAME_RE.match(getattr(cls, "name", "")):
            raise TypeError(f"{cls.__name__}: rule name must be snake_case, got {getattr(cls, 'name', None)!r}")
        if not _CODE_RE.match(getattr(cls, "code", "")):
            raise TypeError(f"{cls.__name__}: rule code must look like KV01, got {getattr(cls, 'code', None)!r}")
        doc = cls.doc()
        missing = [h for h in DOC_HEADINGS if f"{h}:" not in doc and f"{h}\n" not in doc]
        if missing:
            raise TypeError(f"{cls.__name__}: docstring lacks the heading(s) {', '.join(missing)}")

    # -- docs ----------------------------------------------------------------------------------
    @classmethod
    def doc(cls) -> str:
        """The rule's doc: its own class docstring, else its module's docstring (one rule per file)."""
        own = cls.__dict__.get("__doc__")
        if not own:
            own = getattr(sys.modules.get(cls.__module__), "__doc__", None) or ""
        return inspect.cleandoc(own)

    @classmethod
    def summary_line(cls) -> str:
        """The doc's first paragraph on one line (a summary may wrap in the docstring)."""
        return " ".join(cls.doc().split("\n\n", 1)[0].split()) if cls.doc() else cls.name

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        text = cls.doc()
        out: dict[str, str] = {"": text.split("\n\n", 1)[0]}
        pattern = re.compile(r"^(" + "|".join(re.escape(h) for h in DOC_HEADINGS) + r"):?\s*$", re.M)
        parts = pattern.split(text)
        for i in range(1, len(parts) - 1, 2):
            out[parts[i]] = inspect.cleandoc(parts[i + 1])
        return out

    @classmethod
    def docs_ref(cls) -> str:
        return f"diagnose explain {cls.name}"

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, ctx: RuleContext) -> Finding | list[Finding] | None:  # pragma: no cover
        raise NotImplementedError

    def finding(
        self,
        ctx: RuleContext,
        summary: str,
        evidence: list[Evidence] | None = None,
        suggestions: list[Suggestion] | None = None,
        confidence: str = "medium",
        severity: Severity | None = None,
        notes: list[str] | None = None,
        basis: dict[str, Any] | None = None,
    ) -> Finding:
        return Finding(
            rule=self.name,
            severity=severity or self.severity,
            confidence=confidence,
            target=ctx.target,
            summary=summary,
            evidence=list(evidence or []),
            suggestions=list(suggestions or []),
            docs=self.docs_ref(),
            notes=list(notes or []),
            basis=dict(basis or {}),
        )

    def settle_basis(self, ctx: RuleContext, f: Finding) -> None:
        """Give a finding its basis (when the rule did not) and cap its confidence by it: a finding read
        from one reading is at most low confidence, from a few at most medium (:func:`readings_confidence`).
        A basis of log events or startup lines is what SGLang itself printed: it is not capped."""
        if not f.basis:
            f.basis = default_basis(ctx, self.reads or self.needs, self.events)
        n = f.basis.get("readings")
        if isinstance(n, int) and not f.basis.get("uncapped"):
            f.confidence = min_confidence(f.confidence, readings_confidence(n))


def ev(ctx: RuleContext, signal: str, observed: Any, threshold: Any = None, at: str = "last", rank: str = "", window: str | None = None) -> Evidence:
    """Evidence for a signal; the source is the point that shows it (``last``, ``max``, ``min``)."""
    s = ctx.series(signal, rank)
    src = ""
    if s is not None and len(s):
        idx = len(s) - 1
        if at in ("max", "min"):

            vals = _column(ctx, signal, rank, "values")
            k = _arg_extreme(ctx, vals, at)
            if k is not None:
                idx = k
        src = s.source_at(idx)
    obs = _round(observed)
    # a quantile that is only a bucket's lower bound (its point's source or the window value says so): its range
    bound = (f"> {obs:g} s" if isinstance(obs, (int, float)) and (is_floor(observed) or (MARK in src and is_floor(source=src)
             and obs == _round(s.values[idx]))) else "")  # (MARK in src: is_floor's own first test, without its call)
    return Evidence(signal if not rank else f"{signal}[{rank}]", obs, threshold, window if window is not None else ctx.window_text(), src, bound)


def _round(v: Any) -> Any:
    if isinstance(v, float):
        if v != v:  # NaN
            return None
        v = float(v)  # a numpy float64 read from a column prints as a plain float
        return round(v, 4) if abs(v) < 100 else round(v, 1)
    return v


# -- helpers shared by the rules ---------------------------------------------------------------


def evidence(signal: str, observed: Any, threshold: Any = None, window: str = "", source: str = "") -> Evidence:
    """Evidence with a computed label (e.g. a share or a rate) rather than a raw signal."""
    return Evidence(signal=signal, observed=_round(observed), threshold=threshold, window=window, source=source)


def suggest(ctx: RuleContext, concept: str, current: Any, proposed: Any, why: str, effect: str, assumptions: tuple[str, ...] = ()) -> Suggestion:
    """A suggestion whose flag is spelled for the detected version (engines/sglang/flags.py)."""
    return Suggestion(flag=ctx.flag(concept), current=current, proposed=proposed, why=why, effect=effect, assumptions=assumptions)


def busy_summary(ctx: RuleContext, signal: str, rank: str = "") -> dict[str, Any]:
    """:func:`fast_summary` of the series' positive readings (a busy batch), memoised for the pass."""
    key = ("busy", signal, rank)
    hit = ctx.memo.get(key)
    if hit is None:
        got = arrays(ctx, signal, rank)
        if got is None or len(got[1]) < 64:  # (a short column: the positive values picked in Python)
            hit = summarize([v for v in got[1].tolist() if v > 0] if got is not None else [])
        else:  # the positive values sorted are the tail of the series' sorted values (shared with stats)
            b = got[1][got[1] > 0]
            if len(b) < 64:
                hit = summarize(b.tolist())
            else:
                srt = _sorted(ctx, signal, rank)
                hit = _np_summary(b, None, srt[srt.searchsorted(0.0, "right"):])
        ctx.memo[key] = hit
    return hit  # type: ignore[no-any-return]


def cap_name(ctx: RuleContext) -> str:
    """The running-request cap as the engine names it in its config (evidence labels)."""
    return "max_running_requests" if ctx.mech.reserves_output or not ctx.mech.name else "max_num_seqs"


def pool_name(ctx: RuleContext) -> str:
    """The KV pool's size as the engine names it (evidence labels)."""
    return "max_total_tokens" if ctx.mech.reserves_output or not ctx.mech.name else "KV cache size (tokens)"


def next_pow2(n: float) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def slot_cap(ctx: RuleContext) -> tuple[int | None, str]:
    """The effective max_running_requests (summary line, server info or server args) and its source;
    once per pass (several rules ask)."""
    hit = ctx.memo.get("slot_cap")
    if hit is None:
        hit = (None, "")
        for name in ("max_running_requests", "arg.max_running_requests"):
            v = ctx.cfg(name)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                hit = (int(v), ctx.timeline.cfg_source(name))
                break
        ctx.memo["slot_cap"] = hit
    return hit  # type: ignore[no-any-return]


DERIVED_POOL = "(#token / token usage)"  # how pool_tokens marks a pool it derived rather than read


def pool_tokens(ctx: RuleContext) -> tuple[int | None, str]:
    """The KV pool in tokens and its source: the config's, else derived (:data:`DERIVED_POOL`); once per pass."""
    hit = ctx.memo.get("pool")
    if hit is None:
        v = ctx.cfg("max_total_tokens")
        if isinstance(v, int | float) and v > 0:
            hit = (int(v), ctx.timeline.cfg_source("max_total_tokens"))
        else:  # derive from #token / token usage on the same line when the pool size was not printed
            p = pairs(ctx, "used_tokens", "token_usage")
            ok = np.nonzero(p.b >= 0.05)[0]
            if len(ok):
                k = int(ok[np.argmax(p.b[ok])])
                hit = (int(round(float(p.a[k] / p.b[k]), -2)), f"{p.src(k)} {DERIVED_POOL}")
            else:
                hit = (None, "")
        ctx.memo["pool"] = hit
    return hit  # type: ignore[no-any-return]


def pool_phrase(pool: int, source: str) -> str:
    """``pool N tokens``, or ``pool about N tokens (#token / token usage)`` when :func:`pool_tokens`
    derived it from a 2-decimal usage (good to about 1 %, so rounded to hundreds)."""
    if source.endswith(DERIVED_POOL):
        return f"pool about {pool:,} tokens {DERIVED_POOL}"
    return f"pool {pool:,} tokens"


def tokens_per_request(ctx: RuleContext) -> tuple[float | None, str]:
    """KV tokens one running request holds at decode moments, derived the same way from a log, scrapes
    or Prometheus (:func:`diagnoser.timeline.derived.decode_tokens_per_request`)."""
    if "tpr" not in ctx.memo:
        d = decode_tokens_per_request(ctx.timeline)
        ctx.memo["tpr"] = (d.value, d.how) if d.value is not None else (None, "")
    return ctx.memo["tpr"]  # type: ignore[no-any-return]


def busy(values: list[float]) -> list[float]:
    return [v for v in values if v == v and v > 0]


def share(values: list[float], pred: Any) -> float:
    vals = [v for v in values if v == v]
    return sum(1 for v in vals if pred(v)) / len(vals) if vals else 0.0


def fmt_int(v: Any) -> str:
    try:
        return f"{int(round(float(v))):,}"
    except (TypeError, ValueError):
        return str(v)
