"""SGLang ``/metrics`` expositions → canonical signals (reference §1–2).

Handles both spellings (``sglang:x`` as served, ``sglang_x`` after a Prometheus or router hop), the
2024 pre-release names with a ``name`` label, and every label generation (``model_name``,
``engine_type``, ``tp_rank``, ``dp_rank``, ``pp_rank``, ``moe_ep_rank``, extra labels, ``pid``).

Per-DP-rank series stay apart (rank key ``dp0``…); the timeline aggregates them with each signal's rule.
Counters become rates that survive resets; histograms become per-interval quantiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.model import SignalSink

# gauge (normalised name, no prefix) → canonical signal
GAUGES: dict[str, str] = {
    "num_running_reqs": "running_reqs",
    "num_queue_reqs": "queue_reqs",
    "token_usage": "token_usage",
    "num_used_tokens": "used_tokens",
    "max_total_num_tokens": "max_total_tokens",
    "gen_throughput": "gen_throughput_tps",
    "cache_hit_rate": "cache_hit_rate",
    "is_cuda_graph": "cuda_graph",
    "spec_accept_length": "spec_accept_len",
    "spec_accept_rate": "spec_accept_rate",
    "full_token_usage": "full_token_usage",
    "swa_token_usage": "swa_token_usage",
    "mamba_usage": "mamba_usage",
    "new_token_ratio": "new_token_ratio",
    "num_retracted_reqs": "retracted_reqs",
    "decode_sum_seq_lens": "decode_sum_seq_lens",
    "http_requests_active": "http_requests_active",
    # 2024 pre-release names (label `name`)
    "num_requests_running": "running_reqs",
    "num_requests_waiting": "queue_reqs",
}
# gauges whose per-process (`pid`) series add up; every other gauge takes the max over pids
PID_SUMMED = {"num_retracted_reqs", "num_paused_reqs", "http_requests_active"}
# gauges that are configuration constants
CONFIG_GAUGES: dict[str, str] = {
    "max_total_num_tokens": "max_total_tokens",
    "page_size": "page_size",
    "num_pages": "num_pages",
    "context_len": "context_len",
    "startup_available_gpu_memory_gb": "available_gpu_mem_gb",
    "weight_memory_usage_gb": "weight_mem_gb",
    "kv_cache_memory_usage_gb": "kv_cache_gb",
    "max_running_requests_under_SLO": "max_running_requests_under_slo",
    "max_total_num_tokens_swa": "max_total_tokens_swa",
    "hicache_host_total_tokens": "hicache_host_tokens",
    # pre-release
    "max_prefill_tokens": "max_prefill_tokens",
    "max_running_requests": "max_running_requests",
}
# counter (normalised, with _total) → (rate signal, running-total signal or None)
COUNTERS: dict[str, tuple[str | None, str | None]] = {
    "prompt_tokens_total": ("prompt_tps", None),
    "generation_tokens_total": ("output_tps", None),
    "num_requests_total": ("request_rate", "requests_completed"),
    "request_success_total": ("request_rate", "requests_completed"),  # pre-release
    "num_retracted_requests_total": (None, "retractions_total"),
}
# histogram base name → signal stem
HISTOGRAMS: dict[str, str] = {
    "time_to_first_token_seconds": "ttft_seconds",
    "inter_token_latency_seconds": "itl_seconds",
    "time_per_output_token_seconds": "itl_seconds",  # <= 0.4.4 name
    "e2e_request_latency_seconds": "e2e_seconds",
    "queue_time_seconds": "queue_time_seconds",
}
HISTOGRAM_QUANTILES: dict[str, tuple[float, ...]] = {
    "ttft_seconds": (0.5, 0.95),
    "itl_seconds": (0.5, 0.95),
    "e2e_seconds": (0.95,),
    "queue_time_seconds": (0.95,),
}

# (normalised name, low, high) version evidence from what an exposition contains
VERSION_HINTS: list[tuple[str, tuple[int, int, int] | None, tuple[int, int, int] | None]] = [
    ("max_total_num_tokens", (0, 5, 6), None),
    ("is_cuda_graph", (0, 5, 4), None),
    ("num_retracted_requests_total", (0, 5, 7), None),
    ("realtime_tokens_total", (0, 5, 7), None),
    ("kv_available_tokens", (0, 5, 11), None),
    ("context_len", (0, 5, 11), None),
    ("swa_available_tokens", (0, 5, 12), None),
    ("weight_memory_usage_gb", (0, 5, 17), None),
    ("startup_time_seconds", (0, 5, 17), None),
    ("prefill_effective_tokens_total", (0, 5, 18), None),
    ("scheduler_idle_seconds_total", (0, 5, 20), None),
    ("dp_attention_token_imbalance_ratio", (0, 5, 22), None),
    ("request_time_per_output_token_seconds", (0, 5, 22), None),
    ("prealloc_full_token_usage", (0, 5, 23), None),
    ("queue_time_seconds", (0, 5, 3), None),
    ("inter_token_latency_seconds", (0, 4, 4), None),
    ("num_requests_total", (0, 4, 2), None),
    ("time_per_output_token_seconds", None, (0, 4, 4)),
    ("total_retracted_reqs", (0, 4, 10), (0, 5, 2)),
    ("avg_request_queue_latency", (0, 4, 6), (0, 5, 2)),
    ("num_prefill_infight_queue_reqs", (0, 4, 7), (0, 5, 1)),
    ("num_running_reqs_offline_batch", (0, 5, 2), (0, 5, 10)),
    ("gpu_execution_seconds_total", (0, 5, 7), (0, 5, 10)),
    ("forward_execution_seconds_total", (0, 5, 11), None),
    ("num_requests_running", None, (0, 3, 5)),
]
LABEL_HINTS: list[tuple[str, tuple[int, int, int]]] = [
    ("engine_type", (0, 4, 4)),
    ("tp_rank", (0, 4, 10)),
    ("moe_ep_rank", (0, 5, 7)),
]


def normalise(name: str) -> str | None:
    """``sglang:x`` / ``sglang_x`` → ``x``; ``None`` for series that are not SGLang's."""
    if name.startswith("sglang:") or name.startswith("sglang_"):
        return name[7:]
    return None


def rank_key(labels: dict[str, str]) -> str | None:
    """Rank key for per-rank series; ``None`` for a non-zero attention-TP rank (a replica of rank 0)."""
    tp = labels.get("tp_rank")
    if tp not in (None, "", "0") and "dp_rank" not in labels:
        return None
    parts = []
    dp = labels.get("dp_rank")
    if dp not in (None, ""):
        parts.append(f"dp{dp}")
    pp = labels.get("pp_rank")
    if pp not in (None, "", "0"):
        parts.append(f"pp{pp}")
    return "/".join(parts)


@dataclass(slots=True)
class _HistState:
    buckets: dict[float, float]
    count: float


@dataclass(slots=True)
class MetricsState:
    """What one target's scrapes remember between ticks: counters and histogram buckets."""

    counters: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # key → (ts, value)
    hists: dict[tuple[str, str], tuple[float, _HistState]] = field(default_factory=dict)
    first_hists: dict[tuple[str, str], _HistState] = field(default_factory=dict)
    resets: int = 0
    version: VersionRange = field(default_factory=VersionRange)
    seen_names: set[str] = field(default_factory=set)
    model_names: set[str] = field(default_factory=set)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative (upper bound, count) pairs sorted by bound."""
    if not buckets:
        return math.nan
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
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
    """Turn parsed metric families (prometheus_client objects) into signals. Returns samples used."""
    used = 0
    gauges: dict[tuple[str, str], float] = {}
    gauge_src: dict[tuple[str, str], str] = {}
    counters: dict[tuple[str, str], float] = {}
    hist: dict[tuple[str, str], dict[float, float]] = {}
    label_names: set[str] = set()
    for fam in families:
        base = normalise(fam.name)
        if base is None:
            continue
        for s in fam.samples:
            name = normalise(s.name) or s.name
            labels = s.labels
            label_names.update(labels)
            state.seen_names.add(name)
            mn = labels.get("model_name") or labels.get("name")
            if mn:
                state.model_names.add(mn)
            rk = rank_key(labels)
            if rk is None:
                continue
            if fam.type == "histogram":
                stem = HISTOGRAMS.get(base)
                if stem and name.endswith("_bucket"):
                    le = labels.get("le")
                    if le is None:
                        continue
                    hk = (stem, "")  # tokenizer histograms are per server, not per rank
                    b = hist.setdefault(hk, {})
                    bound = float(le)
                    b[bound] = b.get(bound, 0.0) + s.value
                continue
            if fam.type == "counter" or name.endswith("_total"):
                cname = name if name.endswith("_total") else name + "_total"
                if cname in COUNTERS:
                    ck = (cname, rk)
                    counters[ck] = counters.get(ck, 0.0) + s.value
                continue
            if base in CONFIG_GAUGES:
                sink.set_config(CONFIG_GAUGES[base], _intish(s.value), f"{source} sglang:{base}")
            sig = GAUGES.get(base)
            if sig is None:
                continue
            gk = (sig, rk)
            if gk in gauges:
                gauges[gk] = gauges[gk] + s.value if base in PID_SUMMED else max(gauges[gk], s.value)
            else:
                gauges[gk] = s.value
                gauge_src[gk] = f"{source} sglang:{base}"
            used += 1
    for (sig, rk), v in gauges.items():
        sink.add(sig, ts, v, gauge_src[(sig, rk)], rk)
    _counter_rates(counters, ts, sink, state, source)
    _hist_quantiles(hist, ts, sink, state, source)
    _version_hints(state)
    version_from_labels(label_names, state)
    return used


def _intish(v: float) -> Any:
    return int(v) if not math.isnan(v) and float(v).is_integer() else v


def _counter_rates(counters: dict[tuple[str, str], float], ts: float, sink: SignalSink, state: MetricsState, source: str) -> None:
    for (cname, rk), value in counters.items():
        rate_sig, total_sig = COUNTERS[cname]
        src = f"{source} sglang:{cname}"
        if total_sig:
            sink.add(total_sig, ts, value, src, rk)
        prev = state.counters.get((cname, rk))
        state.counters[(cname, rk)] = (ts, value)
        if prev is None:
            continue
        pts, pval = prev
        dt = ts - pts
        if dt <= 0:
            continue
        delta = value - pval
        if delta < 0:  # counter reset (server restart): count from zero
            state.resets += 1
            delta = value
        if rate_sig:
            sink.add(rate_sig, ts, delta / dt, src, rk)
        if cname == "num_retracted_requests_total":
            sink.add("retracted_reqs", ts, delta, src, rk)


def _hist_quantiles(hist: dict[tuple[str, str], dict[float, float]], ts: float, sink: SignalSink, state: MetricsState, source: str) -> None:
    for (stem, rk), buckets in hist.items():
        cur = _HistState(buckets, buckets.get(math.inf, max(buckets.values(), default=0.0)))
        state.first_hists.setdefault((stem, rk), cur)
        prev = state.hists.get((stem, rk))
        state.hists[(stem, rk)] = (ts, cur)
        if prev is None:
            continue
        _, p = prev
        if cur.count < p.count:  # reset
            state.resets += 1
            diff = sorted(cur.buckets.items())
        else:
            diff = sorted((b, c - p.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
        if not diff or diff[-1][1] <= 0:
            continue
        for q in HISTOGRAM_QUANTILES.get(stem, (0.5, 0.95)):
            v = histogram_quantile(q, diff)
            if not math.isnan(v):
                sink.add(f"{stem}_p{int(q * 100)}", ts, v, f"{source} sglang:{stem} histogram", rk)


def window_quantile(state: MetricsState, stem: str, q: float, rank: str = "") -> float:
    """Quantile over the whole window: last scrape's buckets minus the first one's."""
    first = state.first_hists.get((stem, rank))
    last = state.hists.get((stem, rank))
    if first is None or last is None:
        return math.nan
    cur = last[1]
    diff = sorted((b, c - first.buckets.get(b, 0.0)) for b, c in cur.buckets.items())
    if cur.count < first.count:
        diff = sorted(cur.buckets.items())
    return histogram_quantile(q, diff)


def _version_hints(state: MetricsState) -> None:
    vr = state.version
    names = state.seen_names
    for name, low, high in VERSION_HINTS:
        if name in names or any(n.startswith(name + "_") for n in names if n.startswith(name)):
            if low:
                vr.at_least(low, f"metric sglang:{name}")
            if high:
                vr.at_most(high, f"metric sglang:{name}")


def version_from_labels(label_names: set[str], state: MetricsState) -> None:
    for label, low in LABEL_HINTS:
        if label in label_names:
            state.version.at_least(low, f"label {label}")


def looks_like_sglang(families: list[Any]) -> bool:
    return any(normalise(f.name) is not None for f in families)
