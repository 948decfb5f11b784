"""Requests are slow as the client sees them: time to first token or time between tokens is high at p95.

What it detects:
    The p95 of time to first token (`ttft_seconds_p95`) at or above `ttft_high_s` (2 s), or the p95
    of the time between output tokens (`itl_seconds_p95`) at or above `itl_high_s` (0.2 s). The p95
    is the engine's latency histogram over the whole window when the inputs give it (a recording,
    several scrapes, Prometheus), else the median of the per-interval p95 readings, so one slow
    interval does not fire it alone. Info: a symptom the client feels. The cause (a queue, a full KV
    pool, a prefill budget, a slot cap, large prefills between decode steps) is named by the other
    rules when the inputs show it; this rule proposes no flag. The thresholds are the defaults of
    vllm-doctor 0.6.0's TTFT and TPOT rules, so a server judged by both tools is judged alike; set
    your own SLO with `--set high_latency.ttft_high_s=…`, and `--fail-on info` to make it fail a run.

Why it matters:
    TTFT is what an interactive user waits before anything appears; the time between tokens sets the
    reading speed of a streamed answer. A server can be busy and efficient and still miss both, and a
    latency objective is what most deployments are held to.

Evidence:
    The TTFT p95 and ITL p95 with the scrape they come from, against their thresholds.

    On each engine. On SGLang: the histograms `sglang:time_to_first_token_seconds` and
    `sglang:inter_token_latency_seconds` (`time_per_output_token_seconds` in older releases). On vLLM:
    `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds` (V1), or
    `vllm:time_per_output_token_seconds` (V0 and early V1). Logs alone carry no per-request latency on
    either engine, so a log without metrics cannot be judged.

Fix:
    Follow the cause the other findings name: `queue_buildup` and `kv_saturation` (more capacity or
    a larger pool), `prefill_stall` and `max_running_requests_cap` (admission flags),
    `prefill_decode_interference` (time between tokens during long prefills). With none of them, the
    model and hardware set the latency: a smaller or quantised model, more tensor parallelism, or
    speculative decoding for the time between tokens.

Known false positives:
    Batch jobs and long prompts have a high TTFT by nature; set `ttft_high_s` to your own objective.
    A tiny model on CPU has a high ITL at any load. Histograms count since start: a recording that
    starts cold mixes warm-up requests into the window.

References:
    - How diagnoser reads SGLang's latency histograms: [requests](docs/sglang.md#metrics-requests).
    - vLLM's histograms: `vllm/v1/metrics/loggers.py` and `vllm/engine/metrics.py` (V0) in the vLLM
      releases on PyPI; how diagnoser reads them is in docs/vllm.md (Metrics).
    - vllm-doctor 0.6.0 (PyPI `vllm-doctor`), whose TTFT and TPOT rules use the same default thresholds.
"""

from __future__ import annotations

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, ev


class HighLatency(Rule):
    name = "high_latency"
    code = "LT01"
    title = "High request latency"
    severity = Severity.INFO
    reads = ("ttft_seconds_p95", "itl_seconds_p95")
    defaults = {"ttft_high_s": 2.0, "itl_high_s": 0.2}
    threshold_help = {
        "ttft_high_s": "time to first token p95 (s) at or above this is high",
        "itl_high_s": "time between output tokens p95 (s) at or above this is high",
    }

    @staticmethod
    def _p95(ctx: RuleContext, signal: str) -> float | None:
        whole = (ctx.timeline.meta.get("window_quantiles") or {}).get(signal)
        if isinstance(whole, int | float):
            return float(whole)
        if ctx.series(signal) is None:
            return None
        v = ctx.stats(signal)["p50"]
        return float(v) if isinstance(v, int | float) else None

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        ttft, itl = self._p95(ctx, "ttft_seconds_p95"), self._p95(ctx, "itl_seconds_p95")
        slow_ttft = ttft is not None and ttft >= t["ttft_high_s"]
        slow_itl = itl is not None and itl >= t["itl_high_s"]
        if not (slow_ttft or slow_itl):
            return None
        parts, evs = [], []
        if ttft is not None:
            evs.append(ev(ctx, "ttft_seconds_p95", round(ttft, 3), t["ttft_high_s"], at="max"))
            if slow_ttft:
                parts.append(f"time to first token p95 {ttft:.2f} s (at or above {t['ttft_high_s']:g} s)")
        if itl is not None:
            evs.append(ev(ctx, "itl_seconds_p95", round(itl, 3), t["itl_high_s"], at="max"))
            if slow_itl:
                parts.append(f"time between tokens p95 {itl * 1000:.0f} ms (at or above {t['itl_high_s'] * 1000:g} ms)")
        summary = ("Requests are slow for the client: " + " and ".join(parts)
                   + ". The cause is the capacity finding here when there is one; this rule proposes no flag.")
        return self.finding(ctx, summary, evs, confidence="medium")
