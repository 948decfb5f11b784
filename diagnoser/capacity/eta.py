"""Job progress and ETA: how many of the job's requests are done, at what rate, and when it ends.

Completed requests come from the ``requests_completed`` counter (``sglang:num_requests_total``) or, in a
log, from access-log lines on a generation path (per-line ``access`` events, or the parser's one
``access_summary`` count per log, which has no per-line times and so gives no rate). The rate is the slope over the window; when
neither is there, it is derived from gen throughput / output tokens per request (and said so).
Under a what-if the rate scales with the projected gen throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.timeline import Timeline

GEN_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


@dataclass(slots=True)
class JobProgress:
    job_requests: int | None = None
    completed: int = 0
    completed_source: str = ""
    rate_rps: float | None = None
    rate_source: str = ""

    @property
    def remaining(self) -> int | None:
        return None if self.job_requests is None else max(0, self.job_requests - self.completed)

    def eta_hours(self, rate_scale: float = 1.0) -> float | None:
        """Hours left at the observed rate × ``rate_scale`` (a what-if's throughput ratio)."""
        if self.remaining is None or not self.rate_rps or rate_scale <= 0:
            return None
        return self.remaining / (self.rate_rps * rate_scale) / 3600.0


def progress_from_timeline(tl: Timeline, job_requests: int | None, output_tokens_per_request: float | None = None,
                           gen_tps: float | None = None) -> JobProgress:
    jp = JobProgress(job_requests=job_requests)
    counter = tl.get("requests_completed")
    if counter is not None and len(counter) >= 1:
        first, last = float(counter.values[0]), float(counter.values[-1])
        jp.completed = int(max(0.0, last))
        jp.completed_source = f"{counter.sources[-1]} (requests_completed counter)"
        span = counter.last_ts() - counter.first_ts()
        if len(counter) >= 2 and span > 0 and last > first:
            jp.rate_rps = (last - first) / span
            jp.rate_source = f"requests_completed rose {last - first:.0f} in {span:.0f} s"
    if jp.rate_rps is None:
        access = [e for e in tl.events_of("access")
                  if 200 <= int(e.fields.get("status", 0)) < 300 and str(e.fields.get("path", "")).startswith(GEN_PATHS)]
        if access:
            if not jp.completed_source:
                jp.completed = len(access)
                jp.completed_source = (f"{len(access)} access-log lines ({access[0].source} … {access[-1].source}); "
                                       "requests finished before the log starts are not counted")
            span = access[-1].ts - access[0].ts
            if len(access) >= 3 and span > 0 and not tl.untimed:
                jp.rate_rps = (len(access) - 1) / span
                jp.rate_source = f"{len(access)} completions in {span:.0f} s of access log"
    if not jp.completed_source:
        for ev in tl.events_of("access_summary"):  # the parser's one-per-log access count (no per-line times)
            paths = ev.fields.get("paths") or {}
            ok = sum(int(n) for k, n in paths.items() if str(k).split(" ")[-1].startswith(GEN_PATHS))
            status = ev.fields.get("status") or {}
            bad = sum(int(n) for code, n in status.items() if not str(code).startswith("2"))
            if ok:
                jp.completed = max(0, ok - bad)
                jp.completed_source = (f"{ok} generation requests in the access log ({ev.source}, {bad} not 2xx); "
                                       "requests finished before the log starts are not counted")
    if jp.rate_rps is None and gen_tps and output_tokens_per_request:
        jp.rate_rps = gen_tps / output_tokens_per_request
        why = ("(no completion counter; the access log gives a count, not a rate)" if jp.completed_source
               else "(no completion counter or access log)")
        jp.rate_source = f"gen throughput {gen_tps:.0f} tok/s / {output_tokens_per_request:,.0f} output tokens per request {why}"
    return jp
