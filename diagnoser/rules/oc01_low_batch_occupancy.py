"""The decode batch runs far fewer requests than the slots allow.

What it detects:
    The median busy `running_reqs` (readings with at least one request) at or below `max_share`
    (default 25 %) of the effective `max_running_requests` (summary line, server info or server
    args); when the cap is unknown, a median batch of `small_batch` (default 8) or fewer. Info: a
    small batch is a fact to explain, and the explanation is another rule.

Why it matters:
    Decode cost per step is dominated by reading weights, shared by every request in the batch. A small
    batch leaves most of the GPU's throughput unused: aggregate tokens/s grows almost linearly with the
    batch until compute or the pool binds.

Evidence:
    running_reqs (median, p95) against max_running_requests, the number of requests the KV pool would
    hold at the observed tokens per request, token usage and the queue.

    On each engine. On SGLang: `#running-req` and `sglang:num_running_reqs` against
    `--max-running-requests` and the KV pool. On vLLM: `vllm:num_requests_running` or `Running: N reqs`
    against `--max-num-seqs` (non-default args or the engine config line) and the KV pool (`KV cache
    size`, `# GPU blocks` x block size).

Fix:
    Depends on the cause, named in the summary: an empty queue and low usage → the client sends too
    little (`client_bound`: raise client concurrency); a full pool held by a few requests →
    `runaway_generation`/`kv_saturation`; waiting requests with free KV → `prefill_stall` or
    `max_running_requests_cap`.

Known false positives:
    Latency-sensitive deployments run small batches on purpose. Readings between requests (idle) are
    excluded, but a workload of rare single requests still shows as small.

References:
    - How diagnoser reads SGLang: [`num_running_reqs`](docs/sglang.md#metrics-scheduler), [`#running-req` in
      the Decode batch line](docs/sglang.md#decode-line),
      [`--max-running-requests`](docs/sglang.md#batching-flags), [from signals to a
      bottleneck](docs/sglang.md#bottlenecks).
    - Real cases: issues [#3909](https://github.com/sgl-project/sglang/issues/3909) (low client
      concurrency), [#2746](https://github.com/sgl-project/sglang/issues/2746) (a batch of one holding the
      pool) and [#11948](https://github.com/sgl-project/sglang/issues/11948), and the recorded SGLang 0.5.23
      CPU run `examples/client-bound.dgb`.
"""

from __future__ import annotations

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import (
    Rule,
    RuleContext,
    busy_summary,
    ev,
    evidence,
    fmt_int,
    pool_tokens,
    slot_cap,
    tokens_per_request,
)


class LowBatchOccupancy(Rule):
    name = "low_batch_occupancy"
    code = "OC01"
    title = "Small decode batch"
    severity = Severity.INFO
    reads = ("running_reqs",)
    defaults = {"max_share": 0.25, "small_batch": 8, "min_points": 1}
    threshold_help = {
        "max_share": "median busy batch at or below this share of max_running_requests is low",
        "small_batch": "median busy batch at or below this is low when the cap is unknown",
        "min_points": "fewest busy running readings needed (one reading judges, at low confidence)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        s = ctx.series("running_reqs")
        if s is None:
            return None
        st = busy_summary(ctx, "running_reqs")
        if st["n"] < t["min_points"]:
            return None
        cap, cap_src = slot_cap(ctx)
        if st["p50"] > t["max_share"] * cap if cap else st["p50"] > t["small_batch"]:
            return None  # above the limit already (the pool can only lower it): no need for the pool's numbers
        pool, _ = pool_tokens(ctx)
        tpr, tpr_how = tokens_per_request(ctx)
        fit = int(0.9 * pool / tpr) if pool and tpr else None
        if cap:
            allowed = min(cap, fit) if fit else cap
            limit = t["max_share"] * allowed
            thr = f"<= {t['max_share']:.0%} of {allowed}"
        else:
            limit = t["small_batch"]
            thr = f"<= {t['small_batch']} (cap unknown)"
        if st["p50"] > limit:
            return None
        usage = ctx.stats("token_usage")
        queue = ctx.stats("queue_reqs")
        evs = [ev(ctx, "running_reqs", st["p50"], thr, at="last")]
        if cap:
            evs.append(evidence("max_running_requests", cap, None, "", cap_src))
        if fit is not None:
            evs.append(evidence("requests the pool holds at 0.9 usage", fit, None, "", tpr_how))
        if usage["n"]:
            evs.append(ev(ctx, "token_usage", usage["p95"], None, at="max"))
        parts = [f"The decode batch held {st['p50']:.0f} requests at the median (p95 {st['p95']:.0f})"]
        if cap:
            parts.append(f"of {cap} slots")
        if fit is not None:
            parts.append(f"the pool would hold about {fmt_int(fit)} at the observed {fmt_int(tpr)} tokens per request")
        if usage["n"] and queue["n"]:
            if (queue["max"] or 0) == 0 and (usage["p95"] or 0) < 0.5:
                cause = "no request waited and the pool stayed mostly free: the client sends too little (see client_bound)"
            elif (usage["p95"] or 0) >= 0.9:
                cause = "the pool was full with this few requests: long sequences hold it (see runaway_generation / kv_saturation)"
            else:
                cause = "requests waited while slots and KV were free (see prefill_stall / max_running_requests_cap)"
            parts.append(cause)
        conf = "medium" if cap else "low"
        return self.finding(ctx, "; ".join(parts) + ".", evs, [], confidence=conf, severity=Severity.INFO)
