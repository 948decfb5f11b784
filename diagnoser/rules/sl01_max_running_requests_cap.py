"""The running batch sits at the effective max_running_requests while KV has room and requests wait.

What it detects:
    Readings with a waiting queue where `running_reqs` equals the effective `max_running_requests`
    (summary line `max_running_requests=N`, server info `effective_max_running_requests_per_dp` or
    server args) in at least `at_cap_share` (50 %) of them, with KV usage p95 below `kv_room` (0.9).
    One reading is enough (at low confidence). Without the cap in the inputs, a running count identical in
    every reading with a queue (at least `pinned_points`, 3; from twice that many, the count in
    `at_cap_share` of them that none exceeds) while KV usage stays below `kv_room`
    implies one (low confidence), unless most prefill batches compute a whole power-of-two token budget
    (a chunk of a long prompt): admission then waits on the prefill budget, not on slots
    (`prefill_stall`). Also a cap set at startup below what the operator asked
    for or what the pool allows — `max_running_requests was reduced from requested A to B`,
    `max_running_requests is capped to N by the mamba state cache (…). To raise it: …` (hybrid
    models), speculative decoding's reset to 48: that is evidence on its own, even without runtime
    readings ("will limit you under load"), and the levers the line itself names become suggestions,
    spelled as the server printed them. Speculative decoding's own reset with no reading at the cap is
    info (the engine's default, not a cut of what the operator asked for).

Why it matters:
    Requests beyond the cap wait however much KV is free; the GPU decodes a smaller batch than the pool
    allows and throughput is capped by a number, not by memory or compute.

Evidence:
    running_reqs at the cap, the cap and where it was read, the queue, token usage, the requested vs
    effective value for a startup reduction.

Fix:
    Raise `--max-running-requests` to what the pool allows at the observed tokens per request (pool ×
    0.9 / tokens per request). For a cap reduced at startup (hybrid models size slots for the worst
    case: every request at the full context), lower `--context-length` to what the workload needs so
    the derived slot count rises, or free memory (`--mem-fraction-static`); for a cap set by the mamba
    state cache, the flags its line names (`--mamba-full-memory-ratio`, `--max-mamba-cache-size`,
    `--mamba-ssm-dtype`).

Known false positives:
    A cap set deliberately low to protect latency. Under DP attention the cap is per DP rank, while the
    aggregate running count sums the ranks.

References:
    - How diagnoser reads SGLang: [the reduced-cap notice and the speculative reset](docs/sglang.md#oom),
      [the summary line](docs/sglang.md#startup-lines),
      [`effective_max_running_requests_per_dp`](docs/sglang.md#server-info),
      [`--max-running-requests`](docs/sglang.md#batching-flags), [from signals to a
      bottleneck](docs/sglang.md#bottlenecks).
    - PR [#27399](https://github.com/sgl-project/sglang/pull/27399): explicit values above the pool's bound
      are clamped.
    - Real cases: issue [#30160](https://github.com/sgl-project/sglang/issues/30160) (reduced at start-up
      for a hybrid model), and the recorded SGLang 0.5.23 CPU run `tests/data/sglang-cpu-real/long-queue`
      (running pinned at `--max-running-requests`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules.base import (
    Rule,
    RuleContext,
    ev,
    evidence,
    fmt_int,
    pool_tokens,
    slot_cap,
    suggest,
    tokens_per_request,
)
from diagnoser.rules.columns import pairs


class MaxRunningRequestsCap(Rule):
    name = "max_running_requests_cap"
    code = "SL01"
    title = "Slot cap binds"
    severity = Severity.WARNING
    reads = ("running_reqs",)
    events = ("max_running_requests_reduced",)
    defaults = {"at_cap_share": 0.5, "kv_room": 0.9, "min_points": 1, "target_usage": 0.9, "pinned_points": 3}
    threshold_help = {
        "at_cap_share": "share of waiting readings with running == cap that counts as capped",
        "kv_room": "KV usage p95 below this counts as room",
        "min_points": "fewest waiting readings needed (one reading judges, at low confidence)",
        "target_usage": "pool usage the proposed cap aims at",
        "pinned_points": "readings with a queue at one identical running count that imply a cap not in the inputs",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        cap, cap_src = slot_cap(ctx)
        if not cap:
            return self._pinned(ctx)
        red = [e for e in ctx.events_of("max_running_requests_reduced")]
        p95 = ctx.stats("token_usage")["p95"]
        if not red and p95 is not None and not p95 < t["kv_room"]:
            return None  # the pool, not the slot cap, is full (checked before the join: the pass has the stats)
        p = pairs(ctx, "running_reqs", "queue_reqs")
        waiting = p.b > 0
        n_wait = int(np.count_nonzero(waiting))
        at = (waiting & (p.a >= cap)).nonzero()[0]
        usage = ctx.stats("token_usage")
        runtime = n_wait >= t["min_points"] and len(at) / n_wait >= t["at_cap_share"] and (usage["p95"] is None or usage["p95"] < t["kv_room"])
        if not runtime and not red:
            return None
        evs = [evidence("max_running_requests (effective)", cap, None, "", cap_src)]
        parts = []
        if runtime:
            share = len(at) / n_wait
            qs = ctx.stats("queue_reqs")
            evs.append(evidence("running_reqs == cap while requests waited", round(share, 2), t["at_cap_share"], ctx.window_text(), p.src(at[0])))
            evs.append(ev(ctx, "queue_reqs", qs["max"], "> 0", at="max"))
            if usage["n"]:
                evs.append(ev(ctx, "token_usage", usage["p95"], f"< {t['kv_room']}", at="max"))
            parts.append(f"{cap} requests ran (the cap) in {share:.0%} of {n_wait} readings with a queue (up to {qs['max']:.0f} waiting)"
                         + (f", while KV usage stayed at or below {usage['max']:.2f}" if usage["n"] else ""))
        requested = None
        for e in red:
            requested = e.fields.get("requested")
            why = e.fields.get("reason")
            evs.append(evidence("max_running_requests reduced at startup", f"{requested if requested else '?'} -> {e.fields.get('effective')}", None, "", e.source))
            parts.append(f"the cap was cut at startup from {requested} to {e.fields.get('effective')}" + (f" by the {why}" if why else "") if requested
                         else f"the cap was set to {e.fields.get('effective')} at startup by the {why}" if why and e.fields.get("levers") is not None
                         else f"the cap was reset to {e.fields.get('effective')} at startup ({why or 'engine default'})")
        sugg = self._suggestions(ctx, cap, requested, runtime)
        have = {x.flag for x in sugg}
        for e in red:
            for x in self._levers(ctx, e.fields, cap, requested):
                if x.flag not in have:
                    have.add(x.flag)
                    sugg.append(x)
        conf = "high" if runtime and red else "medium"
        notes = [] if runtime else ["Only the startup sizing was read; a Decode batch line or scrape would show whether the load reaches the cap."]
        # speculative decoding's own default (48, no operator asked for more) limits only a load that reaches it
        default_only = not runtime and all(e.fields.get("reason") == "speculative decoding" for e in red)
        return self.finding(ctx, "; ".join(parts)[0].upper() + "; ".join(parts)[1:] + ".", evs, sugg, confidence=conf, notes=notes,
                            basis=None if runtime else {"startup": True}, severity=Severity.INFO if default_only else None)

    def _pinned(self, ctx: RuleContext) -> Finding | None:
        """No cap in the inputs, but the running batch held at exactly one count in every reading with a
        queue (at least ``pinned_points``) while KV had room: a count that does not move with the queue is
        a cap (SGLang admits up to max_running_requests), inferred at low confidence."""
        t = ctx.thresholds
        p = pairs(ctx, "running_reqs", "queue_reqs")
        waiting = (p.b > 0).nonzero()[0]
        if len(waiting) < t["pinned_points"]:
            return None
        run = p.a[waiting]
        vals, counts = np.unique(run, return_counts=True)
        k = int(np.argmax(counts))
        value = float(vals[k])
        # the count most readings with a queue show, never exceeded: a scrape taken between a completion and
        # the next admission reads one less, so "every reading" would miss a cap seen through /metrics
        at = counts[k] / len(run)
        if value < 1 or at < t["at_cap_share"] or float(run.max()) > value or (len(run) < 2 * t["pinned_points"] and at < 1):
            return None
        n_wait = len(run)
        waiting = waiting[run == value]
        usage = ctx.stats("token_usage")
        if usage["n"] == 0 or not (usage["p95"] or 0) < t["kv_room"]:
            return None  # without a usage reading, a full pool cannot be ruled out
        if _prefill_budget_binds(ctx, t["at_cap_share"]):
            return None  # each prefill batch spends a whole token budget: admission waits on prefill (prefill_stall)
        qs = ctx.stats("queue_reqs")
        evs = [evidence("running_reqs in every reading with a queue", int(value), f"the same in >= {t['pinned_points']} readings",
                        ctx.window_text(), p.src(int(waiting[0]))),
               ev(ctx, "queue_reqs", qs["max"], "> 0", at="max"),
               ev(ctx, "token_usage", usage["p95"], f"< {t['kv_room']}", at="max")]
        pool, _ = pool_tokens(ctx)
        tpr, how = tokens_per_request(ctx)
        cap = int(value)
        if pool and tpr:
            fit = int(t["target_usage"] * pool / tpr)
            proposed: Any = max(cap + 1, fit - fit % 8 if fit >= 16 else fit)
            why = f"the pool holds about {fmt_int(fit)} requests at {fmt_int(tpr)} tokens each ({how}); {cap} ran"
        else:
            proposed, why = f"higher than {cap} (e.g. {2 * cap})", f"{cap} ran in every reading while requests waited and KV had room"
        sugg = [suggest(ctx, "max_running_requests", None, proposed, why + "; the cap itself is not in the inputs (inferred)",
                        "more requests run at once while the queue lasts, until the pool fills",
                        ("the pinned count is max_running_requests (check the summary line or server info)",))]
        summary = (f"{cap} requests ran in {'every one' if len(waiting) == n_wait else f'{len(waiting)}'} of {n_wait} readings with a queue (up to {qs['max']:.0f} waiting) while KV usage "
                   f"stayed at or below {usage['max']:.2f}: a count that does not move with the queue is a cap — max_running_requests, "
                   "inferred (it is not in the inputs).")
        return self.finding(ctx, summary, evs, sugg, confidence="low",
                            notes=["Pass the startup log (its summary line prints max_running_requests) or --url for server info to confirm."])

    @staticmethod
    def _levers(ctx: RuleContext, fields: dict[str, Any], cap: int, requested: Any) -> list[Suggestion]:
        """The flags the start-up line itself names (``To raise it: increase --mamba-full-memory-ratio or
        --max-mamba-cache-size, or … --mamba-ssm-dtype bfloat16``), spelled as the server printed them."""
        out: list[Suggestion] = []
        detail = str(fields.get("detail") or "")
        reason = fields.get("reason") or "a start-up limit"
        known = dict(re.findall(r"(\w+)=(\d+)", detail))
        per = re.search(r"(\d+) (?:state )?slots? per request", detail)
        want = requested if isinstance(requested, int) and requested > cap else 2 * cap
        for flag, value in fields.get("levers") or []:
            name = flag.lstrip("-").replace("-", "_")
            cur: Any = ctx.cfg(f"arg.{name}")
            if value:
                proposed: Any = value
                effect = "about halves the memory each request's state takes, so about twice the requests fit"
            elif name in known:
                cur = int(known[name]) if cur is None else cur
                slots = int(per.group(1)) if per else None
                proposed = slots * want if slots else 2 * int(known[name])
                effect = (f"room for about {want} requests at {slots} slots each" if slots else "about twice the cap")
            else:
                proposed = f"higher than the current{'' if cur is None else f' ({cur})'} (e.g. 2x)"
                effect = "the cap rises with the memory the state cache gets"
            if cur is not None and str(cur).lower() == str(proposed).lower():
                continue
            out.append(Suggestion(flag=flag, current=cur, proposed=proposed,
                                  why=f"the server capped max_running_requests to {cap} because of the {reason}, and its start-up line names {flag} as a lever"
                                  + ("" if cur is not None else "; the current value is not in the inputs"),
                                  effect=effect, assumptions=("the GPU has memory for the larger state cache (it comes out of the KV pool)",)))
        return out

    def _suggestions(self, ctx: RuleContext, cap: int, requested: Any, runtime: bool) -> list[Suggestion]:
        t = ctx.thresholds
        out: list[Suggestion] = []
        pool, _ = pool_tokens(ctx)
        tpr, how = tokens_per_request(ctx)
        if pool and tpr:
            fit = int(t["target_usage"] * pool / tpr)
            proposed = max(cap + 1, fit - fit % 8 if fit >= 16 else fit)
            if proposed > cap:
                out.append(suggest(ctx, "max_running_requests", cap, proposed,
                                   f"the pool holds about {fmt_int(fit)} requests at {fmt_int(tpr)} tokens each ({how}); the cap admits {cap}",
                                   f"up to {proposed / cap:.1f}x the running batch while requests wait, until the pool fills",
                                   (f"requests keep needing about {fmt_int(tpr)} KV tokens", "the client keeps enough requests in flight")))
        elif requested and requested > cap:
            out.append(suggest(ctx, "max_running_requests", cap, requested,
                               f"the engine cut the requested {requested} to {cap}; it only honours more slots once the worst-case sizing allows it",
                               f"up to {requested / cap:.1f}x the running batch once --context-length (or memory) allows it",
                               ("apply together with the --context-length change",)))
        if requested and requested > cap:
            ctxlen = ctx.cfg("context_len", ctx.cfg("arg.context_length"))
            factor = cap / requested
            if isinstance(ctxlen, int | float) and ctxlen > 0:
                prop: Any = max(1024, int(ctxlen * factor) // 1024 * 1024)
                why = f"slots are sized for requests of the full context ({int(ctxlen):,} tokens)"
            else:
                prop = f"about {factor:.2f} x the current context length (what your longest request needs)"
                why = "slots are sized for requests of the full context; the current --context-length is not in the inputs"
            out.append(suggest(ctx, "context_length", ctxlen if isinstance(ctxlen, int | float) else None, prop, why,
                               f"the derived slot count rises roughly in proportion (toward the requested {requested})",
                               ("no request needs more than the new context length",)))
            mfs = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
            out.append(suggest(ctx, "mem_fraction_static", mfs if isinstance(mfs, int | float) else None,
                               round(min(mfs + 0.03, 0.95), 2) if isinstance(mfs, int | float) else "current + 0.02 to 0.03",
                               "more static memory leaves room for more request and state slots",
                               "a few more slots; the capacity model gives the number",
                               ("keep 5–8 GB free for activations and graphs",)))
        return out


def _prefill_budget_binds(ctx: RuleContext, share: float) -> bool:
    """Most prefill batches computed a whole power-of-two token budget (a chunk of a long prompt, or
    --max-prefill-tokens): SGLang admits from the queue only while the batch's prefill budget lasts, so a
    running count that does not move is then held by prefill, not by a slot cap (see prefill_stall)."""
    from diagnoser.rules.pf01_prefill_stall import per_pass

    pv = per_pass(ctx)
    pv = pv[~np.isnan(pv)] if len(pv) else pv
    if not len(pv):
        return False
    p2 = np.exp2(np.ceil(np.log2(np.maximum(pv, 1.0))))
    full = (pv >= 0.98 * p2) & (p2 >= 64)
    return bool(np.count_nonzero(full) >= share * len(pv))
