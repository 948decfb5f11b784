"""The KV pool is the limit: token usage stays near capacity while requests wait or decode retracts.

What it detects:
    Readings with a waiting queue that the shared admission model (`diagnoser/rules/admission.py`, see
    [admission and `new_token_ratio`](docs/sglang.md#batching-flags)) leaves to the KV test — no PD
    transfer, state pool, slot cap or prefill budget held them, in the order SGLang's
    `get_new_batch_prefill` tests them at v0.5.23 — and where the next request does not fit: its prompt +
    min(output, 4096) + a page is more than free + evictable KV less what the running requests still
    reserve (their remaining output x `new_token_ratio`; `PrefillAdder.add_one_req` returns `NO_TOKEN`).
    The sizes are the finished requests' mean prompt and output (token and request counters), else
    estimated from the readings (uncached tokens per admitted request in the Prefill lines; output = 2 x
    (tokens a running request holds - prompt)); without either, or when they are only estimated (no
    request finished: a cohort admitted together is early in its output, and `ignore_eos` requests
    reserve all of theirs), a running count held at one value below the slot cap while requests keep
    waiting and no budget binds is the reservation (inferred). So usage can read 0.6 while nothing more
    fits. As a fallback for inputs without the numbers: token usage
    (`sglang:token_usage` or `token usage:`; the worst pool for hybrid models) at or above `usage_high`
    (0.95), or `waiting_usage` (0.9) with more than `deep_queue` (2000) waiting. It fires when such
    readings are at least `min_share` (60 %) of the readings with a queue; or when decode retracts
    requests (retraction lines or counters) while requests wait or the pool is full in `min_share` of the
    readings, with a sampled usage peak of at least `retract_usage_floor` (0.75): a retraction is
    SGLang's own statement that the pool ran out ([retraction](docs/sglang.md#retraction)), and usage
    read every few seconds is a saw-tooth that misses the full moments. With no usage reading at all, a
    retraction line or `Decode out of memory` is the finding (low confidence). A server at its slot cap
    is left to `max_running_requests_cap` (SGLang tests the slots first). One reading judges (a pasted
    line, one scrape), at low confidence.

Why it matters:
    Every admitted request needs KV slots for its whole context. When the pool is full, the scheduler
    cannot admit more requests however many the client sends, so throughput is capped by pool size,
    not by compute; requests that cannot grow are retracted and recomputed.

Evidence:
    token_usage (peak, and the share of waiting points at or above the threshold), queue_reqs,
    running_reqs against max_running_requests, the pool size and retraction events; every number
    cites the log line or scrape that shows it.

    On each engine. On SGLang: token usage (`sglang:token_usage`, `token usage:` in the Decode line), the
    queue (`#queue-req`, `sglang:num_queue_reqs`), retractions (the retract line,
    `sglang:num_retracted_reqs`), `new_token_ratio` and the Prefill line's request sizes. On vLLM: usage
    from `vllm:kv_cache_usage_perc` (V1; `vllm:gpu_cache_usage_perc` before the rename and on V0) or `GPU
    KV cache usage: X%` in the stats line, the queue from `vllm:num_requests_waiting` or
    `Waiting:`/`Pending: M reqs`, preemptions (vLLM's retraction) from `vllm:num_preemptions_total`, the
    stats line's `Preemptions: P` (0.32) and V0's preemption warning. The admission test is the engine's
    own (`ctx.mech`): SGLang's `PrefillAdder` reservation arithmetic, vLLM's free-block test
    (`kv_cache_manager.allocate_slots`: the next prompt's blocks against the free blocks, nothing reserved).

    vLLM's refusal. On vLLM the mechanism also answers, per reading at usage >= `waiting_usage` (0.9), why
    the pool takes no further request of the running requests' mean size (usage x pool / running):
    `kv_full`, fewer free blocks than it needs, or `kv_watermark`, its blocks are free but not beside the
    blocks admission keeps free. The reserve depends on the engine core (the `vllm_engine` fact, V0 or V1,
    from the stats line's shape, the start-up line or V0/V1-only series): V0's `BlockSpaceManager` keeps 1 %
    of the blocks (`vllm/core/block_manager.py` `can_allocate` at v0.2.7 and v0.10.2), V1's `KVCacheManager`
    none (`vllm/v1/core/kv_cache_manager.py` at v0.10.2; `--watermark`, 0 by default, at 0.32.0). A
    refused reading with a queue is a KV-held reading. V1 admits a request while its first chunk's blocks
    are free and preempts a running request when another cannot get a block
    (`vllm/v1/core/sched/scheduler.py`), so its full pool need not show a queue: on V1 the finding holds
    when the refusal covers `min_share` of the busy readings at usage >= 0.9 and requests waited, were
    preempted, or the refusal covers `min_share` of all busy readings. On either core it also holds when
    the latest busy reading is refused and, in `min_share` of the readings with a queue, the requests in
    flight (running + waiting) are more than the pool holds at the running requests' size.

Fix:
    Grow the pool or shrink per-token cost: raise `--mem-fraction-static` while keeping 5–8 GB free
    for activations and graphs (SGLang's tuning guide: `available_gpu_mem` 5–8 GB is right); when the pool is
    capped by `--max-total-tokens`, raise that cap, to the next power of two that holds the requests in
    flight (median running + median waiting over the readings with work, idle stretches left out, with
    25 % headroom) at their full length with 10 % to spare, and at least twice the pool; `--kv-cache-dtype fp8_e4m3` doubles tokens per
    byte; for hybrid SWA models whose full-attention pool is full while the SWA pool is nearly empty,
    lower `--swa-full-tokens-ratio`; for MLA models at TP > 1, DP attention gives each rank its own
    pool (the capacity model adds the numbers). HiCache does not help here: it grows the prefix cache,
    not the decode pool. `--cpu-offload-gb` is never suggested: it slows every step.

    On vLLM: `--num-gpu-blocks-override` when it sized the pool; else `--gpu-memory-utilization` + 0.05 (at
    most 0.95; not on the CPU build, nor under `--kv-cache-memory-bytes` or a block override, where vLLM
    does not read it). When the current value and the start-up lines "Available KV cache memory" and the KV
    cache size are in the log, the KV tokens it gains are sized by vLLM's budget (`total x utilization` less
    weights, activations and non-torch memory, `determine_available_memory`): the device holds at least
    (weights + KV) / utilization, so the gain is a lower bound. Then `--kv-cache-dtype fp8`. When the
    refusal holds and as many requests or more were in flight, `--max-num-seqs` down to what the pool holds
    at the running requests' size (running / usage, the median over the refused readings), or at their full length
    when the finished requests give it: above it vLLM admits into a full pool and preempts.

Known false positives:
    Usage above 0.9 with a short or empty queue is SGLang's own definition of healthy ([tuning
    guide](docs/sglang.md#tuning-guide)); this rule needs waiting requests or retractions as well, and the
    default threshold is 0.95, above the guide's 0.9. A few requests with runaway outputs can fill the pool
    by themselves; then flag changes do not help and none are proposed (see `runaway_generation`). The
    footprint path uses the mean length of the requests that finished in the window: when only a few short
    requests finished, or lengths vary widely, the estimate is rough (confidence low), and it needs requests
    waiting in most readings as well.
    On vLLM V1 a full pool with nothing waiting is found when the mechanism says it takes no more requests of
    the running ones' size: many small requests at 0.92 usage leave room for more and are not.

References:
    - How diagnoser reads SGLang: [`token_usage` and `num_used_tokens`](docs/sglang.md#metrics-scheduler),
      [the Decode batch line](docs/sglang.md#decode-line), [retraction lines](docs/sglang.md#retraction),
      [KV-pool sizing](docs/sglang.md#kv-sizing), [admission and
      `new_token_ratio`](docs/sglang.md#batching-flags), [SGLang's tuning
      guide](docs/sglang.md#tuning-guide), [from signals to a bottleneck](docs/sglang.md#bottlenecks).
    - SGLang's [hyperparameter tuning
      guide](https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html).
    - Real cases: issue [#2746](https://github.com/sgl-project/sglang/issues/2746) (outputs without a bound
      fill the pool), issue [#26248](https://github.com/sgl-project/sglang/issues/26248) (a hybrid-SWA pool
      pinned at 1.00), and two recorded SGLang 0.5.23 CPU runs: `examples/kv-full-retract.dgb` and an
      engine-bound model whose pool fills (`tests/data/sglang-cpu-real/medium-engine-bound-kv-full`).
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.admission import (
    admission,
    dp_ranks,
    fit_at_full_length,
    full_pool,
    kv_reason,
    retraction_count,
    retractions,
)
from diagnoser.rules.base import (
    Rule,
    RuleContext,
    ev,
    evidence,
    fmt_int,
    pool_name,
    pool_phrase,
    tokens_per_request,
)
from diagnoser.rules.columns import arrays
from diagnoser.rules.er01_oom import oom_detail
from diagnoser.rules.proposals import pool_suggestions, seqs_cut

__all__ = ["KVSaturation", "dp_ranks", "retraction_count", "retractions"]  # the last three: shared with kv02, compare, tests


# the flags whose proposal sizes the pool for the demand seen (proposals.bounded_pool): where one is
# proposed, the pool can hold the requests in flight and a cut of the running cap would only hold it back.
# A memory share (+0.05 of the GPU) or FP8 KV grows the pool by a bounded factor that need not cover the
# demand, so the cut stays beside them, as vLLM's own tuning guide names both.
DEMAND_SIZED = ("num_gpu_blocks_override", "max_total_tokens")


def _grows_pool(ctx: RuleContext, flag: str) -> bool:
    """Whether a suggestion's flag sizes the pool for the demand seen."""
    for concept in DEMAND_SIZED:
        try:
            if ctx.flag(concept) == flag:
                return True
        except KeyError:  # the engine has no such flag
            continue
    return False


class KVSaturation(Rule):
    name = "kv_saturation"
    code = "KV01"
    title = "KV pool full"
    severity = Severity.WARNING
    needs = ("token_usage",)
    reads = ("token_usage",)
    events = ("retraction", "oom")
    defaults = {"usage_high": 0.95, "waiting_usage": 0.9, "deep_queue": 2000, "min_share": 0.6, "min_points": 1, "critical_share": 0.9,
                "few_requests": 4, "retract_usage_floor": 0.75, "arithmetic": 1}
    threshold_help = {
        "usage_high": "token usage at or above this counts as full when the sizes for the reservation arithmetic are missing (0-1)",
        "waiting_usage": "token usage at or above this counts as full while more than deep_queue requests wait (0-1)",
        "deep_queue": "waiting requests above which usage from waiting_usage counts as full (the tuning guide's healthy queue ends at 2000)",
        "min_share": "share of the readings with a queue that must be held by KV",
        "min_points": "fewest usage readings needed to judge (one reading judges, at low confidence)",
        "critical_share": "share of full readings that makes it critical when requests also wait and decode retracts",
        "few_requests": "a pool filled by this many requests or fewer is left to runaway_generation (no flag advice)",
        "retract_usage_floor": "with retractions (the pool ran out) and waiting requests, the sampled usage peak needed (0-1)",
        "arithmetic": "1: the admission model's reservation arithmetic decides; 0: only the usage thresholds",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        got = arrays(ctx, "token_usage")  # (NaNs dropped; the pass's column, which the admission model reads too)
        vals = got[1] if got is not None else np.zeros(0)
        if not len(vals) or len(vals) < t["min_points"]:
            return self._ran_out(ctx) if not len(vals) else None
        a = admission(ctx)
        if a.cap and a.share("slots") >= 0.5:
            return None  # the slot cap binds first (max_running_requests_cap)
        peak, high = float(vals.max()), t["usage_high"]
        wait_high = min(high, t["waiting_usage"])
        n_wait = a.n_wait
        if n_wait:
            with np.errstate(invalid="ignore"):
                by_usage = (a.usage >= high) | ((a.usage >= wait_high) & (a.queue > t["deep_queue"]))  # (NaN usage: False)
            arith = a.kv_arith if t["arithmetic"] else np.zeros(len(a.open), dtype=bool)
            kv = a.open & (by_usage | arith)
            wshare = float(np.count_nonzero(kv)) / n_wait
            deep = bool(np.count_nonzero(kv & by_usage & ~(a.usage >= high)))
            only_arith = not np.count_nonzero(kv & by_usage)  # then requests must also wait in most readings (a brief queue is no limit)
        else:  # no reading with a queue: none is open to a KV test
            by_usage, kv, wshare, deep, only_arith = None, a.open, 0.0, False, True
        n_retract, retract_src = retraction_count(ctx)
        fshare = float(np.count_nonzero(vals >= high)) / len(vals)
        path_kv = n_wait > 0 and wshare >= t["min_share"] and (not only_arith or np.count_nonzero(a.queue > 0) >= t["min_share"] * len(a.queue))
        path_retract = n_retract > 0 and peak >= t["retract_usage_floor"] and (n_wait > 0 or fshare >= t["min_share"])
        ref = full_pool(ctx, a, n_wait, n_retract)
        path_full = ref is not None and ref.holds
        if not (path_kv or path_retract or path_full):
            return None
        only_arith = only_arith and path_kv
        refused_kv = a.refusal is not None and bool(np.count_nonzero(kv & (a.refusal != "")))  # the engine's refusal held queued readings
        running, queue = ctx.stats("running_reqs"), ctx.stats("queue_reqs")
        pool, pool_src = a.pool, a.pool_src
        evs = [ev(ctx, "token_usage", peak, (wait_high if deep else high) if peak >= high or (path_kv and not only_arith) else
                  t["retract_usage_floor"] if path_retract else t["waiting_usage"] if path_full else None, at="max")]
        parts = [f"KV token usage peaked at {peak:.2f}"]
        if ref is not None and (path_full or refused_kv):
            parts.append(ref.sentence(ctx, evs, why_no_queue=not path_kv))
        if path_kv:
            src = a.sources[int(kv.nonzero()[0][0])]
            evs.append(evidence("share of readings with a queue where the next request did not fit the KV pool", round(wshare, 2), t["min_share"],
                                ctx.window_text(), src))
            if only_arith and refused_kv:
                parts.append(f"the next request did not fit in {wshare:.0%} of the {n_wait} reading(s) with a queue")
            elif only_arith:
                parts.append(kv_reason(ctx, a, wshare, n_wait, evs))
            else:
                parts.append(f"it was >= {wait_high if deep else high:.2f} (or the next request did not fit) while requests waited in {wshare:.0%} "
                             f"of the {n_wait} reading(s) with a queue"
                             + (f" (more than {t['deep_queue']:,} waiting: admission also reserves room for the running requests' remaining output, "
                                "so the queue forms before usage reads 1.0)" if deep else ""))
        if queue["max"]:
            evs.append(ev(ctx, "queue_reqs", queue["max"], "> 0", at="max"))
            parts.append(f"up to {queue['max']:.0f} requests waited")
        if running["n"]:
            evs.append(ev(ctx, "running_reqs", running["p50"], a.cap, at="last"))
            ran = f"{running['max']:.0f}" if running["min"] == running["max"] else f"{running['min']:.0f}–{running['max']:.0f}"
            parts.append(f"{ran} ran" + (f" of {a.cap} slots" if a.cap else ""))
        if pool:
            evs.append(evidence(pool_name(ctx), pool, None, "", pool_src))
            parts.append(pool_phrase(pool, pool_src))
        if n_retract:
            evs.append(evidence(f"{ctx.word('preemption')} events", n_retract, None, ctx.window_text(), retract_src))
            parts.append(f"{n_retract} {ctx.word('preemption')} event(s)" + ("" if peak >= high else
                         f" — {ctx.word('engine')} {ctx.word('preempt')}s only when the pool cannot hold the next decode tokens, "
                         "so the pool ran out between the readings"))
        ushare = float(np.count_nonzero(kv & by_usage)) / n_wait if n_wait else 0.0  # critical: the pool reads full, not only reserved
        crit = (ushare >= t["critical_share"] or fshare >= t["critical_share"]) and n_wait > 0 and n_retract > 0
        conf = "high" if path_kv and path_retract else "low" if only_arith and not path_retract else "medium"
        if path_full and not (path_kv or path_retract):
            conf = "medium" if ref is not None and ref.n_full >= 3 else "low"
        tpr, _ = tokens_per_request(ctx)
        foot, _fit = fit_at_full_length(ctx)
        tpr = max(tpr or 0.0, foot or 0.0) or None
        few = running["p50"] is not None and running["p50"] <= t["few_requests"] and pool and tpr and tpr * max(running["p50"], 1) >= 0.8 * pool
        notes: list[str] = []
        if few:
            notes.append(f"{running['p50']:.0f} request(s) hold the whole pool (about {fmt_int(tpr)} tokens each): "
                         "bound max_tokens on the client first (see runaway_generation); no flag change is proposed.")
        sugg = [] if few else pool_suggestions(ctx, pool)
        # the cap cut is for a pool that no proposal sizes for the demand: where one does (the block-count
        # override), that is the fix (more requests decode at once) and a cut sized on today's pool would hold
        # the larger pool back
        if not few and ref is not None and ref.n_full and not any(_grows_pool(ctx, x.flag) for x in sugg):
            sugg += seqs_cut(ctx, ref)
        return self.finding(ctx, "; ".join(parts) + ".", evs, sugg, confidence=conf, severity=Severity.CRITICAL if crit else self.severity, notes=notes)

    def _ran_out(self, ctx: RuleContext) -> Finding | None:
        """No usage reading: SGLang's own statement that the pool ran out — a retraction line (decode
        needed more slots than free + evictable) or a decode allocation failure — is the finding."""
        n_retract, retract_src = retraction_count(ctx)
        dec = [e for e in ctx.events_of("oom") if e.fields.get("phase") == "decode" and not e.fields.get("device_memory")]
        if not n_retract and not dec:
            return None
        evs, parts = [], []
        if n_retract:
            evs.append(evidence(f"{ctx.word('preemption')} events", n_retract, None, ctx.window_text(), retract_src))
            parts.append(f"{n_retract} retraction line(s): SGLang retracts running requests only when decode needs more KV slots than are free or evictable"
                         if ctx.mech.reserves_output else
                         f"{n_retract} preemption(s): vLLM preempts a running request only when another cannot get a KV block")
        if dec:
            e = dec[0]
            evs.append(evidence("decode out of memory", str(e.fields.get("text", ""))[:120], None, "", e.source))
            d = oom_detail(ctx, e)
            txt = "decode could not allocate KV slots for the next tokens (\"Decode out of memory\")"
            if d.get("available") is not None:
                txt += (f": {fmt_int(d['available'])} free and {fmt_int(d.get('evictable', 0))} evictable token(s)"
                        + (f" for {fmt_int(d['requested'])} requested" if d.get("requested") is not None else ""))
                evs.append(evidence("free KV tokens at the failure", d["available"], None, "", d.get("source", "")))
            parts.append(txt)
        pool, pool_src = admission(ctx).pool, admission(ctx).pool_src
        if pool:
            evs.append(evidence(pool_name(ctx), pool, None, "", pool_src))
            parts.append(pool_phrase(pool, pool_src))
        notes = ["No token-usage reading is in the inputs: the pool is judged from SGLang's own message; "
                 "a Decode batch line or a /metrics scrape would show how often it is full."] if ctx.mech.reserves_output else [
                 "No KV usage reading is in the inputs: the pool is judged from vLLM's preemptions; its stats line or a /metrics scrape "
                 "would show how often it is full."]
        kinds = ([ctx.word("preemption")] if n_retract else []) + (["decode out of memory"] if dec else [])
        return self.finding(ctx, "The KV pool ran out: " + "; ".join(parts) + ".", evs, pool_suggestions(ctx, pool),
                            confidence="low" if n_retract + len(dec) <= 1 else "medium", notes=notes,
                            basis={"events": n_retract + len(dec), "kind": ", ".join(kinds)})
