"""Wire the capacity model into the findings: every suggestion quantified, ranked by expected gain.

``enrich(report, timelines, extras)`` runs after :func:`diagnoser.evaluate.evaluate` (``cli/run.py``
``analyse()``). For each finding it

* fills each suggestion's ``effect``, ``assumptions``, ``gain`` and ``projection`` from the what-if for
  its flag (pool tokens, running requests, gen throughput, job ETA; docs/sglang.md#what-ifs);
* for ``kv_saturation``, adds the capacity-ranked changes the rule did not already propose: DP attention
  (MLA at TP > 1), ``--mem-fraction-static`` up to the largest value that keeps ≥ 6 GiB free, FP8 KV;
  and a note that HiCache grows the prefix cache, not decode concurrency;
* re-sorts by expected gain and re-runs :func:`diagnoser.evaluate.check_suggestions`, so contradicting,
  no-op and never-propose (``--cpu-offload-gb``) suggestions are still refused.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from diagnoser import gcpause
from diagnoser.capacity.build import planner_for
from diagnoser.capacity.whatif import Planner, Scenario
from diagnoser.evaluate import Report, RuleError, check_suggestions, version_tuple, vet_suggestion
from diagnoser.model import Finding, Suggestion
from diagnoser.timeline import Timeline

HICACHE_NOTE = (
    "HiCache (--enable-hierarchical-cache, --hicache-size/--hicache-ratio) extends the prefix cache into host RAM: "
    "it raises reuse of shared prefixes, not the number of requests that can decode at once, so it does not fix a "
    "full decode pool; suggest it when the cache hit rate is limited by evictions."
)


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def scenario_for(s: Suggestion, planner: Planner) -> Scenario | None:
    """The what-if that matches a suggestion's flag and proposed value (None when we cannot size it)."""
    flag, prop = s.flag, s.proposed
    n = _num(prop)
    if flag == "--mem-fraction-static":
        return planner.mem_fraction(n) if n is not None else planner.best_mem_fraction()
    if flag == "--kv-cache-dtype" and str(prop).lower().startswith("fp8"):
        return planner.kv_fp8()
    if flag in ("--enable-dp-attention", "--attn-dp-size"):
        return planner.dp_attention(int(n) if flag == "--attn-dp-size" and n and n > 1 else None)
    if n is None:
        if flag == "--enable-hierarchical-cache":
            return planner.hicache(ratio=2.0)
        return None
    table = {
        "--max-running-requests": lambda: planner.max_running_requests(int(n)),
        "--max-total-tokens": lambda: planner.max_total_tokens(int(n)),
        "--context-length": lambda: planner.context_length(int(n)),
        "--chunked-prefill-size": lambda: planner.chunked_prefill_size(int(n)),
        "--max-prefill-tokens": lambda: planner.max_prefill_tokens(int(n)),
        "--schedule-conservativeness": lambda: planner.schedule_conservativeness(n),
        "--cuda-graph-max-bs": lambda: planner.cuda_graph_max_bs(int(n)),
        "--cuda-graph-max-bs-decode": lambda: planner.cuda_graph_max_bs(int(n)),
        "--hicache-size": lambda: planner.hicache(size_gb=n),
        "--hicache-ratio": lambda: planner.hicache(ratio=n),
    }
    fn = table.get(flag)
    return fn() if fn else None


_FOLLOW_UPS = {"apply together with the pool change", "apply together with the cap change"}  # rules/proposals.py


def quantified(s: Suggestion, sc: Scenario, now: Scenario) -> Suggestion:
    """The suggestion with the what-if's numbers; a worded value ("current + 0.02") becomes the sized one."""
    if _num(s.proposed) is None and sc.proposed is not None and sc.flag == s.flag:
        s = replace(s, proposed=sc.proposed, current=s.current if s.current is not None else sc.current)
    effect = sc.effect_text(now)
    if s.effect and s.effect not in effect and "capacity model" not in s.effect:
        if sc.fits and _other_limit(sc, now):
            # the rule's own effect is what the change allows; the projection says what binds first
            effect = f"{effect} Once {sc.limit.split(' (')[0]} no longer binds: {s.effect}"
        else:
            effect = f"{effect} — {s.effect}"
    gain = sc.gain if sc.gain is not None else s.gain
    if not sc.fits:
        gain = -1.0
    return replace(s, effect=effect, gain=gain, assumptions=tuple(s.assumptions) + tuple(sc.assumptions) + tuple(sc.risks),
                   projection=sc.to_dict())


_OWN_LIMIT = {"--max-running-requests": "max_running_requests", "--context-length": "max_running_requests"}


def _other_limit(sc: Scenario, now: Scenario) -> bool:
    """The projected running batch is held by something other than what the change moves (the client,
    the demand seen, or no limit at all), so the rule's own claim is a ceiling, not the projection."""
    if not sc.limit or sc.limit.startswith("no limit") or not (sc.moved(now) or sc.stays(now)):
        return False
    return not sc.limit.startswith(_OWN_LIMIT.get(sc.flag, "the KV pool"))


def _why(sc: Scenario, planner: Planner) -> str:
    p = planner.pool
    if sc.flag in ("--enable-dp-attention", "--attn-dp-size"):
        return (f"MLA keeps the whole latent KV on every rank, so at TP {p.tp} the {p.pool_tokens:,}-token pool is the whole "
                f"server's; DP attention gives each of {p.tp} DP ranks its own pool.")
    if sc.flag == "--mem-fraction-static":
        per = 0.01 * (p.pre_gib or 0) * (1 << 30) / (p.bpt or 1)
        return (f"the pool budget is free-after-weights − (1 − f) × free-before-weights, so each +0.01 adds about {per:,.0f} "
                f"tokens here (not a proportional share of the pool); {p.headroom_gib:.1f} GiB is free after the pool and graphs."
                if p.headroom_gib is not None else
                f"the pool budget is free-after-weights − (1 − f) × free-before-weights: each +0.01 adds about {per:,.0f} tokens here.")
    if sc.flag == "--kv-cache-dtype":
        return "FP8 KV stores each token in half the bytes: twice the tokens in the same memory."
    return "sized by the capacity model."


def _kv_saturation(f: Finding, planner: Planner, now: Scenario, notes: list[str]) -> None:
    have = {s.flag for s in f.suggestions}
    fraction = next((_num(s.proposed) for s in f.suggestions if s.flag == "--mem-fraction-static" and _num(s.proposed)), None)
    for sc in planner.for_kv_saturation(fraction):
        if sc.flag in have:
            continue
        s = Suggestion(flag=sc.flag, current=sc.current, proposed=sc.proposed, why=_why(sc, planner))
        f.suggestions.append(quantified(s, sc, now))
    if HICACHE_NOTE not in f.notes:
        f.notes.append(HICACHE_NOTE)
    p, w = planner.pool, planner.work
    if p.pool_tokens and p.bpt:
        f.notes.append(f"capacity: {p.total_tokens:,} pool tokens ({p.pool_source}), {p.bpt:,.0f} KV bytes per token per rank "
                       f"({p.bpt_source}); {planner.model.describe() if planner.model else 'no decode points to fit throughput'}.")
    if now.job_eta_hours is not None:
        jp = w.progress
        f.notes.append(f"job: {jp.completed:,} of {jp.job_requests:,} requests done ({jp.completed_source or 'none counted'}); "
                       f"ETA at the current rate {now.job_eta_hours / 24:.1f} days ({jp.rate_source}).")
    for n in notes:
        if n not in f.notes:
            f.notes.append(n)


@gcpause.paused()  # (as evaluate: after a fleet pass a cyclic collection would walk every object the pass made)
def enrich(report: Report, timelines: list[Timeline], extras: dict[str, Any] | None = None) -> None:
    extras = dict(extras or {})
    try:
        _enrich(report, timelines, extras)
    finally:  # every suggestion that reaches the report, those added here too, goes through the checks
        check_suggestions(report, timelines, extras)


def _enrich(report: Report, timelines: list[Timeline], extras: dict[str, Any]) -> None:
    by_target = {tl.target: tl for tl in timelines}
    planners: dict[str, tuple[Planner, list[str]]] = {}
    for f in report.findings:
        tl = by_target.get(f.target)
        if tl is None or not f.suggestions and f.rule != "kv_saturation":
            continue
        try:
            if (tl.engine or "sglang") != "sglang":  # the capacity planner is SGLang's memory model
                _enrich_pool_scaling(f, tl)
                continue
            if f.target not in planners:
                planner, notes = planners[f.target] = planner_for(tl, extras, version_tuple(tl))
                if any(x.rule == "kv_saturation" and x.target == f.target for x in report.findings):
                    planner.work.kv_bound = True  # the rule found the pool is the limit: trust it over the mean
                if extras.get("model_config") and planner.pool.shape is None:  # the user's file was unusable
                    report.errors.append(RuleError("capacity", f.target, next((n for n in notes if "config" in n), "model config unusable")))
            _enrich_finding(f, *planners[f.target], tl=by_target.get(f.target))
        except Exception as e:  # isolation: the findings stand without numbers; the error is listed
            report.errors.append(RuleError("capacity", f.target, f"{type(e).__name__}: {e}"))


def _enrich_pool_scaling(f: Finding, tl: Timeline) -> None:
    """A non-SGLang target (vLLM): the what-if is KV-pool scaling from the observed pool, not SGLang's
    memory model. FP8 KV doubles the tokens; a larger ``--num-gpu-blocks-override`` scales them by the
    blocks. ``--gpu-memory-utilization`` is sized by the rule itself, through vLLM's memory arithmetic
    (``ctx.mech.memory_what_if``: engines/vllm/memory.py); ``--max-model-len`` is not proposed."""
    from diagnoser.capacity.serverstate import prompt_tokens
    from diagnoser.evaluate import request_tokens

    pool = tl.cfg("max_total_tokens") or tl.cfg("kv_pool_tokens_log")
    if not isinstance(pool, int | float) or pool <= 0:
        return
    full = request_tokens(tl) or prompt_tokens(tl)
    out = []
    for s in f.suggestions:
        new = None
        if s.flag == "--kv-cache-dtype" and str(s.proposed).lower().startswith("fp8"):
            new, how = 2 * pool, "FP8 KV stores a token in half the bytes"
        elif s.flag == "--num-gpu-blocks-override" and _num(s.proposed) and _num(s.current):
            new, how = pool * float(s.proposed) / float(s.current), "the pool is the blocks x block size"  # type: ignore[arg-type]
        if new is None:
            out.append(s)
            continue
        fit = ""
        if full:
            bs = tl.cfg("block_size")
            held, per = float(full), f"{full:,.0f} tokens per request"
            if isinstance(bs, int | float) and not isinstance(bs, bool) and bs > 0:  # vLLM allocates whole blocks
                blocks = math.ceil(full / bs)
                held, per = blocks * float(bs), f"{full:,.0f} tokens per request ({blocks} block{'s' if blocks != 1 else ''} of {int(bs)})"
            fit = f"; at {per} it holds about {pool / held:,.1f} → {new / held:,.1f} requests at once"
        eff = f"KV pool {int(pool):,} → {int(new):,} tokens ({how}){fit}"
        out.append(replace(s, effect=f"{eff} — {s.effect}" if s.effect else eff,
                           assumptions=tuple(s.assumptions) + ("the what-if scales the observed pool; weights and activations unchanged",)))
    f.suggestions = out


def _enrich_finding(f: Finding, planner: Planner, notes: list[str], tl: Timeline | None = None) -> None:
    now = planner.now()
    out = []
    for s in f.suggestions:
        if planner.state is not None:  # sized as SGLang will run it (capped, or the flag that binds); no-ops go at the checks
            vetted, _why = vet_suggestion(f, s, planner.state, s.current, tl)
            s = vetted or s
        sc = scenario_for(s, planner)
        out.append(quantified(s, sc, now) if sc is not None else s)
    f.suggestions = out
    if f.rule == "kv_saturation":
        _kv_saturation(f, planner, now, notes)
    # by expected gain; a compound limit's follow-up (the limit that binds after the first change) stays after it
    f.suggestions.sort(key=lambda s: (any(a in _FOLLOW_UPS for a in s.assumptions), -(s.gain if s.gain is not None else -0.5)))
