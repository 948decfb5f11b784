"""vLLM ``/metrics`` expositions → canonical signals (docs/vllm.md#metrics).

Reads both spellings (``vllm:x`` as served, ``vllm_x`` after a Prometheus hop), V0 and V1 names
(:mod:`diagnoser.engines.vllm.metric_names`), labels ``model_name`` and ``engine`` (V1's data-parallel
engine index: series stay apart per engine, rank key ``dp0``…, and the timeline sums or averages them with
each signal's rule). Counters become per-interval rates that survive a reset; histograms become
per-interval quantiles, and :func:`window_quantiles` gives the whole window's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from diagnoser.engines.vllm.metric_names import (
    CACHE_INFO_FACTS,
    COUNTERS,
    GAUGES,
    HISTOGRAM_QUANTILES,
    HISTOGRAMS,
    VERSION_HINTS,
    WANTED,
)
from diagnoser.engines.vllm.versions import VersionRange
from diagnoser.model import SignalSink

Sample = tuple[str, dict[str, str], float]

_LINE_RE = re.compile(r'^vllm[:_]([A-Za-z_][A-Za-z0-9_]*)(?:\{((?:[^}"]|"(?:[^"\\\n]|\\.)*")*)\})?[ \t]+([^ \t\n]+)', re.MULTILINE)
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def normalise(name: str) -> str | None:
    """``vllm:x`` / ``vllm_x`` → ``x``; ``None`` for series that are not vLLM's."""
    if name.startswith("vllm:") or name.startswith("vllm_"):
        return name[5:]
    return None


def fast_samples(text: str, limit: int | None = None) -> list[Sample]:
    """The wanted samples of an exposition, read with one line grammar (HELP/TYPE and other families
    skipped); at most ``limit`` of them (the caller's cap on what one scrape may make us hold). A value that
    is not a finite number is kept here: :func:`ingest_samples` drops and counts it, as on the reference path."""
    out: list[Sample] = []
    for m in _LINE_RE.finditer(text):
        if limit is not None and len(out) >= limit:
            break
        name, lab, val = m.groups()
        if name not in WANTED:
            continue
        try:
            value = float(val)
        except ValueError:
            continue
        out.append((name, dict(_LABEL_RE.findall(lab)) if lab else {}, value))
    return out


def samples_from_families(families: Iterable[Any]) -> list[Sample]:
    """The same samples from prometheus_client metric families (the reference path)."""
    out: list[Sample] = []
    for fam in families:
        if normalise(fam.name) is None:
            continue
        for s in fam.samples:
            name = normalise(s.name)
            if name in WANTED:
                try:
                    out.append((name, dict(s.labels), float(s.value)))
                except (OverflowError, ValueError):
                    continue
    return out


def has_vllm_family(families: Iterable[Any]) -> bool:
    return any(normalise(f.name) is not None for f in families)


def rank_key(labels: dict[str, str]) -> str:
    """``dp0``, ``dp1``… for V1's ``engine`` label; ``""`` for V0 (one engine)."""
    eng = labels.get("engine")
    return f"dp{eng}" if eng not in (None, "") else ""


@dataclass(slots=True)
class _Hist:
    buckets: dict[float, float]
    count: float


@dataclass(slots=True)
class MetricsState:
    """What one target's scrapes remember between ticks."""

    counters: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    hists: dict[tuple[str, str], tuple[float, _Hist]] = field(default_factory=dict)
    first_hists: dict[tuple[str, str], _Hist] = field(default_factory=dict)
    resets: int = 0
    version: VersionRange = field(default_factory=VersionRange)
    seen_names: set[str] = field(default_factory=set)
    model_names: set[str] = field(default_factory=set)
    label_names: set[str] = field(default_factory=set)
    last_ts: float | None = None
    dropped: int = 0
    drop_examples: list[str] = field(default_factory=list)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative (upper bound, count) pairs sorted by bound."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def ingest_families(families: Any, ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    return ingest_samples(samples_from_families(families), ts, sink, state, source)


def ingest_text(text: str, ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    return ingest_samples(fast_samples(text), ts, sink, state, source)


def _intish(text: str) -> Any:
    try:
        f = float(text)
    except ValueError:
        return {"True": True, "False": False}.get(text, text)
    if not math.isfinite(f):
        return None
    return int(f) if f.is_integer() and "." not in text else f


def ingest_samples(samples: list[Sample], ts: float, sink: SignalSink, state: MetricsState, source: str) -> int:
    """One scrape's samples → signals, config facts and version evidence."""
    used = 0
    gauges: dict[tuple[str, str], float] = {}
    gauge_name: dict[str, str] = {}
    counters: dict[tuple[str, str], float] = {}
    hist: dict[tuple[str, str], dict[float, float]] = {}
    pool: float | None = None  # KV tokens (cache_config_info): usage × pool is the tokens the running requests hold
    for name, labels, value in samples:
        state.seen_names.add(name)
        if labels:
            state.label_names.update(labels)
            mn = labels.get("model_name")
            if mn:
                state.model_names.add(mn)
        if name == "cache_config_info":
            if rank_key(labels) in ("", "dp0"):
                for lab, fact in CACHE_INFO_FACTS.items():
                    v = labels.get(lab)
                    if v not in (None, "", "None"):
                        sink.set_config(fact, _intish(v), f"{source} vllm:cache_config_info{{{lab}}}")
                pool = _pool(labels)
                if pool:
                    sink.set_config("max_total_tokens", int(pool), f"{source} vllm:cache_config_info (num_gpu_blocks × block_size)")
            used += 1
            continue
        if not (0.0 <= value < math.inf):
            state.dropped += 1
            if len(state.drop_examples) < 1:
                state.drop_examples.append(f"vllm:{name} {value!r}")
            continue
        rk = rank_key(labels)
        if name.endswith("_bucket"):
            stem = HISTOGRAMS.get(name[:-7])
            le = labels.get("le")
            if stem is None or le is None:
                continue
            try:
                bound = float(le)
            except ValueError:
                state.dropped += 1
                continue
            b = hist.setdefault((stem, rk), {})
            b[bound] = b.get(bound, 0.0) + value
            used += 1
            continue
        if name in COUNTERS:
            key = (name, rk)
            counters[key] = counters.get(key, 0.0) + value  # label splits (finished_reason) add up
            used += 1
            continue
        sig = GAUGES.get(name)
        if sig is None:
            continue
        gauges[(sig, rk)] = gauges.get((sig, rk), 0.0) + value if sig in ("running_reqs", "queue_reqs", "swapped_reqs") else value
        gauge_name[sig] = name
        used += 1
    has_v1_counter = any(k[0] == "generation_tokens_total" for k in counters) and state.last_ts is not None
    for (sig, rk), v in gauges.items():
        if sig == "gen_throughput_tps" and has_v1_counter:
            continue
        sink.add(sig, ts, v, f"{source} vllm:{gauge_name[sig]}", rk)
        if sig == "token_usage" and pool:  # KV blocks in use × block size (block-granular, like SGLang's #token by pages)
            sink.add("used_tokens", ts, round(v * pool), f"{source} vllm:{gauge_name[sig]} × pool {int(pool)}", rk)
    _counter_rates(counters, ts, sink, state, source, emit_gen="gen_throughput_tps" not in gauge_name)
    _hist_quantiles(hist, ts, sink, state, source)
    detect_version(state)
    engine_from_metrics(state, sink, source)
    state.last_ts = ts
    return used


# the series only one engine exports: V0's swap gauges (vllm/engine/metrics.py at v0.4.3 … v0.8.5; V1's
# vllm/v1/metrics/loggers.py has no swap), V1's renamed usage and prefix-cache counters (vllm/v1/metrics/loggers.py
# at v0.10.2, absent from vllm/engine/metrics.py at v0.10.2)
V0_ONLY = ("num_requests_swapped", "cpu_cache_usage_perc")
V1_ONLY = ("kv_cache_usage_perc", "prefix_cache_queries_total", "prefix_cache_queries")


def engine_from_metrics(state: MetricsState, sink: SignalSink, source: str) -> None:
    """``vllm_engine`` ("V0" / "V1") from the names and labels seen: V0 alone exports
    ``vllm:num_requests_swapped`` and ``vllm:cpu_cache_usage_perc``; V1 alone labels its series with
    ``engine`` (its ``labelnames = ["model_name", "engine"]``; V0 labels ``model_name``) and exports
    ``kv_cache_usage_perc`` and ``prefix_cache_queries``. Set once, when one side is seen and the other is
    not (seen_names are normalised: no ``vllm:`` prefix)."""
    v0 = [n for n in V0_ONLY if n in state.seen_names]
    v1 = (["label engine"] if "engine" in state.label_names else []) + [n for n in V1_ONLY if n in state.seen_names]
    if bool(v0) != bool(v1):
        tag, why = ("V0", v0) if v0 else ("V1", v1)
        sink.set_config("vllm_engine", tag, f"{source} {why[0]} ({tag}'s metrics only)", override=False)


def _pool(labels: dict[str, str]) -> float | None:
    """The KV pool in tokens from cache_config_info's labels: num_gpu_blocks × block_size (kv_cache_size_tokens when given)."""
    for key in ("kv_cache_size_tokens",):
        try:
            v = float(labels[key])
            if v > 0 and math.isfinite(v):
                return v
        except (KeyError, ValueError):
            pass
    try:
        v = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return v if v > 0 and math.isfinite(v) else None


def _delta(state: MetricsState, key: tuple[str, str], ts: float, value: float) -> tuple[float, float] | None:
    prev = state.counters.get(key)
    state.counters[key] = (ts, value)
    if prev is None:
        if state.last_ts is None or state.last_ts >= ts:
            return None
        prev = (state.last_ts, 0.0)  # appeared while scraped: it counted from 0 in between
    dt = ts - prev[0]
    if dt <= 0:
        return None
    inc = value - prev[1]
    if inc < 0:
        state.resets += 1
        inc = value
    return inc, dt


def _counter_rates(counters: dict[tuple[str, str], float], ts: float, sink: SignalSink, state: MetricsState, source: str,
                   emit_gen: bool) -> None:
    prefix: dict[str, dict[str, float]] = {}  # rank → {"q": queried, "h": hit} over the interval
    for (name, rk), value in counters.items():
        d = _delta(state, (name, rk), ts, value)
        src = f"{source} vllm:{name}"
        rate_sig, total_sig = COUNTERS[name]
        if total_sig:
            sink.add(total_sig, ts, value, src, rk)
        if d is None:
            continue
        inc, dt = d
        if rate_sig:
            sink.add(rate_sig, ts, inc / dt, src, rk)
        if name == "generation_tokens_total":  # V1 counts tokens as they are generated, step by step
            sink.add("decode_tokens", ts, inc, src, rk)
            if emit_gen:
                sink.add("gen_throughput_tps", ts, inc / dt, f"{src} (rate)", rk)
        elif name == "num_preemptions_total":
            sink.add("retracted_reqs", ts, inc, src, rk)
        elif name.endswith("prefix_cache_queries_total"):
            prefix.setdefault(rk, {})["q"] = prefix.setdefault(rk, {}).get("q", 0.0) + inc
        elif name.endswith("prefix_cache_hits_total"):
            prefix.setdefault(rk, {})["h"] = prefix.setdefault(rk, {}).get("h", 0.0) + inc
    for rk, d in prefix.items():
        q, h = d.get("q"), d.get("h")
        if q is None or h is None:
            continue
        src = f"{source} vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total"
        sink.add("prefill_new_tokens", ts, max(0.0, q - h), src, rk)
        sink.add("prefill_cached_tokens", ts, h, src, rk)
        if q > 0:
            sink.add("cache_hit_rate", ts, min(1.0, h / q), f"{src} (hits/queries over the interval)", rk)


def _hist_quantiles(hist: dict[tuple[str, str], dict[float, float]], ts: float, sink: SignalSink, state: MetricsState, source: str) -> None:
    merged: dict[str, dict[float, float]] = {}
    for (stem, _rk), buckets in hist.items():  # request histograms: one distribution over the engines
        m = merged.setdefault(stem, {})
        for b, c in buckets.items():
            m[b] = m.get(b, 0.0) + c
    for stem, buckets in merged.items():
        cur = _Hist(buckets, buckets.get(math.inf, max(buckets.values(), default=0.0)))
        key = (stem, "")
        prev = state.hists.get(key)
        if prev is None and state.last_ts is not None and state.last_ts < ts:
            prev = (state.last_ts, _Hist({}, 0.0))
        state.first_hists.setdefault(key, prev[1] if prev else cur)
        state.hists[key] = (ts, cur)
        if prev is None:
            continue
        p = prev[1]
        if cur.count < p.count:
            state.resets += 1
            diff = sorted(cur.buckets.items())
        else:
            diff = sorted((b, c - p.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
        if not diff or diff[-1][1] <= 0:
            continue
        for q in HISTOGRAM_QUANTILES.get(stem, (0.5, 0.95)):
            v = histogram_quantile(q, diff)
            if not math.isnan(v):
                sink.add(f"{stem}_p{int(q * 100)}", ts, v, f"{source} vllm:{stem} histogram", "")


def window_quantiles(state: MetricsState) -> dict[str, float]:
    """``{"ttft_seconds_p95": …}`` over the whole window (last scrape's buckets minus the first one's)."""
    out: dict[str, float] = {}
    for key, (_ts, cur) in state.hists.items():
        first = state.first_hists.get(key)
        if first is None or first is cur:
            continue
        diff = sorted(cur.buckets.items()) if cur.count < first.count else sorted(
            (b, c - first.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
        for q in HISTOGRAM_QUANTILES.get(key[0], (0.5, 0.95)):
            v = histogram_quantile(q, diff)
            if not math.isnan(v):
                out[f"{key[0]}_p{int(q * 100)}"] = v
    return out


def detect_version(state: MetricsState) -> VersionRange:
    vr = VersionRange()
    if state.seen_names:
        vr.at_least((0, 2, 0), "vllm metrics exist")
    if "engine" in state.label_names:
        vr.at_least((0, 7, 0), "label engine (the V1 engine's loggers; 0.6.6 has none)")
    for name, low, high in VERSION_HINTS:
        if name in state.seen_names:
            if low:
                vr.at_least(low, f"metric vllm:{name.removesuffix('_count')}")
            if high:
                vr.at_most(high, f"metric vllm:{name.removesuffix('_count')}")
    state.version = vr
    return vr
