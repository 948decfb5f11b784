"""A prefix cache (radix cache or HiCache) is enabled but earns little.

What it detects:
    The prefix-cache hit rate: cached / (cached + new) tokens summed over `Prefill batch` lines, else
    the mean of `sglang:cache_hit_rate`. (a) HiCache is enabled (`--enable-hierarchical-cache`,
    host-pool startup lines) and the hit rate is below `min_hit` (10 %): warning, the host pool costs
    RAM and copy bandwidth for nothing. (b) The radix cache's hit rate fell by half or more between the
    first and second half of the window to below `min_hit` while KV usage p95 was at or above
    `high_usage` (0.9): evictions are dropping reusable prefixes (info).

Why it matters:
    Every cached prefix token is a prefill token not computed: a good hit rate cuts TTFT and prefill
    load. A hierarchical cache that earns nothing only costs; a full device pool that evicts prefixes
    wastes reuse a larger (host) cache would keep.

Evidence:
    Cached and new prefill tokens (or the hit-rate gauge), the first/second half hit rates, KV usage,
    the HiCache host pool size.

Fix:
    (a) Turn HiCache off when the workload shares no prefixes, or check the routing keeps sessions on one
    server. (b) `--enable-hierarchical-cache` with a host pool (`--hicache-ratio` 2 by default) keeps
    evicted prefixes in host RAM; it raises prefix reuse, never decode concurrency
    ([HiCache flags](docs/sglang.md#hicache-flags)).

Known false positives:
    Workloads with unique prompts (each begins with a distinct line) have a low hit rate whatever the
    cache; that is why (b) needs a falling rate with a full pool, not a low rate alone (the recorded
    CPU runs stay silent). Before 0.4.4 the gauge was cumulative since start.

References:
    - How diagnoser reads SGLang: [`cache_hit_rate` across versions](docs/sglang.md#metrics-scheduler),
      [HiCache metrics](docs/sglang.md#metrics-cache), [`#cached-token` in the Prefill batch
      line](docs/sglang.md#prefill-line), [HiCache start-up lines](docs/sglang.md#startup-lines), [HiCache
      flags](docs/sglang.md#hicache-flags).
    - SGLang's [hyperparameter tuning
      guide](https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html).
    - No public real case yet: tested on a constructed log in SGLang's start-up and batch-line shapes.
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, evidence, suggest
from diagnoser.rules.columns import pairs


def hit_rate(ctx: RuleContext, lo: int = 0, hi: int | None = None) -> tuple[float | None, str]:
    """cached / (cached + new) over the prefill readings [lo:hi], else the mean of the hit-rate gauge."""
    p = pairs(ctx, "prefill_cached_tokens", "prefill_new_tokens")
    if len(p):
        hi = len(p) if hi is None else hi
        cached = float(np.add.reduce(p.a[lo:hi]))  # ndarray.sum without its Python wrapper
        new = float(np.add.reduce(p.b[lo:hi]))
        return (cached / (cached + new) if cached + new > 0 else None), p.src(lo)
    s = ctx.series("cache_hit_rate")
    if s is not None and len(s):
        return sum(s.values.tolist()) / len(s), s.sources[0]
    return None, ""


class LowCacheHit(Rule):
    name = "low_cache_hit"
    code = "CA01"
    title = "Prefix cache earns little"
    severity = Severity.WARNING
    defaults = {"min_hit": 0.1, "high_usage": 0.9, "min_points": 4}
    threshold_help = {
        "min_hit": "hit rate (0-1) below this is low",
        "high_usage": "KV usage p95 at or above this means the pool evicts",
        "min_points": "fewest prefill readings needed",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        hicache = bool(ctx.cfg("enable_hierarchical_cache", ctx.cfg("arg.enable_hierarchical_cache"))) or ctx.cfg("hicache_host_gb") is not None
        if not hicache:  # without HiCache it needs a radix cache and a pool that runs full: check those first (cheap)
            if ctx.cfg("disable_radix_cache", ctx.cfg("arg.disable_radix_cache")) is True:
                return None
            p95 = ctx.stats("token_usage")["p95"]
            if p95 is None or not p95 >= t["high_usage"]:
                return None
        npts = len(pairs(ctx, "prefill_cached_tokens", "prefill_new_tokens"))
        n = npts if npts else len(ctx.series("cache_hit_rate") or [])
        if n < t["min_points"]:
            return None
        rate, src = hit_rate(ctx)
        if rate is None:
            return None
        hicache = bool(ctx.cfg("enable_hierarchical_cache", ctx.cfg("arg.enable_hierarchical_cache"))) or ctx.cfg("hicache_host_gb") is not None
        if hicache and rate < t["min_hit"]:
            host_gb = ctx.cfg("hicache_host_gb")
            evs = [evidence("prefix cache hit rate", round(rate, 3), t["min_hit"], ctx.window_text(), src),
                   evidence("HiCache host pool (GB)", host_gb if host_gb is not None else "enabled", None, "",
                            ctx.timeline.cfg_source("hicache_host_gb") or ctx.timeline.cfg_source("enable_hierarchical_cache"))]
            summary = ("HiCache is enabled" + (f" with a {host_gb:g} GB host pool" if host_gb is not None else "")
                       + f", yet only {rate:.1%} of prefill tokens came from the cache over {n} prefill readings.")
            sugg = [suggest(ctx, "hierarchical_cache", True, False, f"the host tier earns a {rate:.1%} hit rate: the workload reuses few prefixes",
                            "frees the host RAM and the copy bandwidth the tier uses; no loss of reuse at this hit rate",
                            ("the workload stays the same (no shared system prompt or multi-turn sessions arriving later)",))]
            return self.finding(ctx, summary, evs, sugg, confidence="medium")
        if hicache or (ctx.cfg("disable_radix_cache", ctx.cfg("arg.disable_radix_cache")) is True):
            return None
        half = npts // 2
        if half < 2:
            return None
        r1, s1 = hit_rate(ctx, 0, half)
        r2, s2 = hit_rate(ctx, half)
        usage = ctx.stats("token_usage")
        if r1 is None or r2 is None or usage["p95"] is None:
            return None
        if not (r2 < t["min_hit"] and r2 <= 0.5 * r1 and usage["p95"] >= t["high_usage"]):
            return None
        evs = [evidence("hit rate, first half", round(r1, 3), None, "", s1), evidence("hit rate, second half", round(r2, 3), t["min_hit"], "", s2),
               evidence("token_usage p95", round(usage["p95"], 3), t["high_usage"], ctx.window_text(), "")]
        summary = f"The prefix-cache hit rate fell from {r1:.1%} to {r2:.1%} while the KV pool ran full (p95 usage {usage['p95']:.2f}): evictions drop reusable prefixes."
        sugg = [suggest(ctx, "hierarchical_cache", False, True, "evicted prefixes would be kept in host RAM and loaded back instead of recomputed",
                        "a higher prefix hit rate and less prefill work; it does not raise the number of requests that decode at once",
                        ("host RAM has room for the host pool (--hicache-ratio 2 by default) plus a 10 GiB reserve",))]
        return self.finding(ctx, summary, evs, sugg, confidence="low", severity=Severity.INFO)
