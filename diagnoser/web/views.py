"""JSON documents behind every page (each page's JSON twin is exactly this document).

Everything a target or its config provides is redacted here (``redact``), and rendered by Jinja2 with
autoescape, so neither secrets nor markup from a server reach the browser unescaped.
"""

from __future__ import annotations

import math
from typing import Any

from diagnoser.floor import above
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
SEV_RANK = {"info": 1, "warning": 2, "critical": 3}
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


def stamp(ts: Any) -> str | None:
    """An ISO stamp to the second (``2026-12-02T14:20:05Z``): the page's times, without microseconds."""
    f = _num(ts)
    return None if f is None else iso(math.floor(f))


def span_text(seconds: float) -> str:
    """``45 s``, ``2 min 10 s``, ``5 min``, ``1 h 5 min``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        m, r = divmod(s, 60)
        return f"{m} min" + (f" {r} s" if r else "")
    h, r = divmod(s // 60, 60)
    return f"{h} h" + (f" {r} min" if r else "")


def headline(t: Any) -> list[dict[str, Any]]:
    """The tiles: each signal over the judged window, its median and max when the window has two or more
    readings, else its last reading and how old it is; ``how`` says which (never a bare instant value)."""
    ws = getattr(t, "window_stats", None) or {}
    end = (ws.get("_window") or {}).get("end")
    out = []
    for key, label, f in HEADLINE:
        st = ws.get(key)
        fl = (st or {}).get("floor") or {}  # a quantile known only as more than a bucket's floor: "> 100.00 s"
        if st and st["n"] >= 2:
            out.append({"signal": key, "label": label, "value": st["median"], "max": st["max"], "last": st["last"], "n": st["n"],
                        "how": "median · max", "text": above(fmt(f, st["median"]), fl.get("median", False)),
                        "max_text": above(fmt(f, st["max"]), fl.get("max", False))})
        elif st:
            age = None if end is None else max(0.0, end - st["last_ts"])
            out.append({"signal": key, "label": label, "value": st["last"], "last": st["last"], "n": 1, "age_s": age,
                        "how": "last reading" + ("" if age is None else f", {span_text(age)} ago"),
                        "text": above(fmt(f, st["last"]), fl.get("last", False))})
        elif key in t.latest:  # nothing in the window: the last reading before it, said to be old
            out.append({"signal": key, "label": label, "value": _num(t.latest[key]), "n": 0, "how": "before the window",
                        "text": fmt(f, t.latest[key])})
        if fl and out and out[-1]["signal"] == key:
            out[-1]["lower_bound"] = sorted(k for k, v in fl.items() if v)
    mrr = t.config.get("max_running_requests")
    if mrr is not None:
        out.insert(1, {"signal": "max_running_requests", "label": "max running", "value": _num(mrr.value), "how": "config",
                       "text": fmt("{:.0f}", mrr.value)})
    return out


def window_doc(t: Any) -> dict[str, Any]:
    """The judged window as it was and the data it had: ``text`` says both ("5 min, 2 min 10 s of data")."""
    ws = getattr(t, "window_stats", None) or {}
    w, data = ws.get("_window") or {}, ws.get("_data") or {}
    start, end = w.get("start", t.window[0]), w.get("end", t.window[1])
    out: dict[str, Any] = {"start": stamp(start), "end": stamp(end), "data_start": stamp(data.get("first")), "data_end": stamp(data.get("last"))}
    if start is None or end is None:
        out["text"] = "no window yet"
        return out
    length = float(end) - float(start)
    out["length_s"] = round(length, 1)
    if not data:
        out["data_s"] = 0.0
        out["text"] = f"{span_text(length)}, no readings in it"
        return out
    got = float(data["last"]) - float(data["first"])
    out["data_s"] = round(got, 1)
    if got >= length * 0.95:
        out["text"] = f"{span_text(length)}, readings throughout"
    else:
        out["text"] = f"{span_text(length)}, {span_text(got)} of data ({stamp(data['first'])[11:19]} → {stamp(data['last'])[11:19]})"
    return out


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}  # as the projects write their names


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
        "engine": getattr(t, "engine", "sglang"),
        "engine_name": ENGINE_NAMES.get(getattr(t, "engine", "sglang"), "SGLang"),
        "model_name": redact_text(t.model_name),
        "last_error": redact_text(t.last_error),
        "last_scrape": stamp(t.last_scrape_ts),
        "scrapes": t.scrapes,
        "scrape_errors": t.scrape_errors,
        "headline": headline(t),
        "window": window_doc(t),
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
            out["eta_at"] = stamp((t.window[1] or 0) + remaining / rate)
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
        "resolved": [{"at": stamp(ts), "rule": f.rule, "severity": f.severity.label, "summary": redact_text(f.summary)} for ts, f in snap.resolved if f.target == t.name][-20:],
        "config": main,
        "config_other": rest,
        "signals": {k: v for k, v in sorted(t.latest.items()) if k in SIGNALS and _num(v) is not None},
        "charts": CHARTS,
        "eta": job_eta(t, job_requests, monitor),
        # every rule of the last pass and why it is fine or could not judge (the text report's --verbose)
        "checked": redact_strings([c for c in getattr(snap, "checked", []) if c.get("target") == t.name]),
        "generated_at": iso(snap.ts),
    })
    doc["client"] = client_doc(monitor, t)
    doc["top_fixes"] = top_fixes(doc["findings"], 3)
    doc["top_fix"] = doc["top_fixes"][0] if doc["top_fixes"] else None
    doc["verdict"] = verdict(doc, doc["top_fixes"])
    return doc


def client_doc(monitor: Any, t: Any) -> dict[str, Any] | None:
    """``serve --client-results``: the client's run beside the first target's timeline (timeline/client.py)."""
    run = getattr(monitor, "client_run", None)
    if run is None or t.index != 0:
        return None
    from diagnoser.timeline.client import reconcile

    try:
        live = monitor.target(t.index)
    except (AttributeError, IndexError):
        return None
    with live.lock:
        sec = reconcile(run, live.timeline)
    return redact_strings(sec)


def series_doc(monitor: Any, t: Any, range_s: float, max_points: int = 600, snap: Any = None) -> dict[str, Any]:
    end = snapshot_end(monitor, t, snap)
    names = sorted({s[0] for c in CHARTS for s in c["signals"]})
    data = monitor.series(t.index, names, end - range_s, None, max_points=max_points)
    lines = {}
    for c in CHARTS:
        cl = c.get("cfg_line")
        if cl and cl[0] in t.config and _num(t.config[cl[0]].value) is not None:
            lines[c["id"]] = {"label": cl[1], "value": _num(t.config[cl[0]].value)}
    cur = snap or monitor.snapshot
    firing = {f.rule: f.severity.label for f in cur.firing(t.name)} if hasattr(cur, "firing") else None
    marks, resolved = band_marks(getattr(cur, "episodes", []), t.name, end - range_s, firing)
    return {"target": t.index, "start": end - range_s, "end": end, "range_s": range_s, "series": data, "lines": lines, "marks": marks,
            "resolved_marks": resolved, "tz": "UTC"}


def band_marks(episodes: list[dict[str, Any]], target: str, since: float,
               firing: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(bands, resolved): the charts shade only findings at warning or above that fire now (an episode
    opens when a finding fires, never while it is pending; ``firing``, rule → severity of what fires now,
    drops an episode whose finding has eased to info); info notes are never shaded, and episodes that
    resolved are listed beside the charts, not shaded."""
    bands, resolved = [], []
    for e in episodes:
        if e["target"] != target or SEV_RANK.get(str(e["severity"]), 0) < SEV_RANK["warning"]:
            continue
        m = {"rule": e["rule"], "severity": e["severity"], "start": e["start"], "end": e["end"]}
        if e["end"] is None:
            now = e["severity"] if firing is None else firing.get(e["rule"])
            if SEV_RANK.get(str(now), 0) >= SEV_RANK["warning"]:
                bands.append(dict(m, severity=now))
        elif e["end"] >= since:
            resolved.append(m)
    return bands, resolved


def snapshot_end(monitor: Any, t: Any, snap: Any = None) -> float:
    ts = (snap or monitor.snapshot).ts
    if t.is_url:
        return float(ts)
    return float(t.window[1] or ts)


RULE_PAGE_LEAD = ("Summary", "Fix", "What it detects")


def lead_sections(sections: dict[str, str]) -> dict[str, str]:
    """A rule page leads with what the rule detects (its summary line) and the fix, then the detection in
    full (RULE_PAGE_LEAD), then the rest in the docstring's order: a reader who came from a finding wants
    the change on the first screen (a phone's too), not 1,600 px down."""
    out = {k: sections[k] for k in RULE_PAGE_LEAD if k in sections}
    out.update((k, v) for k, v in sections.items() if k not in out)
    return out


def rules_doc() -> dict[str, Any]:
    return {"rules": [{"name": r.name, "code": r.code, "severity": r.severity.label, "summary": r.summary_line(), "page": f"/rules/{r.name}", "for_seconds": r.for_seconds} for r in REGISTRY]}


def rule_doc(name: str) -> dict[str, Any] | None:
    r = by_name(name)
    if r is None:
        return None
    return {
        "name": r.name, "code": r.code, "severity": r.severity.label, "summary": r.summary_line(),
        "sections": lead_sections({k or "Summary": v for k, v in r.doc_sections().items()}),
        "thresholds": {k: {"default": v, "help": r.threshold_help.get(k, "")} for k, v in r.defaults.items()},
        "for_seconds": r.for_seconds,
    }
