"""What-ifs: what a flag change does to the pool, the running batch, gen throughput and the job's ETA.

Every projection is anchored on what the server showed (its pool, its running batch at its token usage,
its throughput) and moved by the formulas of docs/sglang.md#kv-sizing only for the change itself:

* pool: ``--mem-fraction-static`` adds ``Δf × free-before-weights`` GiB per rank; fp8 KV halves bytes per
  token; DP attention gives each DP rank its own pool, minus the attention weights it must now hold whole.
* running: when the KV pool is the limit (usage ≥ 0.9 with a queue), the batch grows with the pool at the
  observed KV held per running request; capped by the client's concurrency and max_running_requests.
* throughput: the fitted step-time model (:mod:`throughput`), ratio-scaled from the observed throughput.
* ETA: the observed completion rate × the throughput ratio.

HiCache grows the *prefix cache* in host RAM; it never raises decode concurrency. ``--cpu-offload-gb``
is never proposed.
"""

from __future__ import annotations

from typing import Any

from diagnoser.capacity.kvbytes import GIB, attention_weight_gib_per_rank, kv_dtype_bytes, tokens_for_budget
from diagnoser.capacity.pool import PoolFacts
from diagnoser.capacity.scenario import Scenario, Workload, min_confidence, show_value
from diagnoser.capacity.throughput import ThroughputModel
from diagnoser.engines.sglang import flags
from diagnoser.engines.sglang import scheduler_model as SM
from diagnoser.engines.sglang.scheduler_model import ServerState

MIN_HEADROOM_GIB = 6.0  # target free memory for activations + CUDA graphs (docs/sglang.md#tuning-guide: 5-8 GB)
WARN_HEADROOM_GIB = 8.0
RISK_HEADROOM_GIB = 5.0
MAX_FRACTION = 0.95
DP_ATTENTION_RESERVE_GIB = 4.0  # SGLang's auto fraction reserves this much more with DP attention (docs/sglang.md#mem-fraction-default, 0.4.8-0.5.2)
MAX_EXTRAPOLATION = 3.0  # throughput is not projected past this multiple of the largest batch observed
HOST_RESERVE_GIB = 10.0  # SGLang keeps 10 GiB of host RAM free when sizing HiCache (docs/sglang.md#hicache-flags)
CHUNK_MIB_PER_TOKEN = 1.5  # activation reserve per chunked-prefill token (docs/sglang.md#mem-fraction-default, v0.5.3+ auto reserve)
GRAPH_MIB_PER_BS = 2.0  # CUDA-graph reserve per captured batch size (docs/sglang.md#mem-fraction-default, v0.5.3+ auto reserve)


class Planner:
    """Runs what-ifs for one server from its pool facts, workload and throughput model."""

    def __init__(self, pool: PoolFacts, work: Workload, model: ThroughputModel | None = None,
                 version: tuple[int, int, int] | None = None, state: ServerState | None = None) -> None:
        self.pool, self.work, self.model, self.version = pool, work, model, version
        self.state = state  # SGLang's scheduler/memory model of this server (engines/sglang/scheduler_model.py)
        self._now: Scenario | None = None

    def _pinned(self) -> str:
        """Why the pool cannot grow from memory (a --max-total-tokens cap binds), or ""."""
        if self.state is None:
            return ""
        pinned, why = self.state.pool_pinned()
        return why if pinned else ""

    def _grow_pinned(self, flag: str, current: Any, proposed: Any, why: str) -> Scenario:
        """A change that grows the profiled capacity while the cap pins the pool: the pool stays."""
        sc = self._scenario(flag, current, proposed, self.pool.pool_tokens)
        sc.assumptions.insert(0, f"the pool stays at {self.pool.pool_tokens or 0:,} tokens: {why} "
                              f"({SM.cite('pool_min')}); raise --max-total-tokens instead")
        sc.gain = 0.0
        return sc

    # -- core projection ---------------------------------------------------------------------------
    def _scenario(self, flag: str, current: Any, proposed: Any, per_rank: int | None, pools: int | None = None,
                  running_cap: float | None = None, confidence: str | None = None, change: str | None = None) -> Scenario:
        p, w = self.pool, self.work
        pools = pools or p.pools
        total = None if per_rank is None else per_rank * pools
        sc = Scenario(change=change or f"{flag} {show_value(current)} → {show_value(proposed)}", flag=flag, current=current,
                      proposed=proposed, pool_tokens=total, pool_tokens_per_rank=per_rank, lever=running_cap is not None)
        if total is not None and w.tokens_per_request:
            sc.max_concurrent_requests = int(total // w.tokens_per_request)
            if w.tokens_per_request_p95:
                sc.max_concurrent_requests_p95 = int(total // w.tokens_per_request_p95)
        run = self._project_running(sc, total, pools, running_cap)
        sc.projected_running = run
        sc.fit = self.model.quality() if self.model is not None else None
        conf = confidence or "medium"
        if run is not None and w.gen_tps:
            base_run = w.running or run
            ratio: float | None = None
            if abs(run - base_run) < 0.5:
                ratio = 1.0  # the running batch does not move: neither does the step time
            elif self.model is not None and self.model.projectable:
                at = run
                if self.model.batch_max and run > MAX_EXTRAPOLATION * self.model.batch_max:
                    at = MAX_EXTRAPOLATION * self.model.batch_max
                    sc.assumptions.append(f"throughput projected no further than {MAX_EXTRAPOLATION:g}× the largest batch seen "
                                          f"({self.model.batch_max:.0f} running, so to {at:.0f}): a floor for the gain, not a forecast")
                ratio = self.model.tps(at) / self.model.tps(base_run) if self.model.tps(base_run) > 0 else 1.0
                conf = min_confidence(conf, self.model.confidence(run))
            else:
                sc.no_throughput = self.model.why_not() if self.model is not None else "no decode reading with a batch and a throughput to fit"
                conf = min_confidence(conf, "low")
            if ratio is not None:
                sc.projected_gen_throughput_tps = w.gen_tps * ratio
                sc.gain = ratio - 1.0
                sc.job_eta_hours = w.progress.eta_hours(ratio)
        elif run is not None and self.model is not None and self.model.projectable:
            sc.projected_gen_throughput_tps = self.model.tps(run)
            conf = min_confidence(conf, self.model.confidence(run))
        sc.confidence = conf
        return sc

    def _project_running(self, sc: Scenario, total: int | None, pools: int, running_cap: float | None) -> float | None:
        """Running batch after a change: scale by the binding limit (KV pool, slots, client) when the server
        is at it; otherwise the batch stays (demand- or admission-bound) unless a new limit cuts it."""
        p, w = self.pool, self.work
        inf = float("inf")
        run0 = w.running
        if run0 is None:
            if sc.max_concurrent_requests is None:
                return None
            sc.assumptions.append("running = requests that fit at full length (no running batch observed)")
            run0 = float(sc.max_concurrent_requests)
            caps = [c for c in (running_cap, w.client_concurrency) if c]
            return min([run0, *caps])
        base = p.total_tokens
        ratio = total / base if total is not None and base else 1.0
        if w.kv_bound:
            kv_now = run0
        elif w.usage and w.usage > 0.02:
            kv_now = run0 * max(w.usage, 0.95) / w.usage
        else:
            kv_now = inf
        slot_now = float(p.max_running_requests * p.pools) if p.max_running_requests else inf
        slot_new = float(running_cap) if running_cap is not None else (float(p.max_running_requests * pools) if p.max_running_requests else inf)
        client = float(w.client_concurrency) if w.client_concurrency else inf
        client_name = "the client's concurrency"
        if client == inf and w.demand:
            client, client_name = w.demand, f"the demand seen (at most {w.demand:.0f} requests in flight)"
        limits_new = {"the KV pool": kv_now * ratio, "max_running_requests": slot_new, client_name: client}
        l_now = min(kv_now, slot_now, client)
        l_new = min(limits_new.values())
        if l_now == inf or l_new == inf or l_now <= 0:  # nothing runs now (e.g. a PD prefill server waiting on bootstraps)
            return run0
        binding = min(limits_new, key=lambda k: limits_new[k])
        sc.limit = binding if "(" in binding else f"{binding} ({limits_new[binding]:,.0f})"
        if run0 >= 0.9 * l_now:
            run = run0 * l_new / l_now
            if abs(run - run0) > 0.5:
                sc.assumptions.append(f"running then bound by {binding}")
            return run
        if l_new < run0:
            sc.assumptions.append(f"running capped by {binding}")
            return l_new
        sc.limit = f"no limit: {run0:.0f} running is below what the pool, the slots and the client allow (the arrivals set it)"
        return run0

    def now(self) -> Scenario:
        if self._now is None:
            self._now = self._scenario("(current)", None, None, self.pool.pool_tokens, change="current settings")
            self._now.gain = 0.0
        return self._now

    # -- changes -------------------------------------------------------------------------------------
    def mem_fraction(self, fraction: float) -> Scenario:
        p = self.pool
        flag = flags.spelling("mem_fraction_static", self.version)
        cur = p.mem_fraction
        if cur is None or p.pre_gib is None or not p.bpt or p.pool_tokens is None:
            missing = [n for n, v in (("the current --mem-fraction-static", cur), ("free memory before weights ('Load weight begin' line or --gpu-mem-gb)", p.pre_gib),
                                      ("bytes per token (--model-config or the 'KV Cache is allocated' line)", p.bpt), ("the pool size", p.pool_tokens)) if v is None or v == 0]
            sc = Scenario(change=f"{flag} → {fraction:.2f}", flag=flag, current=cur, proposed=round(fraction, 2), fits=False)
            sc.risks.append("cannot size it: missing " + ", ".join(missing) + ".")
            return sc
        pinned = self._pinned()
        if pinned and fraction > cur:
            return self._grow_pinned(flag, cur, round(fraction, 2), pinned)
        delta_tokens = int((fraction - cur) * p.pre_gib * GIB // p.bpt)
        per_rank = max(0, (p.pool_tokens + delta_tokens) // p.page_size * p.page_size)
        budget = p.budget_gib(fraction) if p.pool_tokens == 0 else None
        if budget is not None:  # no pool today: the weights overrun the budget, so count from the budget itself
            per_rank = tokens_for_budget(budget, p.bpt, p.page_size)
        if self.state is not None and self.state.cap_tokens:
            per_rank = SM.effective_pool(per_rank, self.state.cap_tokens)[0] or per_rank  # SGLang takes min(profile, cap)
        sc = self._scenario(flag, cur, round(fraction, 2), per_rank)
        sc.assumptions.append(f"each +0.01 adds 1% of the {p.pre_gib:.1f} GiB free before weights ({p.pre_source or 'estimate'}) = "
                              f"{0.01 * p.pre_gib * GIB / p.bpt:,.0f} tokens per rank (docs/sglang.md#kv-budget)")
        head = p.headroom_at(fraction)
        sc.headroom_gib = head
        if head is None:
            sc.risks.append("free memory after the pool is unknown (no available_gpu_mem in the log); check it stays ≥ 5–8 GB.")
            sc.confidence = min_confidence(sc.confidence, "low")
        elif head < RISK_HEADROOM_GIB:
            sc.risks.append(f"only {head:.1f} GiB would stay free for activations and CUDA graphs (< {RISK_HEADROOM_GIB:.0f}): likely OOM under load.")
            sc.fits = head > 0
            sc.risky = True
        elif head < WARN_HEADROOM_GIB:
            sc.risks.append(f"headroom for activations and CUDA graphs falls to {head:.1f} GiB (keep ≥ 5–8 GB); "
                            "if prefill OOMs, lower --chunked-prefill-size or the CUDA-graph batch size.")
        return sc

    def best_mem_fraction(self) -> Scenario | None:
        """The largest fraction (0.01 steps, ≤ 0.95) that keeps ≥ 6 GiB free; None when none beats today."""
        p = self.pool
        if p.mem_fraction is None or p.pre_gib is None:
            return None
        best = None
        f = round(p.mem_fraction + 0.01, 2)
        while f <= MAX_FRACTION + 1e-9:
            head = p.headroom_at(f)
            if head is not None and head < MIN_HEADROOM_GIB:
                break
            best = f
            if head is None and f >= p.mem_fraction + 0.05:
                break  # headroom unknown: go no further than +0.05
            f = round(f + 0.01, 2)
        return self.mem_fraction(best) if best else None

    def kv_fp8(self) -> Scenario | None:
        p = self.pool
        flag = flags.spelling("kv_cache_dtype", self.version)
        s_now = kv_dtype_bytes(p.kv_cache_dtype, p.shape.model_dtype_bytes if p.shape else 2.0)
        if s_now <= 1 or not p.pool_tokens:
            return None
        if p.device == "cpu":
            return None  # FP8 KV is a GPU feature (docs/sglang.md#memory-flags); a CPU engine keeps its dtype
        pinned = self._pinned()
        if pinned:
            return self._grow_pinned(flag, p.kv_cache_dtype, "fp8_e4m3", pinned)
        per_rank = int(p.pool_tokens * s_now // 1) // p.page_size * p.page_size
        sc = self._scenario(flag, p.kv_cache_dtype, "fp8_e4m3", per_rank)
        sc.assumptions.append(f"same KV budget at 1 byte per element instead of {s_now:g} (docs/sglang.md#kv-bytes): {s_now:g}× tokens")
        sc.risks.append("FP8 KV can cost a little accuracy; check your eval, and that the attention backend supports it.")
        return sc

    def dp_attention(self, dp: int | None = None, fraction: float | None = None) -> Scenario | None:
        """DP attention for MLA at TP > 1; when the replicated weights leave too little KV, paired with a
        larger mem fraction (``fraction``, else the largest that keeps ≥ 6 GiB free)."""
        p = self.pool
        if p.dp_attention or p.tp <= 1 or p.pool_tokens is None:
            return None
        kind = p.shape.attention if p.shape is not None else p.attention_hint
        if kind != "mla":
            return None  # DP attention helps the pool only where TP replicates the KV (MLA)
        dp = dp or p.tp
        if self._pinned():
            return None  # each rank's pool would still be the --max-total-tokens cap
        spell = flags.flag("dp_attention", self.version)
        if spell.flag == "--attn-dp-size":
            flag, cur, prop = spell.flag, 1, dp
        else:
            flag, cur, prop = spell.flag, False, True
        extra_flags = [] if spell.flag == "--attn-dp-size" else [f"--dp-size {dp}"]
        assumptions = [f"each of the {dp} DP ranks gets its own pool (attention TP {p.tp} → {max(1, p.tp // dp)}); "
                       "MoE/MLP stay tensor-parallel (docs/sglang.md#parallelism-flags)"]
        if p.shape is None or not p.bpt:
            sc = self._scenario(flag, cur, prop, p.pool_tokens, pools=dp, confidence="low")
            sc.assumptions = assumptions + ["upper bound: the attention weights each rank must now hold whole are unknown without --model-config"]
            sc.extra_flags = extra_flags
            return sc
        wb = p.attn_weight_bytes
        extra = attention_weight_gib_per_rank(p.shape, max(1, p.tp // dp), wb) - attention_weight_gib_per_rank(p.shape, p.attention_tp, wb)
        assumptions.append(f"attention weights replicated on each rank cost {extra:.1f} GiB more per rank "
                           + (f"({wb:.3g} B/param, the checkpoint's quantized attention)" if wb is not None else
                              f"({p.shape.model_dtype_bytes:g} B/param, the checkpoint dtype; quantized attention would cost less)"))
        budget = (p.kv_gib or p.pool_tokens * p.bpt / GIB) - extra
        budget_now = budget
        fraction_note = None
        if budget * GIB / p.bpt < 0.25 * p.pool_tokens and p.pre_gib and p.mem_fraction is not None:
            if fraction is None:
                f_best = self.best_mem_fraction()
                fraction = float(f_best.proposed) if f_best is not None else None
            if fraction is not None and fraction > p.mem_fraction:
                budget += (fraction - p.mem_fraction) * p.pre_gib
                fraction_note = f"{flags.spelling('mem_fraction_static', self.version)} {fraction:g}"
        per_rank = max(0, int(budget * GIB // p.bpt) // p.page_size * p.page_size)
        sc = self._scenario(flag, cur, prop, per_rank, pools=dp)
        sc.assumptions = assumptions + sc.assumptions
        sc.extra_flags = extra_flags + ([fraction_note] if fraction_note else [])
        sc.confidence = min_confidence(sc.confidence, "medium")
        if per_rank <= 0:
            sc.fits = False
            sc.risks.append(f"the replicated attention weights ({extra:.1f} GiB per rank) leave no KV budget.")
        else:
            sc.risks.append("the throughput projection extrapolates the observed step-time model, and DP attention changes "
                            "the step (gathers for the MoE layers) and needs more activation memory (SGLang's auto fraction "
                            "reserves about 4 GiB more for it, docs/sglang.md#mem-fraction-default).")
            if fraction_note:
                sc.risks.append(f"at the current fraction the replicated weights leave {budget_now:.1f} GiB of KV per rank "
                                f"(too little), so this projection includes {fraction_note}.")
            head = p.headroom_at(fraction) if fraction_note and fraction is not None else p.headroom_gib
            if head is not None:
                sc.headroom_gib = head
                if head - DP_ATTENTION_RESERVE_GIB < RISK_HEADROOM_GIB:
                    sc.risks.append(f"{head:.1f} GiB stays free after the pool; less about {DP_ATTENTION_RESERVE_GIB:g} GiB for DP "
                                    f"attention's buffers leaves {head - DP_ATTENTION_RESERVE_GIB:.1f} GiB: watch for OOM, and lower "
                                    "--chunked-prefill-size if it happens.")
        return sc

    def max_total_tokens(self, n: int) -> Scenario:
        """Lift (or set) the --max-total-tokens cap; SGLang keeps the profiled pool if the cap exceeds it (docs/sglang.md#oom)."""
        p = self.pool
        flag = flags.spelling("max_total_tokens", self.version)
        profiled = None
        if p.mem_fraction is not None and p.bpt:
            budget = p.budget_gib(p.mem_fraction)
            if budget is not None and budget > 0:
                profiled = int(budget * GIB // p.bpt) // p.page_size * p.page_size
        if self.state is not None and self.state.profiled_tokens:
            profiled = self.state.profiled_tokens  # the engine said it ("larger than the profiled value")
        per_rank = SM.effective_pool(profiled, n)[0] or n  # SGLang takes min(profile, cap)
        sc = self._scenario(flag, p.pool_tokens, n, per_rank)
        if profiled is None:
            sc.assumptions.append("the memory budget is unknown, so the cap is taken to fit; SGLang uses the profiled pool if it does not")
            sc.confidence = min_confidence(sc.confidence, "low")
        elif profiled < n:
            sc.risks.append(f"the memory budget holds only about {profiled:,} tokens per rank: SGLang keeps the profiled value.")
        else:
            sc.assumptions.append(f"the memory budget at the current fraction holds about {profiled:,} tokens per rank")
        return sc

    def max_running_requests(self, n: int) -> Scenario:
        p = self.pool
        flag = flags.spelling("max_running_requests", self.version)
        attn_dp = p.dp if p.dp_attention else 1
        eff, bound = SM.effective_max_running_requests(n, p.pool_tokens, p.context_len, self.version, attn_dp)
        per = eff if eff is not None else n
        cap = float(per * attn_dp) if p.dp_attention else float(per * p.pools)
        sc = self._scenario(flag, p.max_running_requests, n, p.pool_tokens, running_cap=cap)
        sc.assumptions.append("the pool is unchanged; only the slot cap moves")
        if bound in ("pool", "context") and eff is not None and eff < n // max(1, attn_dp):
            sc.assumptions.append(f"SGLang bounds it by {'pool // 2' if bound == 'pool' else 'the context-length slot estimate'} = "
                                  f"{eff:,} per worker ({SM.cite('max_running')})")
        return sc

    def context_length(self, n: int) -> Scenario:
        """A smaller context length raises the request-slot pool (clamp(pool / context × 512, 2048, 4096))."""
        p = self.pool
        flag = flags.spelling("context_length", self.version)
        pool = p.pool_tokens or 0
        slots = min(max(int(pool / max(1, n) * 512), 2048), 4096)
        cap = min(pool // 2, slots) if pool else slots
        sc = self._scenario(flag, p.context_len, n, p.pool_tokens, running_cap=float(cap * p.pools))
        sc.assumptions.append(f"effective max_running_requests becomes min(pool // 2, clamp(pool / {n} × 512, 2048, 4096)) = {cap} "
                              "when it is not set explicitly (docs/sglang.md#batching-flags); prompts longer than the new limit are refused")
        return sc

    def chunked_prefill_size(self, n: int) -> Scenario:
        p = self.pool
        flag = flags.spelling("chunked_prefill_size", self.version)
        sc = self._scenario(flag, p.chunked_prefill_size, n, p.pool_tokens, confidence="low")
        cost = ((n - (p.chunked_prefill_size or n)) * CHUNK_MIB_PER_TOKEN) / 1024
        if p.headroom_gib is not None:
            sc.headroom_gib = p.headroom_gib - cost
        sc.assumptions.append(f"activation memory ≈ {CHUNK_MIB_PER_TOKEN} MiB per chunk token ({cost:+.1f} GiB; docs/sglang.md#mem-fraction-default); "
                              "larger chunks admit long prompts faster but stall decode longer per chunk")
        return sc

    def max_prefill_tokens(self, n: int) -> Scenario:
        p = self.pool
        flag = flags.spelling("max_prefill_tokens", self.version)
        sc = self._scenario(flag, p.max_prefill_tokens, n, p.pool_tokens, confidence="low")
        sc.assumptions.append("one prefill batch may admit up to this many tokens; decode capacity is unchanged")
        return sc

    def schedule_conservativeness(self, c: float) -> Scenario:
        p = self.pool
        flag = flags.spelling("schedule_conservativeness", self.version)
        cur = p.schedule_conservativeness if p.schedule_conservativeness is not None else 1.0
        sc = self._scenario(flag, cur, c, p.pool_tokens, confidence="low")
        a, b = SM.new_token_ratio(cur), SM.new_token_ratio(c)
        sc.assumptions.append(f"initial new_token_ratio {a.init:.2f} → {b.init:.2f}, floor {a.floor:.3f} → {b.floor:.3f} "
                              f"({SM.cite('ratio')}): "
                              + ("fewer admissions, fewer retractions" if c > cur else "more admissions, higher usage, more retraction risk")
                              + "; requests with ignore_eos reserve their whole max_new_tokens either way")
        return sc

    def cuda_graph_max_bs(self, n: int) -> Scenario:
        p = self.pool
        flag = flags.spelling("cuda_graph_max_bs", self.version)
        cur = p.cuda_graph_max_bs
        sc = self._scenario(flag, cur, n, p.pool_tokens, confidence="low")
        per_bs = (p.graph_gib / cur) if (p.graph_gib and cur) else GRAPH_MIB_PER_BS / 1024
        cost = (n - (cur or n)) * per_bs
        if p.headroom_gib is not None:
            sc.headroom_gib = p.headroom_gib - cost
        src = "the captured graphs' measured memory" if (p.graph_gib and cur) else f"{GRAPH_MIB_PER_BS} MiB per batch size (docs/sglang.md#mem-fraction-default)"
        sc.assumptions.append(f"graph memory {cost:+.2f} GiB from {src}; decode batches above the captured size run eagerly (slower)")
        return sc

    def hicache(self, size_gb: float | None = None, ratio: float | None = None, ranks_on_host: int | None = None) -> Scenario:
        """HiCache host pool: fit in host RAM (keep 10 GiB free) and prefix reuse; decode concurrency unchanged."""
        p = self.pool
        flag = flags.spelling("hicache_size" if size_gb is not None else "hicache_ratio", self.version)
        ranks = ranks_on_host or max(1, p.tp * (p.dp if not p.dp_attention else 1))
        per_rank_tokens = None
        if size_gb is not None and p.bpt:
            per_rank_tokens = int(size_gb * 1e9 // p.bpt)
            host_gib = size_gb * 1e9 / GIB * ranks
        elif ratio is not None and p.pool_tokens and p.bpt:
            per_rank_tokens = int(p.pool_tokens * ratio)
            host_gib = per_rank_tokens * p.bpt / GIB * ranks
        else:
            host_gib = None
        sc = self._scenario(flag, None, size_gb if size_gb is not None else ratio, p.pool_tokens, confidence="medium")
        sc.gain = None
        sc.assumptions.append(
            "HiCache extends the prefix cache into host RAM: it raises reuse of shared prefixes (fewer prefill tokens), "
            "not the number of requests that can decode at once — the GPU pool and the running batch stay as they are")
        if per_rank_tokens is not None:
            sc.assumptions.append(f"host pool {per_rank_tokens:,} tokens per rank × {ranks} ranks on this host = {host_gib:,.0f} GiB host RAM")
        if host_gib is not None and p.host_mem_gib is not None:
            free = p.host_mem_gib - HOST_RESERVE_GIB
            if host_gib > free:
                sc.fits = False
                fit_gb = max(0.0, free / ranks * GIB / 1e9)
                sc.risks.append(f"needs {host_gib:,.0f} GiB of host RAM but only {free:,.0f} GiB may be used "
                                f"({p.host_mem_gib:,.0f} GiB − 10 GiB reserve); at most --hicache-size {fit_gb:.0f} per rank fits.")
        return sc

    # -- the ranked list for a saturated KV pool -----------------------------------------------------
    def for_kv_saturation(self, fraction: float | None = None) -> list[Scenario]:
        """DP attention, mem fraction, FP8 KV: those that fit without risk, by expected gain."""
        frac = self.mem_fraction(fraction) if fraction is not None else self.best_mem_fraction()
        pool_now = self.now().pool_tokens
        out = [s for s in (self.dp_attention(fraction=fraction), frac, self.kv_fp8())
               if s is not None and s.fits and not s.risky and s.pool_tokens != pool_now]  # a pinned pool does not grow
        out.sort(key=lambda s: -(s.gain if s.gain is not None else -1.0))
        return out

    def plan(self) -> list[Scenario]:
        """Every what-if that applies, for ``diagnose plan``."""
        p = self.pool
        out: list[Scenario | None] = [self.dp_attention(), self.best_mem_fraction(), self.kv_fp8()]
        if p.mem_fraction is not None and p.mem_fraction + 0.10 <= 0.99:
            hi = self.mem_fraction(round(min(MAX_FRACTION, p.mem_fraction + 0.10), 2))
            if not any(s is not None and s.change == hi.change for s in out):
                out.append(hi)
        if p.host_mem_gib is not None and p.bpt:
            out.append(self.hicache(ratio=2.0))
        done = [s for s in out if s is not None]
        done.sort(key=lambda s: (not s.fits, s.risky, -(s.gain if s.gain is not None else -1.0)))
        return done


__all__ = ["Planner", "Scenario", "Workload"]
