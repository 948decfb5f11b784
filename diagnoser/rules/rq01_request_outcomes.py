"""Requests fail: rejected (context length, queue full, rate limit), aborted or errors, as a share of the requests.

What it detects:
    The share of requests that did not get an answer, by cause. From the access log: the POST requests
    (`INFO: … "POST /generate HTTP/1.1" 400`) by status — 400 with `request_too_long` lines (`The input
    (N tokens) is longer than the model's context length (M tokens)`, `Input length (N tokens) exceeds
    the maximum allowed length`) is a context-length rejection, 503 is the waiting queue full
    (`--max-queued-requests`: `The request queue is full.`, `Scheduler._abort_on_queued_limit` in
    `python/sglang/srt/managers/scheduler.py` at v0.5.23), 429 a rate limit, other 4xx/5xx errors.
    From the metrics: the increase of `sglang:num_aborted_requests_total` (client disconnects, timeouts,
    and the queue-full aborts; `observability/metrics_collector.py` at v0.5.23) against the requests that
    finished (`sglang:num_requests_total`). It is a warning from `fail_share` (5 %) of the requests and
    critical from `critical_share` (20 %); fewer is info. One access-log summary or two scrapes judge.

Why it matters:
    A rejected or aborted request is work the client did not get: the latency and throughput figures
    of the requests that succeeded say nothing about them, so a server that rejects a large share of
    its requests is not healthy however fast its answers are.

Evidence:
    Requests counted and failed by status (access log), the longest prompt rejected and the allowed
    length, the aborted-request counter's increase and the finished requests, with their sources.

    On each engine. On SGLang: abort and error counters, HTTP responses, access lines and requests
    rejected as too long. On vLLM: uvicorn access lines (status codes) and requests rejected for exceeding
    the model length; `vllm:request_success_total` is read as completions (its `finished_reason` split
    into abort and error is not yet).

Fix:
    Context length: raise `--context-length` to the next power of two above the longest prompt rejected
    (at most the KV pool: a request must fit in it), or cut prompts on the client (or
    `--allow-auto-truncate`). Queue full: the queue limit protects latency; a larger
    `--max-queued-requests` (twice the current) trades the rejections for queue time, and the real fix is
    throughput (the admission findings) or replicas. Aborts: clients disconnect or time out — set their
    timeouts above the TTFT p95 the server shows, or cut the wait (the admission findings); no server
    flag. Other errors: see `engine_crash`.

Known false positives:
    An access log that also holds health checks: only POST requests count when there are any. A
    benchmark that cancels its requests on purpose aborts them.

References:
    - How diagnoser reads SGLang: [access-log lines](docs/sglang.md#logs),
      [the request counters](docs/sglang.md#metrics-requests).
    - SGLang 0.5.23: `python/sglang/srt/managers/scheduler.py` `_abort_on_queued_limit` (503, "The request
      queue is full."), `managers/tokenizer_manager.py` (the context-length check, 400).
"""

from __future__ import annotations

from typing import Any

from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules.admission import admission
from diagnoser.rules.base import Rule, RuleContext, evidence, next_pow2, pool_tokens, suggest


class RequestOutcomes(Rule):
    name = "request_outcomes"
    code = "RQ01"
    title = "Requests fail"
    severity = Severity.WARNING
    reads = ("aborted_total",)
    events = ("access_summary", "request_too_long")
    defaults = {"fail_share": 0.05, "critical_share": 0.2}
    threshold_help = {
        "fail_share": "share of the requests rejected, aborted or failed that makes it a warning",
        "critical_share": "share that makes it critical",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        evs: list[Any] = []
        parts: list[str] = []
        sugg: list[Suggestion] = []
        total = failed = 0
        acc = ctx.events_of("access_summary")
        status: dict[str, int] = {}
        if acc:
            a = acc[-1]
            status = {str(k): int(v) for k, v in (a.fields.get("status") or {}).items()}
            posts = sum(int(v) for p, v in (a.fields.get("paths") or {}).items() if str(p).startswith("POST "))
            total = posts or sum(status.values())
            bad = {k: v for k, v in status.items() if k[:1] in "45"}
            failed = sum(bad.values())
        elif ctx.series("http_responses_total") is not None:  # the API's own answer counters (sglang:http_responses_total)
            total = _counter_increase(ctx, "http_responses_total")
            status = {c: n for c in ("400", "429", "503") if (n := _counter_increase(ctx, f"http_{c}_total"))}
            other = _counter_increase(ctx, "http_errors_total") - sum(status.values())
            if other > 0:
                status["other 4xx/5xx"] = other
            gone = min(status.get("400", 0), _counter_increase(ctx, "aborted_total"))  # a client that disconnects is answered 400 and counted aborted
            if gone:
                status["400"] -= gone
                status = {k: v for k, v in status.items() if v}
            bad = dict(status, **({"400 (client disconnected)": gone} if gone else {}))
            failed = sum(bad.values())
            if failed:
                s = ctx.series("http_errors_total")
                evs.append(evidence("requests failed (sglang:http_responses_total, by status)", ", ".join(f"{v:,} x {k}" for k, v in sorted(bad.items())),
                                    None, ctx.window_text(), s.last_source() if s is not None else ""))
                parts.append(f"{failed:,} of {total:,} requests got an error status ({', '.join(f'{v:,} x HTTP {k}' for k, v in sorted(bad.items()))})")
        if acc:
            if failed:
                evs.append(evidence("requests failed (access log, by status)", ", ".join(f"{v:,} x {k}" for k, v in sorted(bad.items())),
                                    None, "", a.source))
                parts.append(f"{failed:,} of {total:,} requests got an error status ({', '.join(f'{v:,} x HTTP {k}' for k, v in sorted(bad.items()))})")
        aborted, finished, src = _counter_increase(ctx, "aborted_total"), _counter_increase(ctx, "requests_completed"), ""
        if aborted:
            s = ctx.series("aborted_total")
            src = s.last_source() if s is not None else ""
            evs.append(evidence("aborted requests (sglang:num_aborted_requests_total increase)", aborted, None, ctx.window_text(), src))
            parts.append(f"{aborted:,} request(s) were aborted (client disconnects, timeouts or queue-full rejections)")
            if not failed:  # the counters alone: aborted against finished
                # sglang:num_requests_total counts an aborted request too: it finishes, with a truncated decode
                # (tokenizer_manager.py at v0.5.23, observe_one_finished_request; the real aborts recording: 128
                # streamed, 64 aborted, num_requests_total 128), so the finished count is the total when it holds them
                total, failed = (finished if finished >= aborted else aborted + finished), aborted
            elif not acc:
                pass  # the answer counters already hold the aborts (as 400s) and the queue-full 503s
            elif status.get("503", 0) < aborted:
                failed += aborted - status.get("503", 0)  # aborts beyond the queue-full 503s (a streaming disconnect logs 200)
        if not failed or not total:
            return None
        share = min(failed / total, 1.0)
        evs.insert(0, evidence("share of requests rejected, aborted or failed", round(share, 3), t["fail_share"], ctx.window_text(), evs[0].source))
        sugg += self._context(ctx, status, parts, evs, t["fail_share"] * total)
        if status.get("503"):
            cur = ctx.cfg("arg.max_queued_requests")
            parts.append(f"{status['503']:,} x 503: the waiting queue was full" + (f" (--max-queued-requests {cur})" if cur else ""))
            held, held_share = admission(ctx).top()
            see = {"slots": "max_running_requests_cap", "kv": "kv_saturation", "budget": "prefill_stall"}.get(held)
            if see and held_share >= 0.5:  # the queue fills because admission is held: that limit is the fix, not a longer queue
                parts.append(f"the queue fills because {see} holds admission: its fix serves more, a longer queue only waits longer")
            elif isinstance(cur, int | float) and cur > 0:
                sugg.append(suggest(ctx, "max_queued_requests", int(cur), next_pow2(2 * cur),
                                    f"{status['503']:,} requests were turned away with 503 because {int(cur)} already waited",
                                    "fewer rejections, traded for queue time (TTFT); the lasting fix is throughput (the admission findings) or replicas",
                                    ("the clients accept a longer wait rather than a retry",)))
        notes = []
        if aborted:
            ttft = ctx.stats("ttft_seconds_p95")
            notes.append("Aborted requests are client disconnects or timeouts (or queue-full rejections): set client timeouts above the "
                         + (f"TTFT p95 the server shows (median {ttft['p50']:.1f} s)" if ttft["n"] else "time the server takes")
                         + ", or cut the wait; no server flag changes what a client gives up on.")
        sev = Severity.CRITICAL if share >= t["critical_share"] else Severity.WARNING if share >= t["fail_share"] else Severity.INFO
        summary = f"{share:.0%} of the requests did not get an answer: " + "; ".join(parts) + "."
        return self.finding(ctx, summary, evs, sugg, severity=sev, notes=notes, confidence="high" if acc else "medium",
                            basis={"events": max(len(acc), 1), "kind": "access log" if acc else "request counters"})

    @staticmethod
    def _context(ctx: RuleContext, status: dict[str, int], parts: list[str], evs: list[Any], enough: float) -> list[Suggestion]:
        """400s with the server's own context-length lines: the longest prompt rejected and what fits."""
        long_ = [e for e in ctx.events_of("request_too_long")]
        cur = ctx.cfg("context_len", ctx.cfg("arg.context_length"))
        pool, _ = pool_tokens(ctx)
        if not long_:
            if not status.get("400"):
                return []
            parts.append(f"{status['400']:,} x 400: bad requests (a prompt longer than the context length shows as a "
                         "'longer than the model's context length' line in the server log)")
            if not isinstance(cur, int | float) or cur <= 0 or (pool and cur >= pool) or status["400"] < enough:
                return []  # (a few 400s without the log's lines are no case for a longer context)
            proposed = min(2 * int(cur), pool) if pool else 2 * int(cur)
            return [suggest(ctx, "context_length", int(cur), proposed, f"{status['400']:,} requests were rejected with 400 at a context length of {int(cur):,}",
                            "prompts up to twice as long are served, if the 400s are prompts longer than the context",
                            ("the 400s are prompts longer than the context (the server log says so on each: pass it to check)",
                             "the model supports the longer context (its config's max_position_embeddings)"))]
        worst = max(long_, key=lambda e: int(e.fields.get("input_tokens") or 0))
        need, allowed = int(worst.fields.get("input_tokens") or 0), int(worst.fields.get("allowed_tokens") or 0)
        evs.append(evidence("longest prompt rejected (tokens)", need, allowed, "", worst.source))
        parts.append(f"{len(long_):,} prompt(s) were rejected as too long (up to {need:,} tokens, {allowed:,} allowed)")
        if worst.fields.get("limit") not in ("context", None, ""):
            return []  # the pool, not the context length, rejected it (kv_pool_too_small)
        proposed = next_pow2(need + 1)
        if pool and proposed > pool:
            proposed = pool
        if proposed <= allowed:
            return []
        return [suggest(ctx, "context_length", cur or allowed, proposed, f"prompts of up to {need:,} tokens were rejected with {allowed:,} allowed",
                        "the rejected prompts are served (each needs its KV in the pool)",
                        ("the model supports the longer context (its config's max_position_embeddings)", "or cut prompts on the client instead"))]


def _counter_increase(ctx: RuleContext, signal: str) -> int:
    """A counter's increase over the window (a reset counts from 0); its value when read once."""
    s = ctx.series(signal)
    if s is None or not len(s):
        return 0
    v = [x for x in s.values.tolist() if x == x]  # (floats already)
    if not v:
        return 0
    if len(v) == 1:
        return int(v[0])
    inc = 0.0
    for a, b in zip(v, v[1:], strict=False):
        inc += b - a if b >= a else b
    return int(inc)
