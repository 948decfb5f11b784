"""The server runs without `--enable-metrics`: no `/metrics` to read.

What it detects:
    A target whose `/metrics` answered 404 (SGLang mounts the route only with `--enable-metrics`), or
    a configuration (server args from the startup log or server info) with `enable_metrics` false.
    Warning when a `--url` target cannot be scraped for that reason; info when only a log was read (the
    diagnosis then rests on the log alone).

Why it matters:
    Without metrics there are no latency histograms (TTFT, ITL, queue time), no retraction counters
    and no live gauges; the diagnosis is limited to what the log prints every 40 decode steps.

Evidence:
    The HTTP answer from `/metrics` or the `enable_metrics=False` server argument, with its source.

    On each engine. On SGLang: a 404 from `/metrics` or `enable_metrics=False` in the server args. vLLM
    always serves `/metrics`, so on vLLM the rule only sees a 404 from a proxy in front of it.

Fix:
    Restart SGLang with `--enable-metrics` (no measurable cost), then point `--url` at the server.

Known false positives:
    A proxy or router in front of the server that does not forward `/metrics` also answers 404; the
    router's own `/engine_metrics` is not the engine's `/metrics`.

References:
    - How diagnoser reads SGLang: [enabling metrics](docs/sglang.md#enable-metrics), [the router's
      `/engine_metrics`](docs/sglang.md#router), [what a log alone can show](docs/sglang.md#sources).
    - SGLang's [production metrics page](https://docs.sglang.ai/references/production_metrics.html).
    - Tested on a real SGLang 0.5.23 start-up log whose `server_args` say `enable_metrics` is false.
"""

from __future__ import annotations

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, suggest
from diagnoser.rules.in01_source_unreachable import is_metrics_off, target_error


class MetricsDisabled(Rule):
    name = "metrics_disabled"
    code = "IN02"
    title = "Metrics off"
    severity = Severity.WARNING
    for_seconds = 0.0

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        err = target_error(ctx)
        flag = ctx.cfg("enable_metrics", ctx.cfg("arg.enable_metrics"))
        src = ctx.timeline.cfg_source("enable_metrics") or ctx.timeline.cfg_source("arg.enable_metrics")
        if err and is_metrics_off(err):
            evs = [Evidence("/metrics", err, None, "", ctx.target)]
            if flag is False:
                evs.append(Evidence("enable_metrics", False, True, "", src))
            sugg = [suggest(ctx, "enable_metrics", False, True, "the server has no /metrics route", "live gauges, latency histograms and counters become readable", ("a restart is acceptable",))]
            return self.finding(ctx, f"{ctx.target} has no /metrics: {err}", evs, sugg, confidence="high")
        if flag is False:
            evs = [Evidence("enable_metrics", False, True, "", src)]
            sugg = [suggest(ctx, "enable_metrics", False, True, "the server runs without metrics", "latency histograms, retraction counters and live gauges for the next diagnosis", ("a restart is acceptable",))]
            return self.finding(ctx, "The server runs without --enable-metrics; this diagnosis rests on the log alone (no latency histograms, no counters).",
                                evs, sugg, confidence="high", severity=Severity.INFO)
        return None
