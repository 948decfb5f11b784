"""Grafana dashboards as code: "SGLang overview", "vLLM overview" and "diagnoser findings".

The rendered JSON is committed under ``dashboards/`` (``python -m diagnoser.outputs.promgen`` writes it)
and provisioned by docker-compose. Rules every panel follows:

- the datasource is the ``${datasource}`` variable, never a fixed UID (SGLang's own example broke on
  that until PR https://github.com/sgl-project/sglang/pull/4051);
- vLLM's selectors likewise take ``vllm[:_]NAME``, with the names a series had across releases in one regex
  (docs/vllm.md#metrics), kept apart per ``model_name`` and V1 ``engine`` (the data-parallel index);
- raw SGLang selectors take both spellings, ``{__name__=~"sglang[:_]NAME"}`` (docs/sglang.md#spelling), and
  gauges are folded with ``max by (instance, model_name, dp_rank)`` so TP/PP/CP ranks that repeat a
  value count once while DP ranks stay apart (docs/sglang.md#stats-rank, docs/sglang.md#labels);
- every panel has a description; annotations mark when findings and alerts fire;
- every division goes through :func:`ratio`, whose denominator keeps only samples above 0: a zero
  denominator (no prompt tokens in the interval, a target whose gen throughput reads 0) leaves a gap
  instead of ±Inf or NaN.
"""

from __future__ import annotations

import json
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39

# selectors for the overview: scheduler series carry dp_rank (0.4.10+, when dp_size > 1); the
# tokenizer's request-level series never do, so they are filtered by instance and model only
SCHED = 'instance=~"$instance", model_name=~"$model", dp_rank=~"$dp_rank"'
TOKZ = 'instance=~"$instance", model_name=~"$model"'
BY = "instance, model_name, dp_rank"
RANK_LEGEND = "{{instance}} {{model_name}} dp={{dp_rank}}"


def sg(metric: str, extra: str) -> str:
    return '{__name__=~"sglang[:_]' + metric + '"' + (", " + extra if extra else "") + "}"


def gauge(metric: str) -> str:
    return f"max by ({BY}) ({sg(metric, SCHED)})"


def rate(metric: str, sel: str = TOKZ, by: str = "instance, model_name") -> str:
    return f"sum by ({by}) (rate({sg(metric, sel)}[$__rate_interval]))"


def quantile(q: float, hist: str) -> str:
    return f"histogram_quantile({q}, sum by (le, instance, model_name) (rate({sg(hist + '_bucket', TOKZ)}[$__rate_interval])))"


def ratio(num: str, den: str, on: str = "") -> str:
    """``num / den`` that cannot reach ±Inf or NaN: samples whose denominator is 0 drop out (a gap in the panel).

    ``on`` is the vector matching, e.g. ``on (target) group_left ()``: the empty label list is needed, since
    ``group_left (`` would read the parenthesised denominator as labels to copy."""
    return f"{num} / {on + ' ' if on else ''}({den} > 0)"


def target(expr: str, legend: str, ref: str, instant: bool = False, fmt: str = "time_series") -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "format": fmt}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def panel(pid: int, title: str, description: str, targets: list[dict[str, Any]], grid: tuple[int, int, int, int],
          kind: str = "timeseries", unit: str = "short", **extra: Any) -> dict[str, Any]:
    x, y, w, h = grid
    p: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}, "tooltip": {"mode": "multi", "sort": "desc"}}
    for k, v in extra.items():
        if k == "defaults":
            p["fieldConfig"]["defaults"].update(v)
        else:
            p[k] = v
    return p


def datasource_var() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",  # also matches series without the label (dp_rank on single-rank servers)
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "options": [],
    }


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]], variables: list[dict[str, Any]],
              annotations: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    builtin = {
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": tags,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "id": None,
        "links": [],
        "annotations": {"list": [builtin, *annotations]},
        "templating": {"list": variables},
        "panels": panels,
    }


ALERTS_ANNOTATION = {
    "name": "Alerts firing",
    "datasource": DS,
    "enable": True,
    "iconColor": "red",
    "expr": 'ALERTS{alertstate="firing", alertname=~"(Diagnoser|SGLang).+"}',
    "step": "30s",
    "titleFormat": "{{alertname}}",
    "textFormat": "{{instance}}{{target}} {{severity}}",
    "tagKeys": "severity,alertname",
}


def sglang_overview() -> dict[str, Any]:
    w = 12
    panels = [
        panel(1, "KV token usage",
              "Share of the KV pool held by live requests (sglang:token_usage = used / pool), per DP rank; the worst "
              "pool for hybrid models. Above 0.9 with requests queued means the pool caps the batch (rule kv_saturation); "
              "above 0.9 with an empty queue is healthy.",
              [target(gauge("token_usage"), RANK_LEGEND, "A")], (0, 0, w, 8), unit="percentunit",
              defaults={"min": 0, "max": 1, "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 0.9}]}}),
        panel(2, "Running vs queued requests",
              "Requests in the running batch (num_running_reqs) and waiting in the scheduler queue (num_queue_reqs), per DP "
              "rank. A queue that stays up while running stays flat means admission is capped: by the KV pool (see token "
              "usage) or by --max-running-requests.",
              [target(gauge("num_running_reqs"), "running " + RANK_LEGEND, "A"),
               target(gauge("num_queue_reqs"), "queued " + RANK_LEGEND, "B")], (w, 0, w, 8)),
        panel(3, "Generation throughput",
              "Decode tokens per second as the scheduler reports it (gen_throughput, per DP rank, averaged over "
              "--decode-log-interval steps) and as clients receive it (rate of generation_tokens_total of finished requests).",
              [target(gauge("gen_throughput"), "scheduler " + RANK_LEGEND, "A"),
               target(rate("generation_tokens_total"), "finished {{instance}} {{model_name}}", "B")], (0, 8, w, 8), unit="short"),
        panel(4, "Prefill tokens",
              "Prefill tokens per second: computed vs served from the prefix cache (realtime_tokens_total by mode, 0.5.7+), "
              "and prompt tokens of finished requests (prompt_tokens_total). Flat prefill while requests queue points at "
              "--chunked-prefill-size / --max-prefill-tokens.",
              [target(rate("realtime_tokens_total", SCHED + ', mode=~"prefill.*"', f"{BY}, mode"), "{{mode}} " + RANK_LEGEND, "A"),
               target(rate("prompt_tokens_total"), "prompt {{instance}} {{model_name}}", "B")], (w, 8, w, 8)),
        panel(5, "Retractions",
              "Requests retracted because the KV pool ran out during decode, per rate interval "
              "(num_retracted_requests_total, 0.5.7+; total_retracted_reqs on 0.4.10-0.5.2), and the size of the last "
              "retraction event (num_retracted_reqs, 0.5.2+). Retracted requests are recomputed: every one costs throughput.",
              [target(f"sum by ({BY}) (increase({sg('num_retracted_requests_total', SCHED)}[$__rate_interval]))\n"
                      f"or sum by ({BY}) (delta({sg('total_retracted_reqs', SCHED)}[$__rate_interval]))", "retracted " + RANK_LEGEND, "A"),
               target(f"sum by ({BY}) ({sg('num_retracted_reqs', SCHED)})", "last event " + RANK_LEGEND, "B")], (0, 16, w, 8)),
        panel(6, "KV pool: used vs capacity",
              "KV slots held by live requests (num_used_tokens) against the pool size (max_total_num_tokens, 0.5.6+), in "
              "tokens. The pool size comes from --mem-fraction-static or --max-total-tokens (diagnoser's docs/sglang.md, KV-pool sizing).",
              [target(gauge("num_used_tokens"), "used " + RANK_LEGEND, "A"),
               target(gauge("max_total_num_tokens"), "capacity " + RANK_LEGEND, "B")], (w, 16, w, 8)),
        panel(7, "Time to first token",
              "TTFT quantiles from the tokenizer's histogram (time_to_first_token_seconds) over the rate interval. High TTFT "
              "with a long queue is admission; with an empty queue it is prefill speed.",
              [target(quantile(q, "time_to_first_token_seconds"), f"p{int(q * 100)} {{{{instance}}}} {{{{model_name}}}}", ref)
               for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))], (0, 24, w, 8), unit="s"),
        panel(8, "Inter-token latency",
              "ITL quantiles (inter_token_latency_seconds, 0.4.4+; the older time_per_output_token_seconds before) over the rate interval: the decode step time a streaming "
              "client sees. It grows with the running batch and with prefill chunks that interrupt decode.",
              [target(quantile(q, "inter_token_latency_seconds") + "\nor " + quantile(q, "time_per_output_token_seconds"),
                      f"p{int(q * 100)} {{{{instance}}}} {{{{model_name}}}}", ref)
               for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))], (w, 24, w, 8), unit="s"),
        panel(9, "Prefix cache hit rate",
              "Share of prompt tokens served from the prefix cache: per prefill batch from the scheduler (cache_hit_rate), "
              "and over the rate interval from the tokenizer's counters (cached_tokens_total / prompt_tokens_total).",
              [target(gauge("cache_hit_rate"), "last batch " + RANK_LEGEND, "A"),
               target(ratio(f"sum by (instance, model_name) (rate({sg('cached_tokens_total', TOKZ)}[$__rate_interval]))",
                            f"sum by (instance, model_name) (rate({sg('prompt_tokens_total', TOKZ)}[$__rate_interval]))"),
                      "window {{instance}} {{model_name}}", "B")], (0, 32, w, 8), unit="percentunit", defaults={"min": 0, "max": 1}),
        panel(10, "Queue time",
              "Time requests waited in the scheduler queue (queue_time_seconds, 0.5.3+), p50 and p95 over the rate interval.",
              [target(quantile(q, "queue_time_seconds"), f"p{int(q * 100)} {{{{instance}}}} {{{{model_name}}}}", ref)
               for q, ref in ((0.5, "A"), (0.95, "B"))], (w, 32, w, 8), unit="s"),
    ]
    ref = "{__name__=~\"sglang[:_]num_running_reqs\"}"
    variables = [
        datasource_var(),
        query_var("instance", "Instance", f"label_values({ref}, instance)"),
        query_var("model", "Model", 'label_values({__name__=~"sglang[:_]num_running_reqs", instance=~"$instance"}, model_name)'),
        query_var("dp_rank", "DP rank", 'label_values({__name__=~"sglang[:_]num_running_reqs", instance=~"$instance", model_name=~"$model"}, dp_rank)'),
    ]
    findings_ann = {
        "name": "diagnoser findings",
        "datasource": DS,
        "enable": True,
        "iconColor": "orange",
        "expr": "max by (target, rule, severity) (diagnoser_finding_active) > 0",
        "step": "30s",
        "titleFormat": "{{rule}} ({{severity}})",
        "textFormat": "{{target}}",
        "tagKeys": "rule,severity",
    }
    return dashboard(
        "sglang-overview", "SGLang overview",
        "SGLang's /metrics: load, KV pool, throughput, latency, retractions and cache, per instance, model and DP rank. "
        "Works with both the sglang: and sglang_ spellings.",
        panels, variables, [findings_ann, ALERTS_ANNOTATION], ["sglang", "diagnoser"],
    )


def diagnoser_findings() -> dict[str, Any]:
    t = 'target=~"$target"'
    w = 12
    panels = [
        panel(1, "Findings over time",
              "Each row is one finding diagnoser reported for a target (diagnoser_finding_active{rule,severity,target}); "
              "a bar means the finding was active. A finding that resolves leaves a gap. Open /rules/<rule> in "
              "`diagnose serve`, or run `diagnose explain <rule>`, for what it means.",
              [target(f"max by (target, rule, severity) (diagnoser_finding_active{{{t}}})", "{{rule}} ({{severity}}) {{target}}", "A")],
              (0, 0, 24, 8), kind="state-timeline",
              defaults={"mappings": [{"type": "value", "options": {"1": {"text": "active", "color": "red", "index": 0}}}],
                        "color": {"mode": "thresholds"},
                        "thresholds": {"mode": "absolute", "steps": [{"color": "transparent", "value": None}, {"color": "red", "value": 1}]}},
              options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                       "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False}}),
        panel(2, "Current suggestions and projected gains",
              "The flag changes diagnoser proposes now (diagnoser_suggestion_info: flag, current -> proposed value) joined "
              "with the projections of the top suggestions: running requests and generation throughput expected after the "
              "change (diagnoser_suggestion_projected_*), and the throughput gain against the current gen throughput "
              "(empty while the current gen throughput is 0: an idle server has no ratio).",
              [target(f"max by (target, rule, flag, current, proposed) (diagnoser_suggestion_info{{{t}}})", "", "A", instant=True, fmt="table"),
               target(f"max by (target, rule, flag) (diagnoser_suggestion_projected_running_reqs{{{t}}})", "", "B", instant=True, fmt="table"),
               target(f"max by (target, rule, flag) (diagnoser_suggestion_projected_gen_throughput_tps{{{t}}})", "", "C", instant=True, fmt="table"),
               target(ratio(f"max by (target, rule, flag) (diagnoser_suggestion_projected_gen_throughput_tps{{{t}}})",
                            f'max by (target) (diagnoser_signal{{{t}, signal="gen_throughput_tps"}})', "on (target) group_left ()"),
                      "", "D", instant=True, fmt="table")],
              (0, 8, 24, 8), kind="table",
              transformations=[{"id": "merge", "options": {}},
                               {"id": "organize", "options": {"excludeByName": {"Time": True, "Value #A": True},
                                                              "renameByName": {"Value #B": "projected running reqs", "Value #C": "projected gen tok/s", "Value #D": "throughput gain (x)"}}}]),
        panel(3, "KV pool capacity vs use",
              "The KV pool size diagnoser read for each target (diagnoser_pool_capacity_tokens) against the tokens live "
              "requests hold (signal used_tokens). Use pinned at capacity while requests queue is the kv_saturation finding.",
              [target(f"max by (target) (diagnoser_pool_capacity_tokens{{{t}}})", "capacity {{target}}", "A"),
               target(f'max by (target) (diagnoser_signal{{{t}, signal="used_tokens"}})', "used {{target}}", "B")], (0, 16, w, 8)),
        panel(4, "Load: running, queued, token usage",
              "The canonical signals diagnoser derives from each target (diagnoser_signal): running and queued requests, "
              "and KV token usage (0-1, right axis).",
              [target(f'max by (target, signal) (diagnoser_signal{{{t}, signal=~"running_reqs|queue_reqs"}})', "{{signal}} {{target}}", "A"),
               target(f'max by (target, signal) (diagnoser_signal{{{t}, signal="token_usage"}})', "{{signal}} {{target}}", "B")],
              (w, 16, w, 8),
              fieldConfig={"defaults": {"unit": "short"}, "overrides": [
                  {"matcher": {"id": "byFrameRefID", "options": "B"},
                   "properties": [{"id": "unit", "value": "percentunit"}, {"id": "custom.axisPlacement", "value": "right"}]}]}),
        panel(5, "Scrape health",
              "Whether diagnoser's last scrape of each target worked (diagnoser_scrape_up, 1 = up) and how long it took "
              "(diagnoser_scrape_duration_seconds). A target that stays down raises the DiagnoserTargetScrapeFailing alert.",
              [target(f"max by (target) (diagnoser_scrape_up{{{t}}})", "up {{target}}", "A"),
               target(f"max by (target) (diagnoser_scrape_duration_seconds{{{t}}})", "duration {{target}}", "B")], (0, 24, w, 8),
              fieldConfig={"defaults": {"unit": "short"}, "overrides": [
                  {"matcher": {"id": "byFrameRefID", "options": "B"},
                   "properties": [{"id": "unit", "value": "s"}, {"id": "custom.axisPlacement", "value": "right"}]}]}),
        panel(6, "Scrape errors and rule-pass time",
              "Failed scrapes per second (rate of diagnoser_scrape_errors_total) per target, and how long one pass of all "
              "rules took (diagnoser_rule_pass_duration_seconds).",
              [target(f"sum by (target) (rate(diagnoser_scrape_errors_total{{{t}}}[$__rate_interval]))", "errors/s {{target}}", "A"),
               target("max(diagnoser_rule_pass_duration_seconds)", "rule pass", "B")], (w, 24, w, 8)),
    ]
    variables = [datasource_var(), query_var("target", "Target", "label_values(diagnoser_scrape_up, target)")]
    findings_ann = {
        "name": "Findings fire",
        "datasource": DS,
        "enable": True,
        "iconColor": "orange",
        "expr": f"max by (target, rule, severity) (diagnoser_finding_active{{{t}}}) > 0",
        "step": "30s",
        "titleFormat": "{{rule}} ({{severity}})",
        "textFormat": "{{target}}",
        "tagKeys": "rule,severity",
    }
    return dashboard(
        "diagnoser-findings", "diagnoser findings",
        "What diagnoser found on each SGLang target, what it suggests changing and the projected gain, and whether its "
        "scrapes work. Fed by `diagnose serve`'s /metrics.",
        panels, variables, [findings_ann, ALERTS_ANNOTATION], ["sglang", "diagnoser"],
    )


# -- vLLM ---------------------------------------------------------------------------------------------
# vLLM's series (docs/vllm.md#metrics): both spellings (``vllm:x`` as served, ``vllm_x`` after a Prometheus
# hop), V0 and V1 names through one regex where a series was renamed, per model_name and per V1 ``engine``
# (the data-parallel engine index, vllm/v1/metrics/loggers.py); V0 series have no ``engine`` label, which
# the "All" value (.*) also matches.
VSEL = 'instance=~"$instance", model_name=~"$model", engine=~"$engine"'
VBY = "instance, model_name, engine"
VLEGEND = "{{instance}} {{model_name}} engine={{engine}}"


def vl(names: str, extra: str = VSEL) -> str:
    """A selector over ``vllm[:_]NAMES`` (NAMES a regex of the names a series had across releases)."""
    return '{__name__=~"vllm[:_]' + names + '"' + (", " + extra if extra else "") + "}"


def vgauge(names: str) -> str:
    return f"max by ({VBY}) ({vl(names)})"


def vrate(names: str, by: str = VBY) -> str:
    return f"sum by ({by}) (rate({vl(names)}[$__rate_interval]))"


def vquantile(q: float, hist: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {VBY}) (rate({vl(hist + '_bucket')}[$__rate_interval])))"


def vllm_overview() -> dict[str, Any]:
    w = 12
    qs = ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    panels = [
        panel(1, "KV cache usage",
              "Share of the KV blocks held by requests (kv_cache_usage_perc; gpu_cache_usage_perc before 0.10, both in "
              "0.10.2), a fraction 0-1 despite its name, per engine. Near 1 with requests waiting means the KV cache caps "
              "the batch and vLLM preempts (rule kv_saturation); near 1 with nothing waiting is healthy.",
              [target(vgauge("(kv|gpu)_cache_usage_perc"), VLEGEND, "A")], (0, 0, w, 8), unit="percentunit",
              defaults={"min": 0, "max": 1, "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 0.9}]}}),
        panel(2, "Running vs waiting requests",
              "Requests in the running batch (num_requests_running) and waiting for admission (num_requests_waiting), per "
              "engine. A queue that stays up while running stays flat means admission is capped: by KV blocks (see KV cache "
              "usage), by --max-num-seqs, or by the per-step token budget --max-num-batched-tokens.",
              [target(vgauge("num_requests_running"), "running " + VLEGEND, "A"),
               target(vgauge("num_requests_waiting"), "waiting " + VLEGEND, "B")], (w, 0, w, 8)),
        panel(3, "Token throughput",
              "Prompt and generation tokens per second: the rate of prompt_tokens_total / generation_tokens_total, or on "
              "V0 servers before 0.7 the logger's own averages (avg_prompt_throughput_toks_per_s, "
              "avg_generation_throughput_toks_per_s).",
              [target(vrate("generation_tokens_total") + "\nor " + vgauge("avg_generation_throughput_toks_per_s"), "generation " + VLEGEND, "A"),
               target(vrate("prompt_tokens_total") + "\nor " + vgauge("avg_prompt_throughput_toks_per_s"), "prompt " + VLEGEND, "B")],
              (0, 8, w, 8)),
        panel(4, "Preemptions",
              "Requests preempted because the KV cache ran out (num_preemptions_total, 0.4.3+), per rate interval. vLLM "
              "recomputes (V1) or swaps (V0 --preemption-mode swap) a preempted request: every one costs throughput.",
              [target(f"sum by ({VBY}) (increase({vl('num_preemptions_total')}[$__rate_interval]))", "preempted " + VLEGEND, "A")],
              (w, 8, w, 8)),
        panel(5, "Time to first token",
              "TTFT quantiles from vLLM's histogram (time_to_first_token_seconds) over the rate interval. High TTFT with "
              "requests waiting is admission; with nothing waiting it is prefill speed.",
              [target(vquantile(q, "time_to_first_token_seconds"), f"p{int(q * 100)} " + VLEGEND, ref) for q, ref in qs],
              (0, 16, w, 8), unit="s"),
        panel(6, "Inter-token latency",
              "ITL quantiles (inter_token_latency_seconds, 0.8.6+; time_per_output_token_seconds before) over the rate "
              "interval: the decode step a streaming client sees. It grows with the running batch and with prefill "
              "chunks scheduled into the same step.",
              [target(vquantile(q, "inter_token_latency_seconds") + "\nor " + vquantile(q, "time_per_output_token_seconds"),
                      f"p{int(q * 100)} " + VLEGEND, ref) for q, ref in qs], (w, 16, w, 8), unit="s"),
        panel(7, "Prefix cache hit rate",
              "Share of prompt tokens found in the prefix cache over the rate interval: prefix_cache_hits_total / "
              "prefix_cache_queries_total (V1, in tokens; gpu_prefix_cache_hits / _queries in earlier V1 releases), or "
              "V0's gpu_prefix_cache_hit_rate gauge. Empty while no prompt was looked up.",
              [target(ratio(vrate("(gpu_)?prefix_cache_hits(_total)?"), vrate("(gpu_)?prefix_cache_queries(_total)?"))
                      + "\nor " + vgauge("gpu_prefix_cache_hit_rate"), VLEGEND, "A")],
              (0, 24, w, 8), unit="percentunit", defaults={"min": 0, "max": 1}),
        panel(8, "Queue time and end-to-end latency",
              "Time requests waited for admission (request_queue_time_seconds) and their whole time in the server "
              "(e2e_request_latency_seconds), p50 and p95 over the rate interval.",
              [target(vquantile(0.5, "request_queue_time_seconds"), "queue p50 " + VLEGEND, "A"),
               target(vquantile(0.95, "request_queue_time_seconds"), "queue p95 " + VLEGEND, "B"),
               target(vquantile(0.5, "e2e_request_latency_seconds"), "e2e p50 " + VLEGEND, "C"),
               target(vquantile(0.95, "e2e_request_latency_seconds"), "e2e p95 " + VLEGEND, "D")], (w, 24, w, 8), unit="s"),
        panel(9, "Finished requests",
              "Requests finished per second by reason (request_success_total{finished_reason}: stop, length, abort). "
              "Many 'length' endings mean requests run to their max_tokens.",
              [target(f"sum by (instance, model_name, finished_reason) (rate({vl('request_success_total', TOKZ)}[$__rate_interval]))",
                      "{{finished_reason}} {{instance}} {{model_name}}", "A")], (0, 32, w, 8)),
        panel(10, "KV cache configuration",
              "The cache configuration vLLM exports as an info gauge (cache_config_info): block size, number of KV blocks, "
              "the memory share --gpu-memory-utilization, KV dtype and prefix caching, per instance.",
              [target('max by (instance, block_size, num_gpu_blocks, gpu_memory_utilization, cache_dtype, enable_prefix_caching) '
                      '({__name__=~"vllm[:_]cache_config_info", instance=~"$instance"})', "", "A", instant=True, fmt="table")],
              (w, 32, w, 8), kind="table"),
        panel(11, "diagnoser findings on vLLM targets",
              "What diagnoser found on each vLLM target (diagnoser_finding_active{engine=\"vllm\"}, from `diagnose serve`'s "
              "/metrics): a bar while a finding fires. The rules and their fixes: `diagnose explain RULE` or /rules/RULE in serve.",
              [target('max by (target, rule, severity) (diagnoser_finding_active{engine="vllm"})', "{{rule}} ({{severity}}) {{target}}", "A")],
              (0, 40, w, 8), kind="state-timeline",
              defaults={"mappings": [{"type": "value", "options": {"1": {"text": "active", "color": "red", "index": 0}}}],
                        "color": {"mode": "thresholds"},
                        "thresholds": {"mode": "absolute", "steps": [{"color": "transparent", "value": None}, {"color": "red", "value": 1}]}},
              options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                       "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False}}),
        panel(12, "diagnoser suggestions for vLLM targets",
              "The flag changes diagnoser proposes now for vLLM targets, in vLLM's flags (diagnoser_suggestion_info"
              "{engine=\"vllm\"}: flag, current -> proposed), and whether diagnoser's last scrape of each vLLM target worked "
              "(diagnoser_scrape_up).",
              [target('max by (target, rule, flag, current, proposed) (diagnoser_suggestion_info{engine="vllm"})', "", "A", instant=True, fmt="table"),
               target('max by (target) (diagnoser_scrape_up{engine="vllm"})', "", "B", instant=True, fmt="table")],
              (w, 40, w, 8), kind="table", transformations=[{"id": "merge", "options": {}}]),
    ]
    ref = '{__name__=~"vllm[:_]num_requests_running"'
    variables = [
        datasource_var(),
        query_var("instance", "Instance", f"label_values({ref}}}, instance)"),
        query_var("model", "Model", f'label_values({ref}, instance=~"$instance"}}, model_name)'),
        query_var("engine", "Engine (DP)", f'label_values({ref}, instance=~"$instance", model_name=~"$model"}}, engine)'),
    ]
    findings_ann = {
        "name": "diagnoser findings",
        "datasource": DS,
        "enable": True,
        "iconColor": "orange",
        "expr": 'max by (target, rule, severity) (diagnoser_finding_active{engine="vllm"}) > 0',
        "step": "30s",
        "titleFormat": "{{rule}} ({{severity}})",
        "textFormat": "{{target}}",
        "tagKeys": "rule,severity",
    }
    alerts_ann = {**ALERTS_ANNOTATION, "expr": 'ALERTS{alertstate="firing", alertname=~"(Diagnoser|VLLM).+"}'}
    return dashboard(
        "vllm-overview", "vLLM overview",
        "vLLM's /metrics: load, KV cache, throughput, preemptions, latency and prefix cache, per instance, model and "
        "data-parallel engine, and what diagnoser found on vLLM targets. Works with both the vllm: and vllm_ "
        "spellings and with V0 and V1 names.",
        panels, variables, [findings_ann, alerts_ann], ["vllm", "diagnoser"],
    )


DASHBOARDS = {"dashboards/sglang-overview.json": sglang_overview, "dashboards/diagnoser-findings.json": diagnoser_findings,
              "dashboards/vllm-overview.json": vllm_overview}


def rendered_dashboards() -> dict[str, str]:
    return {path: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for path, build in DASHBOARDS.items()}


def panel_exprs(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) for every panel target of a dashboard."""
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append((p["title"], t.get("refId", ""), t["expr"]))
    return out
