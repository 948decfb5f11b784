"""A prefix cache (radix cache or HiCache) earns little, or the radix cache is off while prefill dominates.

What it detects:
    The prefix-cache hit rate: cached / (cached + new) tokens summed over `Prefill batch` lines, else
    the mean of `sglang:cache_hit_rate`. (a) HiCache is enabled (`--enable-hierarchical-cache`,
    host-pool startup lines) and the hit rate is below `min_hit` (10 %): warning, the host pool costs
    RAM and copy bandwidth for nothing. (b) The radix cache's hit rate fell by half or more between the
    first and second half of the window to below `min_hit` while KV usage p95 was at or above
    `high_usage` (0.9): evictions are dropping reusable prefixes (info). (c) The radix cache is off
    (`--disable-radix-cache`) while prefill dominates: the prefill tokens computed are at least
    `prefill_ratio` (4) times the tokens decoded. When requests pay for it (TTFT p95 at or above
    `ttft_high_s`, 1 s, or a waiting queue in `queue_share` (30 %) of the readings) it is a warning;
    otherwise info: the engine's work is mostly prompt computation, which a batch job pays for in
    throughput even while TTFT stays low. With the
    cache off no prefix is ever reused (each request's KV is freed at its end), so the hit rate the cache
    would earn cannot be measured; the finding says what it would save per shared prefix share.

Why it matters:
    Every cached prefix token is a prefill token not computed: a good hit rate cuts TTFT and prefill
    load. A hierarchical cache that earns nothing only costs; a full device pool that evicts prefixes
    wastes reuse a larger (host) cache would keep.

Evidence:
    Cached and new prefill tokens (or the hit-rate gauge), the first/second half hit rates, KV usage,
    the HiCache host pool size.

    On each engine. On SGLang: `#cached-token` against `#new-token` in the Prefill line,
    `sglang:cache_hit_rate`, and whether the radix cache is off. On vLLM: `Prefix cache hit rate: H%` in
    the stats line, V0's `vllm:gpu_prefix_cache_hit_rate`, or V1's `vllm:prefix_cache_hits_total` over
    `vllm:prefix_cache_queries_total` per scrape interval (tokens), and `--enable-prefix-caching`.

Fix:
    (a) Turn HiCache off when the workload shares no prefixes, or check the routing keeps sessions on one
    server. (b) `--enable-hierarchical-cache` with a host pool (`--hicache-ratio` 2 by default) keeps
    evicted prefixes in host RAM; it raises prefix reuse, never decode concurrency
    ([HiCache flags](docs/sglang.md#hicache-flags)). (c) Remove `--disable-radix-cache`: prompts that share a
    prefix (a system prompt, few-shot examples, a chat history) then compute it once (recorded on the CPU
    engine: `tests/data/sglang-cpu-before-after/radix-off`).

Known false positives:
    (c) cannot see whether the prompts share prefixes (the cache that would show it is off): a workload
    of unique prompts gains nothing from it, hence low confidence. Workloads with unique prompts (each begins with a distinct line) have a low hit rate whatever the
    cache; that is why (b) needs a falling rate with a full pool, not a low rate alone (the recorded
    CPU runs stay silent). Before 0.4.4 the gauge was cumulative since start.

References:
    - How diagnoser reads SGLang: [`cache_hit_rate` across versions](docs/sglang.md#metrics-scheduler),
      [HiCache metrics](docs/sglang.md#metrics-cache), [`#cached-token` in the Prefill batch
      line](docs/sglang.md#prefill-line), [HiCache start-up lines](docs/sglang.md#startup-lines), [HiCache
      flags](docs/sglang.md#hicache-flags).
    - SGLang's [hyperparameter tuning
      guide](https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html).
    - Real runs: (c) on the SGLang 0.5.23 CPU engine, before and after re-enabling the cache
      (`tests/data/sglang-cpu-before-after/radix-off`); (a) and (b) on constructed logs in SGLang's
      start-up and batch-line shapes (no public case yet).
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, ev, evidence, suggest
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
        return sum(s.values.tolist()) / len(s), s.source_at(0)
    return None, ""


class LowCacheHit(Rule):
    name = "low_cache_hit"
    code = "CA01"
    title = "Prefix cache earns little"
    severity = Severity.WARNING
    defaults = {"min_hit": 0.1, "high_usage": 0.9, "min_points": 4, "prefill_ratio": 4.0, "ttft_high_s": 1.0, "queue_share": 0.3}
    threshold_help = {
        "min_hit": "hit rate (0-1) below this is low",
        "high_usage": "KV usage p95 at or above this means the pool evicts",
        "min_points": "fewest prefill readings needed",
        "prefill_ratio": "radix cache off: prefill tokens computed per token decoded that make prefill dominate",
        "ttft_high_s": "radix cache off: TTFT p95 (s) at or above this means requests pay for the prefill",
        "queue_share": "radix cache off: share of readings with a waiting queue that means requests pay for the prefill",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        hicache = bool(ctx.cfg("enable_hierarchical_cache", ctx.cfg("arg.enable_hierarchical_cache"))) or ctx.cfg("hicache_host_gb") is not None
        if not hicache:  # without HiCache it needs a radix cache and a pool that runs full: check those first (cheap)
            if ctx.cfg("disable_radix_cache", ctx.cfg("arg.disable_radix_cache")) is True:
                return self._radix_off(ctx)
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

    def _radix_off(self, ctx: RuleContext) -> Finding | None:
        """(c): the radix cache is off and prefill dominates; what re-enabling it would save."""
        t = ctx.thresholds
        new = ctx.series("prefill_new_tokens")
        if new is None or len(new) < t["min_points"]:
            return None
        prefill = float(np.nansum(new.values))
        decoded, how = _decoded(ctx)
        if not decoded or prefill < t["prefill_ratio"] * decoded:
            return None
        ttft = (ctx.timeline.meta.get("window_quantiles") or {}).get("ttft_seconds_p95")
        if ttft is None:
            ttft = ctx.stats("ttft_seconds_p95")["p50"]
        q = ctx.series("queue_reqs")
        qshare = float(np.count_nonzero(q.values > 0) / len(q)) if q is not None and len(q) else 0.0
        slow = ttft is not None and ttft >= t["ttft_high_s"]
        pays = slow or qshare >= t["queue_share"]  # requests wait for the prefill: a warning; else a note of the work
        from diagnoser.capacity.serverstate import prompt_tokens

        prompt = prompt_tokens(ctx.timeline)
        src = ctx.timeline.cfg_source("disable_radix_cache") or ctx.timeline.cfg_source("arg.disable_radix_cache")
        evs = [evidence("disable_radix_cache", True, None, "", src),
               evidence("prefill tokens per token decoded", round(prefill / decoded, 1), t["prefill_ratio"], ctx.window_text(), how)]
        if ttft is not None:
            evs.append(ev(ctx, "ttft_seconds_p95", ttft, t["ttft_high_s"], at="max"))
        if q is not None:
            evs.append(evidence("share of readings with a queue", round(qshare, 2), t["queue_share"], ctx.window_text(), q.source_at(0)))
        per = f" ({prompt:,.0f} tokens per prompt)" if prompt else ""
        summary = (f"The radix cache is off (--disable-radix-cache) while prefill dominates: {prefill:,.0f} prompt tokens were computed "
                   f"for {decoded:,.0f} decoded ({prefill / decoded:.0f}x){per}"
                   + (f"; TTFT p95 {ttft:.2f} s" if ttft is not None else "") + (f"; requests waited in {qshare:.0%} of the readings" if qshare else "")
                   + ". Every prompt is computed in full, shared prefixes included."
                   + ("" if pays else f" Not a warning: TTFT p95 is under {t['ttft_high_s']:g} s and a queue showed in under "
                      f"{t['queue_share']:.0%} of the readings, so the cost is engine time, which a batch job pays in throughput."))
        if prompt:
            save = (f"if a share s of each {prompt:,.0f}-token prompt is a prefix other requests share, each later request computes "
                    f"{prompt:,.0f} x (1 - s) tokens instead: at s = 0.5 half the prefill work ({prefill / 2:,.0f} of {prefill:,.0f} tokens "
                    "in this window); TTFT and throughput gain only as far as prefill time is what requests wait for "
                    "(a fast prefill, as of a small model, saves compute but hardly moves TTFT)")
        else:
            save = ("a shared prefix is computed once instead of once per request: the prefill work falls by the shared share "
                    "of each prompt; TTFT and throughput gain only as far as prefill time is what requests wait for")
        sugg = [suggest(ctx, "disable_radix_cache", True, False, "with the radix cache off, no prompt prefix is ever reused", save,
                        ("the prompts share prefixes (a system prompt, few-shot examples, chat history); unique prompts gain nothing",
                         "the pool has room to keep finished requests' prefixes (the cache evicts them when it needs the slots)"))]
        return self.finding(ctx, summary, evs, sugg, confidence="low", severity=Severity.WARNING if pays else Severity.INFO,
                            notes=["The hit rate the cache would earn cannot be measured while it is off; the low confidence says so."])


def _decoded(ctx: RuleContext) -> tuple[float | None, str]:
    """Tokens decoded in the window: the decode-token counter (0.5.7+), else gen throughput x the window."""
    dec = ctx.series("decode_tokens")
    if dec is not None and len(dec) >= 2:
        return float(np.nansum(dec.values)), "sglang:realtime_tokens_total{mode=decode}"
    gen = ctx.stats("gen_throughput_tps")
    start, end = ctx.span()
    if gen["mean"] and start is not None and end is not None and end > start and not ctx.timeline.untimed:
        return gen["mean"] * (end - start), "gen throughput x the window"
    return None, ""
