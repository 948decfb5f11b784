"""The server has headroom and almost no queue: the client's concurrency is the limit.

What it detects:
    A queue that is empty in at least `1 - max_queue_share` of readings (default: non-empty in at most
    10 %), KV usage p95 below `max_usage` (default 0.5) and the busy running batch (p95) below
    `headroom_share` (default 50 %) of what the server could run (the smaller of
    `max_running_requests` and the requests the pool holds at 0.9 usage). Info: the server is
    healthy; the fix is on the client side.

Why it matters:
    A server can only batch what it is sent. With few requests in flight, decode steps are nearly as
    expensive as with a full batch but produce few tokens: aggregate throughput stays low although
    nothing on the server is wrong.

Evidence:
    In-flight requests observed (running p95 and `http_requests_active`), the queue, KV usage, and the
    concurrency that would fill the server with the observed tokens per request.

    On each engine. On SGLang: running requests, the queue and token usage from the Decode line or
    `sglang:` gauges. On vLLM: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
    `vllm:kv_cache_usage_perc` (or the stats line's `Running`, `Waiting`/`Pending`, `GPU KV cache usage`),
    with `--max-num-seqs` as the slot count.

Fix:
    Raise the client's concurrency (`--max-concurrency` in bench_serving, the worker pool of your
    batch job) toward the concurrency reported. No server flag changes help.

Known false positives:
    A deliberately lightly loaded latency service; the end of a benchmark run (drain), when the client
    has run out of requests. Judge on a window taken during steady load (`--last`).

References:
    - How diagnoser reads SGLang: [scheduler gauges](docs/sglang.md#metrics-scheduler),
      [`http_requests_active`](docs/sglang.md#metrics-http),
      [`--max-running-requests`](docs/sglang.md#batching-flags), [SGLang's tuning
      guide](docs/sglang.md#tuning-guide), [from signals to a bottleneck](docs/sglang.md#bottlenecks).
    - Real cases: issue [#3909](https://github.com/sgl-project/sglang/issues/3909) (throughput falls at low
      concurrency), PR [#6081](https://github.com/sgl-project/sglang/pull/6081) (a healthy server: noted,
      not a problem), and the recorded SGLang 0.5.23 CPU run `examples/client-bound.dgb`.
"""

from __future__ import annotations

import numpy as np

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
from diagnoser.rules.columns import arrays


class ClientBound(Rule):
    name = "client_bound"
    code = "OC02"
    title = "Client sends too little"
    severity = Severity.INFO
    reads = ("running_reqs",)
    defaults = {"max_usage": 0.5, "max_queue_share": 0.1, "headroom_share": 0.5, "min_points": 1, "target_usage": 0.9}
    threshold_help = {
        "max_usage": "KV usage p95 below this counts as headroom",
        "max_queue_share": "largest share of readings with a non-empty queue",
        "headroom_share": "running p95 below this share of the server's capacity counts as headroom",
        "min_points": "fewest busy running readings needed (one reading judges, at low confidence)",
        "target_usage": "pool usage the fill concurrency aims at",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        s = ctx.series("running_reqs")
        q = ctx.series("queue_reqs")
        u = ctx.series("token_usage")
        if s is None or q is None or u is None:
            return None
        run = busy_summary(ctx, "running_reqs")
        if run["n"] < t["min_points"]:
            return None
        _, qv = arrays(ctx, "queue_reqs")  # type: ignore[misc]
        qshare = np.count_nonzero(qv > 0) / len(qv) if len(qv) else 1.0  # a bool mean: the count over n
        ust = ctx.stats("token_usage")
        if qshare > t["max_queue_share"] or (ust["p95"] or 0) >= t["max_usage"]:
            return None
        cap, cap_src = slot_cap(ctx)
        pool, pool_src = pool_tokens(ctx)
        tpr, tpr_how = tokens_per_request(ctx)
        fit = int(t["target_usage"] * pool / tpr) if pool and tpr else None
        capacity = min(x for x in (cap, fit) if x) if (cap or fit) else None
        if capacity and run["p95"] >= t["headroom_share"] * capacity:
            return None
        evs = [ev(ctx, "running_reqs", run["p95"], f"< {t['headroom_share']:.0%} of {capacity}" if capacity else None, at="max"),
               evidence("share of readings with a queue", round(qshare, 2), t["max_queue_share"], ctx.window_text(), q.source_at(0)),
               ev(ctx, "token_usage", ust["p95"], t["max_usage"], at="max")]
        act = ctx.stats("http_requests_active")
        if act["n"]:
            evs.append(ev(ctx, "http_requests_active", act["p95"], None, at="max"))
        if cap:
            evs.append(evidence("max_running_requests", cap, None, "", cap_src))
        if fit:
            evs.append(evidence("requests the pool holds at target usage", fit, t["target_usage"], "", f"{pool_src}; {tpr_how}"))
        parts = [f"At most {run['p95']:.0f} requests were in flight (median {run['p50']:.0f}), the queue was empty in {1 - qshare:.0%} of readings "
                 f"and KV usage stayed at or below {ust['p95']:.2f}"]
        notes = []
        if capacity:
            parts.append(f"the server could run about {fmt_int(capacity)} at once" + (f" ({fmt_int(tpr)} tokens per request)" if tpr else ""))
            notes.append(f"Raise the client's concurrency toward {fmt_int(capacity)} in-flight requests; throughput should grow with the batch until the pool or compute binds.")
        else:
            notes.append("Missing: the pool size or max_running_requests (startup log or server info) to say how many requests would fill the server.")
        conf = "medium" if capacity else "low"
        return self.finding(ctx, "; ".join(parts) + ".", evs, [], confidence=conf, severity=Severity.INFO, notes=notes)
