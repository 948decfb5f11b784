"""What a what-if returns (:class:`Scenario`) and what it starts from (:class:`Workload`), with the
one-paragraph effect text that suggestions carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnoser.capacity.eta import JobProgress


@dataclass(slots=True)
class Workload:
    """What the server's clients asked for, as observed (or given on the command line)."""

    tokens_per_request: float | None = None  # p50 (or the given average) of prompt + output
    tokens_per_request_p95: float | None = None
    tokens_source: str = ""
    running: float | None = None  # observed mean running batch
    gen_tps: float | None = None  # observed mean gen throughput
    usage: float | None = None  # observed mean token usage
    queue: float | None = None
    kv_bound: bool = False  # the pool is the limit (usage high, requests wait)
    client_concurrency: int | None = None
    demand: float | None = None  # most requests seen in flight (running + waiting at one moment)
    output_tokens_per_request: float | None = None
    progress: JobProgress = field(default_factory=JobProgress)


@dataclass(slots=True)
class Scenario:
    change: str  # "--mem-fraction-static 0.85 → 0.90"
    flag: str
    current: Any
    proposed: Any
    pool_tokens: int | None = None
    pool_tokens_per_rank: int | None = None
    max_concurrent_requests: int | None = None
    max_concurrent_requests_p95: int | None = None
    projected_running: float | None = None
    projected_gen_throughput_tps: float | None = None
    job_eta_hours: float | None = None
    confidence: str = "low"
    assumptions: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    headroom_gib: float | None = None
    fits: bool = True
    risky: bool = False  # fits, but leaves too little headroom to recommend
    gain: float | None = None  # relative gen-throughput gain vs now
    extra_flags: list[str] = field(default_factory=list)  # other changes this one needs
    limit: str = ""  # what bounds the projected running batch ("the client's concurrency (4)")
    lever: bool = False  # the change moves the pool or the slot cap (so the running batch could move)
    fit: dict[str, Any] | None = None  # the step-time fit's quality (method, R², points, batch range)
    no_throughput: str = ""  # why no throughput number is projected (a fit too weak to extrapolate)

    def to_dict(self) -> dict[str, Any]:
        r = (lambda v, d=0: None if v is None else round(v, d) if d else round(v))  # noqa: E731
        return {
            "change": self.change, "flag": self.flag, "current": self.current, "proposed": self.proposed,
            "pool_tokens": self.pool_tokens, "pool_tokens_per_rank": self.pool_tokens_per_rank,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_concurrent_requests_p95": self.max_concurrent_requests_p95,
            "projected_running": r(self.projected_running, 1), "projected_gen_throughput_tps": r(self.projected_gen_throughput_tps),
            "job_eta_hours": r(self.job_eta_hours, 1), "gain": r(self.gain, 3), "confidence": self.confidence,
            "headroom_gib": r(self.headroom_gib, 1), "fits": self.fits, "risky": self.risky, "extra_flags": list(self.extra_flags),
            "assumptions": list(self.assumptions), "risks": list(self.risks), "limit": self.limit,
            "fit": dict(self.fit) if self.fit else None, "no_throughput": self.no_throughput or None,
        }

    def effect_text(self, now: Scenario | None = None) -> str:
        """One paragraph: what the change should buy, with its numbers and assumptions."""
        if not self.fits:
            return "Does not fit: " + "; ".join(self.risks or self.assumptions)
        parts = []
        if self.pool_tokens is not None and now is not None and now.pool_tokens:
            d = self.pool_tokens - now.pool_tokens
            if d:
                parts.append(f"pool {now.pool_tokens:,} → {self.pool_tokens:,} tokens ({d:+,}, {d / now.pool_tokens:+.0%})")
        moved = self.moved(now)
        if moved:
            parts.append(f"running {now.projected_running:.0f} → {self.projected_running:.0f}")  # type: ignore[union-attr]
            if self.projected_gen_throughput_tps is not None and now is not None and now.projected_gen_throughput_tps:
                r2 = (self.fit or {}).get("r2")
                parts.append(f"gen throughput {now.projected_gen_throughput_tps:.0f} → {self.projected_gen_throughput_tps:.0f} tok/s"
                             + (f" (step-time fit R² {r2:.2f})" if isinstance(r2, float) else ""))
            elif self.no_throughput:
                parts.append(f"no throughput number: {self.no_throughput}")
            if self.job_eta_hours is not None and now is not None and now.job_eta_hours is not None:
                parts.append(f"job ETA {_eta(now.job_eta_hours)} → {_eta(self.job_eta_hours)}")
        elif self.stays(now):
            n = f"{self.projected_running:.0f}"
            if self.limit.startswith("no limit"):
                parts.append(f"running stays at {n}: {self.limit[len('no limit: '):]}; no throughput gain is projected")
            elif self.limit:
                parts.append(f"running stays at {n}: {self.limit} binds first, so no throughput gain is projected")
            else:
                parts.append(f"running stays at {n}: the pool is not what limits it")
        if self.headroom_gib is not None:
            parts.append(f"{self.headroom_gib:.1f} GiB left for activations and graphs")
        if self.projected_running is None and (now is None or now.projected_running is None):
            parts.append("no running batch was observed, so running and throughput are not projected")
        text = "; ".join(parts) if parts else "the capacity model does not size this change: pool and slot cap stay as they are"
        text += f" ({self.confidence} confidence)."
        if self.extra_flags:
            text += " Needs also: " + ", ".join(self.extra_flags) + "."
        if self.risks:
            text += " Risk: " + " ".join(self.risks)
        if self.assumptions:
            own = [a for a in self.assumptions if not a.startswith(("running then bound", "running capped"))]
            bound = [a for a in self.assumptions if a not in own]
            text += " Assumes: " + "; ".join(a.rstrip(".") for a in (own + bound)[:4]) + "."
        return text


    def moved(self, now: Scenario | None) -> bool:
        """The projected running batch differs from today's as printed (whole requests)."""
        return (self.projected_running is not None and now is not None and now.projected_running is not None
                and round(self.projected_running) != round(now.projected_running))

    def stays(self, now: Scenario | None) -> bool:
        """A change to the pool or the slot cap that does not move the running batch."""
        if self.projected_running is None or now is None or self.moved(now):
            return False
        return self.lever or (self.pool_tokens is not None and self.pool_tokens != now.pool_tokens)


def _eta(h: float) -> str:
    return f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} h"


def show_value(v: Any) -> str:
    return "unset" if v is None else str(v)


def min_confidence(a: str, b: str) -> str:
    order = {"low": 0, "medium": 1, "high": 2}
    return a if order.get(a, 0) <= order.get(b, 0) else b
