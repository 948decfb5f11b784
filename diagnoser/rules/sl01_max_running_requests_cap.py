"""The running batch sits at the effective max_running_requests while KV has room and requests wait.

What it detects:
    Readings with a waiting queue that the shared admission model ([admission](docs/sglang.md#batching-flags),
    `diagnoser/rules/admission.py`) classifies as *slots* — the running batch at the effective
    `max_running_requests` (summary line `max_running_requests=N`, server info
    `effective_max_running_requests_per_dp` or server args), which SGLang's scheduler tests before the
    prefill budget and the KV reservation (`get_new_batch_prefill` at v0.5.23) — in at least
    `at_cap_share` (50 %) of them, with KV usage p95 below `kv_room` (0.9). The running count is read from
    Decode lines and scrapes only: a Prefill line's `#running-req` is the batch beside that prefill. One
    reading is enough (at low confidence). Without the cap in the inputs, a running count held at one value
    in most readings with a queue (at least 3, never exceeded) while KV usage stays low and no prefill
    budget binds implies one (low confidence). Also a cap set at startup below what the operator asked
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
    Raise `--max-running-requests` to the smallest of: what the pool allows at the observed tokens per
    request (pool × 0.9 / tokens per request), the demand seen (running + waiting while busy, × 1.25) and
    SGLang's own bound (pool // 2). For a cap reduced at startup (hybrid models size slots for the worst
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

from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules.admission import admission
from diagnoser.rules.base import Rule, RuleContext, cap_name, ev, evidence, suggest, tokens_per_request
from diagnoser.rules.proposals import bounded_slots, compound_after_slots


class MaxRunningRequestsCap(Rule):
    name = "max_running_requests_cap"
    code = "SL01"
    title = "Slot cap binds"
    severity = Severity.WARNING
    reads = ("running_reqs",)
    events = ("max_running_requests_reduced",)
    defaults = {"at_cap_share": 0.5, "kv_room": 0.9, "min_points": 1}
    threshold_help = {
        "at_cap_share": "share of waiting readings held by the slot cap (the admission model's 'slots') that counts as capped",
        "kv_room": "KV usage p95 below this counts as room",
        "min_points": "fewest waiting readings needed (one reading judges, at low confidence)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        a = admission(ctx)
        red = [] if a.cap_inferred else ctx.events_of("max_running_requests_reduced")
        usage = ctx.stats("token_usage")
        if not a.cap or (not red and usage["p95"] is not None and not usage["p95"] < t["kv_room"]):
            return None  # the pool, not the slot cap, is full
        share = a.share("slots")
        runtime = a.n_wait >= t["min_points"] and share >= t["at_cap_share"] and share > 0
        if not runtime and not red:
            return None
        cap = a.cap
        evs = [evidence("max_running_requests (inferred: the running count held while requests waited)" if a.cap_inferred
                        else f"{cap_name(ctx)} (effective)", cap, None, "", a.cap_src)]
        parts = []
        if runtime:
            qs = ctx.stats("queue_reqs")
            evs += [evidence("readings with a queue held by the slot cap", round(share, 2), t["at_cap_share"], ctx.window_text(), a.first("slots")),
                    ev(ctx, "queue_reqs", qs["max"], "> 0", at="max")]
            if usage["n"]:
                evs.append(ev(ctx, "token_usage", usage["p95"], f"< {t['kv_room']}", at="max"))
            parts.append(f"{cap} requests ran (the cap{', inferred: it is not in the inputs' if a.cap_inferred else ''}) in {share:.0%} of "
                         f"{a.n_wait} readings with a queue (up to {qs['max']:.0f} waiting)"
                         + (f", while KV usage stayed at or below {usage['max']:.2f}" if usage["n"] else ""))
        requested = None
        for e in red:
            requested, why, eff = e.fields.get("requested"), e.fields.get("reason"), e.fields.get("effective")
            evs.append(evidence("max_running_requests reduced at startup", f"{requested if requested else '?'} -> {eff}", None, "", e.source))
            parts.append(f"the cap was cut at startup from {requested} to {eff}" + (f" by the {why}" if why else "") if requested
                         else f"the cap was set to {eff} at startup by the {why}" if why and e.fields.get("levers") is not None
                         else f"the cap was reset to {eff} at startup ({why or 'engine default'})")
        sugg = self._suggestions(ctx, cap, requested, a.cap_inferred)
        have = {x.flag for x in sugg}
        for e in red:
            for x in _levers(ctx, e.fields, cap, requested):
                if x.flag not in have:
                    have.add(x.flag)
                    sugg.append(x)
        notes = [] if runtime else ["Only the startup sizing was read; a Decode batch line or scrape would show whether the load reaches the cap."]
        if a.cap_inferred:
            notes.append("Pass the startup log (its summary line prints max_running_requests) or --url for server info to confirm.")
        default_only = not runtime and all(e.fields.get("reason") == "speculative decoding" for e in red)
        text = "; ".join(parts)
        return self.finding(ctx, text[0].upper() + text[1:] + ".", evs, sugg, notes=notes,
                            confidence="low" if a.cap_inferred else "high" if runtime and red else "medium",
                            basis=None if runtime else {"startup": True}, severity=Severity.INFO if default_only else None)

    def _suggestions(self, ctx: RuleContext, cap: int, requested: Any, inferred: bool) -> list[Suggestion]:
        out: list[Suggestion] = []
        tpr, how = tokens_per_request(ctx)
        proposed, why = bounded_slots(ctx, cap, tpr)
        if proposed:
            out.append(suggest(ctx, "max_running_requests", None if inferred else cap, proposed,
                               f"{why} ({how})" if tpr and "pool holds" in why else why,
                               f"up to {proposed / cap:.1f}x the running batch while requests wait",
                               (f"requests keep needing about {tpr:,.0f} KV tokens" if tpr else "the pool holds the larger batch",
                                "the client keeps enough requests in flight")))
            out += compound_after_slots(ctx, cap, proposed)
        elif requested and requested > cap:
            out.append(suggest(ctx, "max_running_requests", cap, requested,
                               f"the engine cut the requested {requested} to {cap}; it only honours more slots once the worst-case sizing allows it",
                               f"up to {requested / cap:.1f}x the running batch once --context-length (or memory) allows it",
                               ("apply together with the --context-length change",)))
        if requested and requested > cap:
            ctxlen = ctx.cfg("context_len", ctx.cfg("arg.context_length"))
            factor = cap / requested
            known = isinstance(ctxlen, int | float) and ctxlen > 0
            out.append(suggest(ctx, "context_length", ctxlen if known else None,
                               max(1024, int(ctxlen * factor) // 1024 * 1024) if known else f"about {factor:.2f} x the current context length (what your longest request needs)",
                               f"slots are sized for requests of the full context ({int(ctxlen):,} tokens)" if known
                               else "slots are sized for requests of the full context; the current --context-length is not in the inputs",
                               f"the derived slot count rises roughly in proportion (toward the requested {requested})",
                               ("no request needs more than the new context length",)))
            mfs = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
            num = isinstance(mfs, int | float)
            out.append(suggest(ctx, "mem_fraction_static", mfs if num else None, round(min(mfs + 0.03, 0.95), 2) if num else "current + 0.02 to 0.03",
                               "more static memory leaves room for more request and state slots", "a few more slots; the capacity model gives the number",
                               ("keep 5–8 GB free for activations and graphs",)))
        return out


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
            effect = f"room for about {want} requests at {slots} slots each" if slots else "about twice the cap"
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
