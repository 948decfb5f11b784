"""Bounded proposals shared by the admission rules: every value is bounded by what the pool holds, by the
demand seen (running + waiting while busy, with 25 % headroom) and by SGLang's own limits (pool // 2 for
--max-running-requests, v0.5.23 ``mem_cache/kv_cache_configurator.py`` ``resolve_max_num_reqs``), so the
same run gives the same value (within a power of two) from its log, one scrape, --url or Prometheus."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from diagnoser.model import Suggestion
from diagnoser.rules.admission import admission, dp_ranks, full_length, server_state_of
from diagnoser.rules.base import next_pow2, suggest

if TYPE_CHECKING:
    from diagnoser.rules.base import RuleContext

HEADROOM = 1.25  # demand headroom of a bounded proposal


def bounded_slots(ctx: RuleContext, cap: int, tpr: float | None) -> tuple[int | None, str]:
    """The slot cap to propose: what the pool holds at the observed tokens per request (0.9 x pool / tpr),
    bounded by the demand seen (running + waiting, x 1.25) and by SGLang's own bound (pool // 2), at
    least cap + 1; (None, why) when nothing above the cap is warranted."""
    a = admission(ctx)
    bounds: list[tuple[float, str]] = []
    if a.pool and tpr:
        bounds.append((0.9 * a.pool * dp_ranks(ctx) / tpr, f"the pool holds about {0.9 * a.pool * dp_ranks(ctx) / tpr:,.0f} requests at {tpr:,.0f} tokens each"))
    dem = a.demand(90)
    mq = ctx.cfg("arg.max_queued_requests")
    full_queue = isinstance(mq, int | float) and mq > 0 and len(a.queue) and float(a.queue.max()) >= mq
    if dem and full_queue:  # the queue limit turned the rest away: the demand seen is a floor
        bounds.append((2 * dem * HEADROOM, f"{dem:,.0f} requests were in flight while --max-queued-requests {int(mq)} turned more away "
                       "(twice that, with 25 % headroom)"))
    elif dem:
        bounds.append((dem * HEADROOM, f"{dem:,.0f} requests were in flight (running + waiting, 90th percentile while busy), with 25 % headroom"))
    if a.pool and ctx.mech.reserves_output:
        bounds.append((a.pool // 2 * dp_ranks(ctx), "SGLang bounds the cap by pool // 2"))
    elif a.pool:  # vLLM admits into the pool and preempts the requests it cannot grow (v1/core/sched/scheduler.py)
        full = full_length(ctx) or tpr
        if full:
            bounds.append((a.pool * dp_ranks(ctx) / full, f"the KV pool holds about {a.pool * dp_ranks(ctx) / full:,.0f} requests at their full "
                           f"length ({full:,.0f} tokens): beyond that vLLM preempts running requests"))
        mnbt = ctx.cfg("max_num_batched_tokens")
        if isinstance(mnbt, int | float) and not isinstance(mnbt, bool) and mnbt > 0:
            bounds.append((float(mnbt), f"vLLM requires --max-num-batched-tokens ({int(mnbt):,}) >= --max-num-seqs"))
    if not bounds:
        return None, ""
    value, why = min(bounds, key=lambda b: b[0])
    v = int(value)
    v = v - v % 8 if v >= 16 else v
    if v <= cap:
        return None, why
    return v, why


def bounded_pool(ctx: RuleContext, pool: int, full: float | None) -> int:
    """The pool to propose: the requests in flight at their full length with 10 % to spare, at least twice
    the pool, to the next power of two. In flight is the 90th percentile of running + waiting while busy,
    as for the slot cap: the sum of the two medians under-counts a closed loop's clients (a reading falls
    between a request's end and the next one's arrival) and moved with the window, so two windows of one
    run sized one pool 32 and 64 blocks on the real vLLM engine."""
    a = admission(ctx)
    dem = a.demand(90)
    want = dem * full / 0.9 / dp_ranks(ctx) if full and dem else 0.0
    return next_pow2(max(want, 2 * pool))



def pool_suggestions(ctx: RuleContext, pool: int | None) -> list[Suggestion]:
    """kv_saturation's changes: the --max-total-tokens cap when it (not memory) sizes the pool, bounded by
    the demand seen; else a larger static fraction (not on CPU, not with 6 GB or less free) and FP8 KV;
    for a hybrid SWA model whose full pool is full and its SWA pool half empty, a lower
    --swa-full-tokens-ratio."""
    if ctx.mech.name == "vllm":
        return vllm_pool_suggestions(ctx, pool)
    state = server_state_of(ctx)
    pinned, pinned_why = state.pool_pinned()  # SGLang takes min(profile, --max-total-tokens)
    cap_tokens = state.cap_tokens or (pool if pinned else None)
    if pinned and cap_tokens and pool:
        proposed = bounded_pool(ctx, pool, full_length(ctx))
        why = (f"the pool is capped by --max-total-tokens {int(cap_tokens):,}, not by GPU memory" if state.cap_tokens else
               f"the pool is not sized by memory: {pinned_why}")
        out = [suggest(ctx, "max_total_tokens", int(cap_tokens), proposed, why,
                       f"about {proposed / pool:.1f}x the KV slots, so roughly that many more requests can decode at once",
                       ("the device has memory free for the larger pool (the cap, not memory, sized it)",))]
        more = compound_after_pool(ctx, out[0], proposed)
        return [replace(out[0], effect=more[0]), more[1]] if more else out
    out: list[Suggestion] = []
    mfs = ctx.cfg("mem_fraction_static") or ctx.cfg("arg.mem_fraction_static")
    avail = ctx.cfg("available_gpu_mem_gb")
    if ctx.cfg("device") != "cpu" and not (avail is not None and avail <= 6):
        known = isinstance(mfs, int | float)
        out.append(suggest(ctx, "mem_fraction_static", mfs if known else None, round(min(float(mfs) + 0.04, 0.95), 2) if known else "current + 0.03 to 0.05",
                           "a larger static fraction grows the KV pool" + ("" if known else "; the current value is not in the inputs (pass the startup log or --url for server info)"),
                           "each +0.01 adds about 1 % of the GPU's free memory to the pool (docs/sglang.md#kv-budget); the capacity model gives the tokens",
                           ("keep 5–8 GB free for activations and graphs (available_gpu_mem in the summary line)",)))
    if ctx.cfg("device") != "cpu":
        dtype = ctx.cfg("kv_cache_dtype") or ctx.cfg("arg.kv_cache_dtype")
        if dtype in (None, "auto", "bf16", "float16", "bfloat16", "fp16"):
            out.append(suggest(ctx, "kv_cache_dtype", dtype, "fp8_e4m3", "an 8-bit KV cache stores twice the tokens in the same memory",
                               "about 2x the KV slots at the same memory fraction", ("the model tolerates fp8 KV (check quality on your evals)",)))
    full, swa = ctx.stats("full_token_usage"), ctx.stats("swa_token_usage")
    if full["max"] is not None and swa["max"] is not None and full["max"] >= ctx.thresholds["usage_high"] and swa["max"] < 0.5:
        ratio = ctx.cfg("swa_full_tokens_ratio") or ctx.cfg("arg.swa_full_tokens_ratio")
        factor = max(swa["max"] / 0.5, 0.1)
        out.append(suggest(ctx, "swa_full_tokens_ratio", ratio, round(float(ratio) * factor, 2) if isinstance(ratio, int | float) else f"about {factor:.2f} x the current ratio",
                           f"the full-attention pool is full ({full['max']:.2f}) while the sliding-window pool is at most {swa['max']:.2f} used",
                           "moves memory from the SWA pool to the full-attention pool, so more long requests fit",
                           ("the SWA pool stays below about half full at the new ratio",)))
    return out


def vllm_pool_suggestions(ctx: RuleContext, pool: int | None) -> list[Suggestion]:
    """vLLM's ways to a larger KV pool. ``--num-gpu-blocks-override`` when it (not memory) sized the pool,
    bounded by the demand seen; else ``--gpu-memory-utilization`` (the share of the WHOLE GPU that weights,
    activations and KV may take: the KV pool gets what is left of total x utilization after the profiled
    weights and activations, vllm/v1/worker/gpu_worker.py ``determine_available_memory``), never above
    0.95, not on CPU (its KV space is ``VLLM_CPU_KVCACHE_SPACE``); and FP8 KV (``--kv-cache-dtype fp8``:
    half the bytes per token). The full memory model is engines/vllm/memory.py's (the capacity plan)."""
    out: list[Suggestion] = []
    cpu = str(ctx.cfg("device") or "").lower() == "cpu"
    override, bs = ctx.cfg("num_gpu_blocks_override"), ctx.cfg("block_size")
    if isinstance(override, int | float) and override > 0 and isinstance(bs, int | float) and bs > 0 and pool:
        full = full_length(ctx)
        # vLLM gives a request whole blocks (KVCacheManager.allocate_slots: cdiv(tokens, block_size)), so a
        # request of 175 tokens holds 2 blocks of 128: sized in tokens, 16 of them "fit" 32 blocks exactly
        # and the pool stayed full on the real engine
        held = math.ceil(full / int(bs)) * int(bs) if full else None
        want = bounded_pool(ctx, pool, held)
        blocks = int(-(-want // int(bs)))
        out.append(suggest(ctx, "num_gpu_blocks_override", int(override), blocks,
                           f"--num-gpu-blocks-override {int(override)} sizes the pool ({int(override)} blocks of {int(bs)} tokens = {pool:,} tokens), not memory",
                           f"about {blocks * int(bs) / pool:.1f}x the KV tokens, so fewer preemptions and more requests decoding at once",
                           ("the device has memory for the larger pool (drop the override to let vLLM size it from memory)",)))
        return out
    if cpu:
        return out  # the CPU pool is VLLM_CPU_KVCACHE_SPACE (an environment variable, not a flag): said in the docs, not proposed
    gmu = ctx.cfg("gpu_memory_utilization")
    known = isinstance(gmu, int | float) and not isinstance(gmu, bool)
    cur = float(gmu) if known else 0.9  # EngineArgs default (vllm/engine/arg_utils.py)
    if cur < 0.95:
        proposed = round(min(cur + 0.05, 0.95), 2)
        effect, assumptions = "each +0.01 adds about 1 % of the GPU's total memory to the KV pool", ["no other process uses the GPU's remaining memory"]
        wif = ctx.mech.memory_what_if(ctx.cfg, ctx.flag("gpu_memory_utilization"), float(gmu), proposed, ctx.version) if known else None
        if wif:  # the engine's memory arithmetic, from the start-up lines (a lower bound: the device's total is not logged)
            now, gained = int(wif["tokens_now"]), int(wif["tokens_gained"])
            effect = (f"KV pool {now:,} → at least {now + gained:,} tokens (+{gained:,}, {gained / now:.0%}; a lower bound): {wif['how']} "
                      f"({wif['cites']})")
            assumptions = list(wif["assumptions"]) + assumptions
        out.append(suggest(ctx, "gpu_memory_utilization", gmu if known else None, proposed if known else "current + 0.05, at most 0.95",
                           "--gpu-memory-utilization is the share of the whole GPU vLLM may use for weights, activations and KV; the KV pool "
                           "gets what the profiled weights and activations leave of it" + ("" if known else "; the current value is not in the inputs "
                                                                                          "(vLLM's default is 0.9)"),
                           effect, tuple(assumptions)))
    dtype = ctx.cfg("kv_cache_dtype")
    if dtype in (None, "auto", "bf16", "float16", "bfloat16", "fp16"):
        out.append(suggest(ctx, "kv_cache_dtype", dtype, "fp8", "an 8-bit KV cache stores twice the tokens in the same memory",
                           "about 2x the KV tokens at the same --gpu-memory-utilization", ("the model tolerates fp8 KV (check quality on your evals)",)))
    return out


def seqs_cut(ctx: RuleContext, ref: Any) -> list[Suggestion]:
    """The running-request cap down to what the pool holds, when the engine's own KV test says the pool
    could not take one more of the running requests (``ref``: :class:`~diagnoser.rules.admission.FullPool`)
    and more work than that was in flight. Only on an engine that reserves nothing for future output (vLLM:
    it admits into the pool and preempts, recomputing, the running requests that cannot grow;
    v1/core/sched/scheduler.py, core/scheduler.py). The value is what the pool holds at the running
    requests' size (running / usage, the median over the refused readings), and at most at their full length (pool /
    mean prompt + output of the finished requests) when that is known: an upper bound, as they still grow."""
    if ctx.mech.reserves_output or not ref.fit or not ref.n_full:
        return []
    a = admission(ctx)
    fit, how = ref.fit, f"the pool holds about {ref.fit:,.1f} requests at the running requests' size when it refused (running / usage, median)"
    foot = a.full_length()
    if a.pool and foot and a.pool / foot < fit:  # the cap is per engine (one DP rank's scheduler), like the pool
        fit = a.pool / foot
        how = f"the pool of {a.pool:,} tokens holds about {fit:,.1f} requests at their full length ({foot:,.0f} tokens, mean prompt + output)"
    n = max(int(fit), 1)
    busy = (a.label != "report") & ((a.running > 0) | (a.queue > 0))
    inflight = float(np.max(a.running[busy] + a.queue[busy])) / dp_ranks(ctx) if np.any(busy) else 0.0  # per rank
    if inflight < n or (a.cap and not a.cap_inferred and n >= a.cap):
        return []  # the cap would not bind on the work seen, or it is already as low
    cur = a.cap if a.cap and not a.cap_inferred else None
    per = ", per DP rank" if dp_ranks(ctx) > 1 else ""
    why = (f"{how}, and up to {inflight:,.0f} requests were in flight (running + waiting{per}): {ctx.word('engine')} admits them into the pool and "
           f"{ctx.word('preempt')}s running requests that cannot get a block" + ("" if cur else
           "; the current value is not in the inputs (vLLM's API server defaults to 256, 1024 on a GPU of 70 GiB or more that is not an A100, "
           "128 per CPU rank)"))
    effect = (f"at most {n} requests run at once, about what the pool holds: the rest wait in the queue instead of being admitted "
              f"into a full pool and {ctx.word('preempted')} (recomputed) as they grow" if inflight > n else
              f"the {n} requests in flight already fill the pool: a cap of {n} keeps any further request out of it instead of "
              f"{ctx.word('preempt')}ing running ones for it")
    return [suggest(ctx, "max_running_requests", cur, n, why, effect,
                    ("the requests still grow by their output: fewer fit at full length, so lower it further if preemptions continue",
                     "with a larger pool (the changes above), size it again for the new pool"))]


def compound_after_pool(ctx: RuleContext, first: Suggestion, new_pool: int) -> list[Any]:
    """Compound limits, in SGLang's order (the slots are tested before the KV): when the larger pool holds
    more requests than the slot cap admits and the demand wants more, the cap binds next. The pool's change
    says so, with the combined projection, and the cap's change follows it: [the pool change's effect, the
    cap's change], or [] when the cap does not bind next."""
    a = admission(ctx)
    full = full_length(ctx)
    if not a.cap or a.cap_inferred or not full:
        return []
    fit = new_pool * dp_ranks(ctx) / full
    dem = a.demand(90)  # in flight as bounded_pool counts it
    running = float(np.median(a.running[a.running > 0])) if np.any(a.running > 0) else 0.0
    if not (a.cap < fit and a.cap < dem):
        return []
    both = int(min(fit, dem))
    cap = next_pow2(both) if both > a.cap else a.cap + 1
    cap = min(cap, new_pool // 2 * dp_ranks(ctx))
    effect = (f"running {running:.0f} → {a.cap} (then --max-running-requests {a.cap} binds: SGLang tests the slots before the KV); "
                    f"with --max-running-requests {cap} too, running → about {both} (the pool holds {fit:,.0f} at {full:,.0f} tokens each, "
                    f"{dem:,.0f} were in flight)")
    return [effect, suggest(ctx, "max_running_requests", a.cap, cap,
                            f"after the pool grows to {new_pool:,} tokens it holds about {fit:,.0f} requests at full length, but the cap admits {a.cap}",
                    f"together with --max-total-tokens {new_pool:,}: running → about {both}",
                    ("apply together with the pool change",))]


def compound_after_slots(ctx: RuleContext, cap: int, proposed: int) -> list[Suggestion]:
    """The other order: a larger slot cap that the pool, at the requests' full length, cannot hold; when
    --max-total-tokens (not memory) sizes the pool, the pool's change that lets the new cap run."""
    a = admission(ctx)
    full = a.full_length() if not a.estimated else None  # the finished requests' own sizes only
    state = server_state_of(ctx)
    pinned, _ = state.pool_pinned()
    if not a.pool or not full or not pinned:
        return []
    fit = a.pool * dp_ranks(ctx) / full
    if proposed <= fit:
        return []
    pool = next_pow2(proposed * full / 0.9 / dp_ranks(ctx))
    return [suggest(ctx, "max_total_tokens", state.cap_tokens or a.pool, pool,
                    f"at {full:,.0f} tokens per request the pool holds about {fit:,.0f}: above that the pool binds after the cap (cap {cap} → {proposed})",
                    f"together with --max-running-requests {proposed}: running → about {proposed} (both limits raised)",
                    ("apply together with the cap change", "the device has memory free for the larger pool"))]
