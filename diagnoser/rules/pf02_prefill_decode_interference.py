"""Back-to-back large prefills starve decode: running requests get no decode step while prompts are computed.

What it detects:
    Runs of consecutive `Prefill batch` lines with no `Decode batch` line between them (log order),
    at least `min_run` (3) long, each computing `min_batch_tokens` (8192) new tokens or more on
    average, while at least `min_running` (1) requests were already running and waiting for their next
    token. From `/metrics` alone: gen throughput falling below `dip_ratio` (50 %) of its median at
    scrapes where prompt throughput peaks (`prompt_tps` at or above its p75) while requests run.

Why it matters:
    SGLang schedules prefill first. Each long prefill step blocks every running request's next decode
    step, so their inter-token latency spikes and generation throughput dips while prompts are computed.

Evidence:
    The longest run: number of prefill batches, tokens, running requests, the first and last line; or
    the gen-throughput dip with the scrape times.

    On each engine. On SGLang: consecutive Prefill lines with their `#running-req`, and the decode
    throughput between them. On vLLM the engine's mechanism says whether a step that admits prompts runs
    without decode: V0 without chunked prefill does (`vllm/core/scheduler.py` `_schedule_default` at
    v0.4.3 / v0.6.6: "Don't schedule decodes if prefills are scheduled"), V1 and V0 with
    `--enable-chunked-prefill` do not. There the rule reads the stats lines (or scrapes): an interval with
    generation at 0 tok/s while prompts were computed at `min_prompt_tps` (100) or more and requests were
    already running at the reading before it; those requests got no token for the whole interval. One
    such interval is enough (at low confidence; two or more, medium).

Fix:
    On vLLM V0: `--enable-chunked-prefill` (0.4.3+), with `--max-num-batched-tokens` at vLLM's own
    default for chunked prefill (512 at 0.4.3, 2,048 from 0.6.6), raised to fit the running decodes; not
    proposed where the release lacks the flag or chunked prefill is already on. On SGLang:
    `--enable-mixed-chunk` (mix decode tokens into prefill batches), a smaller
    `--chunked-prefill-size` / `--max-prefill-tokens` (shorter prefill steps, each one interrupts
    less), or PD disaggregation for heavy prefill traffic. When more requests wait for prefill than run
    (a prefill-bound queue with KV room, see `prefill_stall`), smaller prefill batches would lengthen
    that queue: only `--enable-mixed-chunk` is proposed then.

Known false positives:
    A start-up burst (no request running yet) is excluded by `min_running`. Logs shipped without
    ordering guarantees can interleave lines.

References:
    - How diagnoser reads SGLang: the [Prefill](docs/sglang.md#prefill-line) and
      [Decode](docs/sglang.md#decode-line) batch lines and [their cadence](docs/sglang.md#cadence), [chunked
      prefill and `--enable-mixed-chunk`](docs/sglang.md#batching-flags), [SGLang's tuning
      guide](docs/sglang.md#tuning-guide).
    - Real case: PR [#14050](https://github.com/sgl-project/sglang/pull/14050), back-to-back prefills
      starving decode.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from diagnoser.mechanism import StepModel
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules.base import Rule, RuleContext, evidence, next_pow2, suggest
from diagnoser.rules.columns import aligned, arrays, pairs, raw_arrays, times_in_order
from diagnoser.timeline import quantile

_LINE = re.compile(r":(\d+)$")


def _line(src: str) -> int:
    m = _LINE.search(src)
    return int(m.group(1)) if m else -1


def running_at(ctx: RuleContext, times: list[float]) -> list[float]:
    """The running count read at each of these times: the last reading (not NaN) at that time, else 0.
    At a time gen_throughput_tps was read, this is the join of running_reqs with it (pairs)."""
    got = arrays(ctx, "running_reqs")
    rts, rv = got if got is not None else (np.zeros(0), np.zeros(0))
    if times_in_order(ctx, rts):  # (no NaN time) the last reading at a time is the one a dict of time -> reading keeps
        get = dict(zip(rts.tolist(), rv.tolist(), strict=True)).get
        return [get(t, 0) for t in times]
    at = rts.searchsorted(np.asarray(times, dtype=float), "right") - 1
    return [rv.item(k) if k >= 0 and rts.item(k) == t else 0 for k, t in zip(at.tolist(), times, strict=True)]


def _logged(labels: list[str]) -> np.ndarray:
    """Per source label: True when it is not a scrape's (a source reads ``label:line`` or the label)."""
    return np.fromiter((not label.startswith("scrape@") for label in labels), dtype=bool, count=len(labels))


def _lines(labels: list[str], lab: np.ndarray, line: np.ndarray) -> np.ndarray:
    """:func:`_line` of each source from its stored parts: the stored line number, else (a source kept
    whole) the number its label ends with, if any."""
    out = line.astype(np.int64)
    alone = (out < 0).nonzero()[0]
    if len(alone):
        out[alone] = np.fromiter(map(_line, labels), dtype=np.int64, count=len(labels))[lab[alone]]
    return out


class PrefillDecodeInterference(Rule):
    name = "prefill_decode_interference"
    code = "PF02"
    title = "Prefills starve decode"
    severity = Severity.WARNING
    reads = ("prefill_new_tokens",)
    defaults = {"min_run": 3, "min_batch_tokens": 8192, "min_running": 1, "dip_ratio": 0.5, "min_scrapes": 6, "min_prompt_tps": 100.0}
    threshold_help = {
        "min_run": "fewest consecutive prefill batches with no decode between",
        "min_batch_tokens": "mean new tokens per prefill batch in the run",
        "min_running": "requests already running during the run",
        "dip_ratio": "gen throughput below this share of its median at prompt peaks (metrics path)",
        "min_scrapes": "fewest scrapes for the metrics path",
        "min_prompt_tps": "prompt tok/s of an interval with no generation that counts as prefill-only (engines whose steps are prefill-only)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        return self._prefill_only(ctx) or self._from_log(ctx) or self._from_metrics(ctx)

    def _prefill_only(self, ctx: RuleContext) -> Finding | None:
        """An engine whose steps that admit prompts run no decode (the mechanism says so: vLLM V0 without
        chunked prefill): intervals with no generation while prompts were computed and requests already ran."""
        t = ctx.thresholds
        state = ctx.memo.get("mech_state")
        if state is None:
            state = ctx.memo["mech_state"] = ctx.mech.state_of(ctx.timeline.cfg, ctx.version)
        model = ctx.mech.prefill_only_steps(state)
        if model is None or not model.prefill_only:
            return None
        got = arrays(ctx, "gen_throughput_tps")
        if got is None or ctx.series("prompt_tps") is None or ctx.series("running_reqs") is None:
            return None
        ts, gen = got
        if len(ts) < 2:
            return None
        prompt, run = aligned(ctx, "gen_throughput_tps", "prompt_tps"), aligned(ctx, "gen_throughput_tps", "running_reqs")
        queue = aligned(ctx, "gen_throughput_tps", "queue_reqs") if ctx.series("queue_reqs") is not None else np.full(len(ts), np.nan)
        with np.errstate(invalid="ignore"):
            # the requests running at the previous reading got no token over the interval: none was generated
            starved = (gen[1:] < 0.05) & (prompt[1:] >= t["min_prompt_tps"]) & (run[:-1] >= t["min_running"]) & (ts[1:] > ts[:-1])
        k = starved.nonzero()[0] + 1
        if not len(k):
            return None
        src = ctx.series("gen_throughput_tps").sources  # type: ignore[union-attr]
        secs = float((ts[k] - ts[k - 1]).sum())
        waited = run[k - 1]
        pr = prompt[k]
        q = queue[k][~np.isnan(queue[k])]
        with np.errstate(invalid="ignore"):
            decode_only = (gen > 0) & (prompt == 0)
        dec = float(np.median(gen[decode_only])) if decode_only.any() else None
        dec_run = float(np.median(run[decode_only])) if decode_only.any() else None
        where = f"{src[int(k[0])]}" + (f" .. {_line(src[int(k[-1])])}" if len(k) > 1 else "")
        evs = [evidence("stats intervals with generation 0 tok/s while prompts were computed", len(k), ">= 1", ctx.window_text(), where),
               evidence("prompt_tps in those intervals", f"{pr.min():,.0f}–{pr.max():,.0f}", f">= {t['min_prompt_tps']:g}", "", where),
               evidence("running_reqs at the reading before (requests that got no token)", f"{waited.min():.0f}–{waited.max():.0f}",
                        f">= {t['min_running']}", "", src[int(k[0]) - 1]),
               evidence("scheduler", model.why, None, "", model.cites)]
        if len(q):
            evs.append(evidence("queue_reqs (prompts waiting) in those intervals", f"{q.min():.0f}–{q.max():.0f}", None, "", where))
        if dec is not None:
            evs.append(evidence("gen_throughput_tps in decode-only readings (median)", round(dec, 1), None, ctx.window_text(), ""))
        n = len(k)
        summary = (f"In {n} stats interval{'s' if n > 1 else ''} ({secs:,.0f} s) generation was 0 tok/s while prompts were computed at "
                   f"{pr.min():,.0f}–{pr.max():,.0f} tok/s: the {waited.min():.0f}–{waited.max():.0f} requests already running got no token, "
                   f"because {model.why}"
                   + (f", so decode stops while prompts wait ({q.min():.0f}–{q.max():.0f} waiting)." if len(q) and q.max() > 0 else "."))
        notes: list[str] = []
        sugg = self._chunked_prefill(ctx, state, model, float(np.nanmax(run[k])), dec, dec_run, notes)
        if not sugg and notes:
            summary += " " + notes[0]
        return self.finding(ctx, summary, evs, sugg, confidence="low" if n < 2 else "medium", notes=notes or None)

    def _chunked_prefill(self, ctx: RuleContext, state: Any, model: StepModel, running: float, dec: float | None, dec_run: float | None,
                         notes: list[str]) -> list[Suggestion]:
        """Chunked prefill, and the step budget it runs with, as the engine's mechanism sizes them."""
        mech = ctx.mech
        spelled = ctx.flag("enable_chunked_prefill")
        if not spelled.startswith("--"):
            rel = ctx.timeline.version or (".".join(map(str, ctx.version)) if ctx.version else "at this release")
            notes.append(f"{ctx.word('engine')} {rel} has no chunked prefill flag {spelled}: upgrading to a release with it, "
                         "and turning it on, is the way to run decode beside prefill.")
            return []
        cur = ctx.cfg("enable_chunked_prefill")
        cur_on = cur if isinstance(cur, bool) else (str(cur).lower() == "true" if cur is not None else False)
        exact = bool(ctx.timeline.version and ctx.timeline.version[0].isdigit())
        assume = () if exact else (f"the release has {spelled} (the inputs do not give the exact version; upgrade first on one without it)",)
        after = mech.state_after(state, spelled, True)
        budget = mech.chunked_prefill_budget(mech.state_after(after, ctx.flag("max_num_batched_tokens"), None))
        then = mech.prefill_only_steps(after)
        if then is None or then.prefill_only:
            return []  # the mechanism does not say the change removes the prefill-only steps
        chunk_note = f"prompts are split into chunks of at most {budget[0]:,} tokens less the decodes" if budget else "prompts are split into chunks"
        rate = (f" (it ran at {dec:,.1f} tok/s with {dec_run:.0f} running in the decode-only readings)" if dec is not None and dec_run else "")
        out = [suggest(ctx, "enable_chunked_prefill", cur_on, True,
                       f"{then.why} ({then.cites}); now {model.why}"
                       + ("" if cur is not None else "; the current value is not in the inputs (the prefill-only intervals show it off)"),
                       f"the running requests keep getting a token every step while prompts are prefilled: generation no longer stops while "
                       f"prompts wait{rate}; {chunk_note}, so a long prompt takes a few steps (TTFT rises somewhat)",
                       assume)]
        if budget is None:
            return out
        proposed = budget[0]
        if running * 2 > proposed:  # room for prompt chunks beside the decodes (one token each)
            proposed = next_pow2(running * 2)
        cur_b = ctx.cfg("max_num_batched_tokens")
        cur_b = int(cur_b) if isinstance(cur_b, int | float) and not isinstance(cur_b, bool) else None
        if cur_b is not None and cur_b <= proposed:
            return out  # the configured budget already bounds a step that tightly
        was = f"{cur_b:,}" if cur_b is not None else "not in the inputs"
        s = suggest(ctx, "max_num_batched_tokens", cur_b, proposed,
                    f"together with {spelled}: the step budget ({was}; without chunked prefill it must hold a whole prompt) bounds how many "
                    f"tokens one step computes; {budget[1]}" + (f", raised to leave room beside {running:.0f} running decodes" if proposed > budget[0] else ""),
                    f"each step carries the running decodes and up to {proposed - running:,.0f} prompt tokens, so no step is a long prefill "
                    "and the running requests' inter-token latency stays short",
                    ("decode latency matters more than the last bit of prefill throughput",) + assume)
        return [*out, replace(s, projection={"extra_flags": [f"{spelled} True"]})]

    def _from_log(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        ps = ctx.series("prefill_new_tokens")
        if ps is None:
            return None
        _, pv = raw_arrays(ctx, "prefill_new_tokens")
        labels, lab, line = ps.sources.parts()
        if not any(not labels[i].startswith("scrape@") for i in lab[(pv >= t["min_batch_tokens"]).nonzero()[0]].tolist()):
            return None  # no logged batch that large: no run can average min_batch_tokens
        logged = _logged(labels)[lab]  # read from a log line, not a scrape
        # the logged batches with the running count read at the same moment, in log line order (stable)
        # a Prefill line's #running-req is the decode batch that waits while it runs (prefill_running_reqs)
        p = pairs(ctx, "prefill_new_tokens", "prefill_running_reqs" if ctx.series("prefill_running_reqs") is not None else "running_reqs")
        at = np.arange(len(ps)) if p.idx is None else p.idx  # the joined points' positions in the series
        lines = _lines(labels, lab[at], line[at])
        keep = (logged[at] & (lines >= 0)).nonzero()[0]
        if len(keep) < t["min_run"]:
            return None
        order = keep[np.argsort(lines[keep], kind="stable")]
        ln, run = lines[order], p.b[order]
        dec_lines = np.zeros(0, dtype=np.int64)
        dec_s = ctx.series("gen_throughput_tps")
        if dec_s is not None:
            dlabels, dlab, dline = dec_s.sources.parts()
            dl = _lines(dlabels, dlab, dline)
            dec_lines = np.sort(dl[_logged(dlabels)[dlab] & (dl >= 0)])
        # a run: consecutive batches (in line order) with min_running running and no decode line between
        ok = run >= t["min_running"]
        start = ok.copy()
        if len(ok) > 1:
            cut = ~ok[:-1]
            if len(dec_lines):
                nxt = np.searchsorted(dec_lines, ln[:-1], side="right")  # the first decode line after each batch
                cut |= (nxt < len(dec_lines)) & (dec_lines[np.minimum(nxt, len(dec_lines) - 1)] < ln[1:])
            start[1:] &= cut
        firsts = start.nonzero()[0]
        if not len(firsts):
            return None
        stop_at = np.append((~ok | start).nonzero()[0], len(ok))  # a run stops at a batch that is not ok or starts a run
        ends = stop_at[np.searchsorted(stop_at, firsts, side="right")]
        k = int(np.argmax(ends - firsts))  # the first longest run
        if ends[k] - firsts[k] < t["min_run"]:
            return None
        sel = order[firsts[k]:ends[k]]
        best = list(zip(p.ts[sel].tolist(), p.a[sel].tolist(), p.b[sel].tolist(), [p.src(i) for i in sel.tolist()], strict=True))
        mean_tok = sum(p[1] for p in best) / len(best)
        if mean_tok < t["min_batch_tokens"]:
            return None
        total = sum(p[1] for p in best)
        rmin, rmax = min(p[2] for p in best), max(p[2] for p in best)
        evs = [evidence("consecutive prefill batches with no decode line between", len(best), t["min_run"], "", f"{best[0][3]} .. {_line(best[-1][3])}"),
               evidence("prefill_new_tokens per batch (mean)", round(mean_tok), t["min_batch_tokens"], "", best[0][3]),
               evidence("running_reqs during the run", f"{rmin:.0f}–{rmax:.0f}", f">= {t['min_running']}", "", best[-1][3])]
        summary = (f"{len(best)} prefill batches ran back to back ({total:,.0f} new tokens, {mean_tok:,.0f} per batch) with no decode step between them "
                   f"while {rmin:.0f}–{rmax:.0f} requests were running and waiting for their next token.")
        return self.finding(ctx, summary, evs, self._suggestions(ctx, mean_tok), confidence="medium")

    def _from_metrics(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        sa, sb = ctx.series("prompt_tps"), ctx.series("gen_throughput_tps")
        if sa is None or sb is None:
            return None
        if len(sa) < 64 and len(sb) < 64:  # scrapes only: joint()'s dict join is cheapest (with positions, as below)
            get = dict(zip(sb.ts.tolist(), sb.values.tolist(), strict=True)).get
            pts: list = [(t_, v, w, i) for i, (t_, v) in enumerate(zip(sa.ts.tolist(), sa.values.tolist(), strict=True))  # type: ignore[type-arg]
                         if (w := get(t_)) is not None and v == v and w == w]
            src = sa.source_at  # (a source is formatted only for a finding)
        else:  # joint()'s points from pairs(), with the position of each: its source is formatted for the evidence only
            pj = pairs(ctx, "prompt_tps", "gen_throughput_tps")
            pts = list(zip(pj.ts.tolist(), pj.a.tolist(), pj.b.tolist(), range(len(pj)), strict=True))
            src = pj.src  # type: ignore[assignment]
        if len(pts) < t["min_scrapes"]:
            return None
        floor = t["min_running"]
        pts = [p for p, r in zip(pts, running_at(ctx, [p[0] for p in pts]), strict=True) if r >= floor]
        if len(pts) < t["min_scrapes"]:
            return None
        gens = sorted(p[2] for p in pts)
        prompts = sorted(p[1] for p in pts)
        med, p75 = quantile(gens, 0.5), quantile(prompts, 0.75)
        if med <= 0 or p75 <= 0:
            return None
        peaks = [p for p in pts if p[1] >= p75]
        low = t["dip_ratio"] * med
        dips = [p for p in peaks if p[2] < low]
        if len(dips) < 2 or len(dips) < 0.5 * len(peaks):
            return None
        evs = [evidence("gen_throughput_tps at prompt peaks", round(min(d[2] for d in dips), 1), f"< {t['dip_ratio']} x median {med:.0f}", ctx.window_text(), src(dips[0][3])),
               evidence("prompt_tps p75", round(p75, 1), None, ctx.window_text(), "")]
        summary = f"Generation throughput fell below {t['dip_ratio']:.0%} of its median ({med:.0f} tok/s) in {len(dips)} of {len(peaks)} scrapes where prompt throughput peaked, while requests were running."
        return self.finding(ctx, summary, evs, self._suggestions(ctx, None), confidence="low")

    def _suggestions(self, ctx: RuleContext, mean_tok: float | None):  # type: ignore[no-untyped-def]
        out = []
        mixed = ctx.cfg("enable_mixed_chunk", ctx.cfg("arg.enable_mixed_chunk"))
        if mixed is not True:
            out.append(suggest(ctx, "enable_mixed_chunk", mixed, True, "decode tokens ride along with prefill batches instead of waiting for them"
                               + ("" if mixed is not None else "; the current value is not in the inputs (default off)"),
                               "running requests keep getting tokens during prefill bursts: lower ITL spikes, steadier generation",
                               ("not with EAGLE speculative decoding, which disables mixed chunks",)))
        queue, running = ctx.stats("queue_reqs"), ctx.stats("running_reqs")
        if not running["n"]:  # only Prefill lines: their #running-req is the decode batch beside each prefill
            running = ctx.stats("prefill_running_reqs")
        if (queue["p50"] or 0) > 0 and (queue["p50"] or 0) >= (running["p50"] or 0) and (ctx.stats("token_usage")["p95"] or 0) < 0.9:
            # more requests wait for prefill than run: the queue is prefill-bound, and smaller prefill batches would
            # lengthen it (prefill_stall); mixing decode into the prefill batches helps both sides
            return out
        chunk = ctx.cfg("chunked_prefill_size", ctx.cfg("arg.chunked_prefill_size"))
        basis = mean_tok if mean_tok else (chunk if isinstance(chunk, int | float) and chunk > 0 else 16384)
        p = 2048
        while p * 2 <= basis / 4 and p < 8192:
            p *= 2
        if not isinstance(chunk, int | float) or chunk <= 0 or chunk > p:
            out.append(suggest(ctx, "chunked_prefill_size", chunk if isinstance(chunk, int | float) else None, p,
                               "shorter prefill steps interrupt decode for less time each" + ("" if isinstance(chunk, int | float) else "; the current value is not in the inputs"),
                               "each prefill step blocks decode for a fraction of the time; long prompts take more steps (TTFT rises a little)",
                               ("decode latency matters more than the last bit of prefill throughput",)))
        mpt = ctx.cfg("max_prefill_tokens", ctx.cfg("arg.max_prefill_tokens"))
        if not isinstance(mpt, int | float) or mpt > p:
            out.append(suggest(ctx, "max_prefill_tokens", mpt if isinstance(mpt, int | float) else None, p,
                               "caps the tokens one prefill batch computes" + ("" if isinstance(mpt, int | float) else "; the current value is not in the inputs (default 16384)"),
                               "fewer requests admitted per prefill batch, so each prefill step is shorter",
                               ("a single request longer than this is still admitted whole (the bound is max(this, context length))",)))
        return out
