"""Data-parallel ranks carry very different loads.

What it detects:
    Per-DP-rank series (`dp_rank` label, `DPn` log prefix): the mean running requests (else used
    tokens), waiting requests and generation throughput of each rank. Fires when the busiest rank's
    mean is at least `max_ratio` (1.5) times the mean over ranks — with a mean of at least
    `min_mean` (2) running requests, `min_queue` (4) waiting or `min_gen_tps` (10) tokens/s — or
    when one rank queues requests while another has half its load or less. One scrape (one reading
    per rank) is enough, at low confidence, when the busiest rank carries at least `min_spread` (8)
    requests above the mean (ranks log at their own moments: a few requests apart is noise).

Why it matters:
    Under DP attention every rank waits for the slowest at each MLP sync: one overloaded rank sets the
    step time for all, and the idle ranks' KV pools go unused. With plain DP replicas the busiest
    rank's queue sets the latency.

Evidence:
    Mean running requests per rank, the max/mean ratio, queues per rank.

    On each engine. On SGLang: running requests per `dp_rank` (label or `[DP n]` log prefix). On vLLM: the
    V1 metrics' `engine` label (one data-parallel engine each, read as `dp0`, `dp1`…); V0 has one engine,
    so nothing to compare.

Fix:
    Balance the dispatch: the DP controller's load-balance method (shortest queue or fewest tokens
    instead of round robin), or the router's cache-aware policy with a lower balance threshold. Long
    prompts landing on one rank also skew it; `sglang:dp_attention_token_imbalance_ratio` (0.5.22+)
    shows it per step.

Known false positives:
    Ranks report at different moments (every 40 decode steps each), so short windows look uneven; the
    rule needs `min_points` readings per rank.

References:
    - How diagnoser reads SGLang: [DP rank labels](docs/sglang.md#labels), [why DP gauges collided before
      0.4.10](docs/sglang.md#multiprocess), [DP attention metrics](docs/sglang.md#metrics-dp), [the `DPn`
      log prefix](docs/sglang.md#log-prefix), [DP and DP attention](docs/sglang.md#parallelism-flags).
    - Issue [#6892](https://github.com/sgl-project/sglang/issues/6892): DP metrics were wrong before the
      rank labels.
    - Real case: PR [#6081](https://github.com/sgl-project/sglang/pull/6081), a balanced MTP + DP-attention
      server (the rule stays silent); the imbalanced shape is tested on a constructed log in SGLang's DP
      prefix format.
"""

from __future__ import annotations

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import WINDOW_READINGS, Rule, RuleContext, evidence, readings_basis


class DPImbalance(Rule):
    name = "dp_imbalance"
    code = "DP01"
    title = "DP ranks unbalanced"
    severity = Severity.WARNING
    reads = ("running_reqs",)
    defaults = {"max_ratio": 1.5, "min_mean": 2.0, "min_queue": 4.0, "min_gen_tps": 10.0, "min_spread": 8.0, "min_points": 1, "min_ranks": 2}
    threshold_help = {
        "max_ratio": "busiest rank's mean over the mean of all ranks at or above this is imbalanced",
        "min_mean": "mean running requests per rank below this is too idle to judge",
        "min_points": "fewest readings per rank (one scrape judges, at low confidence)",
        "min_queue": "mean waiting requests per rank below this are too few to judge a queue imbalance",
        "min_gen_tps": "mean generation throughput per rank below this is too idle to judge",
        "min_spread": "with fewer than a window of readings per rank, the busiest rank must carry this many requests above the mean",
        "min_ranks": "fewest DP ranks",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        found = self._judge(ctx, "running_reqs")
        if found is None and len([r for r in ctx.ranks("running_reqs") if r.startswith("dp")]) < t["min_ranks"]:
            found = self._judge(ctx, "used_tokens")
        for signal in ("queue_reqs", "gen_throughput_tps"):
            if found is None:
                found = self._judge(ctx, signal)
        return found

    def _judge(self, ctx: RuleContext, signal: str) -> Finding | None:
        t = ctx.thresholds
        ranks = [r for r in ctx.ranks(signal) if r.startswith("dp")]
        if len(ranks) < t["min_ranks"]:
            return None
        means: dict[str, float] = {}
        for r in ranks:
            st = ctx.stats(signal, r)
            if st["n"] >= t["min_points"]:
                means[r] = st["mean"]
        if len(means) < t["min_ranks"]:
            return None
        avg = sum(means.values()) / len(means)
        floor = {"running_reqs": t["min_mean"], "queue_reqs": t["min_queue"], "gen_throughput_tps": t["min_gen_tps"]}.get(signal, 0.0)
        if avg < floor or avg <= 0:
            return None
        hi = max(means, key=lambda r: means[r])
        lo = min(means, key=lambda r: means[r])
        ratio = means[hi] / avg
        q_skew = False
        if signal == "running_reqs":
            queued = {r: ctx.stats("queue_reqs", r)["max"] or 0 for r in means}
            q_skew = any(queued[r] > 0 for r in means) and means[lo] <= 0.5 * means[hi] and queued[lo] == 0
        if ratio < t["max_ratio"] and not q_skew:
            return None
        fewest = min(ctx.stats(signal, r)["n"] for r in means)
        if fewest < WINDOW_READINGS and signal in ("running_reqs", "queue_reqs") and means[hi] - avg < t["min_spread"]:
            return None  # a snapshot per rank (each logs at its own moment): a spread of a few requests is noise
        hs, ls = ctx.series(signal, hi), ctx.series(signal, lo)
        evs = [evidence(f"{signal}[{hi}] mean", round(means[hi], 1), f">= {t['max_ratio']} x mean", ctx.window_text(), hs.last_source() if hs else ""),
               evidence(f"{signal}[{lo}] mean", round(means[lo], 1), None, ctx.window_text(), ls.last_source() if ls else ""),
               evidence("max / mean over ranks", round(ratio, 2), t["max_ratio"], ctx.window_text(), "")]
        label = {"running_reqs": "running requests", "used_tokens": "used KV tokens", "queue_reqs": "waiting requests",
                 "gen_throughput_tps": "generation throughput (tok/s)"}.get(signal, signal)
        summary = (f"Across {len(means)} DP ranks the mean {label} ranged from {means[lo]:.1f} ({lo}) to {means[hi]:.1f} ({hi}); "
                   f"the busiest rank carries {ratio:.2f}x the average" + ("; a rank queued requests while another had half the load or less" if q_skew else "") + ".")
        basis = dict(readings_basis(ctx, signal, min(means, key=lambda r: ctx.stats(signal, r)["n"])), signal=f"{signal} per DP rank")
        return self.finding(ctx, summary, evs, [], confidence="medium" if fewest >= 5 else "low", basis=basis,
                            notes=["Balance the dispatch: the DP controller's load-balance method (shortest queue / fewest tokens) or the router's cache-aware policy."])
