"""JSON documents behind every page (each page's JSON twin is exactly this document).

Everything a target or its config provides is redacted here (``redact``), and rendered by Jinja2 with
autoescape, so neither secrets nor markup from a server reach the browser unescaped.
"""

from __future__ import annotations

import math
from typing import Any

from diagnoser.model import basis_text, iso
from diagnoser.outputs.report import config_table
from diagnoser.redact import redact_strings, redact_text
from diagnoser.rules import REGISTRY, by_name
from diagnoser.timeline import SIGNALS, Timeline
from diagnoser.web.present import present_suggestion, top_fixes, verdict

HEADLINE = [
    ("running_reqs", "running", "{:.0f}"),
    ("queue_reqs", "queued", "{:.0f}"),
    ("token_usage", "KV usage", "{:.2f}"),
    ("gen_throughput_tps", "gen tok/s", "{:,.0f}"),
    ("ttft_seconds_p95", "TTFT p95", "{:.2f} s"),
    ("cache_hit_rate", "cache hit", "{:.0%}"),
]
MAIN_CONFIG = (
    "version", "served_model_name", "model_path", "max_total_tokens", "max_running_requests", "chunked_prefill_size",
    "max_prefill_tokens", "mem_fraction_static", "tp_size", "dp_size", "kv_cache_dtype", "cuda_graph_max_bs",
    "schedule_conservativeness", "context_len", "page_size",
)
# chart groups on the target page (static/chart.js draws them): each signal is [name, label] or
# [name, label, axis] with axis "y2" for a second unit on the right; "axes" names each axis' unit and the
# factor its values are shown at (ITL in ms beside TTFT in s); "ymax"/"ref" are a y-range hint and a
# reference line, "cfg_line" a reference line read from the config.
CHARTS: list[dict[str, Any]] = [
    {"id": "batch", "title": "Requests: running vs queued", "signals": [["running_reqs", "running"], ["queue_reqs", "queued"]],
     "cfg_line": ["max_running_requests", "max_running_requests"], "axes": {"y": {"unit": "requests"}}},
    {"id": "usage", "title": "KV token usage (1.0 = pool full)", "signals": [["token_usage", "token usage"]], "ymax": 1.0, "ref": 1.0,
     "axes": {"y": {"unit": ""}}},
    {"id": "gen", "title": "Gen throughput", "signals": [["gen_throughput_tps", "gen tok/s"]], "axes": {"y": {"unit": "tok/s"}}},
    {"id": "prefill", "title": "Prefill tokens per batch: new vs cached", "signals": [["prefill_new_tokens", "new"], ["prefill_cached_tokens", "cached"]],
     "axes": {"y": {"unit": "tokens"}}},
    {"id": "retract", "title": "Retracted requests", "signals": [["retracted_reqs", "retracted"]], "axes": {"y": {"unit": "requests"}}},
    {"id": "latency", "title": "Latency: TTFT (s, left) · inter-token (ms, right)",
     "signals": [["ttft_seconds_p50", "TTFT p50"], ["ttft_seconds_p95", "TTFT p95"], ["itl_seconds_p50", "ITL p50", "y2"], ["itl_seconds_p95", "ITL p95", "y2"]],
     "axes": {"y": {"unit": "s"}, "y2": {"unit": "ms", "factor": 1000}}},
]
RANGES = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def fmt(fmt_str: str, v: Any) -> str:
    f = _num(v)
    if f is None:
        return "–"
    try:
        return fmt_str.format(f)
    except (ValueError, TypeError):
        return str(v)


def health(t: Any, findings: list[Any]) -> str:
    if t.is_url and t.up is False:
        return "down"
    if t.is_url and t.up is None:
        return "starting"
    sev = max((int(f.severity) for f in findings if f.state == "firing"), default=0)
    return {0: "ok", 1: "ok", 2: "warning", 3: "critical"}[sev]


def headline(t: Any) -> list[dict[str, Any]]:
    out = []
    for key, label, f in HEADLINE:
        if key in t.latest:
            out.append({"signal": key, "label": label, "value": _num(t.latest[key]), "text": fmt(f, t.latest[key])})
    mrr = t.config.get("max_running_requests")
    if mrr is not None:
        out.insert(1, {"signal": "max_running_requests", "label": "max running", "value": _num(mrr.value), "text": fmt("{:.0f}", mrr.value)})
    return out


def finding_doc(f: Any) -> dict[str, Any]:
    d = redact_strings(f.to_dict())
    d["severity"] = f.severity.label
    d["rule_page"] = f"/rules/{f.rule}"
    d["anchor"] = f"f-{f.rule}"
    d["basis_text"] = basis_text(f.basis)  # "on 1 reading", "on 8 readings over 9 s", "on 2 log events"
    d["suggestions"] = [present_suggestion(s) for s in d.get("suggestions") or []]
    return d


def target_summary(snap: Any, t: Any) -> dict[str, Any]:
    findings = snap.for_target(t.name)
    return {
        "id": t.index,
        "name": redact_text(t.name),
        "page": f"/target/{t.index}",
        "health": health(t, findings),
        "kind": "url" if t.is_url else "log",
        "version": t.version,
        "model_name": redact_text(t.model_name),
        "last_error": redact_text(t.last_error),
        "last_scrape": iso(t.last_scrape_ts),
        "scrapes": t.scrapes,
        "scrape_errors": t.scrape_errors,
        "headline": headline(t),
        "findings": [
            {"rule": f.rule, "severity": f.severity.label, "state": f.state, "summary": redact_text(f.summary), "rule_page": f"/rules/{f.rule}"}
            for f in findings
        ],
        "top_fix": next(iter(top_fixes([finding_doc(f) for f in findings if f.suggestions], 1)), None),
    }


def overview_doc(snap: Any, interval: float) -> dict[str, Any]:
    return {
        "generated_at": iso(snap.ts),
        "tick": snap.tick,
        "interval_s": interval,
        "targets": [target_summary(snap, t) for t in snap.targets],
        "firing": len(snap.firing()),
        "errors": redact_strings(snap.errors),
    }


def job_eta(t: Any, job_requests: int | None, monitor: Any) -> dict[str, Any] | None:
    """Remaining requests and the time left at the recent completion rate (last 10 minutes)."""
    if not job_requests:
        return None
    done = _num(t.latest.get("requests_completed"))
    out: dict[str, Any] = {"job_requests": job_requests, "completed": done, "rate_rps": None, "eta_s": None, "eta_at": None}
    if done is None:
        out["note"] = "The server exposes no completed-request counter (sglang:num_requests_total) yet; the ETA needs it."
        return out
    s = monitor.series(t.index, ["requests_completed"], (t.window[1] or 0) - 600, None, max_points=10_000).get("requests_completed")
    if s and len(s["t"]) >= 2 and s["t"][-1] > s["t"][0]:
        rate = ((s["v"][-1] or 0) - (s["v"][0] or 0)) / (s["t"][-1] - s["t"][0])
        out["rate_rps"] = round(rate, 3)
        remaining = max(0.0, job_requests - done)
        out["remaining"] = remaining
        if rate > 0:
            out["eta_s"] = round(remaining / rate, 1)
            out["eta_at"] = iso((t.window[1] or 0) + remaining / rate)
        else:
            out["note"] = "No request completed in the last 10 minutes, so no ETA."
    else:
        out["note"] = "Need two scrapes of the completed-request counter for a rate."
    return out


def target_doc(snap: Any, t: Any, monitor: Any, job_requests: int | None = None) -> dict[str, Any]:
    tl = Timeline(target=t.name, config=dict(t.config))
    cfg = config_table(tl)
    main = {k: cfg[k] for k in MAIN_CONFIG if k in cfg}
    rest = {k: v for k, v in cfg.items() if k not in main}
    doc = target_summary(snap, t)
    doc.update({
        "findings": [finding_doc(f) for f in snap.for_target(t.name)],
        "resolved": [{"at": iso(ts), "rule": f.rule, "severity": f.severity.label, "summary": redact_text(f.summary)} for ts, f in snap.resolved if f.target == t.name][-20:],
        "config": main,
        "config_other": rest,
        "signals": {k: v for k, v in sorted(t.latest.items()) if k in SIGNALS and _num(v) is not None},
        "window": {"start": iso(t.window[0]), "end": iso(t.window[1])},
        "charts": CHARTS,
        "eta": job_eta(t, job_requests, monitor),
        # every rule of the last pass and why it is fine or could not judge (the text report's --verbose)
        "checked": redact_strings([c for c in getattr(snap, "checked", []) if c.get("target") == t.name]),
        "generated_at": iso(snap.ts),
    })
    doc["top_fixes"] = top_fixes(doc["findings"], 3)
    doc["top_fix"] = doc["top_fixes"][0] if doc["top_fixes"] else None
    doc["verdict"] = verdict(doc, doc["top_fixes"])
    return doc


def series_doc(monitor: Any, t: Any, range_s: float, max_points: int = 600, snap: Any = None) -> dict[str, Any]:
    end = snapshot_end(monitor, t, snap)
    names = sorted({s[0] for c in CHARTS for s in c["signals"]})
    data = monitor.series(t.index, names, end - range_s, None, max_points=max_points)
    lines = {}
    for c in CHARTS:
        cl = c.get("cfg_line")
        if cl and cl[0] in t.config and _num(t.config[cl[0]].value) is not None:
            lines[c["id"]] = {"label": cl[1], "value": _num(t.config[cl[0]].value)}
    marks = [{"rule": e["rule"], "severity": e["severity"], "start": e["start"], "end": e["end"]}
             for e in getattr(monitor.snapshot, "episodes", []) if e["target"] == t.name and (e["end"] is None or e["end"] >= end - range_s)]
    return {"target": t.index, "start": end - range_s, "end": end, "range_s": range_s, "series": data, "lines": lines, "marks": marks,
            "tz": "UTC"}


def snapshot_end(monitor: Any, t: Any, snap: Any = None) -> float:
    ts = (snap or monitor.snapshot).ts
    if t.is_url:
        return float(ts)
    return float(t.window[1] or ts)


def rules_doc() -> dict[str, Any]:
    return {"rules": [{"name": r.name, "code": r.code, "severity": r.severity.label, "summary": r.summary_line(), "page": f"/rules/{r.name}", "for_seconds": r.for_seconds} for r in REGISTRY]}


def rule_doc(name: str) -> dict[str, Any] | None:
    r = by_name(name)
    if r is None:
        return None
    return {
        "name": r.name, "code": r.code, "severity": r.severity.label, "summary": r.summary_line(),
        "sections": {k or "Summary": v for k, v in r.doc_sections().items()},
        "thresholds": {k: {"default": v, "help": r.threshold_help.get(k, "")} for k, v in r.defaults.items()},
        "for_seconds": r.for_seconds,
    }
