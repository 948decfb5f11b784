"""Too little was read to judge the server's load.

What it detects:
    A target with fewer than ``min_points`` (3) readings of every load signal (``running_reqs``,
    ``queue_reqs``, ``token_usage``): warning when there is none at all (only startup lines, or a log of
    something else), info when there are a few. Unreachable targets are left to ``source_unreachable``.

Why it matters:
    Rules need a window: one or two readings cannot show a persistent queue, a pinned pool or a trend.
    Saying so is better than a confident verdict from nothing.

Evidence:
    The number of readings of each load signal, lines read and recognised.

Fix:
    Sample longer (``--duration 60s``), pass the full server log (``--log``) including the Decode/Prefill
    batch lines, or scrape ``/metrics`` with ``--url``. Logs need ``--log-level info`` for the batch lines.

Known false positives:
    An idle server legitimately produces few lines; then there is nothing to diagnose.

References:
    ../shared/reference/sglang.md §3.6 (cadence: a decode line every 40 steps, idle gauges every ~30 s),
    §10 (what each source can show); case 035-sglang-30160 (two startup lines, no load readings).
"""

from __future__ import annotations

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext

LOAD = ("running_reqs", "queue_reqs", "token_usage")


class InsufficientData(Rule):
    name = "insufficient_data"
    code = "IN03"
    title = "Not enough data"
    severity = Severity.WARNING
    for_seconds = 0.0
    defaults = {"min_points": 3}
    threshold_help = {"min_points": "fewest readings of some load signal needed to judge"}

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        from diagnoser.rules.in01_source_unreachable import target_error

        if target_error(ctx):
            return None
        counts = {s: len(ctx.series(s) or []) for s in LOAD}
        best = max(counts.values())
        if best >= ctx.thresholds["min_points"]:
            return None
        read = sum(i.lines_read for i in ctx.timeline.inputs if i.kind == "log")
        rec = sum(i.lines_recognized for i in ctx.timeline.inputs if i.kind == "log")
        scrapes = sum(i.scrapes for i in ctx.timeline.inputs if i.kind == "metrics")
        evs = [Evidence(f"{s} readings", n, f">= {ctx.thresholds['min_points']}", "", "") for s, n in counts.items()]
        what = []
        if read:
            what.append(f"{rec} of {read} log lines recognised")
        if scrapes:
            what.append(f"{scrapes} scrape(s)")
        sev = Severity.WARNING if best == 0 else Severity.INFO
        summary = (f"Only {best} reading(s) of the load signals (running, queue, token usage)" + (f" ({', '.join(what)})" if what else "")
                   + ": too little to judge the load over time.")
        return self.finding(ctx, summary, evs, [], confidence="high", severity=sev,
                            notes=["Sample longer (--duration 60s), pass the full server log with its Decode/Prefill batch lines, or scrape /metrics with --url."])
