"""Prefill admits too little while requests wait and KV has room: capped prefill batches or an admission stall.

What it detects:
    Two shapes. (1) Capped prefill: at least ``min_batches`` (5) prefill batches, of which at least
    ``cap_share`` (50 %) compute exactly the per-batch cap (``--chunked-prefill-size`` or
    ``--max-prefill-tokens``, from the config; else a power-of-two batch size that repeats in half the
    batches, inferred), while a backlog waits (``#queue-req`` > 0 or ``#pending-token`` above
    ``pending_factor`` × the cap) in at least half of them and KV usage p95 stays below ``kv_room``
    (0.9). (2) Admission stall: requests wait for ``stall_seconds`` (20 s) or more with no prefill batch
    at all, KV usage below ``kv_room``, fewer running than the slot cap and no retraction.

Why it matters:
    Time to first token is the queue wait plus the prefill time. A small prefill cap splits each prompt
    into many steps (each a scheduler round trip); a stalled admission leaves free KV and slots unused
    while requests wait.

Evidence:
    prefill_new_tokens against the cap, the share of capped batches, the queue / pending tokens at those
    batches, token usage; for a stall, the longest wait without admission with its first and last line.

Fix:
    (1) Raise ``--chunked-prefill-size`` (and ``--max-prefill-tokens`` when it is the smaller), toward
    the defaults for the GPU class (reference §5.2: 4096–8192 below 160 GiB). (2) Lower
    ``--schedule-conservativeness`` (the tuning guide: usage < 0.9 with a queue → e.g. 0.3), which lowers
    the future-token reservation that blocks admission.

Known false positives:
    A small chunk size chosen on purpose to protect decode latency (see
    ``prefill_decode_interference``, the opposite trade-off). A stall while the scheduler waits on a
    grammar compile or a PD transfer is not an admission problem.

References:
    ../shared/reference/sglang.md §3.2 (Prefill batch line, #pending-token), §5.2 (chunked prefill,
    max_prefill_tokens, schedule-conservativeness, new_token_ratio), §7, §8 (prefill-bound), §9 (issue
    #7133); case cpu-real prefill-capped.
"""

from __future__ import annotations

import bisect

import numpy as np

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, evidence, slot_cap, suggest
from diagnoser.rules.columns import aligned, argmax_source, raw_arrays, times_in_order


class PrefillStall(Rule):
    name = "prefill_stall"
    code = "PF01"
    title = "Prefill admits too little"
    severity = Severity.WARNING
    defaults = {"min_batches": 5, "cap_share": 0.5, "kv_room": 0.9, "stall_seconds": 20.0, "pending_factor": 2.0, "target_chunk": 8192}
    threshold_help = {
        "min_batches": "fewest prefill batches needed to judge capping",
        "cap_share": "share of prefill batches at the cap that counts as capped",
        "kv_room": "KV usage below this counts as room",
        "stall_seconds": "seconds of waiting without any admission that count as a stall",
        "pending_factor": "pending prompt tokens above this many caps count as a backlog",
        "target_chunk": "largest chunk size proposed (GPU default class below 160 GiB)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        return self._capped(ctx) or self._stall(ctx)

    def _cap(self, ctx: RuleContext, vals: list[float]) -> tuple[int | None, str, str]:
        known = []
        for name in ("chunked_prefill_size", "max_prefill_tokens"):
            v = ctx.cfg(name, ctx.cfg(f"arg.{name}"))
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                known.append((int(v), name, ctx.timeline.cfg_source(name) or ctx.timeline.cfg_source(f"arg.{name}")))
        if known:
            return min(known)
        uniq, counts = np.unique(raw_arrays(ctx, "prefill_new_tokens")[1].astype(int), return_counts=True)
        k = int(np.argmax(counts))
        value, count = int(uniq[k]), int(counts[k])
        if count >= self_share(vals) and value >= 64 and value & (value - 1) == 0:
            return value, "inferred", "the most common prefill batch size"
        return None, "", ""

    def _capped(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        p = ctx.series("prefill_new_tokens")
        if p is None or len(p) < t["min_batches"]:
            return None
        cap, cap_name, cap_src = self._cap(ctx, p.values)
        if not cap:
            return None
        _, pv = raw_arrays(ctx, "prefill_new_tokens")
        at_mask = pv >= 0.98 * cap
        at_cap = at_mask.nonzero()[0]
        cshare = len(at_cap) / len(p)
        if not len(at_cap) or cshare < t["cap_share"]:  # none at the cap is never "capped", even at cap_share 0
            return None
        usage = ctx.stats("token_usage")
        if usage["p95"] is not None and usage["p95"] >= t["kv_room"]:
            return None  # no KV room (checked before the joins: the pass has the stats)
        qa = aligned(ctx, "prefill_new_tokens", "queue_reqs")
        pa = aligned(ctx, "prefill_new_tokens", "pending_tokens")
        with np.errstate(invalid="ignore"):
            back = at_mask & ((qa > 0) | (pa > t["pending_factor"] * cap))
        backlog = back.nonzero()[0]
        if len(backlog) < 0.5 * len(at_cap):
            return None
        ps = ctx.stats("pending_tokens")
        qs = ctx.stats("queue_reqs")
        evs = [evidence("prefill_new_tokens at the cap", cap, f"{cap_name}", "", cap_src or p.sources[int(at_cap[0])]),
               evidence("share of prefill batches at the cap", round(cshare, 2), t["cap_share"], ctx.window_text(), p.sources[int(at_cap[0])]),
               Evidence("capped batches with a backlog", len(backlog), f">= half of {len(at_cap)}", ctx.window_text(), p.sources[int(backlog[0])])]
        if ps["n"]:
            evs.append(evidence("pending_tokens", ps["max"], f"> {t['pending_factor']:.0f} x cap", ctx.window_text(), argmax_source(ctx, "pending_tokens")))
        if usage["n"]:
            evs.append(evidence("token_usage p95", round(usage["p95"], 3), f"< {t['kv_room']}", ctx.window_text(), ""))
        summary = (f"{cshare:.0%} of {len(p)} prefill batches computed exactly {cap:,} tokens (the {cap_name.replace('_', ' ')} cap) "
                   f"while up to {qs['max'] or 0:.0f} requests waited" + (f" and up to {ps['max']:,.0f} prompt tokens were pending" if ps["n"] else "")
                   + (f"; KV usage stayed at or below {usage['max']:.2f}" if usage["n"] else "") + ".")
        proposed = max(2 * cap, min(int(t["target_chunk"]), _pow2_at_least(ps["p50"] or 0)))
        sugg = []
        cur_chunk = ctx.cfg("chunked_prefill_size", ctx.cfg("arg.chunked_prefill_size"))
        if cap_name in ("chunked_prefill_size", "inferred"):
            sugg.append(suggest(ctx, "chunked_prefill_size", cur_chunk if cap_name != "inferred" else None, proposed,
                                f"each prompt is computed in {cap:,}-token steps while {qs['max'] or 0:.0f} requests wait",
                                f"about {proposed // cap}x fewer prefill steps per prompt, so shorter queue time and TTFT",
                                ("the GPU has activation memory for the larger chunk (it is reserved from the non-static fraction)",)))
        mpt = ctx.cfg("max_prefill_tokens", ctx.cfg("arg.max_prefill_tokens"))
        if isinstance(mpt, int | float) and mpt < proposed:
            sugg.append(suggest(ctx, "max_prefill_tokens", mpt, max(proposed, 16384),
                                "the per-batch prefill budget is below the proposed chunk size", "lets a prefill batch use the larger chunk",
                                ("16384 is SGLang's default",)))
        return self.finding(ctx, summary, evs, sugg, confidence="high" if cap_name != "inferred" else "medium")

    def _stall(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        if ctx.timeline.untimed:
            return None
        q = ctx.series("queue_reqs")
        if q is None:
            return None
        qts, qv = raw_arrays(ctx, "queue_reqs")
        pts, _ = raw_arrays(ctx, "prefill_new_tokens")
        if len(pts) and len(qts) and times_in_order(ctx, pts) and times_in_order(ctx, qts):
            # a stall lies between two admissions (or before the first / after the last): when no such
            # gap is stall_seconds long, there is none (checked before the joins)
            gaps = np.subtract(pts[1:], pts[:-1])
            widest = max(float(np.maximum.reduce(gaps)) if len(gaps) else 0.0, float(pts[0] - qts[0]), float(qts[-1] - pts[-1]))
            if widest < t["stall_seconds"]:
                return None
        u = aligned(ctx, "queue_reqs", "token_usage")
        r = aligned(ctx, "queue_reqs", "running_reqs")
        cap, _ = slot_cap(ctx)
        with np.errstate(invalid="ignore"):
            ok = (qv > 0) & ~(u >= t["kv_room"]) & (~(r >= cap) if cap else True)
        if not ok.any():
            return None
        rts = np.asarray(sorted(e.ts for e in ctx.events_of("retraction")), dtype=float)
        adm = np.searchsorted(pts, qts, side="right")  # admissions up to each queue reading
        ret = np.searchsorted(rts, qts, side="right")
        # a stretch: consecutive ok readings with no admission or retraction after its first reading
        brk = np.ones(len(qts), dtype=bool)
        brk[1:] = ~ok[1:] | ~ok[:-1] | (adm[1:] != adm[:-1]) | (ret[1:] != ret[:-1])
        group = np.cumsum(brk)
        best: tuple[float, str, str, float] | None = None
        g = group[ok]  # non-decreasing (a cumsum): dropping repeats gives np.unique's ids without its numpy.ma import (~15 ms at start-up)
        gids = g[np.r_[True, g[1:] != g[:-1]]] if len(g) else g
        if len(gids):
            first = np.searchsorted(group, gids, side="left")
            last = np.searchsorted(group, gids, side="right") - 1
            dur = qts[last] - qts[first]
            k = int(np.argmax(dur))
            if dur[k] >= t["stall_seconds"]:
                q = ctx.series("queue_reqs")
                best = (float(dur[k]), q.sources[first[k]], q.sources[last[k]], float(qv[last[k]]))  # type: ignore[union-attr]
        if best is None:
            return None
        dur, s0, s1, v = best
        evs = [Evidence("seconds waiting without an admission", round(dur, 1), t["stall_seconds"], f"{dur:.0f} s", f"{s0} .. {s1}"),
               Evidence("queue_reqs", v, "> 0", "", s1)]
        cur = ctx.cfg("schedule_conservativeness", ctx.cfg("arg.schedule_conservativeness"))
        sugg = []
        if not isinstance(cur, int | float) or cur > 0.3:
            sugg.append(suggest(ctx, "schedule_conservativeness", cur, 0.3 if not isinstance(cur, int | float) or cur > 0.6 else round(cur / 2, 2),
                                "requests waited with free KV and free slots: admission reserves too much room for future tokens",
                                "admits waiting requests sooner; raises token usage and some retraction risk",
                                ("the stall comes from the future-token reservation (new_token_ratio), not from a grammar or PD transfer wait",)))
        summary = f"Requests waited {dur:.0f} s with no prefill admission although KV usage stayed below {t['kv_room']} and slots were free (up to {v:.0f} waiting)."
        return self.finding(ctx, summary, evs, sugg, confidence="medium")


def _between(sorted_ts: list[float], lo: float, hi: float) -> bool:
    i = bisect.bisect_right(sorted_ts, lo)
    return i < len(sorted_ts) and sorted_ts[i] <= hi


def self_share(vals: list[float]) -> float:
    return 0.5 * len(vals)


def _pow2_at_least(n: float) -> int:
    p = 1
    while p < n:
        p *= 2
    return p
