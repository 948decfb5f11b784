"""Sizing a server before it exists: SGLang's own pool formula fed with estimates, and the estimate set
beside the engine's numbers when a start-up log is at hand.

SGLang (``python/sglang/srt/model_executor/model_runner.py`` / ``pool_configurator.py`` at v0.5.23) measures
``pre``, the free memory before the weights load, and after loading sizes the KV pool from what is left:
``budget = (pre − weights) − pre × (1 − mem_fraction_static)``; ``max_total_num_tokens = budget / bytes per
token``, rounded down to whole pages. ``pre × (1 − f)`` stays free for activations and CUDA graphs; what the
graphs and buffers take out of it (:data:`GRAPH_ESTIMATE_GIB` when no log says) leaves the headroom the
summary line prints as ``available_gpu_mem``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnoser.capacity.kvbytes import GIB, tokens_for_budget
from diagnoser.capacity.pool import PoolFacts

GRAPH_ESTIMATE_GIB = 2.5  # CUDA graphs + NCCL/attention workspaces after the pool, when no log says (typical 2-5 GiB)


@dataclass(slots=True)
class MemoryPlan:
    """One GPU rank's memory at a configuration, from estimates (GiB, as SGLang prints them)."""

    pre_gib: float  # free before weights
    fraction: float
    weights_gib: float
    bpt: float  # KV bytes per token per rank
    page_size: int = 1
    pools: int = 1
    pre_source: str = ""
    fraction_source: str = ""
    weights_source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def reserve_gib(self) -> float:
        """Memory the fraction keeps out of the static pool: activations, CUDA graphs, buffers."""
        return self.pre_gib * (1 - self.fraction)

    @property
    def budget_gib(self) -> float:
        return self.pre_gib - self.weights_gib - self.reserve_gib

    @property
    def tokens_per_rank(self) -> int:
        return tokens_for_budget(self.budget_gib, self.bpt, self.page_size)

    @property
    def total_tokens(self) -> int:
        return self.tokens_per_rank * self.pools

    @property
    def kv_gib(self) -> float:
        return self.tokens_per_rank * self.bpt / GIB

    @property
    def headroom_gib(self) -> float:
        return self.reserve_gib - GRAPH_ESTIMATE_GIB

    @property
    def fits(self) -> bool:
        return self.tokens_per_rank > 0

    def fraction_for(self, tokens: int) -> float:
        """The smallest mem_fraction_static whose pool holds ``tokens`` per rank."""
        need = self.weights_gib + tokens * self.bpt / GIB
        return need / self.pre_gib

    def to_dict(self) -> dict[str, Any]:
        r = (lambda v: round(v, 2))  # noqa: E731
        return {
            "free_before_weights_gib": r(self.pre_gib), "free_before_weights_source": self.pre_source,
            "mem_fraction_static": self.fraction, "mem_fraction_source": self.fraction_source,
            "weights_gib_per_rank": r(self.weights_gib), "weights_source": self.weights_source,
            "kv_budget_gib": r(self.budget_gib), "kv_gib": r(self.kv_gib), "reserve_gib": r(self.reserve_gib),
            "headroom_gib": r(self.headroom_gib), "pool_tokens_per_rank": self.tokens_per_rank, "pools": self.pools,
            "pool_tokens": self.total_tokens, "fits": self.fits,
        }


def fraction_from_engine(p: PoolFacts) -> float | None:
    """The fraction a server used, recovered from its own memory lines when it did not print it:
    ``f = 1 − (free after weights − KV size) / free before weights``."""
    if p.pre_gib and p.after_weights_gib is not None and p.kv_gib:
        f = 1 - (p.after_weights_gib - p.kv_gib) / p.pre_gib
        if 0 < f < 1:
            return round(f, 3)
    return None


def _diff(engine: float | None, est: float | None) -> float | None:
    if engine is None or est is None or not engine:
        return None
    return est / engine - 1


def compare(engine: PoolFacts, plan: MemoryPlan, implied_weights: float | None = None) -> list[dict[str, Any]]:
    """Rows of engine vs estimate (weights, pool, KV, headroom) with the relative difference; the weights
    the engine's pool implies stand in when it did not print its own."""
    w = engine.weights_gib if engine.weights_gib is not None else implied_weights
    rows = [
        ("weights GiB/rank", w, plan.weights_gib, 2),
        ("pool tokens/rank", engine.pool_tokens, plan.tokens_per_rank, 0),
        ("KV GiB/rank", engine.kv_gib, plan.kv_gib, 2),
        ("headroom GiB", engine.headroom_gib, plan.headroom_gib, 2),
    ]
    out = []
    for name, e, s, nd in rows:
        if e is None:
            continue
        d = _diff(e, s)
        out.append({"what": name, "engine": round(e, nd) if nd else e, "estimate": round(s, nd) if nd else s,
                    "difference": None if d is None else round(d, 4)})
    return out


__all__ = ["GRAPH_ESTIMATE_GIB", "MemoryPlan", "compare", "fraction_from_engine"]
