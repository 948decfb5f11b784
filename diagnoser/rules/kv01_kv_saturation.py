"""The KV pool is the limit: token usage stays near capacity while requests wait.

What it detects:
    Token usage (``sglang:token_usage`` or ``token usage:`` in Decode/Prefill lines; for hybrid models
    the worst of the full/SWA/Mamba pools) at or above ``usage_high`` (default 0.95) for at least
    ``min_share`` (default 60 %) of the window, while requests wait (``queue_reqs`` > 0) or decode
    retracts, and the running batch sits below the effective ``max_running_requests``.

Why it matters:
    Every admitted request needs KV slots for its whole context. When the pool is full, the scheduler
    cannot admit more requests however many the client sends, so throughput is capped by pool size,
    not by compute; requests that cannot grow are retracted and recomputed.

Evidence:
    token_usage (mean, min and the share of points above the threshold), queue_reqs, running_reqs
    against max_running_requests, used_tokens against max_total_tokens; every number cites the log
    line or scrape that shows it.

Fix:
    Grow the pool or shrink per-token cost: raise ``--mem-fraction-static`` while keeping 5–8 GB free
    for activations and graphs (reference §7: available_gpu_mem 5–8 GB is right); ``--kv-cache-dtype
    fp8_e4m3`` doubles tokens per byte; for MLA models at TP > 1, DP attention gives each rank its own
    pool. HiCache does not help here: it grows the prefix cache, not the decode pool.
    ``--cpu-offload-gb`` is never suggested: it slows every step.

Known false positives:
    Usage above 0.9 with a short or empty queue is SGLang's own definition of healthy (hyperparameter
    tuning guide); this rule needs waiting requests or retractions as well. A few requests with
    runaway outputs can fill the pool by themselves (see ``runaway_generation``).

References:
    ../shared/reference/sglang.md §2.1 (token_usage, num_used_tokens), §3.3 (decode line), §5.1
    (pool sizing), §7 (tuning guide), §8 (KV-bound); cases 007-sglang-2746, 022-sglang-26248.
"""

from __future__ import annotations

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, ev


class KVSaturation(Rule):
    name = "kv_saturation"
    code = "KV01"
    severity = Severity.WARNING
    needs = ("token_usage",)
    defaults = {"usage_high": 0.95, "min_share": 0.6, "min_points": 2, "critical_share": 0.9}
    threshold_help = {
        "usage_high": "token usage at or above this counts as full (0-1)",
        "min_share": "share of the window's points that must be full",
        "min_points": "fewest usage points needed to judge",
        "critical_share": "share of full points that makes it critical when requests also wait",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        usage = ctx.series("token_usage")
        if usage is None or len(usage) < t["min_points"]:
            return None
        vals = usage.finite()
        high = [v for v in vals if v >= t["usage_high"]]
        share = len(high) / len(vals)
        if share < t["min_share"]:
            return None
        queue = ctx.stats("queue_reqs")
        retractions = ctx.timeline.events_of("retraction")
        retracted = ctx.stats("retracted_reqs")
        waiting = (queue["max"] or 0) > 0
        retracting = bool(retractions) or (retracted["max"] or 0) > 0
        if not (waiting or retracting):
            return None
        running = ctx.stats("running_reqs")
        mrr = ctx.cfg("max_running_requests")
        if mrr and running["max"] is not None and running["max"] >= mrr:
            return None  # the slot cap binds, not the pool (max_running_requests_cap)
        evidence = [
            ev(ctx, "token_usage", max(vals), t["usage_high"], at="max"),
        ]
        evidence.append(ev(ctx, "token_usage", round(share, 2), t["min_share"]))
        evidence[-1] = type(evidence[-1])("token_usage share of points >= threshold", round(share, 2), t["min_share"], evidence[-1].window, evidence[-1].source)
        if waiting:
            evidence.append(ev(ctx, "queue_reqs", queue["max"], "> 0", at="max"))
        if running["n"]:
            evidence.append(ev(ctx, "running_reqs", running["mean"], mrr))
        if retractions:
            evidence.append(type(evidence[0])("retraction events", len(retractions), None, ctx.window_text(), retractions[0].source))
        pool = ctx.cfg("max_total_tokens")
        parts = [f"KV token usage was >= {t['usage_high']:.2f} in {share:.0%} of the window (peak {max(vals):.2f})"]
        if waiting:
            parts.append(f"up to {queue['max']:.0f} requests waited")
        if running["n"]:
            parts.append(f"only {running['min']:.0f}–{running['max']:.0f} ran" + (f" of {mrr} slots" if mrr else ""))
        if pool:
            parts.append(f"pool {int(pool):,} tokens")
        if retractions:
            parts.append(f"{len(retractions)} retraction event(s)")
        sev = Severity.CRITICAL if share >= t["critical_share"] and waiting and retracting else self.severity
        return self.finding(ctx, "; ".join(parts) + ".", evidence, [], confidence="high" if waiting else "medium", severity=sev)
