"""Prefill admits too little while requests wait and KV has room: capped prefill batches or an admission stall.

What it detects:
    Two shapes. (1) Capped prefill: prefill batches of which at least `cap_share` (50 %) compute exactly the
    per-batch cap (`--chunked-prefill-size` or `--max-prefill-tokens`, from the config; else the largest
    power-of-two batch size that repeats in half the batches, inferred; or a batch size that repeats exactly
    while the next request of that size would not have fitted the power-of-two budget above it — the
    scheduler adds requests to a batch until the budget is spent; a batch is one `Prefill batch` line, or a
    scrape interval's prefill tokens over its prefill forward passes,
    `sglang:cuda_graph_passes_total{mode=prefill_*}`, and an interval whose every pass was a whole chunk had
    a backlog, the prompts' remaining chunks), while a backlog waits (`#queue-req` > 0
    or `#pending-token` above `pending_factor` × the cap) in at least half of them and KV usage p95 stays
    below `kv_room` (0.9). One batch is enough to judge (at low confidence); fewer than `few_batches` (3)
    are info unless `deep_queue` (100) requests wait (a long prompt being chunked while a few wait is normal
    work). Batches at a chunk cap that each pack two or more requests (or, from scrapes, a mean prompt that
    fits in one chunk) are whole prompts packed to the chunk size, not a prompt cut into chunks: prefill
    compute sets the pace, so that shape is info with no chunk change (a larger chunk packs more per step
    for about the same tokens per second). The cap is the shared admission model's prefill budget (`diagnoser/rules/admission.py`), and
    nothing fires when the model says most readings with a queue were held by the slot cap or the KV
    reservation instead (SGLang tests the slots before the budget, and a batch that admits little because
    the pool is reserved is not capped by its budget). (2) Admission stall: requests wait for
    `stall_seconds` (20 s) or more with no prefill batch at all, KV usage below `kv_room`, and every
    reading of the stretch classified *none* by the admission model — no slot cap, prefill budget, state
    pool, transfer or KV reservation (computed, or inferred from a running count held below the cap)
    explains the wait, and no retraction. A server whose running count sits at one value below the cap
    while requests wait is reservation-bound (`kv_saturation`), not stalled.

Why it matters:
    Time to first token is the queue wait plus the prefill time. A small prefill cap splits each prompt
    into many steps (each a scheduler round trip); a stalled admission leaves free KV and slots unused
    while requests wait.

Evidence:
    prefill_new_tokens against the cap, the share of capped batches, the queue / pending tokens at those
    batches, token usage; for a stall, the longest wait without admission with its first and last line.

    On each engine. On SGLang: the Prefill line (`#new-seq`, `#new-token`, `#cached-token`),
    `--chunked-prefill-size` and `--max-prefill-tokens`. On vLLM there is no per-batch prefill line:
    prompt tokens computed per scrape interval come from V1's prefix-cache counters
    (`vllm:prefix_cache_queries_total` minus `_hits_total`), the budget from `--max-num-batched-tokens`;
    the admission test is vLLM's step budget (the mean prompt against what the decoders leave of
    `--max-num-batched-tokens`). A vLLM log alone cannot show a prefill stall yet.

Fix:
    (1) Raise `--chunked-prefill-size` (and `--max-prefill-tokens` when it is the smaller) to the default
    class, `target_chunk` (8192; [defaults](docs/sglang.md#batching-flags): 4096–8192 below 160 GiB), or
    twice the cap when that is larger (on the real CPU engine, 128 → 8192 took TTFT p95 from 3.3 to
    0.35 s: `tests/engine/test_before_after.py`). (2)
    Lower `--schedule-conservativeness` (the tuning guide: usage < 0.9 with a queue → e.g. 0.3), which
    lowers the future-token reservation that blocks admission.

    On vLLM the budget is the step's `--max-num-batched-tokens`, decode and prefill tokens together
    (`docs/vllm.md#mechanism`): when it held the queue in `cap_share` of the readings
    with one (the mean prompt is longer than what the decoders leave of it, so a prompt mid-prefill takes
    the rest of every step) and KV has room, the fix is `--max-num-batched-tokens` raised to vLLM's
    default class (2,048) or enough for the mean prompt in one step, at most `--max-num-seqs` ×
    `--max-model-len`.
Known false positives:
    A small chunk size chosen on purpose to protect decode latency (see
    `prefill_decode_interference`, the opposite trade-off). A stall while the scheduler waits on a
    grammar compile or a PD transfer is not an admission problem.

References:
    - How diagnoser reads SGLang: [the Prefill batch line and
      `#pending-token`](docs/sglang.md#prefill-line), [chunked prefill, `--max-prefill-tokens`,
      `--schedule-conservativeness` and `new_token_ratio`](docs/sglang.md#batching-flags), [SGLang's tuning
      guide](docs/sglang.md#tuning-guide), [from signals to a bottleneck](docs/sglang.md#bottlenecks).
    - Issue [#7133](https://github.com/sgl-project/sglang/issues/7133): admission stops with free KV and a
      low conservativeness.
    - Real case: the recorded SGLang 0.5.23 CPU run `examples/prefill-capped.dgb`.
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.admission import admission, per_pass, prefill_budget
from diagnoser.rules.base import Rule, RuleContext, evidence, suggest
from diagnoser.rules.columns import aligned, argmax_source, raw_arrays, times_in_order


class PrefillStall(Rule):
    name = "prefill_stall"
    code = "PF01"
    title = "Prefill admits too little"
    severity = Severity.WARNING
    reads = ("prefill_new_tokens",)
    defaults = {"min_batches": 1, "few_batches": 3, "deep_queue": 100, "cap_share": 0.5, "kv_room": 0.9, "stall_seconds": 20.0, "pending_factor": 2.0, "target_chunk": 8192}
    threshold_help = {
        "min_batches": "fewest prefill batches needed to judge capping (one batch judges, at low confidence)",
        "few_batches": "below this many prefill batches a capped batch is info unless deep_queue requests wait",
        "deep_queue": "waiting requests that make even one or two capped batches a warning",
        "cap_share": "share of prefill batches at the cap that counts as capped",
        "kv_room": "KV usage below this counts as room",
        "stall_seconds": "seconds of waiting without any admission that count as a stall",
        "pending_factor": "pending prompt tokens above this many caps count as a backlog",
        "target_chunk": "largest chunk size proposed (GPU default class below 160 GiB)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        a = admission(ctx)
        if a.share("slots") + a.share("kv") >= 0.5:
            return None  # the slot cap or the KV reservation holds the queue, not the prefill budget (SGLang tests slots first)
        if not ctx.mech.reserves_output:
            return self._step_budget(ctx)
        return self._capped(ctx) or self._stall(ctx)

    def _step_budget(self, ctx: RuleContext) -> Finding | None:
        """vLLM: the step's token budget (``--max-num-batched-tokens``) held the queue in most readings with one,
        by the admission model's arithmetic (the mean prompt is longer than what the decoders leave of the
        budget, so a prompt mid-prefill takes the rest of every step: v1/core/sched/scheduler.py)."""
        t = ctx.thresholds
        a = admission(ctx)
        share = a.share("budget")
        if a.n_wait < 3 or share < t["cap_share"] or not a.budget or a.prompt is None:
            return None
        u = ctx.stats("token_usage")
        if u["p95"] is not None and u["p95"] >= t["kv_room"]:
            return None
        steps = -(-a.prompt // a.budget)
        run = ctx.stats("running_reqs")
        want = max(2 * a.budget, 2048, int(2 ** np.ceil(np.log2(max(a.prompt + (run["p95"] or 0), 1.0)))))
        proposed = min(want, max(int(t["target_chunk"]), 2 * a.budget))
        seqs, mml = ctx.cfg("max_running_requests"), ctx.cfg("context_len")
        if isinstance(seqs, int | float) and isinstance(mml, int | float) and seqs > 0 and mml > 0:
            proposed = min(proposed, int(seqs * mml))  # above max_num_seqs x max_model_len no step can use it
        evs = [evidence("share of readings with a queue held by the step token budget", round(share, 2), t["cap_share"], ctx.window_text(), a.first("budget")),
               evidence("max_num_batched_tokens", a.budget, None, "", a.budget_src),
               evidence("mean prompt (uncached tokens per finished request)", round(a.prompt), f"> {a.budget} - running", ctx.window_text(),
                        "prompt tokens / finished requests")]
        summary = (f"In {share:.0%} of the {a.n_wait} readings with a queue the step token budget held the waiting requests: "
                   f"--max-num-batched-tokens {a.budget:,} is below the mean prompt of {a.prompt:,.0f} tokens, so each prompt takes about "
                   f"{steps:.0f} steps to prefill and uses the budget the waiting requests need, while slots and KV were free.")
        sugg = []
        if proposed > a.budget:
            sugg.append(suggest(ctx, "max_num_batched_tokens", a.budget, proposed,
                                f"each step schedules at most {a.budget:,} tokens (decode and prefill together); a prompt of {a.prompt:,.0f} tokens "
                                f"needs {steps:.0f} steps; vLLM's default for an API server below 70 GiB is 2,048 (vllm/engine/arg_utils.py)",
                                f"a mean prompt prefills in {-(-a.prompt // proposed):.0f} step(s) instead of {steps:.0f}: lower TTFT and a shorter queue",
                                ("longer steps slow the decode of the running requests a little (prefill and decode share a step)",)))
        return self.finding(ctx, summary, evs, sugg, confidence="medium", severity=Severity.WARNING)

    def _capped(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        p = ctx.series("prefill_new_tokens")
        if p is None or len(p) < t["min_batches"] or any(e.fields.get("phase") in ("prefill", "extend") for e in ctx.events_of("oom")):
            return None  # (prefill ran out of memory: a larger prefill budget is the wrong way)
        cap, cap_name, cap_src = prefill_budget(ctx)
        if not cap:
            return None
        pv = per_pass(ctx)  # tokens of one prefill batch (a scrape's interval: per forward pass)
        with np.errstate(invalid="ignore", divide="ignore"):
            at_mask = pv >= 0.98 * cap
            if cap_name == "budget":  # admitted up to the budget: the next request would not have fitted
                seqs = np.nan_to_num(aligned(ctx, "prefill_new_tokens", "prefill_new_seqs"), nan=1.0)
                at_mask = at_mask | ((seqs >= 2) & (pv + pv / np.maximum(seqs, 1) > cap))
        at_cap = at_mask.nonzero()[0]
        n_batches = int(np.count_nonzero(~np.isnan(pv)))
        if n_batches < t["min_batches"] or not len(at_cap) or len(at_cap) / n_batches < t["cap_share"]:
            return None
        cshare = len(at_cap) / n_batches
        usage = ctx.stats("token_usage")
        if usage["p95"] is not None and usage["p95"] >= t["kv_room"]:
            return None  # no KV room
        qa, pa = aligned(ctx, "prefill_new_tokens", "queue_reqs"), aligned(ctx, "prefill_new_tokens", "pending_tokens")
        # a scrape interval whose every pass computed a whole chunk had a backlog: the prompts' remaining chunks
        chunked = np.zeros(len(pv), dtype=bool)
        if cap_name in ("chunked_prefill_size", "inferred"):
            labels, lab, _line = p.sources.parts()
            scraped = np.array([lb.startswith(("scrape@", "prometheus@")) for lb in labels], dtype=bool)
            chunked = scraped[lab] & np.isnan(pa) if len(lab) else chunked
        with np.errstate(invalid="ignore"):
            backlog = (at_mask & ((qa > 0) | (pa > t["pending_factor"] * cap) | chunked)).nonzero()[0]
        if len(backlog) < 0.5 * len(at_cap):
            return None
        ps, qs = ctx.stats("pending_tokens"), ctx.stats("queue_reqs")
        evs = [evidence("prefill_new_tokens at the cap", cap, f"{cap_name}", "", cap_src or p.sources[int(at_cap[0])]),
               evidence("share of prefill batches at the cap", round(cshare, 2), t["cap_share"], ctx.window_text(), p.sources[int(at_cap[0])]),
               Evidence("capped batches with a backlog", len(backlog), f">= half of {len(at_cap)}", ctx.window_text(), p.sources[int(backlog[0])])]
        if ps["n"]:
            evs.append(evidence("pending_tokens", ps["max"], f"> {t['pending_factor']:.0f} x cap", ctx.window_text(), argmax_source(ctx, "pending_tokens")))
        if usage["n"]:
            evs.append(evidence("token_usage p95", round(usage["p95"], 3), f"< {t['kv_room']}", ctx.window_text(), ""))
        tail = (f" while up to {qs['max'] or 0:.0f} requests waited" + (f" and up to {ps['max']:,.0f} prompt tokens were pending" if ps["n"] else "")
                + (f"; KV usage stayed at or below {usage['max']:.2f}" if usage["n"] else "") + ".")
        mpt = ctx.cfg("max_prefill_tokens", ctx.cfg("arg.max_prefill_tokens"))
        info = Severity.INFO if len(p) < t["few_batches"] and (qs["max"] or 0) < t["deep_queue"] else None  # a chunked prompt, a short queue: normal work
        if cap_name == "budget":
            sugg = [suggest(ctx, "max_prefill_tokens", mpt, 2 * cap,
                            f"each prefill batch stopped at about {cap:,} tokens while {qs['max'] or 0:.0f} requests waited"
                            + ("" if mpt is not None else "; the current value is not in the inputs (default 16384)"),
                            "more waiting requests admitted per prefill step, so a shorter queue wait",
                            ("the GPU has activation memory for the larger batch", "--chunked-prefill-size is not the smaller budget"))]
            notes = ["Each prefill step already computes a large batch: a larger budget admits more per step but the gain is modest "
                     "when prefill compute is the limit (more prefill capacity: DP, replicas, or PD disaggregation)."]
            return self.finding(ctx, f"{cshare:.0%} of {n_batches} prefill batches stopped admitting at the per-batch prefill budget (about {cap:,} "
                                f"tokens: {cap_src})" + tail, evs, sugg, confidence="medium", notes=notes, severity=info)
        proposed = max(2 * cap, int(t["target_chunk"]))  # the default class, from any input (pending tokens are log-only)
        packed, per = self._packed(ctx, cap, cap_name, at_cap)
        if packed:
            # several whole prompts packed to the chunk size (the last one split), not one prompt cut into chunks: prefill
            # compute sets the pace, and a larger chunk packs more per step for about the same tokens per second
            # (python/sglang/srt/managers/schedule_policy.py, PrefillAdder's rem_chunk_tokens at v0.5.23)
            notes = ["A larger chunk packs more prompts into each prefill step but computes about the same tokens per second: "
                     "the queue shortens with fewer prompt tokens to compute (a prefix cache that hits) or more prefill capacity "
                     "(DP, replicas, PD disaggregation)."]
            return self.finding(ctx, f"{cshare:.0%} of {n_batches} prefill batches were full at the {cap:,}-token {cap_name.replace('_', ' ')}, "
                                f"each packing {per}," + tail[:-1]
                                + ": the prompts fit in one chunk, so prefill compute, not the chunk size, set the pace.",
                                evs, [], confidence="medium", notes=notes, severity=Severity.INFO)
        sugg = []
        if cap_name in ("chunked_prefill_size", "inferred"):
            cur = ctx.cfg("chunked_prefill_size", ctx.cfg("arg.chunked_prefill_size"))
            sugg.append(suggest(ctx, "chunked_prefill_size", cur if cap_name != "inferred" else None, proposed,
                                f"each prompt is computed in {cap:,}-token steps while {qs['max'] or 0:.0f} requests wait",
                                f"about {proposed // cap}x fewer prefill steps per prompt, so shorter queue time and TTFT",
                                ("the GPU has activation memory for the larger chunk (it is reserved from the non-static fraction)",)))
        if isinstance(mpt, int | float) and mpt < proposed:
            sugg.append(suggest(ctx, "max_prefill_tokens", mpt, max(proposed, 16384), "the per-batch prefill budget is below the proposed chunk size",
                                "lets a prefill batch use the larger chunk", ("16384 is SGLang's default",)))
        return self.finding(ctx, f"{cshare:.0%} of {n_batches} prefill batches computed exactly {cap:,} tokens (the {cap_name.replace('_', ' ')} cap)" + tail,
                            evs, sugg, confidence="high" if cap_name != "inferred" else "medium", severity=info)

    @staticmethod
    def _packed(ctx: RuleContext, cap: float, cap_name: str, at_cap: np.ndarray) -> tuple[bool, str]:
        """Whether the batches at a chunk cap are whole prompts packed to the chunk size rather than a prompt cut
        into chunks, and how many per batch. A prompt longer than the chunk fills a batch alone (`#new-seq: 1`);
        when (nearly) every batch at the cap holds two or more requests the prompts fit in one chunk. Without
        the per-batch request counts (scrapes), the finished requests' mean uncached prompt against the cap."""
        if cap_name not in ("chunked_prefill_size", "inferred"):
            return False, ""
        seqs = aligned(ctx, "prefill_new_tokens", "prefill_new_seqs")[at_cap]
        known = seqs[~np.isnan(seqs)]
        prompt = admission(ctx).prompt
        what = f"about {cap / prompt:.1f} prompts of {prompt:,.0f} tokens" if prompt else ""
        if len(known):
            if np.count_nonzero(known >= 2) < 0.9 * len(known):
                return False, ""
            return True, what or f"{float(np.mean(known)):.1f} requests on average"
        return bool(prompt is not None and 0 < prompt <= cap), what

    def _stall(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        if ctx.timeline.untimed or ctx.series("queue_reqs") is None:
            return None
        qts, qv = raw_arrays(ctx, "queue_reqs")
        waiting = qv > 0
        if not np.count_nonzero(waiting):
            return None  # nothing waited
        pts, _ = raw_arrays(ctx, "prefill_new_tokens")
        if len(pts) and len(qts) and times_in_order(ctx, pts) and times_in_order(ctx, qts):
            # a stall lies between two admissions (or before the first / after the last): none that long, no stall
            gaps = np.subtract(pts[1:], pts[:-1])
            widest = max(float(np.maximum.reduce(gaps)) if len(gaps) else 0.0, float(pts[0] - qts[0]), float(qts[-1] - pts[-1]))
            if widest < t["stall_seconds"]:
                return None
        u = aligned(ctx, "queue_reqs", "token_usage")
        a = admission(ctx)
        held = np.isin(qts, np.asarray(a.ts)[(a.label != "none") & (a.label != "idle")])  # a limit of the admission model held these
        with np.errstate(invalid="ignore"):
            ok = waiting & ~(u >= t["kv_room"]) & ~held
        if not ok.any():
            return None
        rts = np.asarray(sorted(e.ts for e in ctx.events_of("retraction")), dtype=float)
        adm, ret = np.searchsorted(pts, qts, side="right"), np.searchsorted(rts, qts, side="right")
        # a stretch: consecutive ok readings with no admission or retraction after its first reading
        brk = np.ones(len(qts), dtype=bool)
        brk[1:] = ~ok[1:] | ~ok[:-1] | (adm[1:] != adm[:-1]) | (ret[1:] != ret[:-1])
        group = np.cumsum(brk)
        g = group[ok]
        gids = g[np.r_[True, g[1:] != g[:-1]]] if len(g) else g
        first, last = np.searchsorted(group, gids, side="left"), np.searchsorted(group, gids, side="right") - 1
        dur = qts[last] - qts[first]
        k = int(np.argmax(dur))
        if dur[k] < t["stall_seconds"]:
            return None
        q = ctx.series("queue_reqs")
        d, s0, s1, v = float(dur[k]), q.sources[first[k]], q.sources[last[k]], float(qv[last[k]])  # type: ignore[union-attr]
        evs = [Evidence("seconds waiting without an admission", round(d, 1), t["stall_seconds"], f"{d:.0f} s", f"{s0} .. {s1}"), Evidence("queue_reqs", v, "> 0", "", s1)]
        cur = ctx.cfg("schedule_conservativeness", ctx.cfg("arg.schedule_conservativeness"))
        sugg = []
        if not isinstance(cur, int | float) or cur > 0.3:
            sugg.append(suggest(ctx, "schedule_conservativeness", cur, 0.3 if not isinstance(cur, int | float) or cur > 0.6 else round(cur / 2, 2),
                                "requests waited with free KV and free slots, and no slot cap, prefill budget or KV reservation the inputs show explains it",
                                "admits waiting requests sooner; raises token usage and some retraction risk",
                                ("the stall comes from the future-token reservation (new_token_ratio), not from a grammar, LoRA or PD transfer wait",)))
        return self.finding(ctx, f"Requests waited {d:.0f} s with no prefill admission although KV usage stayed below {t['kv_room']} and slots were free "
                            f"(up to {v:.0f} waiting).", evs, sugg, confidence="medium")
