"""A few requests generate far longer than the rest and hold the KV pool by themselves.

What it detects:
    A median running batch of ``max_running`` (4) or fewer requests whose KV tokens fill at least
    ``pool_share`` (80 %) of the pool (token usage p50), so each request holds a large share of the pool,
    with the held tokens still growing (the requests keep generating). From logs: ``#token`` and
    ``#running-req`` on Decode lines; from ``/metrics``: ``num_used_tokens`` and ``num_running_reqs``.

Why it matters:
    Requests without a bounded ``max_tokens`` (or with EOS ignored) keep decoding until the pool or the
    context limit stops them: they block every other request, trigger retractions, and the GPU decodes
    a batch of one or two at a fraction of its throughput.

Evidence:
    Running requests, token usage, KV tokens per request and their growth, with the lines they come
    from.

Fix:
    On the client: set ``max_tokens`` / ``max_new_tokens`` and honour EOS / stop strings (the public case
    was fixed by switching the benchmark client). Server flags do not fix it; ``--context-length``
    bounds the worst case.

Known false positives:
    Genuinely long-context workloads (a few 100k-token documents) look the same; check that the
    outputs, not the prompts, are long.

References:
    ../shared/reference/sglang.md §3.3 (#token, token usage), §3.4 (retraction after the pool fills),
    §5.1; case 007-sglang-2746.
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, evidence, fmt_int, pool_tokens
from diagnoser.rules.columns import pairs


class RunawayGeneration(Rule):
    name = "runaway_generation"
    code = "RG01"
    title = "Runaway outputs hold the pool"
    severity = Severity.WARNING
    defaults = {"max_running": 4, "pool_share": 0.8, "min_points": 3}
    threshold_help = {
        "max_running": "median running requests at or below this count as a few",
        "pool_share": "token usage (p50) at or above this counts as holding the pool",
        "min_points": "fewest decode readings with #token and #running-req",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        p50 = ctx.stats("token_usage")["p50"]
        if p50 is None or p50 < t["pool_share"]:
            return None  # a few requests do not hold the pool (checked before the join: the pass has the stats)
        pr = pairs(ctx, "used_tokens", "running_reqs")
        k = (pr.b > 0).nonzero()[0]
        if len(k) < t["min_points"]:
            return None
        med_run = np.sort(pr.b[k]).item(len(k) // 2)  # the upper median of the (positive) running counts
        if med_run > t["max_running"]:
            return None
        usage = ctx.stats("token_usage")
        if usage["p50"] is None or usage["p50"] < t["pool_share"]:
            return None
        pts = [(float(pr.ts[i]), float(pr.a[i]), float(pr.b[i]), pr.src(i)) for i in k]
        growth = pts[-1][1] - pts[0][1]
        if growth <= 0:
            return None
        per = pts[-1][1] / pts[-1][2]
        pool, _ = pool_tokens(ctx)
        evs = [evidence("running_reqs (median)", med_run, f"<= {t['max_running']}", ctx.window_text(), pts[len(pts) // 2][3]),
               evidence("token_usage (p50)", usage["p50"], t["pool_share"], ctx.window_text(), ctx.series("token_usage").sources[0]),  # type: ignore[union-attr]
               evidence("used_tokens per running request", round(per), None, "", pts[-1][3]),
               evidence("used_tokens growth over the window", round(growth), "> 0 (still generating)", ctx.window_text(), f"{pts[0][3]} .. {pts[-1][3]}")]
        summary = (f"{med_run:.0f} request(s) held {usage['p50']:.0%} of the KV pool" + (f" ({fmt_int(pool)} tokens)" if pool else "")
                   + f", about {fmt_int(per)} tokens each, and kept growing by {fmt_int(growth)} tokens over the window.")
        return self.finding(ctx, summary, evs, [], confidence="medium",
                            notes=["Bound max_tokens on the client and honour EOS/stop strings; server flags do not fix runaway outputs."])
