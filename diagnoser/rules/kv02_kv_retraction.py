"""Decode ran out of KV slots and retracted requests: occasional (fine) or frequent (costly).

What it detects:
    Retraction events: `KV cache pool is full. Retract requests.` / `Decode out of memory happened.`
    lines (each line the parser keeps is one event: the copies that the TP ranks of one DP group print
    for the same retraction are dropped, two retractions in the same second are two), the
    `sglang:num_retracted_requests_total` counter or the `num_retracted_reqs` gauge. At least
    `frequent_count` (default 3) events at `frequent_per_min` (default 1) or more per minute is
    frequent (warning); fewer is occasional (info). When no retraction line was captured, a pool pinned
    at `pinned_usage` (default 0.99) whose used tokens then drop by `implied_drop` (default 5 % of
    the pool) while the running count does not fall (so no request finished to free them) implies a
    retraction (low confidence).

Why it matters:
    A retracted request loses its KV and goes back to the queue; its prompt and generated tokens are
    computed again later. Frequent retraction wastes compute and stalls the affected requests.

Evidence:
    Number of retraction events (and retracted requests when more), the rate per minute, the new_token_ratio
    jump, the line or scrape of the first event; for the implied case, the pinned usage and the drop with
    line numbers. A big log judged on its newest part gets a note with the retractions counted before it.

Fix:
    SGLang's tuning guide: occasional retraction (about once a minute) is fine; frequent retraction
    means raising `--schedule-conservativeness` (e.g. 1.0 → 1.3) so admission reserves more room for
    future decode tokens. Growing the pool (`kv_saturation`) also helps, without shrinking the batch: when
    a larger pool is suggested for the same server, this suggestion says to apply it after that one and
    only if retractions persist. The suggestion passes SGLang's
    scheduler model (`diagnoser/engines/sglang/scheduler_model.py`): the initial new_token_ratio is
    min(0.7 × conservativeness, 1.0) (`python/sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py`
    at v0.5.23), so from 1.43 up a larger value changes nothing and none is proposed; `ignore_eos` requests
    (`--ignore-eos`) reserve their whole max_new_tokens whatever the ratio, so none is proposed for them.

    On vLLM the same events are preemptions (`vllm:num_preemptions_total`; V0's `is preempted by
    PreemptionMode.RECOMPUTE` warning): a running request that cannot get a KV block preempts another, which
    is recomputed later (`vllm/v1/core/sched/scheduler.py`). vLLM reserves nothing for future output, so
    there is no conservativeness to raise: the fix is a larger pool (`--num-gpu-blocks-override` when it
    sized the pool, else `--gpu-memory-utilization` up to 0.95 on a GPU, and FP8 KV), and only when
    none of those is in reach, `--max-num-seqs` down to the requests the pool holds at their full length (else a
    note says to cap it on the new pool if preemptions persist)
    (`docs/vllm.md#mechanism`).
Known false positives:
    A retraction during a burst at the start of a benchmark is normal. The implied case cannot tell a
    retraction from a request that finished while another was admitted in the same interval.

References:
    - How diagnoser reads SGLang: [retraction lines by version](docs/sglang.md#retraction), [retraction
      metrics](docs/sglang.md#metrics-queue), [`--schedule-conservativeness` and
      `new_token_ratio`](docs/sglang.md#batching-flags), [SGLang's tuning
      guide](docs/sglang.md#tuning-guide) (about once a minute is fine).
    - SGLang's [hyperparameter tuning
      guide](https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html).
    - Real cases: issues [#2746](https://github.com/sgl-project/sglang/issues/2746) and
      [#26248](https://github.com/sgl-project/sglang/issues/26248), and the recorded SGLang 0.5.23 CPU run
      `examples/kv-full-retract.dgb`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, evidence, readings_basis, suggest
from diagnoser.rules.columns import argmax_source, pairs
from diagnoser.rules.kv01_kv_saturation import retractions


class KVRetraction(Rule):
    name = "kv_retraction"
    code = "KV02"
    title = "Requests retracted (KV full)"
    severity = Severity.WARNING
    events = ("retraction",)
    defaults = {"frequent_per_min": 1.0, "frequent_count": 3, "pinned_usage": 0.99, "implied_drop": 0.05, "proposed_conservativeness": 1.3}
    threshold_help = {
        "frequent_per_min": "retractions per minute at or above this are frequent (the guide: about once a minute is fine)",
        "frequent_count": "fewest retraction events that can be frequent",
        "pinned_usage": "usage at or above this counts as a pinned pool (implied retraction)",
        "implied_drop": "drop in usage (0-1 of the pool) after a pinned pool that implies a retraction",
        "proposed_conservativeness": "--schedule-conservativeness proposed when retraction is frequent",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        n, reqs, src = retractions(ctx)
        if n == 0:
            return self._implied(ctx)
        start, end = ctx.span()
        minutes = (end - start) / 60 if start is not None and end is not None and end > start and not ctx.timeline.untimed else None
        rate = n / max(minutes, 1.0) if minutes else None
        frequent = n >= t["frequent_count"] and (rate is None or rate >= t["frequent_per_min"])
        evs = [evidence("retraction events", n, f">= {t['frequent_count']} and >= {t['frequent_per_min']}/min is frequent", ctx.window_text(), src)]
        if rate is not None:
            evs.append(evidence("retractions per minute", round(rate, 2), t["frequent_per_min"], ctx.window_text(), src))
        ratio = ctx.series("new_token_ratio")
        first = ctx.events_of("retraction")
        if first and "new_token_ratio_after" in first[0].fields:
            f = first[0].fields
            evs.append(evidence("new_token_ratio", f"{f['new_token_ratio_before']} -> {f['new_token_ratio_after']}", None, "", first[0].source))
        elif ratio is not None:
            evs.append(evidence("new_token_ratio", round(max(ratio.values.tolist()), 3), None, ctx.window_text(), argmax_source(ctx, "new_token_ratio")))
        when = f" over {minutes:.1f} min ({rate:.1f}/min)" if minutes else ""
        ranks = {e.rank for e in first}
        rank_txt = f", logged by {len(ranks)} ranks" if len(ranks) > 1 else ""
        if reqs > n:
            rank_txt += f", {reqs} requests in all"
        notes = _before_window(ctx)
        if not ctx.mech.reserves_output:  # vLLM: preemption by recompute, no output reservation to raise
            return self._preempted(ctx, n, when, rank_txt, frequent, evs, notes, minutes)
        if frequent:
            summary = f"Decode retracted requests {n} times{when}{rank_txt}: frequent (the tuning guide calls about once a minute fine)."
            return self.finding(ctx, summary, evs, [self._conservativeness(ctx)], confidence="high", severity=Severity.WARNING,
                                basis={"events": n, "kind": "retraction"}, notes=notes)
        summary = f"Decode retracted requests {n} time(s){when}{rank_txt}: occasional, which the tuning guide calls fine."
        return self.finding(ctx, summary, evs, [], confidence="high" if minutes else "medium", severity=Severity.INFO,
                            basis={"events": n, "kind": "retraction"}, notes=notes)

    def _preempted(self, ctx: RuleContext, n: int, when: str, rank_txt: str, frequent: bool, evs: list[Evidence], notes: list[str],
                   minutes: float | None) -> Finding:
        """vLLM: a running request that cannot get a KV block preempts the lowest-priority running one, whose
        blocks are freed and whose prompt and output are computed again when it is rescheduled
        (``_preempt_request`` in vllm/v1/core/sched/scheduler.py; V0's RECOMPUTE mode in vllm/core/scheduler.py).
        The fixes vLLM's own tuning docs name: a larger KV pool, or fewer requests at once (--max-num-seqs)."""
        evs = [replace(e, signal=e.signal.replace("retraction events", "preemptions").replace("retractions per minute", "preemptions per minute"))
               for e in evs]
        basis = {"events": n, "kind": "preemption"}
        if not frequent:
            return self.finding(ctx, f"vLLM preempted requests {n} time(s){when}{rank_txt}: occasional (each one is recomputed).", evs, [],
                                confidence="high" if minutes else "medium", severity=Severity.INFO, basis=basis, notes=notes)
        from diagnoser.rules.admission import admission, fit_at_full_length
        from diagnoser.rules.proposals import vllm_pool_suggestions

        a = admission(ctx)
        sugg = vllm_pool_suggestions(ctx, a.pool)
        foot, fit = fit_at_full_length(ctx)
        cap = a.cap if not a.cap_inferred else None
        ran = float(np.nanmax(a.running)) if len(a.running) else 0.0
        if cap and fit and int(fit) >= 1 and int(fit) < cap and ran > fit:
            if sugg:  # a larger pool comes first; a cut sized on today's pool would contradict it
                notes = [*notes, f"If preemptions persist after the pool change, cap --max-num-seqs at the requests the new pool holds at their "
                                 f"full length ({foot:,.0f} tokens each; today's pool holds about {fit:.1f})."]
            else:
                sugg.append(suggest(ctx, "max_running_requests", cap, int(fit),
                                    f"the KV pool ({a.pool:,} tokens) holds about {fit:.1f} requests at their full length (the mean prompt + output is "
                                    f"{foot:,.0f} tokens), but up to {ran:.0f} ran: vLLM admits into the pool and preempts the requests it cannot grow, "
                                    "and no larger pool is in reach from the inputs",
                                    "no preemptions (each recomputes a request's prompt and output), at the same or a little less throughput",
                                    ("the requests keep the mean length seen",)))
        summary = (f"vLLM preempted requests {n} times{when}{rank_txt}: frequent; each preempted request loses its KV blocks and is "
                   "recomputed from its prompt when rescheduled.")
        return self.finding(ctx, summary, evs, sugg, confidence="high", severity=Severity.WARNING, basis=basis, notes=notes)

    def _conservativeness(self, ctx: RuleContext):  # type: ignore[no-untyped-def]
        cur = ctx.cfg("schedule_conservativeness", ctx.cfg("arg.schedule_conservativeness"))
        prop = ctx.thresholds["proposed_conservativeness"]
        if isinstance(cur, int | float) and cur >= prop:
            prop = round(cur * 1.3, 2)
        why = "admission reserves more KV for future decode tokens, so fewer admitted requests have to be retracted"
        if cur is None:
            why += "; the current value is not in the inputs (SGLang's default is 1.0)"
        return suggest(ctx, "schedule_conservativeness", cur, prop, why,
                       "fewer retractions and recomputed tokens, at the price of a somewhat smaller running batch",
                       ("retractions come from over-admission, not from single requests larger than the pool",))

    def _implied(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        peak = ctx.stats("token_usage")["max"]
        if peak is None or not peak >= t["pinned_usage"]:
            return None  # no usage reading is pinned, so none can imply a retraction (the pass has the stats)
        p = pairs(ctx, "token_usage", "running_reqs")
        if len(p) < 3:
            return None
        u, r = p.a, p.b
        hit = ((u[:-2] >= t["pinned_usage"]) & (u[1:-1] >= t["pinned_usage"]) & (u[1:-1] - u[2:] >= t["implied_drop"]) & (r[2:] >= r[1:-1])).nonzero()[0]
        if not len(hit):
            return None
        i = int(hit[0]) + 1
        u1, r1, s1 = float(u[i]), float(r[i]), p.src(i)
        u2, r2, s2 = float(u[i + 1]), float(r[i + 1]), p.src(i + 1)
        evs = [
            Evidence("token_usage (pinned)", u1, t["pinned_usage"], "", s1),
            Evidence("token_usage (after)", u2, f"drop >= {t['implied_drop']}", "", s2),
            Evidence("running_reqs (before -> after)", f"{r1:.0f} -> {r2:.0f}", "not falling", "", s2),
        ]
        gen = pairs(ctx, "gen_throughput_tps", "running_reqs")
        before = gen.a[gen.ts <= p.ts[i]].tolist()
        after = gen.a[gen.ts > p.ts[i]].tolist()
        sev = Severity.INFO
        extra = ""
        if before and after and max(before) > 0:
            b, a = sum(before) / len(before), sum(after) / len(after)
            evs.append(Evidence("gen_throughput_tps (before -> after)", f"{b:.0f} -> {a:.0f}", None, "", s2))
            if a < 0.5 * b:
                sev = Severity.WARNING
                extra = f"; generation fell from about {b:.0f} to {a:.0f} tok/s afterwards"
        if not ctx.mech.reserves_output:
            from diagnoser.rules.proposals import vllm_pool_suggestions

            summary = (f"No preemption was counted, but the pool was pinned at {u1:.2f} and then dropped to {u2:.2f} while the running "
                       f"count went {r1:.0f} -> {r2:.0f} (no request finished to free the blocks): a preemption is implied{extra}.")
            return self.finding(ctx, summary, evs, vllm_pool_suggestions(ctx, ctx.memo.get("admission").pool if ctx.memo.get("admission") else None),
                                confidence="low", severity=sev, basis=readings_basis(ctx, "token_usage"),
                                notes=["vllm:num_preemptions_total in a /metrics scrape would confirm it (V1 logs no preemption line)."])
        summary = (f"No retraction line was captured, but the pool was pinned at {u1:.2f} and then dropped to {u2:.2f} "
                   f"while the running count went {r1:.0f} -> {r2:.0f} (no request finished to free the slots): "
                   f"a retraction is implied{extra}.")
        return self.finding(ctx, summary, evs, [self._conservativeness(ctx)], confidence="low", severity=sev, basis=readings_basis(ctx, "token_usage"),
                            notes=["The 'KV cache pool is full. Retract requests.' line (WARNING from 0.5.7) would confirm it."])


def _before_window(ctx: RuleContext) -> list[str]:
    """A big log judged on its newest part (``timeline.window``): the retractions counted before it."""
    before = (ctx.timeline.meta.get("log_window") or {}).get("before") or {}
    n = (before.get("events") or {}).get("retraction", 0)
    if not n:
        return []
    secs = before.get("seconds")
    rate = f" ({n / (secs / 60):.1f}/min)" if secs and secs > 60 else ""
    return [f"Only the log's newest part is judged: the {n:,} retraction event(s){rate} before it, from {before.get('start')} "
            f"to {before.get('end')}, are counted, not judged."]
