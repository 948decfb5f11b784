"""Build the report document (the fixed JSON shape) from a collection and an evaluation.

    {"schema_version": "1.0", "status": "ok"|"problems"|"error", "engine": "sglang", "version": …,
     "inputs": [{"kind", "source", "scrapes"|"lines_read", "lines_recognized", "errors"}],
     "window": {"start", "end"}, "config": {TARGET: {NAME: {"value", "source"}}},
     "signals": {TARGET: {SIGNAL: {"last", "mean", "min", "max", "p50", "p95", "n"}}},
     "findings": [] (the top cause first: evaluate.cause_order), "errors": [],
     "checked": [{"rule", "code", "target", "status": fired|fine|not_judged|error, "why"}],
     "top": {TARGET: {"rule", "severity", "confidence", "summary", "suggestion": {"flag", "current", "proposed"} | null}}}
"""

from __future__ import annotations

from typing import Any

from diagnoser import gcpause
from diagnoser.floor import is_floor
from diagnoser.model import Severity, iso
from diagnoser.redact import redact, redact_strings
from diagnoser.timeline import SIGNALS, Timeline
from diagnoser.timeline.derived import window_rate

WINDOW_RATES = ("output_tps", "prompt_tps", "request_rate")
# the report document's schema (diagnoser/schema/report.schema.json): a new key is a minor bump, a key
# removed or changed in meaning a major one
SCHEMA_VERSION = "1.0"


def signal_table(tl: Timeline) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    names = sorted({name for (name, rank) in tl.series if rank == ""}, key=lambda n: (list(SIGNALS).index(n) if n in SIGNALS else 999, n))
    wq = tl.meta.get("window_quantiles") or {}
    for name in names:
        out[name] = tl.stats(name)
        floors = _floor_points(tl, name)
        if name in wq:  # a latency quantile over the whole window (histogram difference last - first)
            out[name]["window"] = float(wq[name])
            if is_floor(wq[name]):
                floors.append("window")
        if floors:  # these values are a bucket's lower bound: the quantile is more than they say ("> 100 s")
            out[name]["lower_bounds"] = floors
        elif name in WINDOW_RATES:  # a counter's rate over the whole window (timeline/derived.py)
            rate = window_rate(tl, name).value
            if rate is not None:
                out[name]["window"] = rate
    for (name, rank) in sorted(tl.series):
        if rank:
            out[f"{name}[{rank}]"] = tl.stats(name, rank)
    return out


def _floor_points(tl: Timeline, name: str) -> list[str]:
    """Which of the series' max/last readings are a quantile's lower bound (their source says so)."""
    s = tl.get(name)
    if s is None or not len(s) or not name.endswith(("_p50", "_p90", "_p95", "_p99")):
        return []
    marks = [is_floor(source=src) for src in s.sources.tolist()]
    out = []
    if any(marks):  # a reading that is "more than f" may have been the largest
        out.append("max")
    if marks[-1]:
        out.append("last")
    return out


def config_table(tl: Timeline) -> dict[str, dict[str, Any]]:
    return {k: redact({"value": v.value, "source": v.source}) if not k.startswith("arg.") else {"value": redact({k[4:]: v.value})[k[4:]], "source": v.source} for k, v in sorted(tl.config.items())}


def top_causes(report: Any, targets: list[str]) -> dict[str, dict[str, Any]]:
    """Per target: the finding that names the bottleneck and the change to make first (evaluate.top_cause)."""
    from diagnoser.evaluate import top_cause

    out: dict[str, dict[str, Any]] = {}
    mine: dict[str, list[Any]] = {}  # findings by target, once (a fleet report has 10,000 targets)
    for f in report.findings:
        mine.setdefault(f.target, []).append(f)
    for t in targets:
        f, s = top_cause(mine.get(t, []), t)
        if f is None:
            continue
        out[t] = {"rule": f.rule, "severity": f.severity.label, "confidence": f.confidence, "summary": f.summary,
                  "suggestion": None if s is None else {"flag": s.flag, "current": s.current, "proposed": s.proposed}}
    return out


@gcpause.paused()  # its dicts and lists hold no cycles: 1.5 s of 4.4 at 10,000 fleet targets (bench/bench_fleet.py)
def build(collection: Any, report: Any, fail_on: Severity = Severity.WARNING, engine: str = "sglang", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    tls: list[Timeline] = collection.timelines
    starts = [s for tl in tls for s in [tl.span()[0]] if s is not None]
    ends = [e for tl in tls for e in [tl.span()[1]] if e is not None]
    version = next((tl.version for tl in tls if tl.version), None)
    usable = collection.usable()
    from diagnoser.rules import REGISTRY

    notes = {r.name for r in REGISTRY if r.note}  # a note about the inputs never makes a problem on its own
    # nothing was recognised: the input errors say why; a note on what the findings stand on has nothing to qualify
    findings = [f.to_dict() for f in report.findings if usable or f.rule not in notes]
    problems = any(f.severity >= fail_on and f.rule not in notes for f in report.findings)
    status = "error" if not usable else ("problems" if problems else "ok")
    untimed = any(tl.untimed for tl in tls)
    engines = {tl.target: getattr(tl, "engine", "sglang") for tl in tls}
    if engine == "sglang" and engines and set(engines.values()) != {"sglang"}:  # detected per input
        engine = "+".join(sorted(set(engines.values())))
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "engine": engine,
        "version": version,
        "inputs": [i.to_dict() for i in collection.inputs],
        "window": {"start": None if untimed else iso(min(starts)) if starts else None, "end": None if untimed else iso(max(ends)) if ends else None},
        "config": {tl.target: config_table(tl) for tl in tls},
        "signals": {tl.target: signal_table(tl) for tl in tls},
        "findings": findings,
        "errors": [e.to_dict() for e in report.errors] + [{"source": "input", "error": m} for m in collection.errors],
    }
    if set(engines.values()) != {"sglang"} and engines:
        doc["engines"] = engines  # each target's engine, when one is not SGLang
    doc["top"] = top_causes(report, [tl.target for tl in tls])
    doc["checked"] = list(getattr(report, "checked", []))
    if getattr(collection, "fleet", None) is not None:  # fleet mode (--prometheus)
        from diagnoser.outputs.fleet import fleet_section

        doc["fleet"] = fleet_section(collection, report)
    if extra:
        doc.update(extra)
    return redact_strings(doc)  # the output door: whatever reached the document, no secret leaves in it
