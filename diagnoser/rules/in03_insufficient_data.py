"""A note on what the findings stand on: few or no load readings, or a server that was idle.

What it detects:
    A target whose window holds fewer than `min_points` (3) readings of every load signal
    (`running_reqs`, `queue_reqs`, `token_usage`): none at all (startup lines, a traceback, a log of
    something else) or a few (one pasted line, one scrape). Also a server that was idle in every
    reading: nothing running and nothing waiting (healthy-idle). Always info: a note, never a verdict.
    It never raises the exit status on its own (`diagnose` exits 1 only for another finding at or
    above `--fail-on`). Unreachable targets are left to `source_unreachable`.

Why it matters:
    The other rules judge what is there: one reading can show a full pool with a queue, a startup line
    a slot cap. Their confidence says how much there was (low for one reading, medium for a few, high
    for a window; every finding shows its readings). This note says what a longer window would add,
    and that an idle server has nothing to diagnose under load.

Evidence:
    The number of readings of each load signal, lines read and recognised, scrapes.

    On each engine: Engine-neutral: the number of readings and scrapes of the canonical signals, whichever
    engine produced them.

Fix:
    Nothing to fix. For a firmer diagnosis sample longer (`--duration 60s`), pass the full server log
    (`--log`, at `--log-level info` for the batch lines), or scrape `/metrics` with `--url`;
    for an idle server, send it the load you want judged.

Known false positives:
    None: it is a statement about the inputs.

References:
    - How diagnoser reads SGLang: [how often lines and gauges update](docs/sglang.md#cadence) (a Decode
      batch line every `--decode-log-interval` steps, a Prefill batch line per batch, idle gauges about
      every 30 s), [what each source can show](docs/sglang.md#sources).
    - SGLang's source at v0.5.23: `python/sglang/srt/managers/scheduler_components/metrics_reporter.py` (the
      batch lines).
    - Real cases: issue [#30160](https://github.com/sgl-project/sglang/issues/30160) (two start-up lines),
      PR [#1461](https://github.com/sgl-project/sglang/pull/1461) (one idle scrape).
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext
from diagnoser.rules.columns import arrays
from diagnoser.rules.in01_source_unreachable import target_error

LOAD = ("running_reqs", "queue_reqs", "token_usage")


class InsufficientData(Rule):
    name = "insufficient_data"
    code = "IN03"
    title = "Few readings (a note)"
    severity = Severity.INFO
    for_seconds = 0.0
    note = True
    reads = LOAD
    defaults = {"min_points": 3}
    threshold_help = {"min_points": "fewer readings of every load signal than this make the note"}

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        if target_error(ctx):
            return None
        counts = {s: len(ctx.series(s) or []) for s in LOAD}
        best = max(counts.values())
        idle = best > 0 and self._idle(ctx)
        if best >= ctx.thresholds["min_points"] and not idle:
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
        inputs = f" ({', '.join(what)})" if what else ""
        lines = "Decode/Prefill batch lines" if ctx.mech.reserves_output else "periodic stats lines"
        notes = [f"For a firmer diagnosis sample longer (--duration 60s), pass the full server log with its {lines}, or scrape /metrics with --url."]
        if idle:
            summary = (f"The server was idle in all {best} reading(s){inputs}: nothing running and nothing waiting. "
                       "Healthy-idle: there is no load to diagnose.")
            notes = ["Send the load you want judged, then diagnose again (or pass the log of a busy period)."]
        elif best == 0:
            summary = (f"No load reading (running, queue, token usage){inputs}: the findings stand on startup lines, "
                       "configuration and log events alone.")
        else:
            summary = (f"Only {best} reading(s) of the load signals{inputs}: the findings judge what is there, "
                       "at lower confidence (low for one reading, medium for a few).")
        return self.finding(ctx, summary, evs, [], confidence="high", severity=Severity.INFO, notes=notes,
                            basis={"readings": best, "uncapped": True} if best else {"startup": True})

    @staticmethod
    def _idle(ctx: RuleContext) -> bool:
        """Nothing running and nothing waiting in any reading (a server with no load)."""
        seen = False
        for s in ("running_reqs", "queue_reqs", "pd_bootstrap_reqs", "pd_inflight_reqs", "pd_prealloc_reqs", "pd_transfer_reqs"):
            got = arrays(ctx, s) if ctx.series(s) is not None else None
            if got is None or not len(got[1]):
                continue
            seen = True
            if np.count_nonzero(got[1] > 0):
                return False
        return seen
