"""The Prometheus exporter behind ``diagnose serve``'s ``/metrics``: a prometheus_client Collector over the
latest live snapshot. Every series is rebuilt from the snapshot on each scrape, so a finding that
resolves simply disappears (no stale series), and while a target is down its signal and pool series
disappear too (its last numbers are not current): ``diagnoser_scrape_up{target} 0`` stays, with the
scrape duration and error count. Every label value goes through the redaction (a target URL, a flag
value). Names are fixed (all underscores, prefix ``diagnoser_``):

    diagnoser_finding_active{rule,severity,target,engine}            1 per active (firing) finding
    diagnoser_signal{target,signal,engine}                            last value of each canonical signal
    diagnoser_pool_capacity_tokens{target,engine}                     KV pool capacity
    diagnoser_suggestion_info{target,rule,flag,current,proposed,engine}        1 per current suggestion
    diagnoser_suggestion_projected_running_reqs{target,rule,flag,engine}       when projected
    diagnoser_suggestion_projected_gen_throughput_tps{target,rule,flag,engine} when projected
    diagnoser_scrape_up{target,engine}, diagnoser_scrape_duration_seconds{target,engine},
    diagnoser_scrape_errors_total{target,engine}, diagnoser_rule_pass_duration_seconds

``engine`` is the target's engine as detected (``sglang`` or ``vllm``), so one Prometheus can keep a
mixed fleet's findings apart (vLLM's own series have an ``engine`` label too, the data-parallel engine
index; the two never meet in one series). A fleet-wide finding (no single target) has ``engine=""``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from diagnoser.redact import redact_text
from diagnoser.timeline import SIGNALS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# keys of Suggestion.projection (diagnoser.capacity.scenario.Scenario.to_dict first), in priority order
_PROJ_KEYS = {
    "running_reqs": ("projected_running", "projected_running_reqs", "running_reqs", "max_running_requests"),
    "gen_throughput_tps": ("projected_gen_throughput_tps", "gen_throughput_tps", "throughput_tps"),
}


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _label(v: Any) -> str:
    return "" if v is None else redact_text(str(v))


def projected(projection: dict[str, Any] | None, kind: str) -> float | None:
    """Pick a projected number out of ``Suggestion.projection`` (keys vary; first finite match wins)."""
    if not projection:
        return None
    for k in _PROJ_KEYS[kind]:
        if k in projection:
            f = _finite(projection[k])
            if f is not None:
                return f
    after = projection.get("after")
    if isinstance(after, dict):
        return projected(after, kind)
    return None


class SnapshotCollector:
    """Collector over ``get_snapshot()`` (a :class:`diagnoser.live.Snapshot`)."""

    def __init__(self, get_snapshot: Callable[[], Any]) -> None:
        self.get_snapshot = get_snapshot

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.get_snapshot()
        active = GaugeMetricFamily("diagnoser_finding_active", "1 for each firing finding", labels=["rule", "severity", "target", "engine"])
        signal = GaugeMetricFamily("diagnoser_signal", "Last value of each canonical signal (aggregate rank)", labels=["target", "signal", "engine"])
        pool = GaugeMetricFamily("diagnoser_pool_capacity_tokens", "KV pool capacity in tokens", labels=["target", "engine"])
        info = GaugeMetricFamily("diagnoser_suggestion_info", "1 for each current suggestion", labels=["target", "rule", "flag", "current", "proposed", "engine"])
        p_run = GaugeMetricFamily("diagnoser_suggestion_projected_running_reqs", "Projected concurrent requests if the suggestion is applied", labels=["target", "rule", "flag", "engine"])
        p_tps = GaugeMetricFamily("diagnoser_suggestion_projected_gen_throughput_tps", "Projected gen throughput (tokens/s) if the suggestion is applied", labels=["target", "rule", "flag", "engine"])
        up = GaugeMetricFamily("diagnoser_scrape_up", "1 when the last scrape of the target succeeded", labels=["target", "engine"])
        dur = GaugeMetricFamily("diagnoser_scrape_duration_seconds", "Duration of the last scrape of the target", labels=["target", "engine"])
        errs = CounterMetricFamily("diagnoser_scrape_errors", "Failed scrapes of the target", labels=["target", "engine"])
        rule_pass = GaugeMetricFamily("diagnoser_rule_pass_duration_seconds", "Duration of the last rule pass over all targets")
        if snap is not None:
            engines = {t.name: _label(getattr(t, "engine", "sglang")) for t in snap.targets}
            seen_active: set[tuple[str, str, str]] = set()
            seen_info: set[tuple[str, ...]] = set()
            seen_proj: set[tuple[str, str, str]] = set()
            for f in snap.findings:
                if f.state != "firing":
                    continue
                eng = engines.get(f.target, "")
                key = (_label(f.rule), f.severity.label, _label(f.target), eng)
                if key not in seen_active:
                    seen_active.add(key)
                    active.add_metric(list(key), 1.0)
                for i, s in enumerate(f.suggestions):
                    labels = (_label(f.target), _label(f.rule), _label(s.flag), _label(s.current), _label(s.proposed), eng)
                    if labels not in seen_info:
                        seen_info.add(labels)
                        info.add_metric(list(labels), 1.0)
                    pk = (_label(f.target), _label(f.rule), _label(s.flag), eng)
                    if i > 0 or pk in seen_proj:
                        continue  # projections for the top suggestion of each finding
                    seen_proj.add(pk)
                    r = projected(s.projection, "running_reqs")
                    if r is not None:
                        p_run.add_metric(list(pk), r)
                    g = projected(s.projection, "gen_throughput_tps")
                    if g is not None:
                        p_tps.add_metric(list(pk), g)
            for t in snap.targets:
                name = _label(t.name)
                eng = engines[t.name]
                if t.is_url:
                    up.add_metric([name, eng], 1.0 if t.up else 0.0)
                    dur.add_metric([name, eng], float(t.last_duration_s))
                    errs.add_metric([name, eng], float(t.scrape_errors))
                    if t.up is False:  # down: its last numbers are not current, so they are not exported
                        continue
                for sig, val in sorted(t.latest.items()):
                    if sig not in SIGNALS:
                        continue
                    v = _finite(val)
                    if v is not None:
                        signal.add_metric([name, sig, eng], v)
                cap = t.config.get("max_total_tokens")
                capv = _finite(cap.value) if cap is not None else _finite(t.latest.get("max_total_tokens"))
                if capv is not None:
                    pool.add_metric([name, eng], capv)
            rule_pass.add_metric([], float(snap.rule_pass_s))
        yield from (active, signal, pool, info, p_run, p_tps, up, dur, errs, rule_pass)


def make_registry(get_snapshot: Callable[[], Any]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(get_snapshot))  # type: ignore[arg-type]
    return reg


def render(registry: CollectorRegistry) -> bytes:
    """The exposition as one buffer (prometheus_client's text format 0.0.4)."""
    return generate_latest(registry)
