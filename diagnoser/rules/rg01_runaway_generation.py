"""A few requests generate far longer than the rest and hold the KV pool by themselves.

What it detects:
    Two shapes. (1) A median running batch of `max_running` (4) or fewer requests whose KV tokens fill
    at least `pool_share` (80 %) of the pool (token usage p50), so each request holds a large share of
    the pool, with the held tokens still growing (the requests keep generating), and each holding more
    than the finished requests' mean prompt + output when requests finished (else a few requests of the
    ordinary length fill a small pool: that is kv_saturation's finding, not a runaway). (2) Without a full
    pool: `#token / #running-req` (`num_used_tokens / num_running_reqs`) of `long_tokens` (32768)
    or more at a median of `max_running_long` (16) running requests or fewer, still growing when
    there are two readings, and at least `prompt_factor` (8) times the prompts the Prefill lines show
    when there are some: the requests hold far more than any prompt, so their outputs run on (info;
    warning once they fill `pool_share` of the pool). One reading judges, at low confidence. (3) From
    the output floor (`output_floor_tokens`, a lower bound on one request's output that the engine's
    reader derives): at least `floor_tokens` (4096) tokens for one request, while `max_running_long`
    (16) or fewer ran at the start of the readings it rests on (info).

Why it matters:
    Requests without a bounded `max_tokens` (or with EOS ignored) keep decoding until the pool or the
    context limit stops them: they block every other request, trigger retractions, and the GPU decodes
    a batch of one or two at a fraction of its throughput.

Evidence:
    Running requests, token usage, KV tokens per request and their growth, with the lines they come
    from.

    On each engine. On SGLang: `#token` / `sglang:num_used_tokens` against the running requests and the
    pool. On vLLM: used tokens are KV usage x the pool (`vllm:kv_cache_usage_perc` x `num_gpu_blocks` x
    block size from `vllm:cache_config_info`, block-granular), against `vllm:num_requests_running`.
    From vLLM's stats lines alone: the output floor, generation tok/s x seconds over consecutive lines
    that admitted no prompt (prompt throughput 0), divided by the requests running at the line before
    them with none waiting or swapped (only those can generate, so one of them generated at least that
    share; docs/vllm.md#logs).

Fix:
    On the client: set `max_tokens` / `max_new_tokens` and honour EOS / stop strings (issue #2746 was fixed
    by switching the benchmark client). Server flags do not fix it; `--context-length` bounds the worst
    case.

Known false positives:
    Genuinely long-context workloads (a few 100k-token documents) look the same; check that the
    outputs, not the prompts, are long.

References:
    - How diagnoser reads SGLang: [`#token` and `token usage` in the Decode batch
      line](docs/sglang.md#decode-line), [retraction once the pool is full](docs/sglang.md#retraction),
      [KV-pool sizing](docs/sglang.md#kv-sizing).
    - Real case: issue [#2746](https://github.com/sgl-project/sglang/issues/2746), fixed by switching the
      benchmark client.
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.admission import fit_at_full_length
from diagnoser.rules.base import Rule, RuleContext, evidence, fmt_int, pool_tokens
from diagnoser.rules.columns import argmax_source, arrays, pairs


def _tail(src: str) -> str:
    """The line number of a ``name:N`` source (the end of a span), else the source."""
    head, _, n = src.rpartition(":")
    return n if head and n.isdigit() else src


class RunawayGeneration(Rule):
    name = "runaway_generation"
    code = "RG01"
    title = "Runaway outputs hold the pool"
    severity = Severity.WARNING
    reads = ("used_tokens", "output_floor_tokens")
    defaults = {"max_running": 4, "pool_share": 0.8, "min_points": 1, "long_tokens": 32768, "max_running_long": 16, "prompt_factor": 8.0,
                "floor_tokens": 4096}
    threshold_help = {
        "max_running": "median running requests at or below this count as a few",
        "pool_share": "token usage (p50) at or above this counts as holding the pool",
        "min_points": "fewest decode readings with #token and #running-req (one reading judges, at low confidence)",
        "long_tokens": "KV tokens per running request at or above which outputs look unbounded (without a full pool)",
        "max_running_long": "median running requests at or below which long requests are judged",
        "prompt_factor": "tokens per request must be this many times the prompts the prefill lines show",
        "floor_tokens": "a lower bound on one request's output (output_floor_tokens) at or above which it counts as running on",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        return self._held(ctx) or self._floor(ctx)

    def _floor(self, ctx: RuleContext) -> Finding | None:
        """One request's output is at least ``floor_tokens``: the engine's lower bound (``output_floor_tokens``),
        read at a few running requests (``max_running_long`` or fewer where the bound's readings start)."""
        t = ctx.thresholds
        got = arrays(ctx, "output_floor_tokens")
        run = arrays(ctx, "running_reqs")
        if got is None or run is None or not len(got[0]):
            return None
        fts, fv = got
        if np.isnan(fv).all():
            return None
        k = int(np.nanargmax(fv))
        floor = float(fv[k])
        if floor < t["floor_tokens"]:
            return None
        rts, rv = run
        pos = int(np.searchsorted(rts, fts[k], "left"))
        if pos >= len(rts) or rts[pos] != fts[k]:
            return None
        on_floor = set(fts.tolist())
        j = pos
        while j > 0 and float(rts[j - 1]) in on_floor:  # back over the readings the bound rests on
            j -= 1
        start = j - 1
        if start < 0:
            return None
        r0 = float(rv[start])
        if r0 < 1 or r0 > t["max_running_long"]:
            return None
        rsrc = ctx.series("running_reqs").sources  # type: ignore[union-attr]
        fsrc = ctx.series("output_floor_tokens").sources  # type: ignore[union-attr]
        secs = float(fts[k] - rts[start])
        evs = [evidence("output_floor_tokens: one request's output at least", round(floor), f">= {t['floor_tokens']}", "", fsrc[k]),
               evidence("running_reqs where those readings start (none waiting)", r0, f"<= {t['max_running_long']}", "", rsrc[start]),
               evidence("readings with no prompt admitted, after it", pos - start, None, f"{secs:,.0f} s", f"{rsrc[start + 1]} .. {_tail(fsrc[k])}")]
        gen = ctx.series("gen_throughput_tps")
        if gen is not None:
            g = gen.values[(gen.ts > rts[start]) & (gen.ts <= fts[k])]
            if len(g):
                evs.append(evidence("gen_throughput_tps over those readings", f"{np.nanmin(g):,.1f}–{np.nanmax(g):,.1f}", None, f"{secs:,.0f} s", ""))
        summary = (f"One request generated at least {fmt_int(floor)} tokens: {fmt_int(floor * r0)} tokens were generated in the {secs:,.0f} s after "
                   f"{rsrc[start]}, where {r0:.0f} request{'s' if r0 != 1 else ''} ran and none waited, and no prompt was admitted since, so only "
                   f"{'those' if r0 != 1 else 'that one'} generated them. An output this long runs on (thinking without a budget, a max_tokens "
                   "the server does not get, an ignored stop string) or the workload asks for very long outputs.")
        notes = ["Check that the client's max_tokens reaches the server (a field it ignores leaves outputs unbounded) and that EOS/stop strings "
                 "are honoured; server flags do not fix runaway outputs."]
        return self.finding(ctx, summary, evs, [], confidence="medium", severity=Severity.INFO, notes=notes)

    def _held(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        p50 = ctx.stats("token_usage")["p50"]
        if p50 is None or p50 < t["pool_share"]:
            return self._long(ctx)  # a few requests do not hold the pool (checked before the join: the pass has the stats)
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
        foot, _ = fit_at_full_length(ctx)
        if foot and per <= foot:
            return None  # no longer than the requests that finished: a small pool of ordinary requests (KV01's case)
        pool, _ = pool_tokens(ctx)
        evs = [evidence("running_reqs (median)", med_run, f"<= {t['max_running']}", ctx.window_text(), pts[len(pts) // 2][3]),
               evidence("token_usage (p50)", usage["p50"], t["pool_share"], ctx.window_text(), ctx.series("token_usage").source_at(0)),  # type: ignore[union-attr]
               evidence("used_tokens per running request", round(per), None, "", pts[-1][3]),
               evidence("used_tokens growth over the window", round(growth), "> 0 (still generating)", ctx.window_text(), f"{pts[0][3]} .. {pts[-1][3]}")]
        summary = (f"{med_run:.0f} request(s) held {usage['p50']:.0%} of the KV pool" + (f" ({fmt_int(pool)} tokens)" if pool else "")
                   + f", about {fmt_int(per)} tokens each, and kept growing by {fmt_int(growth)} tokens over the window.")
        return self.finding(ctx, summary, evs, [], confidence="medium",
                            notes=["Bound max_tokens on the client and honour EOS/stop strings; server flags do not fix runaway outputs."])

    def _long(self, ctx: RuleContext) -> Finding | None:
        """Requests holding far more KV tokens than any prompt while they keep generating: ``#token /
        #running-req`` at or above ``long_tokens`` (and ``prompt_factor`` x the prompts the prefill lines
        show, when they show some). One reading shows the size; growth needs two."""
        t = ctx.thresholds
        pr = pairs(ctx, "used_tokens", "running_reqs")
        k = (pr.b > 0).nonzero()[0]
        if not len(k):
            return None
        med_run = float(np.sort(pr.b[k]).item(len(k) // 2))
        if med_run > t["max_running_long"]:
            return None
        per_all = pr.a[k] / pr.b[k]
        per = float(np.sort(per_all).item(len(per_all) // 2))
        if per < t["long_tokens"]:
            return None
        new, cached, seqs = ctx.stats("prefill_new_tokens"), ctx.stats("prefill_cached_tokens"), ctx.stats("prefill_new_seqs")
        prompt = None
        if new["n"] and seqs["n"] and (seqs["mean"] or 0) > 0:
            prompt = ((new["mean"] or 0) + (cached["mean"] or 0)) / seqs["mean"]
            if per < t["prompt_factor"] * prompt:
                return None  # long prompts, not long outputs
        first, last = int(k[0]), int(k[-1])
        growth = float(pr.a[last] - pr.a[first]) if last != first else None
        if growth is not None and growth <= 0:
            return None  # not generating
        usage = ctx.stats("token_usage")
        pool, _ = pool_tokens(ctx)
        evs = [evidence("KV tokens per running request (median)", round(per), f">= {t['long_tokens']}", ctx.window_text(), pr.src(last)),
               evidence("running_reqs (median)", med_run, f"<= {t['max_running_long']}", ctx.window_text(), pr.src(int(k[len(k) // 2])))]
        if growth is not None:
            evs.append(evidence("used_tokens growth over the window", round(growth), "> 0 (still generating)", ctx.window_text(), f"{pr.src(first)} .. {pr.src(last)}"))
        if prompt is not None:
            evs.append(evidence("prompt tokens per admitted request (prefill lines)", round(prompt), None, ctx.window_text(), argmax_source(ctx, "prefill_new_tokens")))
        if usage["n"]:
            evs.append(evidence("token_usage", usage["max"], None, ctx.window_text(), argmax_source(ctx, "token_usage")))
        summary = (f"{med_run:.0f} running request(s) hold about {fmt_int(per)} KV tokens each"
                   + (f" ({per / prompt:.0f}x the {fmt_int(prompt)}-token prompts)" if prompt else " (far above a typical prompt)")
                   + (f" and kept growing by {fmt_int(growth)} tokens over the window" if growth is not None else "")
                   + ": outputs with no effective length bound" + (f"; they already fill {usage['max']:.0%} of the pool" + (f" ({fmt_int(pool)} tokens)" if pool else "") if usage["n"] else "") + ".")
        sev = Severity.WARNING if (usage["max"] or 0) >= t["pool_share"] else Severity.INFO
        notes = ["Check that the client's max_tokens reaches the server (a field it ignores leaves outputs unbounded) and that EOS/stop strings "
                 "are honoured; server flags do not fix runaway outputs."]
        if prompt is None:
            notes.append("No prefill line shows the prompts: a workload of very long prompts (long-context documents) looks the same.")
        return self.finding(ctx, summary, evs, [], confidence="low" if prompt is None else "medium", severity=sev, notes=notes)
