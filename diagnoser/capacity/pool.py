"""Pool capacity and the GPU memory split, from the engine first (docs/sglang.md#startup-lines, docs/sglang.md#server-info, docs/sglang.md#kv-budget).

Engine facts, in the order trusted: ``sglang:max_total_num_tokens`` / the summary line
``max_total_num_tokens=N … available_gpu_mem=X GB`` / ``KV Cache is allocated. #tokens: N, K size…`` /
``/server_info`` ``memory_usage``; the split from ``Load weight begin/end … avail mem=X GB``.

SGLang sizes the pool as ``budget = avail_after_weights − pre × (1 − mem_fraction_static)`` where ``pre`` is
the free memory before the weights load. So each +0.01 of the fraction adds 1 % of ``pre`` to the pool —
not a proportional share of the current pool. Where the engine is silent, the formula fills in and every
such number says so in :attr:`PoolFacts.notes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnoser.capacity.kvbytes import GIB, ModelShape, bytes_per_token, kv_gib
from diagnoser.timeline import Timeline

CUDA_CONTEXT_GIB = 1.5  # free memory lost to the CUDA context/NCCL before weights load (plan mode estimate)


@dataclass(slots=True)
class PoolFacts:
    """One server's KV pool and memory split; per GPU rank unless a name says total."""

    pool_tokens: int | None = None  # per pool (one DP rank / the single scheduler)
    pool_source: str = ""
    pools: int = 1  # independent pools (DP ranks with DP attention or --dp-size)
    bpt: float | None = None  # KV bytes per token per rank
    bpt_source: str = ""
    kv_gib: float | None = None
    pre_gib: float | None = None  # free before weights ("total_gpu_memory" in SGLang)
    pre_source: str = ""
    after_weights_gib: float | None = None
    weights_gib: float | None = None
    headroom_gib: float | None = None  # free after pool and graphs (available_gpu_mem)
    headroom_source: str = ""
    graph_gib: float | None = None
    mem_fraction: float | None = None
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    context_len: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    cuda_graph_max_bs: int | None = None
    schedule_conservativeness: float | None = None
    hicache: bool = False
    host_mem_gib: float | None = None
    shape: ModelShape | None = None
    device: str = "gpu"
    attention_hint: str = ""  # "mla" / "mha" from the KV allocation line (one KV size vs K and V sizes)
    attn_weight_bytes: float | None = None  # bytes per attention parameter when known (quantized checkpoints); else the dtype
    notes: list[str] = field(default_factory=list)

    @property
    def attention_tp(self) -> int:
        return max(1, self.tp // self.dp) if self.dp_attention else max(1, self.tp)

    @property
    def total_tokens(self) -> int | None:
        return None if self.pool_tokens is None else self.pool_tokens * self.pools

    def budget_gib(self, fraction: float) -> float | None:
        """KV budget per rank at another mem_fraction_static (None when the split is unknown)."""
        if self.pre_gib is None:
            return None
        if self.after_weights_gib is not None:
            return self.after_weights_gib - self.pre_gib * (1 - fraction)
        if self.kv_gib is not None and self.mem_fraction is not None:
            return self.kv_gib + (fraction - self.mem_fraction) * self.pre_gib
        return None

    def headroom_at(self, fraction: float) -> float | None:
        """Free memory left for activations and graphs at another fraction (GiB per rank)."""
        if self.headroom_gib is None or self.mem_fraction is None or self.pre_gib is None:
            return None
        return self.headroom_gib - (fraction - self.mem_fraction) * self.pre_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool_tokens_per_rank": self.pool_tokens, "pools": self.pools, "pool_tokens": self.total_tokens,
            "pool_source": self.pool_source, "bytes_per_token_per_rank": self.bpt, "bytes_per_token_source": self.bpt_source,
            "kv_gib": _r(self.kv_gib), "free_before_weights_gib": _r(self.pre_gib), "free_after_weights_gib": _r(self.after_weights_gib),
            "headroom_gib": _r(self.headroom_gib), "mem_fraction_static": self.mem_fraction, "tp": self.tp, "dp": self.dp,
            "dp_attention": self.dp_attention, "kv_cache_dtype": self.kv_cache_dtype, "notes": list(self.notes),
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _configured_pools(tl: Timeline) -> tuple[bool, int, int]:
    """(DP attention on, DP size, independent KV pools) from the config: one pool per DP rank with DP
    attention or --dp-size, each of ``max_total_tokens``."""
    attn_dp = int(_num(tl.cfg("attn_dp_size")) or 0)
    dp_attention = _truthy(tl.cfg("enable_dp_attention")) or attn_dp > 1
    dp = int(attn_dp if attn_dp > 1 else (_num(tl.cfg("dp_size")) or 1))
    return dp_attention, dp, max(1, dp if (dp_attention or dp > 1) else 1)


def _reporting_dp_ranks(tl: Timeline) -> int:
    """DP ranks that report separately in the input (``dp0``, ``dp1/pp1`` …): the highest index + 1 when
    more than one does, else 0."""
    ranks = {r.split("/")[0] for r in tl.ranks("running_reqs") if r.startswith("dp")}
    idx = [int(r[2:]) for r in ranks if r[2:].isdigit()]
    return max(idx) + 1 if len(ranks) > 1 and idx else 0


def pool_count(tl: Timeline) -> int:
    """Independent KV pools of ``max_total_tokens`` each (the pool size is per rank, while the aggregate
    running/queued/used series sum the ranks): the configured DP, else the DP ranks seen reporting."""
    configured = _configured_pools(tl)[2]
    return configured if configured > 1 else max(1, _reporting_dp_ranks(tl))


def pool_from_timeline(tl: Timeline, shape: ModelShape | None = None) -> PoolFacts:
    """Read the pool and the memory split from a target's config facts (engine numbers first)."""
    cfg, src = tl.cfg, tl.cfg_source
    p = PoolFacts(shape=shape)
    p.tp = int(_num(cfg("tp_size")) or 1)
    p.dp_attention, p.dp, p.pools = _configured_pools(tl)
    p.kv_cache_dtype = str(cfg("kv_cache_dtype") or "auto")
    p.page_size = int(_num(cfg("page_size")) or 1)
    p.context_len = _int(cfg("context_len"))
    p.max_running_requests = _int(cfg("max_running_requests"))
    p.chunked_prefill_size = _int(cfg("chunked_prefill_size"))
    p.max_prefill_tokens = _int(cfg("max_prefill_tokens"))
    p.cuda_graph_max_bs = _int(cfg("cuda_graph_max_bs_captured")) or _int(cfg("cuda_graph_max_bs_decode")) or _int(cfg("cuda_graph_max_bs"))
    p.schedule_conservativeness = _num(cfg("schedule_conservativeness"))
    p.hicache = _truthy(cfg("enable_hierarchical_cache"))
    p.mem_fraction = _num(cfg("mem_fraction_static"))
    p.device = str(cfg("device") or "gpu")
    p.attention_hint = str(cfg("attention_kind_hint") or "")
    for name in ("max_total_tokens", "kv_pool_tokens_log"):
        v = _int(cfg(name))
        if v:
            p.pool_tokens, p.pool_source = v, src(name)
            break
    p.kv_gib = _num(cfg("kv_cache_gb"))
    p.pre_gib = _num(cfg("avail_mem_before_weights_gb"))
    p.pre_source = src("avail_mem_before_weights_gb")
    p.after_weights_gib = _num(cfg("avail_mem_after_weights_gb"))
    p.weights_gib = _num(cfg("weight_mem_gb"))
    p.graph_gib = _num(cfg("graph_mem_gb"))
    p.headroom_gib = _num(cfg("available_gpu_mem_gb"))
    p.headroom_source = src("available_gpu_mem_gb")
    if p.headroom_gib is None and _num(cfg("avail_mem_after_graph_gb")) is not None:
        p.headroom_gib = _num(cfg("avail_mem_after_graph_gb"))
        p.headroom_source = src("avail_mem_after_graph_gb")
    reporting = _reporting_dp_ranks(tl)
    if reporting > 1 and p.pools == 1:
        p.dp = p.pools = reporting
        p.notes.append(f"DP ranks up to DP{p.dp - 1} report separately in the input: {p.dp} pools assumed, one per rank")
    if p.pool_tokens is None:
        est = _pool_from_usage(tl, [r for r in tl.ranks("used_tokens") if r.startswith("dp")] or [""])
        if est:
            p.pool_tokens, p.pool_source = est
            p.notes.append("pool per rank derived from #token / token usage (the engine did not print it)")
    after_pool = _num(cfg("avail_mem_after_pool_gb"))
    if p.graph_gib is None and after_pool is not None and p.headroom_gib is not None and after_pool > p.headroom_gib:
        p.graph_gib = after_pool - p.headroom_gib  # 'Memory pool end' minus what is left after graphs
    if p.pre_gib is None and p.after_weights_gib is not None and p.weights_gib is not None:
        p.pre_gib = p.after_weights_gib + p.weights_gib
        p.pre_source = f"{src('avail_mem_after_weights_gb')} (avail mem + mem usage)"
    settle(p)
    return p


def _pool_from_usage(tl: Timeline, ranks: list[str]) -> tuple[int, str] | None:
    """Pool tokens per rank from the fullest reading of used tokens / token usage (2-decimal usage: best when full)."""
    best: list[tuple[float, float, str]] = []
    for rank in ranks:
        used, usage = tl.get("used_tokens", rank), tl.get("token_usage", rank)
        if used is None or usage is None:
            continue
        by_src = dict(zip(usage.sources.tolist(), usage.values.tolist(), strict=True))
        cands = [(by_src[src], u / by_src[src], src) for u, src in zip(used.values.tolist(), used.sources.tolist(), strict=True)
                 if by_src.get(src, 0) >= 0.05]
        if cands:
            best.append(max(cands))
    if not best:
        return None
    best.sort(key=lambda c: c[1])
    mid = best[len(best) // 2]
    return int(round(mid[1])), f"{mid[2]} (#token / token usage {mid[0]:.2f})"


def _int(v: Any) -> int | None:
    n = _num(v)
    return int(n) if n else None


def settle(p: PoolFacts) -> None:
    """Fill what the engine did not say from what it did (bytes/token, KV size), noting each step."""
    # bytes per token: the engine's own KV size / #tokens when precise enough, else the formula
    formula_bpt = bytes_per_token(p.shape, p.attention_tp, p.kv_cache_dtype) if p.shape else None
    engine_bpt = None
    if p.kv_gib and p.pool_tokens and p.kv_gib >= 0.5:
        engine_bpt = p.kv_gib * GIB / p.pool_tokens
    if formula_bpt:
        p.bpt, p.bpt_source = formula_bpt, "formula from the model config (docs/sglang.md#kv-bytes)"
        if engine_bpt and abs(engine_bpt / formula_bpt - 1) > 0.05:
            p.notes.append(
                f"the engine's KV size implies {engine_bpt:,.0f} B/token but the config formula gives {formula_bpt:,.0f}; "
                "the engine's pool size is used, the formula only for changes"
            )
    elif engine_bpt:
        p.bpt, p.bpt_source = engine_bpt, "engine: KV size / #tokens (no model config)"
    if p.kv_gib is None and p.pool_tokens and p.bpt:
        p.kv_gib = kv_gib(p.pool_tokens, p.bpt)
    if p.pool_tokens is None and p.bpt and p.mem_fraction is not None:
        budget = p.budget_gib(p.mem_fraction)
        if budget is not None:
            from diagnoser.capacity.kvbytes import tokens_for_budget

            p.pool_tokens = tokens_for_budget(budget, p.bpt, p.page_size)
            p.pool_source = "extrapolated: the engine did not print its pool, formula from the memory split"
            p.notes.append("pool size extrapolated from the memory split and the config formula; the engine did not report it")
