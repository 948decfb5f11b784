"""Requests keep waiting in the scheduler queue: a persistent or growing queue, its growth and queue time.

What it detects:
    `queue_reqs` (`#queue-req` in scheduler lines, `#remaining_req` in v0.1 `new fill batch`
    lines, `sglang:num_queue_reqs`; on a PD prefill server plus the bootstrap queue, whose requests
    wait too) above zero in at least `persist_share` (default 80 %) of the readings. One reading is
    enough to judge (at low confidence; medium from 3 readings, high from 10). It is a warning when the
    queue grows by `growth_per_min` (default 10) requests a minute or more, when the p95 queue time
    (`sglang:queue_time_seconds`) reaches `queue_time_high_s` (default 5 s), or when the queue
    exceeds `healthy_max` (default 2000); a steady queue is info. A queue with KV usage below 0.9 and
    the running batch below the slot cap is admission-limited: the note names the candidate causes.
    Without any queue reading, a running-request cap cut at startup below what the operator asked for
    (or below `--client-concurrency`) implies a queue: reported at low confidence, saying what is
    missing.

Why it matters:
    Every waiting request adds its wait to time-to-first-token. A steady queue keeps batches full
    (SGLang's tuning guide calls 100–2000 waiting healthy for throughput); a growing queue means the
    offered load exceeds what the server can run and latency will keep rising.

Evidence:
    Queue length (p50, max), share of readings with a queue, the growth rate per minute (least-squares
    slope), the p95 queue time, the running batch while requests waited.

    On each engine. On SGLang: `#queue-req` (Decode and Prefill lines), `sglang:num_queue_reqs`, the
    queue-time histogram, PD bootstrap queues and `max_running_requests` reductions. On vLLM:
    `vllm:num_requests_waiting` (summed over V1's `engine` ranks), `Waiting:` (V1) or `Pending:` (V0) in
    the stats line, and the p95 of `vllm:request_queue_time_seconds`; the PD and reduction parts are
    SGLang's only.

Fix:
    The queue is a symptom; the cause is named by `kv_saturation` (pool full),
    `max_running_requests_cap` (slot cap), `prefill_stall` (admission) or plain overload (add
    replicas). This rule proposes no flag itself.

Known false positives:
    A burst at the start of a benchmark queues briefly; the share and slope settle it. Under the
    tuning guide's own definition a steady queue with a full pool is healthy for throughput, hence info.

References:
    - How diagnoser reads SGLang: [`num_queue_reqs`](docs/sglang.md#metrics-scheduler),
      [`queue_time_seconds`](docs/sglang.md#metrics-queue), [`#queue-req` in the batch
      lines](docs/sglang.md#decode-line), [SGLang's tuning guide](docs/sglang.md#tuning-guide) (a queue of
      100–2000 is healthy), [from signals to a bottleneck](docs/sglang.md#bottlenecks).
    - Real cases: issue [#26248](https://github.com/sgl-project/sglang/issues/26248), issue
      [#30160](https://github.com/sgl-project/sglang/issues/30160) (a queue implied by a reduced cap), and
      the recorded SGLang 0.5.23 CPU runs `examples/kv-full-retract.dgb` and
      `tests/data/sglang-cpu-real/long-queue`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diagnoser.model import Finding, Severity
from diagnoser.rules.admission import CLASSES, admission
from diagnoser.rules.base import Rule, RuleContext, cap_name, ev, evidence, slot_cap
from diagnoser.rules.columns import aligned, arrays
from diagnoser.timeline import summarize


def slope_per_min(ts: Any, vals: Any) -> float:
    """Least-squares slope of vals over ts, per minute (numpy arrays or lists)."""
    t = np.asarray(ts, dtype=float)
    v = np.asarray(vals, dtype=float)
    if t.size < 3 or t[-1] - t[0] < 10:
        return 0.0
    # ndarray.mean/sum without their Python wrappers: the same reductions, the same division
    n = len(t)
    tc = t - np.add.reduce(t) / n
    den = float(np.add.reduce(tc * tc))
    if den == 0:
        return 0.0
    return 60.0 * float(np.add.reduce(tc * (v - np.add.reduce(v) / n))) / den


_HELD = {"slots": "the slot cap (running at max_running_requests)", "kv": "the KV pool (the next request did not fit beside the running ones' reservation)",
         "budget": "the prefill budget (the last batch spent --chunked-prefill-size / --max-prefill-tokens)", "state": "the state pool",
         "transfer": "the PD prealloc/transfer queues", "none": "nothing (admitted at the next prefill)"}
# the same classes under an engine that reserves no output (vLLM's V1 scheduler, ctx.mech.reserves_output False)
_HELD_BLOCKS = {"slots": "the slot cap (running at --max-num-seqs)", "kv": "the KV pool (fewer free blocks than the next prompt needs)",
                "budget": "the step token budget (--max-num-batched-tokens, after the decoders' tokens)", "state": "the state pool",
                "transfer": "the KV transfer", "none": "nothing (admitted at the next step)"}


class QueueBuildup(Rule):
    name = "queue_buildup"
    code = "QU01"
    title = "Requests queue"
    severity = Severity.WARNING
    reads = ("queue_reqs",)
    defaults = {"min_points": 1, "persist_share": 0.8, "growth_per_min": 10.0, "queue_time_high_s": 5.0, "healthy_max": 2000}
    threshold_help = {
        "min_points": "fewest queue readings needed (one reading judges, at low confidence)",
        "persist_share": "share of readings with a non-empty queue that makes it persistent",
        "growth_per_min": "queue growth (requests per minute) that makes it a warning",
        "queue_time_high_s": "p95 queue time (s) that makes it a warning",
        "healthy_max": "queue length above which it is a warning (the guide's healthy range ends at 2000)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        q = ctx.series("queue_reqs")
        if q is None:
            return self._implied(ctx)
        qts, vals = arrays(ctx, "queue_reqs")  # type: ignore[misc]
        if len(vals) < t["min_points"]:
            return None
        boot = None
        if ctx.series("pd_bootstrap_reqs") is not None:  # PD prefill: requests waiting for the decode side's bootstrap wait too
            boot = np.nan_to_num(aligned(ctx, "queue_reqs", "pd_bootstrap_reqs"))
            if len(boot) == len(vals):
                vals = vals + boot
        busy_share = np.count_nonzero(vals > 0) / len(vals)  # a bool mean: the count over n
        if busy_share < t["persist_share"]:
            return None
        st = summarize(vals) if boot is not None else ctx.stats("queue_reqs")
        slope = 0.0 if ctx.timeline.untimed else slope_per_min(qts, vals)
        qt = ctx.stats("queue_time_seconds_p95")
        running = ctx.stats("running_reqs")
        evs = [
            ev(ctx, "queue_reqs", st["max"], "> 0", at="max"),
            evidence("share of readings with a queue", round(busy_share, 2), t["persist_share"], ctx.window_text(), q.source_at(0)),
        ]
        if slope:
            evs.append(evidence("queue growth (requests/min)", round(slope, 1), t["growth_per_min"], ctx.window_text(), q.last_source()))
        if qt["n"]:
            evs.append(ev(ctx, "queue_time_seconds_p95", qt["p50"], t["queue_time_high_s"], at="max"))
        if running["n"]:
            evs.append(ev(ctx, "running_reqs", running["p50"], None))
        growing = slope >= t["growth_per_min"]
        slow = bool(qt["n"]) and qt["p50"] >= t["queue_time_high_s"]
        huge = st["max"] > t["healthy_max"]
        sev = Severity.WARNING if growing or slow or huge else Severity.INFO
        parts = [f"{st['p50']:.0f} requests waited at the median (max {st['max']:.0f}) in {busy_share:.0%} of {len(vals)} reading(s)"
                 + (" (the scheduler queue and the PD bootstrap queue)" if boot is not None and bool(np.any(boot > 0)) else "")]
        if slope:
            parts.append(f"the queue {'grew' if slope > 0 else 'shrank'} by {abs(slope):.1f} requests/min")
        if qt["n"]:
            parts.append(f"p95 queue time {qt['p50']:.2f} s (median of the scrapes)")
        if running["n"]:
            parts.append(f"while {running['p50']:.0f} ran")
        conf = "high" if len(vals) >= 10 else "medium" if len(vals) >= 3 else "low"
        notes = ["A queue is a symptom: see kv_saturation, max_running_requests_cap or prefill_stall for the cause."]
        why = self._admission(ctx)
        if why:
            notes.append(why)
        if sev == Severity.INFO:
            notes.append("A steady queue keeps batches full" + ("; SGLang's tuning guide calls 100–2000 waiting healthy for throughput."
                                                                if ctx.mech.reserves_output else "."))
        return self.finding(ctx, "; ".join(parts) + ".", evs, [], confidence=conf, severity=sev, notes=notes)

    @staticmethod
    def _admission(ctx: RuleContext) -> str:
        """What held the waiting requests back, from the shared admission model (rules/admission.py): the
        share of the readings with a queue each limit held, in SGLang's order."""
        a = admission(ctx)
        if not a.n_wait:
            return ""
        shares = [(c, a.share(c)) for c in CLASSES[:-1] if a.share(c) > 0]
        if not shares:
            return ""
        held = _HELD if ctx.mech.reserves_output else _HELD_BLOCKS
        text = ", ".join(f"{held[c]} in {v:.0%}" for c, v in sorted(shares, key=lambda cv: -cv[1]))
        top, _ = a.top()
        see = {"slots": "max_running_requests_cap", "kv": "kv_saturation", "budget": "prefill_stall", "transfer": "pd_transfer"}.get(top)
        if top == "none" and not ctx.mech.reserves_output:
            return ("Admission-limited queue: no --max-num-seqs cap, step token budget or KV block shortage the inputs show held the "
                    "waiting requests; candidate causes: prefill compute itself when prompts are long (each step's budget is "
                    "--max-num-batched-tokens), requests that had just arrived, a grammar or LoRA wait.")
        if not ctx.mech.reserves_output:
            return (f"What held the next waiting request back (vLLM's admission order: slots, step token budget, KV blocks), "
                    f"over {a.n_wait} reading(s) with a queue: {text}" + (f"; see {see}." if see else "."))
        if top == "none":
            return ("Admission-limited queue: no slot cap, prefill budget, state pool or KV reservation the inputs show held the waiting "
                    "requests; candidate causes: the future-token reservation when the request sizes are not in the inputs (new_token_ratio x "
                    "each running request's remaining max_new_tokens), prefill compute itself when prompts are long, a grammar, LoRA or PD wait.")
        return (f"What held the next waiting request back (SGLang's admission order: transfer, state pool, slots, prefill budget, KV), "
                f"over {a.n_wait} reading(s) with a queue: {text}" + (f"; see {see}." if see else "."))

    def _implied(self, ctx: RuleContext) -> Finding | None:
        cap, cap_src = slot_cap(ctx)
        if not cap:
            return None
        red = ctx.events_of("max_running_requests_reduced")
        requested = next((e.fields.get("requested") for e in red if e.fields.get("requested")), None)
        cc = ctx.extras.get("client_concurrency")
        offered, why = (cc, "--client-concurrency") if cc else (requested, "the requested --max-running-requests")
        if not offered or offered <= cap:
            return None
        src = red[0].source if red and not cc else cap_src
        evs = [evidence(f"{cap_name(ctx)} (effective)", cap, None, "", cap_src),
               evidence(why.lstrip("-").replace("the requested ", "requested "), offered, None, "", src)]
        summary = (f"No queue length was read (no scheduler line or scrape), but only {cap} requests can run while {why} is "
                   f"{offered}: with that load about {offered - cap} requests wait at any moment.")
        return self.finding(ctx, summary, evs, [], confidence="low", severity=Severity.INFO,
                            notes=["Missing: a Decode/Prefill batch line or a /metrics scrape would show the real queue."])
