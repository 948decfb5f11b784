"""What the client saw beside what the server did, over the same window, and the gap named.

:func:`reconcile` takes a :class:`diagnoser.sources.client_results.ClientRun` (a load tool's result file)
and one target's timeline of canonical signals, and answers the first question of a benchmark that
disappoints: why does the client report fewer tokens per second (or a longer TTFT) than the server?

The window: the client's own start and end when its file has them, else the file's modification time
minus the run's duration; if that does not meet the server's readings (a file copied elsewhere), the
run is placed on the server's busy readings (requests running or queued) of about its length; a
timeline with no timestamps is taken whole. Server counts (finished requests, generated and prompt
tokens) are counter increases over the window widened by one scrape interval at each end, because a
scrape's interval reaches back before its own time; rates divide them by the client's duration so both
sides share one clock.

The rows: output tok/s (client) vs the same tokens counted by the server, vs the decode batch's
generation rate while it decodes (``gen_throughput_tps``, what SGLang's log and gauge print); TTFT
median and p95 (client) vs the server's TTFT histogram; requests sent vs finished on the server vs
queued at the server; the client's concurrency vs the server's running batch. Each gap is named in a
sentence: the queue, the idle share of the run (ramp, drain, prefill between decode steps), prompt
tokens counted in a "total" throughput, other clients on the server, errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diagnoser.model import iso
from diagnoser.timeline import Timeline
from diagnoser.timeline.derived import _span_rate


def _vals(tl: Timeline, name: str) -> np.ndarray:
    s = tl.get(name)
    if s is None or not len(s):
        return np.array([])
    v = s.values.astype(float)
    return v[~np.isnan(v)]


def _total(tl: Timeline, name: str) -> float | None:
    s = tl.get(name)
    if s is None or len(s) < 2:
        return None
    got = _span_rate(s)
    return None if got is None else got[0]


def _interval(tl: Timeline) -> float:
    for name in ("output_tps", "request_rate", "running_reqs", "queue_reqs"):  # a counter: the scrape interval
        s = tl.get(name)
        if s is not None and len(s) >= 3:
            d = np.diff(s.ts)
            d = d[d > 0]
            if len(d):
                return float(np.median(d))
    return 0.0


def _busy_span(tl: Timeline, duration: float) -> tuple[float, float] | None:
    """The span of readings with work on the server (running or queued > 0)."""
    ts: list[float] = []
    for name in ("running_reqs", "queue_reqs"):
        s = tl.get(name)
        if s is not None and len(s):
            ok = s.values > 0
            ts.extend(s.ts[ok].tolist())
    if not ts:
        return None
    a, b = min(ts), max(ts)
    if b - a < duration:  # readings every few seconds: the run reaches past the first and last busy one
        pad = (duration - (b - a)) / 2
        a, b = a - pad, b + pad
    return a, b


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return (a - b) / b


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None or not math.isfinite(v) else spec.format(v)


def reconcile(run: Any, tl: Timeline) -> dict[str, Any]:
    """The ``client`` section of the report (see the module docstring)."""
    out: dict[str, Any] = {"tool": run.tool, "source": run.source, "target": tl.target, "rows": [], "gaps": [], "notes": list(run.notes),
                           "client": run.to_dict()}
    span = tl.span()
    dur = run.duration_s
    start, end, basis = run.start, run.end, run.time_basis
    if tl.untimed or span[0] is None:
        win = tl
        out["window"] = {"start": None, "end": None, "basis": "the whole input (it has no timestamps)"}
    else:
        if start is None or end is None or end < span[0] or start > span[1]:
            busy = _busy_span(tl, dur or 0.0)
            if busy is None:
                out["notes"].append("The server's readings show no request running or queued, so the run cannot be placed on them; "
                                    "the server's numbers are over its whole input.")
                start, end = span
                basis = "the server's whole input"
            else:
                if start is not None:
                    out["notes"].append(f"The client's times ({basis}) do not meet the server's readings "
                                        f"({iso(math.floor(span[0]))} → {iso(math.ceil(span[1]))}); the run is placed on the "
                                        "server's busy readings instead.")
                start, end = busy
                basis = "the server's busy readings (the file has no usable time)"
        pad = _interval(tl)
        win = tl.window(start - pad, end + pad)
        out["window"] = {"start": iso(math.floor(start)), "end": iso(math.ceil(end)), "basis": basis, "pad_s": round(pad, 1),
                         "length_s": round(end - start, 1)}
    c_dur = dur or (None if start is None or end is None else end - start)

    gen_tok = _total(win, "output_tps")  # sglang:generation_tokens_total increase: tokens of finished requests
    fin = _total(win, "request_rate")
    prompt = _total(win, "prompt_tps")
    gen = _vals(win, "gen_throughput_tps")
    gen_busy = gen[gen > 0]
    gen_med = float(np.median(gen_busy)) if len(gen_busy) else None
    run_v, queue_v = _vals(win, "running_reqs"), _vals(win, "queue_reqs")
    busy_run = run_v[run_v > 0]
    ttft50, ttft95 = _vals(win, "ttft_seconds_p50"), _vals(win, "ttft_seconds_p95")
    qt95 = _vals(win, "queue_time_seconds_p95")
    s_out_tps = None if gen_tok is None or not c_dur else gen_tok / c_dur
    rows = out["rows"]

    def row(key: str, label: str, client: float | None, server: float | None, spec: str, how: str, same: bool = True) -> None:
        """``same``: both sides measure the same quantity, so their difference is shown (client vs server, in %)."""
        rows.append({"key": key, "quantity": label, "client": client, "server": server, "client_text": _fmt(client, spec),
                     "server_text": _fmt(server, spec), "diff": _pct(client, server) if same else None, "server_basis": how})

    row("output_tps", "output tok/s", run.output_tps, s_out_tps, "{:,.1f}",
        "generated tokens of finished requests (sglang:generation_tokens_total) over the window / the client's duration")
    row("gen_tps_decoding", "gen tok/s while decoding", run.output_tps, gen_med, "{:,.1f}",
        "median of the decode batch's gen throughput over busy readings (the log's and the gauge's number)", same=False)
    row("output_tokens", "output tokens", run.output_tokens, gen_tok, "{:,.0f}", "increase of sglang:generation_tokens_total")
    row("prompt_tokens", "prompt tokens", run.input_tokens, prompt, "{:,.0f}", "increase of sglang:prompt_tokens_total")
    row("ttft_p50", "TTFT median (s)", run.ttft_p50_s, float(np.median(ttft50)) if len(ttft50) else None, "{:.3f}",
        "median of the per-scrape TTFT medians (sglang:time_to_first_token_seconds)")
    row("ttft_p95", "TTFT p95 (s)", run.ttft_p95_s, float(ttft95.max()) if len(ttft95) else None, "{:.3f}",
        "highest per-scrape TTFT p95")
    row("requests", "requests finished", run.completed, fin, "{:,.0f}", "increase of sglang:num_requests_total")
    busy_q = queue_v[queue_v > 0] if len(busy_run) == 0 else _vals(win, "queue_reqs")
    row("sent", "requests sent", run.sent, None, "{:,.0f}", "the server counts finished requests only")
    row("concurrency", "in flight (client) / running", run.mean_concurrency if run.mean_concurrency is not None else run.max_concurrency,
        float(np.median(busy_run)) if len(busy_run) else None, "{:,.1f}", "median running batch over busy readings", same=False)
    row("queued", "queued at the server", None, float(np.median(busy_q)) if len(busy_q) else None, "{:,.1f}",
        "median of the scheduler queue (sglang:num_queue_reqs) over the window")
    out["server"] = {
        "output_tokens": gen_tok, "requests_finished": fin, "prompt_tokens": prompt, "gen_tps_decoding_median": gen_med,
        "running_max": float(run_v.max()) if len(run_v) else None, "queue_max": float(queue_v.max()) if len(queue_v) else None,
        "queue_mean": float(queue_v.mean()) if len(queue_v) else None, "queue_time_p95_max": float(qt95.max()) if len(qt95) else None,
        "max_running_requests": tl.cfg("max_running_requests"),
    }
    out["gaps"] = _gaps(run, out["server"], s_out_tps, gen_med, c_dur, len(ttft50) > 0, float(np.median(ttft50)) if len(ttft50) else None)
    return out


def _gaps(run: Any, s: dict[str, Any], s_out_tps: float | None, gen_med: float | None, c_dur: float | None,
          have_ttft: bool, s_ttft: float | None) -> list[str]:
    gaps: list[str] = []
    if run.failed:
        top = next(iter(run.errors), "")
        gaps.append(f"{run.failed:,} of {run.sent or run.failed + (run.completed or 0):,} requests failed at the client"
                    + (f" (first error: {top})" if top else "") + "; their tokens are in neither side's throughput.")
    fin = s.get("requests_finished")
    if fin is not None and run.completed is not None:
        if fin > run.completed * 1.1 + 1:
            gaps.append(f"The server finished {fin:,.0f} requests in the window, the client {run.completed:,}: other clients "
                        "(or an earlier run) shared the server, so its numbers are not this client's alone.")
        elif fin < run.completed * 0.9 - 1:
            gaps.append(f"The server counted {fin:,.0f} finished requests in the window, the client {run.completed:,}: the window "
                        "misses part of the run (scrapes too sparse, or the run's time is off).")
    if run.output_tps and s_out_tps and abs(run.output_tps - s_out_tps) / s_out_tps > 0.1:
        gaps.append(f"The client's output tok/s ({run.output_tps:,.1f}) and the server's count of the same tokens "
                    f"({s_out_tps:,.1f}) differ by more than 10 %: the client counts tokens its own way (retokenised text, "
                    "or only successful requests).")
    if run.output_tps and gen_med and gen_med > run.output_tps * 1.15:
        share = run.output_tps / gen_med
        why = []
        qmax = s.get("queue_max") or 0
        if qmax > 0:
            why.append(f"requests waited in the server's queue (up to {qmax:,.0f})")
        why.append("the decode rate counts only the moments the server decodes: prefill between decode steps, the "
                   "ramp-up and the drain at the end of the run (when fewer requests are left) are in the client's "
                   "duration but not in that rate")
        gaps.append(f"The server decodes at about {gen_med:,.0f} tok/s while it decodes, the client saw {run.output_tps:,.1f} "
                    f"over its run ({share:.0%}): " + "; ".join(why) + ".")
    sp, cp = s.get("prompt_tokens"), run.input_tokens
    if sp and cp and abs(sp - cp) > 0.1 * cp:
        more = "more" if sp > cp else "fewer"
        gaps.append(f"The server counted {abs(sp - cp):,.0f} {more} prompt tokens than the client ({sp:,.0f} vs {cp:,.0f}): "
                    + ("the server counts the tokens of the text it receives, which need not be the client's count (a BOS "
                       "token, a chat template, token ids decoded to text and tokenised again), and requests the client does "
                       "not report (its warm-up) are in the server's count." if sp > cp else
                       "the client counts prompt tokens with its own tokenizer, or some prompts never reached the server."))
    if run.total_tps and run.output_tps and run.total_tps > run.output_tps * 1.2:
        gaps.append(f"The client's total throughput ({run.total_tps:,.1f} tok/s) counts prompt tokens too; compare its "
                    f"output throughput ({run.output_tps:,.1f}) with the server's gen tok/s.")
    if run.ttft_p50_s is not None and s_ttft is not None and have_ttft:
        d = run.ttft_p50_s - s_ttft
        if d > max(0.05, 0.2 * s_ttft):
            gaps.append(f"The client's median TTFT ({run.ttft_p50_s:.3f} s) is {d:.3f} s above the server's ({s_ttft:.3f} s): "
                        "time the request spent before the server's clock started (the client's own queue, connection set-up, "
                        "tokenisation, the network).")
        elif run.ttft_p50_s > 0 and (s.get("queue_time_p95_max") or 0) > 0.5 * run.ttft_p50_s:
            gaps.append(f"Most of the client's TTFT ({run.ttft_p50_s:.3f} s median) is time in the server's queue (queue time "
                        f"p95 up to {s['queue_time_p95_max']:.3f} s).")
    cap = s.get("max_running_requests")
    conc = run.max_concurrency
    if conc and isinstance(cap, int | float) and cap and conc > cap:
        gaps.append(f"The client keeps up to {conc:,.0f} requests in flight, the server runs at most {cap:,.0f} "
                    f"(--max-running-requests): about {conc - cap:,.0f} wait in its queue, and their wait is in the client's TTFT.")
    elif conc and s.get("running_max") is not None and s["running_max"] < conc * 0.5 and not (s.get("queue_max") or 0):
        gaps.append(f"The client allows {conc:,.0f} requests in flight but the server ran at most {s['running_max']:,.0f} with no queue: "
                    "the client sent too little to fill it.")
    if not gaps and c_dur:
        gaps.append("The client's and the server's numbers agree within 10-15 %.")
    return gaps
