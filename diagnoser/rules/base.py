"""The rule base class and the context a rule sees.

A rule is one small file with one class. Its docstring must carry the headings
``What it detects``, ``Why it matters``, ``Evidence``, ``Fix``, ``Known false positives`` and
``References``; a class without them fails at import. Thresholds are data (``defaults``), overridable
per rule from a TOML file or the CLI.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.timeline import Series, Timeline

DOC_HEADINGS = ("What it detects", "Why it matters", "Evidence", "Fix", "Known false positives", "References")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_CODE_RE = re.compile(r"^[A-Z]{2}\d{2}$")


@dataclass(slots=True)
class RuleContext:
    """What a rule reads: the target's timeline window, its thresholds, the version and the adapter."""

    timeline: Timeline
    thresholds: dict[str, Any]
    adapter: Any
    version: tuple[int, int, int] | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. capacity model, job size, other findings

    @property
    def target(self) -> str:
        return self.timeline.target

    def flag(self, concept: str) -> str:
        return str(self.adapter.flag(concept, self.version))

    def series(self, signal: str, rank: str = "") -> Series | None:
        return self.timeline.get(signal, rank)

    def stats(self, signal: str, rank: str = "") -> dict[str, Any]:
        return self.timeline.stats(signal, rank)

    def cfg(self, name: str, default: Any = None) -> Any:
        return self.timeline.cfg(name, default)

    def window_text(self) -> str:
        start, end = self.timeline.span()
        if start is None or end is None:
            return ""
        if self.timeline.untimed:
            return "the lines read (no timestamps)"
        return f"{end - start:.0f} s"


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
        return cls.doc().splitlines()[0] if cls.doc() else cls.name

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        text = cls.doc()
        out: dict[str, str] = {"": text.split("\n\n", 1)[0]}
        pattern = re.compile(r"^(" + "|".join(re.escape(h) for h in DOC_HEADINGS) + r"):?\s*$", re.M)
        parts = pattern.split(text)
        for i in range(1, len(parts) - 1, 2):
            out[parts[i]] = parts[i + 1].strip()
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
        )


def ev(ctx: RuleContext, signal: str, observed: Any, threshold: Any = None, at: str = "last", rank: str = "", window: str | None = None) -> Evidence:
    """Evidence for a signal; the source is the point that shows it (``last``, ``max``, ``min``)."""
    s = ctx.series(signal, rank)
    src = ""
    if s is not None and len(s):
        idx = {"last": len(s) - 1, "max": s.argmax(), "min": s.argmin()}.get(at, len(s) - 1)
        src = s.sources[idx] if idx >= 0 else s.last_source()
    return Evidence(signal=signal if not rank else f"{signal}[{rank}]", observed=_round(observed), threshold=threshold, window=window if window is not None else ctx.window_text(), source=src)


def _round(v: Any) -> Any:
    if isinstance(v, float):
        if v != v:  # NaN
            return None
        return round(v, 4) if abs(v) < 100 else round(v, 1)
    return v


# -- helpers shared by the rules ---------------------------------------------------------------


def evidence(signal: str, observed: Any, threshold: Any = None, window: str = "", source: str = "") -> Evidence:
    """Evidence with a computed label (e.g. a share or a rate) rather than a raw signal."""
    return Evidence(signal=signal, observed=_round(observed), threshold=threshold, window=window, source=source)


def suggest(ctx: RuleContext, concept: str, current: Any, proposed: Any, why: str, effect: str, assumptions: tuple[str, ...] = ()) -> Suggestion:
    """A suggestion whose flag is spelled for the detected version (engines/sglang/flags.py)."""
    return Suggestion(flag=ctx.flag(concept), current=current, proposed=proposed, why=why, effect=effect, assumptions=assumptions)


def joint(ctx: RuleContext, a: str, b: str, rank: str = "") -> list[tuple[float, float, float, str]]:
    """Points where both signals were read at the same moment (same log line or same scrape)."""
    sa, sb = ctx.series(a, rank), ctx.series(b, rank)
    if sa is None or sb is None:
        return []
    bmap: dict[float, float] = {}
    for t, v in zip(sb.ts, sb.values, strict=True):
        bmap[t] = v
    out = []
    for t, v, src in zip(sa.ts, sa.values, sa.sources, strict=True):
        w = bmap.get(t)
        if w is not None and v == v and w == w:
            out.append((t, v, w, src))
    return out


def next_pow2(n: float) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def slot_cap(ctx: RuleContext) -> tuple[int | None, str]:
    """The effective max_running_requests (summary line, server info or server args) and its source."""
    for name in ("max_running_requests", "arg.max_running_requests"):
        v = ctx.cfg(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v), ctx.timeline.cfg_source(name)
    return None, ""


def pool_tokens(ctx: RuleContext) -> tuple[int | None, str]:
    v = ctx.cfg("max_total_tokens")
    if isinstance(v, int | float) and v > 0:
        return int(v), ctx.timeline.cfg_source("max_total_tokens")
    # derive from #token / token usage on the same line when the pool size was not printed
    pts = [(u, r, s) for _, u, r, s in joint(ctx, "used_tokens", "token_usage") if r >= 0.05]
    if pts:
        u, r, s = max(pts, key=lambda p: p[1])
        return int(round(u / r, -2)), f"{s} (#token / token usage)"
    return None, ""


def tokens_per_request(ctx: RuleContext) -> tuple[float | None, str]:
    """KV tokens one running request holds: the median of decode_sum_seq_lens / running_reqs (0.5.7+
    metrics), else of used_tokens / running_reqs (used tokens also count prompts still in prefill)."""
    from diagnoser.timeline import quantile

    for signal in ("decode_sum_seq_lens", "used_tokens"):
        per = sorted(u / r for _, u, r, _ in joint(ctx, signal, "running_reqs") if r > 0 and u > 0)
        if per:
            return quantile(per, 0.5), f"median of {signal} / running_reqs"
    return None, ""


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
