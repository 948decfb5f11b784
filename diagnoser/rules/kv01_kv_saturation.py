"""The KV pool is the limit: token usage stays near capacity while requests wait or decode retracts.

What it detects:
    Token usage (`sglang:token_usage` or `token usage:` in Decode/Prefill lines; for hybrid models the worst
    of the full/SWA/Mamba pools) at or above `usage_high` (default 0.95) while requests wait (`queue_reqs` >
    0 on the same line or scrape) in at least `min_share` (default 60 %) of the points where both were read
    (from `waiting_usage`, 0.9, when more than `deep_queue` (2000) wait: beyond the tuning guide's healthy
    queue, admission's reservation for the running requests' remaining output fills the pool before usage
    reads 1.0); or decode retracting requests (retraction lines or counters) while requests wait or the pool
    is full in `min_share` of the window. A retraction is SGLang's own statement that the pool ran out ("KV
    cache pool is full. Retract requests": decode needed more slots than free + evictable; see
    [retraction](docs/sglang.md#retraction)), so on that path sampled usage only has to reach
    `retract_usage_floor` (default 0.75): admission reserves room for future decode tokens
    (`new_token_ratio`, see [admission](docs/sglang.md#batching-flags)) and each retraction frees slots, so
    usage read every few seconds is a saw-tooth that can miss the full moments. Third, the footprint path:
    requests wait in `min_share` of the readings while the running batch already fills the pool at full
    length — running >= `fit_share` (default 0.8) x pool / (mean prompt + mean output tokens of the finished
    requests, from the token and request counters). Usage then reads low because the running requests have
    not grown to their full length yet, but admission reserves room for their remaining output
    (`new_token_ratio`), so no more fit. The running batch must sit below the effective
    `max_running_requests` (otherwise `max_running_requests_cap` is the limit). One reading judges (a pasted
    line, one scrape), at low confidence. With no usage reading at all, SGLang's own statement that the pool
    ran out — a retraction line, or `Decode out of memory` from the KV allocator — is the finding (low
    confidence, from the log events).

Why it matters:
    Every admitted request needs KV slots for its whole context. When the pool is full, the scheduler
    cannot admit more requests however many the client sends, so throughput is capped by pool size,
    not by compute; requests that cannot grow are retracted and recomputed.

Evidence:
    token_usage (peak, and the share of waiting points at or above the threshold), queue_reqs,
    running_reqs against max_running_requests, the pool size and retraction events; every number
    cites the log line or scrape that shows it.

Fix:
    Grow the pool or shrink per-token cost: raise `--mem-fraction-static` while keeping 5–8 GB free
    for activations and graphs (SGLang's tuning guide: `available_gpu_mem` 5–8 GB is right); when the pool is
    capped by `--max-total-tokens`, raise that cap, to the next power of two that holds the requests in
    flight (median running + median waiting over the readings with work, idle stretches left out) at
    their full length with 10 % to spare, and at least twice the pool; `--kv-cache-dtype fp8_e4m3` doubles tokens per
    byte; for hybrid SWA models whose full-attention pool is full while the SWA pool is nearly empty,
    lower `--swa-full-tokens-ratio`; for MLA models at TP > 1, DP attention gives each rank its own
    pool (the capacity model adds the numbers). HiCache does not help here: it grows the prefix cache,
    not the decode pool. `--cpu-offload-gb` is never suggested: it slows every step.

Known false positives:
    Usage above 0.9 with a short or empty queue is SGLang's own definition of healthy ([tuning
    guide](docs/sglang.md#tuning-guide)); this rule needs waiting requests or retractions as well, and the
    default threshold is 0.95, above the guide's 0.9. A few requests with runaway outputs can fill the pool
    by themselves; then flag changes do not help and none are proposed (see `runaway_generation`). The
    footprint path uses the mean length of the requests that finished in the window: when only a few short
    requests finished, or lengths vary widely, the estimate is rough (confidence low), and it needs requests
    waiting in most readings as well.

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

from typing import Any

import numpy as np

from diagnoser.capacity.pool import pool_count
from diagnoser.capacity.serverstate import server_state
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules.base import (
    Rule,
    RuleContext,
    ev,
    evidence,
    fmt_int,
    next_pow2,
    pool_phrase,
    pool_tokens,
    slot_cap,
    suggest,
    tokens_per_request,
)
from diagnoser.rules.columns import argmax_source, arrays, pairs
from diagnoser.rules.er01_oom import oom_detail


def retraction_count(ctx: RuleContext) -> tuple[int, str]:
    """Retraction events and a source: the parser's retraction events (it already drops the copies that
    several TP ranks of one DP group print for one retraction), else the counter's increase, else the
    points of the retracted-requests gauge. Two retractions logged in the same second are two events."""
    n, _reqs, src = retractions(ctx)
    return n, src


def retractions(ctx: RuleContext) -> tuple[int, int, str]:
    """(retraction events, retracted requests, source of the first event); memoised for the pass."""
    hit = ctx.memo.get("retractions")
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    evs = ctx.events_of("retraction")
    if evs and any("pp" not in e.rank for e in evs):
        evs = [e for e in evs if "pp" not in e.rank]  # later pipeline stages repeat stage 0's requests
    reqs = sum(int(e.fields.get("retracted_reqs", 1) or 1) for e in evs)
    tot = ctx.series("retractions_total")
    counted = int(float(tot.values[-1]) - float(tot.values[0])) if tot is not None and len(tot) >= 2 and tot.values[-1] > tot.values[0] else 0
    out: tuple[int, int, str] = (0, 0, "")
    if evs and reqs >= counted:
        out = (len(evs), reqs, evs[0].source)
    elif counted:
        out = (counted, counted, tot.sources[-1])  # type: ignore[union-attr]  # the counter counts requests
    else:
        rr = ctx.series("retracted_reqs")
        if rr is not None:
            pos = [v for v in rr.values.tolist() if v > 0]
            if pos:
                out = (len(pos), int(sum(pos)), argmax_source(ctx, "retracted_reqs"))
    ctx.memo["retractions"] = out
    return out


def dp_ranks(ctx: RuleContext) -> int:
    """Independent pools of ``max_total_tokens`` (one per DP rank under DP), as the capacity model counts
    them; memoised for the pass."""
    if "pools" not in ctx.memo:
        ctx.memo["pools"] = pool_count(ctx.timeline)
    return ctx.memo["pools"]  # type: ignore[no-any-return]


def server_state_of(ctx: RuleContext) -> Any:
    """SGLang's scheduler/memory model of this target (capacity/serverstate.py), memoised for the pass."""
    if "server_state" not in ctx.memo:
        ctx.memo["server_state"] = server_state(ctx.timeline, ctx.extras)
    return ctx.memo["server_state"]


def full_length(ctx: RuleContext, tpr: float | None) -> float | None:
    """Tokens a request holds at its full length: prompt + output of the finished requests (counters),
    else from the decode lines' mean held per running request (a request halfway through its output on
    average: prompt + output / 2) and the prompt length: 2 x held - prompt; else the held tokens."""
    foot, _fit = fit_at_full_length(ctx)
    if foot:
        return foot
    if not tpr:
        return None
    st = server_state_of(ctx)
    prompt = st.prompt_tokens
    if prompt and 0 < prompt < tpr:
        return 2 * tpr - prompt
    return tpr


def footprint(ctx: RuleContext, pts: Any) -> tuple[float | None, float | None, float]:
    """(mean tokens per request at full length, requests the pool holds at that length, share of the
    usage readings with a queue). The length is (uncached prompt + generation token rates) /
    finished-request rate over the window (the prompt scaled by 1 - cache hit rate, since a shared
    prefix is held once): SGLang counts both when a request finishes (docs/sglang.md#metrics-requests), so it is the
    mean full length of the finished requests. None when no request finished or the pool is unknown."""
    qshare = np.count_nonzero(pts.b > 0) / len(pts) if len(pts) else 0.0  # a bool mean: the count over n
    foot, fit = fit_at_full_length(ctx)
    return foot, fit, qshare


def fit_at_full_length(ctx: RuleContext) -> tuple[float | None, float | None]:
    """:func:`footprint`'s (mean tokens per request at full length, requests the pool holds at that length)."""
    from diagnoser.timeline.derived import window_rate

    # over the window, from the completions' own counters (a mean of per-interval rates weighs a burst of
    # completions in a short interval as much as a long quiet one)
    tl = ctx.timeline
    rate = window_rate(tl, "request_rate").value
    out_tps, in_tps = window_rate(tl, "output_tps", decoded=False).value, window_rate(tl, "prompt_tps").value
    pool, _ = pool_tokens(ctx)
    if not rate or out_tps is None or in_tps is None or not pool:
        return None, None
    hit = ctx.stats("cache_hit_rate")["mean"]
    shared = min(max(float(hit), 0.0), 1.0) if hit is not None else 0.0
    foot = (out_tps + in_tps * (1.0 - shared)) / rate  # a cached prefix sits in the pool once, shared
    if foot <= 0:
        return None, None
    return foot, pool * dp_ranks(ctx) / foot


class KVSaturation(Rule):
    name = "kv_saturation"
    code = "KV01"
    title = "KV pool full"
    severity = Severity.WARNING
    needs = ("token_usage",)
    reads = ("token_usage",)
    events = ("retraction", "oom")
    defaults = {"usage_high": 0.95, "waiting_usage": 0.9, "deep_queue": 2000, "min_share": 0.6, "min_points": 1, "critical_share": 0.9, "few_requests": 4,
                "retract_usage_floor": 0.75, "fit_share": 0.8}
    threshold_help = {
        "usage_high": "token usage at or above this counts as full (0-1); the tuning guide calls > 0.9 healthy",
        "waiting_usage": "token usage at or above this counts as full while more than deep_queue requests wait (0-1): admission also reserves room for the running requests' remaining output",
        "deep_queue": "waiting requests above which usage from waiting_usage counts as full (the tuning guide's healthy queue ends at 2000)",
        "min_share": "share of the points with a waiting queue that must be full",
        "min_points": "fewest usage readings needed to judge (one reading judges, at low confidence)",
        "critical_share": "share of full points that makes it critical when requests also wait and decode retracts",
        "few_requests": "a pool filled by this many requests or fewer is left to runaway_generation (no flag advice)",
        "retract_usage_floor": "with retractions (the pool ran out) and waiting requests, the sampled usage peak needed (0-1)",
        "fit_share": "running requests, as a share of the requests the pool holds at full length (prompt + output), that count as a full pool while requests wait",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        usage = ctx.series("token_usage")
        if usage is None or len(usage) < t["min_points"]:
            return self._ran_out(ctx) if usage is None else None
        vals = arrays(ctx, "token_usage")[1]  # type: ignore[index]
        if not len(vals):
            return self._ran_out(ctx)
        high = t["usage_high"]
        wait_high = min(high, t["waiting_usage"])
        peak = float(vals.max())
        n_retract, retract_src = retraction_count(ctx)
        if not (peak >= wait_high or t["min_share"] <= 0 or (n_retract > 0 and peak >= t["retract_usage_floor"])):
            # neither the usage path nor the retraction path can hold: the footprint path needs the running
            # batch at fit_share of what the pool holds at full length (checked before the join)
            _, fit = fit_at_full_length(ctx)
            p50 = ctx.stats("running_reqs")["p50"]
            if fit is None or p50 is None or not p50 >= t["fit_share"] * fit:
                return None
        pts = pairs(ctx, "token_usage", "queue_reqs")
        waiting = pts.b > 0
        # full while requests wait: at usage_high; from waiting_usage when the queue is deeper than the tuning
        # guide's healthy range (admission also reserves room for the running requests' remaining output)
        full_waiting = (waiting & ((pts.a >= high) | ((pts.a >= wait_high) & (pts.b > t["deep_queue"])))).nonzero()[0]
        deep = bool(len(full_waiting)) and bool(np.any(pts.a[full_waiting] < high))
        wshare = len(full_waiting) / len(pts) if len(pts) else 0.0
        waiting = bool(waiting.any())
        path_wait = len(pts) > 0 and wshare >= t["min_share"]
        fshare = np.count_nonzero(vals >= high) / len(vals)
        # a retraction says the pool ran out (docs/sglang.md#retraction); it counts when requests waited or the pool was full
        # most of the time: one retraction at a brief peak with nobody waiting is left to kv_retraction
        # (occasional, fine). Sampled usage misses the full moments (saw-tooth), hence the lower floor.
        path_retract = n_retract > 0 and peak >= t["retract_usage_floor"] and (waiting or fshare >= t["min_share"])
        running = ctx.stats("running_reqs")
        foot, fit, qshare = None, None, 0.0
        if not (path_wait or path_retract):
            foot, fit, qshare = footprint(ctx, pts)
        path_fit = fit is not None and running["p50"] is not None and qshare >= t["min_share"] and running["p50"] >= t["fit_share"] * fit
        if not (path_wait or path_retract or path_fit):
            return None
        cap, cap_src = slot_cap(ctx)
        if cap and running["p50"] is not None and running["p50"] >= cap:
            return None  # the slot cap binds, not the pool (max_running_requests_cap)
        queue = ctx.stats("queue_reqs")
        pool, pool_src = pool_tokens(ctx)
        evs = [ev(ctx, "token_usage", peak, (wait_high if deep else high) if peak >= high or path_wait else t["retract_usage_floor"], at="max")]
        if path_wait:
            src = pts.src(full_waiting[0]) if len(full_waiting) else ""
            evs.append(evidence("share of waiting points with token_usage >= threshold", round(wshare, 2), t["min_share"], ctx.window_text(), src))
        if waiting:
            evs.append(ev(ctx, "queue_reqs", queue["max"], "> 0", at="max"))
        if running["n"]:
            evs.append(ev(ctx, "running_reqs", running["p50"], cap, at="last"))
        if pool:
            evs.append(evidence("max_total_tokens", pool, None, "", pool_src))
        if n_retract:
            evs.append(evidence("retraction events", n_retract, None, ctx.window_text(), retract_src))
        if path_fit and foot is not None and fit is not None:
            evs.append(evidence("tokens per request at full length (mean prompt + output)", round(foot), None, ctx.window_text(),
                                "prompt and generation token counters / finished requests"))
            evs.append(evidence("requests the pool holds at full length", round(fit, 1), None, "", pool_src))
            evs.append(evidence("share of readings with a queue", round(qshare, 2), t["min_share"], ctx.window_text(), argmax_source(ctx, "queue_reqs")))
        parts = [f"KV token usage peaked at {peak:.2f}"]
        if path_wait:
            parts.append(f"it was >= {wait_high if deep else high:.2f} while requests waited in {wshare:.0%} of the {len(pts)} reading(s) with a queue"
                         + (f" (more than {t['deep_queue']:,} waiting: admission also reserves room for the running requests' remaining output, "
                            "so the queue forms before usage reads 1.0)" if deep else ""))
        if waiting:
            parts.append(f"up to {queue['max']:.0f} requests waited")
        if running["n"]:
            ran = f"{running['max']:.0f}" if running["min"] == running["max"] else f"{running['min']:.0f}–{running['max']:.0f}"
            parts.append(f"{ran} ran" + (f" of {cap} slots" if cap else ""))
        if pool:
            parts.append(pool_phrase(pool, pool_src))
        if path_fit and foot is not None and fit is not None and not (path_wait or path_retract):
            parts.append(f"at {foot:,.0f} tokens per request (mean prompt + output) the pool holds about {fit:.1f} requests at full length, "
                         f"and {running['p50']:.0f} ran at the median, so admission (which reserves room for the remaining output, "
                         "docs/sglang.md#batching-flags) has no room for the waiting ones although usage reads lower")
        if n_retract:
            parts.append(f"{n_retract} retraction event(s)" + ("" if peak >= high else
                         " — SGLang retracts only when the pool cannot hold the next decode tokens, so the pool ran"
                         " out between the readings"))
        crit = (wshare >= t["critical_share"] or fshare >= t["critical_share"]) and bool(waiting) and n_retract > 0
        sev = Severity.CRITICAL if crit else self.severity
        conf = "high" if path_wait and path_retract else "medium" if path_wait or path_retract else "low"
        notes: list[str] = []
        sugg: list[Suggestion] = []
        tpr, _ = tokens_per_request(ctx)
        if path_fit and foot is not None:
            tpr = max(tpr or 0.0, foot)  # requests reach this length before they finish
        few = running["p50"] is not None and running["p50"] <= t["few_requests"] and pool and tpr and tpr * max(running["p50"], 1) >= 0.8 * pool
        if few:
            notes.append(f"{running['p50']:.0f} request(s) hold the whole pool (about {fmt_int(tpr)} tokens each): "
                         "bound max_tokens on the client first (see runaway_generation); no flag change is proposed.")
        else:
            sugg = self._suggestions(ctx, pool, tpr, running, queue)
        return self.finding(ctx, "; ".join(parts) + ".", evs, sugg, confidence=conf, severity=sev, notes=notes)

    def _ran_out(self, ctx: RuleContext) -> Finding | None:
        """No usage reading: SGLang's own statement that the pool ran out — a retraction line (decode
        needed more slots than free + evictable) or a decode allocation failure — is the finding."""
        n_retract, retract_src = retraction_count(ctx)
        dec = [e for e in ctx.events_of("oom") if e.fields.get("phase") == "decode" and not e.fields.get("device_memory")]
        if not n_retract and not dec:
            return None
        evs = []
        parts = []
        if n_retract:
            evs.append(evidence("retraction events", n_retract, None, ctx.window_text(), retract_src))
            parts.append(f"{n_retract} retraction line(s): SGLang retracts running requests only when decode needs more KV "
                         "slots than are free or evictable")
        if dec:
            e = dec[0]
            evs.append(evidence("decode out of memory", str(e.fields.get("text", ""))[:120], None, "", e.source))
            detail = oom_detail(ctx, e)
            txt = "decode could not allocate KV slots for the next tokens (\"Decode out of memory\")"
            if detail.get("available") is not None:
                txt += (f": {fmt_int(detail['available'])} free and {fmt_int(detail.get('evictable', 0))} evictable token(s)"
                        + (f" for {fmt_int(detail['requested'])} requested" if detail.get("requested") is not None else ""))
                evs.append(evidence("free KV tokens at the failure", detail["available"], None, "", detail.get("source", "")))
            parts.append(txt)
        pool, pool_src = pool_tokens(ctx)
        if pool:
            evs.append(evidence("max_total_tokens", pool, None, "", pool_src))
            parts.append(pool_phrase(pool, pool_src))
        summary = "The KV pool ran out: " + "; ".join(parts) + "."
        notes = ["No token-usage reading is in the inputs: the pool is judged from SGLang's own message; "
                 "a Decode batch line or a /metrics scrape would show how often it is full."]
        running, queue = ctx.stats("running_reqs"), ctx.stats("queue_reqs")
        sugg = self._suggestions(ctx, pool, tokens_per_request(ctx)[0], running, queue)
        kinds = (["retraction"] if n_retract else []) + (["decode out of memory"] if dec else [])
        return self.finding(ctx, summary, evs, sugg, confidence="low" if n_retract + len(dec) <= 1 else "medium", notes=notes,
                            basis={"events": n_retract + len(dec), "kind": ", ".join(kinds)})

    def _suggestions(self, ctx: RuleContext, pool: int | None, tpr: float | None, running: dict[str, Any], queue: dict[str, Any]) -> list[Suggestion]:
        out: list[Suggestion] = []
        state = server_state_of(ctx)
        pinned, pinned_why = state.pool_pinned()  # SGLang takes min(profile, --max-total-tokens)
        cap_tokens = state.cap_tokens or (pool if pinned else None)
        want = None
        full = full_length(ctx, tpr)
        if full and running["p50"] is not None:
            # every request in flight at its full length: then admission never has to over-commit the pool
            # (it reserves the remaining max_new_tokens x new_token_ratio, which decays toward 0.14 x its start)
            run50, queue50 = _in_flight_while_busy(ctx, running, queue)
            want = (run50 + queue50) * full / 0.9 / dp_ranks(ctx)  # the flag sizes each DP rank's pool
        if pinned and cap_tokens and pool:
            proposed = next_pow2(max(want or 0, 2 * pool))
            why = (f"the pool is capped by --max-total-tokens {int(cap_tokens):,}, not by GPU memory" if state.cap_tokens else
                   f"the pool is not sized by memory: {pinned_why}")
            out.append(suggest(ctx, "max_total_tokens", int(cap_tokens), proposed, why,
                               f"about {proposed / pool:.1f}x the KV slots, so roughly that many more requests can decode at once",
                               ("the device has memory free for the larger pool (the cap, not memory, sized it)",)))
            return out
        mfs = ctx.cfg("mem_fraction_static") or ctx.cfg("arg.mem_fraction_static")
        avail = ctx.cfg("available_gpu_mem_gb")
        device = ctx.cfg("device")
        if device != "cpu":
            if avail is not None and avail <= 6:
                pass  # no headroom left for a larger static fraction
            elif isinstance(mfs, int | float):
                proposed_f = round(min(float(mfs) + 0.04, 0.95), 2)
                out.append(suggest(ctx, "mem_fraction_static", mfs, proposed_f, "a larger static fraction grows the KV pool",
                                   "each +0.01 adds about 1 % of the GPU's free memory to the pool (docs/sglang.md#kv-budget); the capacity model gives the tokens",
                                   ("keep 5–8 GB free for activations and graphs (available_gpu_mem in the summary line)",)))
            else:
                out.append(suggest(ctx, "mem_fraction_static", None, "current + 0.03 to 0.05",
                                   "a larger static fraction grows the KV pool; the current value is not in the inputs (pass the startup log or --url for server info)",
                                   "each +0.01 adds about 1 % of the GPU's free memory to the pool (docs/sglang.md#kv-budget)",
                                   ("keep 5–8 GB free for activations and graphs",)))
            dtype = ctx.cfg("kv_cache_dtype") or ctx.cfg("arg.kv_cache_dtype")
            if dtype in (None, "auto", "bf16", "float16", "bfloat16", "fp16"):
                out.append(suggest(ctx, "kv_cache_dtype", dtype, "fp8_e4m3", "an 8-bit KV cache stores twice the tokens in the same memory",
                                   "about 2x the KV slots at the same memory fraction",
                                   ("the model tolerates fp8 KV (check quality on your evals)",)))
        full = ctx.stats("full_token_usage")
        swa = ctx.stats("swa_token_usage")
        if full["max"] is not None and swa["max"] is not None and full["max"] >= ctx.thresholds["usage_high"] and swa["max"] < 0.5:
            ratio = ctx.cfg("swa_full_tokens_ratio") or ctx.cfg("arg.swa_full_tokens_ratio")
            factor = max(swa["max"] / 0.5, 0.1)
            proposed: Any = round(float(ratio) * factor, 2) if isinstance(ratio, int | float) else f"about {factor:.2f} x the current ratio"
            out.append(suggest(ctx, "swa_full_tokens_ratio", ratio, proposed,
                               f"the full-attention pool is full ({full['max']:.2f}) while the sliding-window pool is at most {swa['max']:.2f} used",
                               "moves memory from the SWA pool to the full-attention pool, so more long requests fit",
                               ("the SWA pool stays below about half full at the new ratio",)))
        return out


def _in_flight_while_busy(ctx: RuleContext, running: dict[str, Any], queue: dict[str, Any]) -> tuple[float, float]:
    """Median running and waiting requests over the readings where the server had work (either > 0).

    The demand a larger pool must hold: an idle stretch in the window (a job that ended, a Prometheus
    range that runs past it, a log that starts before the load) would otherwise pull the medians to 0
    and size the pool by how long the window is, not by the load. Falls back to the plain medians when
    the two series do not join."""
    p = pairs(ctx, "running_reqs", "queue_reqs")
    if len(p):
        busy = (p.a > 0) | (p.b > 0)
        if np.any(busy):
            return float(np.median(p.a[busy])), float(np.median(p.b[busy]))
    return float(running["p50"] or 0.0), float(queue["p50"] or 0.0)
