"""A target named on the command line never answered.

What it detects:
    A `--url` target whose `/metrics` could not be fetched in any scrape of the window: connection
    refused, timeout, DNS failure, an HTML page instead of metrics, an HTTP error other than a missing
    `/metrics` (that one is `metrics_disabled`). The collector keeps a timeline for such a target so
    this finding appears on it. Critical: nothing can be judged for that target.

Why it matters:
    A diagnosis of a server the tool cannot read would be a guess; an unreachable server may also be
    the incident itself (hung, crashed or overloaded).

Evidence:
    The last error (one sentence naming the cause), the number of scrapes tried.

    On each engine: Engine-neutral: whether the URL answered at all, the same for SGLang and vLLM.

Fix:
    Check the host and port (SGLang's default is 30000), that the server is running and that no
    firewall or proxy blocks it; raise `--timeout` for an overloaded server.

Known false positives:
    A server still starting (loading weights) refuses connections for a while; retry after the
    `The server is fired up and ready to roll!` line.

References:
    - How diagnoser reads SGLang: [where `/metrics` lives](docs/sglang.md#enable-metrics),
      [health endpoints](docs/sglang.md#health).
    - Tested on a real connection error (a closed port on 127.0.0.1).
"""

from __future__ import annotations

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext


def target_error(ctx: RuleContext) -> str:
    err = (ctx.extras.get("unreachable") or {}).get(ctx.target) or ctx.timeline.meta.get("unreachable") or ""
    return str(err)


def is_metrics_off(err: str) -> bool:
    return "no /metrics" in err or "--enable-metrics" in err


class SourceUnreachable(Rule):
    name = "source_unreachable"
    code = "IN01"
    title = "Target unreachable"
    severity = Severity.CRITICAL
    for_seconds = 0.0

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        err = target_error(ctx)
        if not err or is_metrics_off(err):
            return None
        tried = next((i for i in ctx.timeline.inputs if i.kind == "metrics"), None)
        evs = [Evidence("last error", err, None, ctx.window_text(), ctx.target)]
        if tried is not None:
            evs.append(Evidence("scrapes that answered", f"0 of {tried.errors}", "> 0", "", ctx.target))
        return self.finding(ctx, f"{ctx.target} did not answer any scrape: {err}", evs, [], confidence="high")
