"""SGLang metric names → canonical signals, and what each name or label says about the version
(docs/sglang.md#labels for the labels, docs/sglang.md#signals for the inventory with added/removed releases). Data tables plus the version detector;
parsing and ingestion live in :mod:`diagnoser.engines.sglang.metrics`."""

from __future__ import annotations

from typing import Any

from diagnoser.engines.sglang.versions import VersionRange, fmt

# gauge (normalised name) → canonical signal
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
    "kv_available_tokens": "kv_available_tokens",
    "kv_evictable_tokens": "kv_evictable_tokens",
    "num_paused_reqs": "paused_reqs",
    "num_grammar_queue_reqs": "grammar_queue_reqs",
    # 2024 pre-release names (label `name`)
    "num_requests_running": "running_reqs",
    "num_requests_waiting": "queue_reqs",
    "new_seq": "prefill_new_seqs",
    "new_token": "prefill_new_tokens",
    "cached_token": "prefill_cached_tokens",
}
# gauges whose per-process (`pid`) series add up; every other gauge takes the max over duplicates
PID_SUMMED = {"num_retracted_reqs", "num_paused_reqs", "http_requests_active"}
# gauges that are configuration constants → config fact
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
# counter (exposed name, with _total) → (rate signal, running-total signal)
COUNTERS: dict[str, tuple[str | None, str | None]] = {
    "prompt_tokens_total": ("prompt_tps", None),
    "generation_tokens_total": ("output_tps", None),
    "num_requests_total": ("request_rate", "requests_completed"),
    "request_success_total": ("request_rate", "requests_completed"),  # pre-release
    "num_retracted_requests_total": (None, "retractions_total"),
    "num_aborted_requests_total": (None, "aborted_total"),
    "http_responses_total": (None, None),  # by endpoint and status_code (0.5.2x): POST responses → http_*_total (metrics.py)  # observability/metrics_collector.py at v0.5.23: aborts and queue-full rejections
    "realtime_tokens_total": (None, None),  # by mode → prefill tokens (below)
    "prefill_effective_tokens_total": (None, None),  # by mode → prefill tokens (below)
    "cuda_graph_passes_total": (None, None),  # by mode → prefill / decode forward passes (0.5.7+)
}
# histogram base name → signal stem
HISTOGRAMS: dict[str, str] = {
    "time_to_first_token_seconds": "ttft_seconds",
    "inter_token_latency_seconds": "itl_seconds",
    "time_per_output_token_seconds": "itl_seconds",  # <= 0.4.4 name
    "e2e_request_latency_seconds": "e2e_seconds",
    "queue_time_seconds": "queue_time_seconds",
    "queue_time_s": "queue_time_seconds",  # 0.5.2 only
    "waiting_request_latency_seconds": "queue_time_seconds",  # pre-release
}
HISTOGRAM_QUANTILES: dict[str, tuple[float, ...]] = {
    "ttft_seconds": (0.5, 0.95),
    "itl_seconds": (0.5, 0.95),
    "e2e_seconds": (0.95,),
    "queue_time_seconds": (0.95,),
}
# (sample name, low, high): version evidence from which names an exposition contains (docs/sglang.md#signals)
VERSION_HINTS: list[tuple[str, tuple[int, int, int] | None, tuple[int, int, int] | None]] = [
    ("num_requests_total", (0, 4, 2), None),
    ("spec_accept_length", (0, 4, 2), None),
    ("cached_tokens_total", (0, 4, 4), None),
    ("inter_token_latency_seconds_count", (0, 4, 4), None),
    ("time_per_output_token_seconds_count", None, (0, 4, 4)),
    ("avg_request_queue_latency", (0, 4, 6), (0, 5, 2)),
    ("num_grammar_queue_reqs", (0, 4, 7), None),
    ("num_prefill_infight_queue_reqs", (0, 4, 7), (0, 5, 1)),
    ("total_retracted_reqs", (0, 4, 10), (0, 5, 2)),
    ("num_retracted_reqs", (0, 5, 2), None),
    ("queue_time_s_count", (0, 5, 2), (0, 5, 2)),
    ("num_running_reqs_offline_batch", (0, 5, 2), (0, 5, 10)),
    ("queue_time_seconds_count", (0, 5, 3), None),
    ("is_cuda_graph", (0, 5, 4), None),
    ("max_total_num_tokens", (0, 5, 6), None),
    ("new_token_ratio", (0, 5, 6), None),
    ("num_retracted_requests_total", (0, 5, 7), None),
    ("realtime_tokens_total", (0, 5, 7), None),
    ("decode_sum_seq_lens", (0, 5, 7), None),
    ("gpu_execution_seconds_total", (0, 5, 7), (0, 5, 10)),
    ("full_token_usage", (0, 5, 10), None),
    ("kv_available_tokens", (0, 5, 11), None),
    ("context_len", (0, 5, 11), None),
    ("forward_execution_seconds_total", (0, 5, 11), None),
    ("swa_available_tokens", (0, 5, 12), None),
    ("spec_num_steps", (0, 5, 13), None),
    ("weight_memory_usage_gb", (0, 5, 17), None),
    ("startup_time_seconds", (0, 5, 17), None),
    ("prefill_effective_tokens_total", (0, 5, 18), None),
    ("scheduler_idle_seconds_total", (0, 5, 20), None),
    ("dp_attention_token_imbalance_ratio_count", (0, 5, 22), None),
    ("request_time_per_output_token_seconds_count", (0, 5, 22), None),
    ("prealloc_full_token_usage", (0, 5, 23), None),
    # more of the added/removed releases: they split the releases where flag spellings change
    ("swa_token_usage", (0, 5, 2), None),
    ("utilization", (0, 5, 2), None),
    ("num_paused_reqs", (0, 5, 2), None),
    ("num_prefill_inflight_queue_reqs", (0, 5, 2), None),
    ("time_to_first_token_seconds_offline_batch_count", (0, 5, 2), (0, 5, 2)),
    ("engine_startup_time", (0, 5, 2), (0, 5, 16)),
    ("engine_load_weights_time", (0, 5, 2), (0, 5, 16)),
    ("pending_prealloc_token_usage", (0, 5, 4), None),
    ("mamba_usage", (0, 5, 5), None),
    ("num_retractions_count", (0, 5, 5), (0, 5, 10)),
    ("evicted_tokens_total", (0, 5, 6), None),
    ("num_unique_running_routing_keys", (0, 5, 8), None),
    ("cache_config_info", (0, 5, 9), (0, 5, 10)),
    ("gpu_overlap_wait_seconds_total", (0, 5, 10), (0, 5, 10)),
    ("hicache_host_used_tokens", (0, 5, 10), None),
    ("num_prefill_prealloc_queue_reqs", (0, 4, 7), (0, 5, 11)),
    ("num_prefill_bootstrap_queue_reqs", (0, 5, 12), None),
    ("uncached_prompt_tokens_histogram_count", (0, 5, 12), None),
    ("spec_verify_calls_total", (0, 5, 13), None),
    ("spec_cap_length", (0, 5, 16), None),
    ("max_total_num_tokens_swa", (0, 5, 17), None),
    ("num_decode_host_receive_queue_reqs", (0, 5, 21), None),
    ("num_decode_deferred_kv_release_reqs", (0, 5, 22), None),
]
# label on a scheduler gauge → at least this version (docs/sglang.md#labels)
LABEL_HINTS: list[tuple[str, tuple[int, int, int]]] = [
    ("engine_type", (0, 4, 4)),
    ("tp_rank", (0, 4, 10)),
    ("moe_ep_rank", (0, 5, 7)),
    ("priority", (0, 5, 10)),
]
# default TTFT bucket bounds per release (docs/sglang.md#metrics-requests); overridable from 0.4.7, so a match is a hint
TTFT_BUCKETS: list[tuple[tuple[float, ...], tuple[int, int, int], tuple[int, int, int] | None]] = [
    ((0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 15, 20, 25, 30), (0, 3, 5), (0, 4, 1)),
    ((0.1, 0.25, 0.5, 0.75, 1, 2, 5, 10, 20, 40, 60, 80, 120, 160), (0, 4, 2), (0, 4, 3)),
    ((0.1, 0.3, 0.5, 0.7, 0.9, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160), (0, 4, 4), (0, 4, 4)),
    ((0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400), (0, 4, 5), None),
]
PRERELEASE_NAMES = {"num_requests_running", "num_requests_waiting", "new_seq", "new_token", "cached_token", "queue_req", "request_success_total"}
SCHEDULER_PROBE = ("num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "gen_throughput", "cache_hit_rate")



def catalogue_sample_names() -> frozenset[str]:
    """The sample names (without ``sglang:`` / ``sglang_``) of every metric any SGLang release defines,
    from the catalogue (diagnoser/engines/sglang/catalogue): a counter's ``…_total``, a histogram's or
    summary's ``_sum``/``_count``, a gauge's own name. Names a
    collector builds at run time (``{name}``) are not listed."""
    from diagnoser.engines.sglang import catalogue

    out: set[str] = set()
    for m in catalogue.metrics():
        name = m["name"]
        if not name.startswith("sglang:") or "{" in name:
            continue
        base = name[len("sglang:"):]
        if m["type"] == "counter":
            out.add(base if base.endswith("_total") else f"{base}_total")
        elif m["type"] in ("histogram", "summary"):
            # _sum and _count (rate and mean); the buckets of the histograms a signal maps are in HISTOGRAMS,
            # the others' buckets are most of a scrape's lines and are not read
            out.update((f"{base}_sum", f"{base}_count"))
        else:
            out.add(base)
    return frozenset(out)


# every sample name the fast path must read: mapped series, version evidence, and every metric SGLang's
# releases define (the catalogue), in both spellings (the fast path's regexes take ``sglang[:_]``)
_READ: frozenset[str] = frozenset(
    [*GAUGES, *CONFIG_GAUGES, *COUNTERS, "cached_tokens_total", "total_retracted_reqs"]
    + [f"{h}_bucket" for h in HISTOGRAMS]
    + [h[0] for h in VERSION_HINTS]
    + sorted(PRERELEASE_NAMES)
)
# the catalogue's names no table above maps: read and seen (MetricsState.seen_names, their values in
# MetricsState.other), not turned into signals, and never an "impossible value" (a NaN gauge of a
# feature that is off is what SGLang exports)
CATALOGUE_ONLY: frozenset[str] = catalogue_sample_names() - _READ
WANTED: frozenset[str] = _READ | CATALOGUE_ONLY


def detect_version(state: Any) -> VersionRange:
    """Narrow the version range from labels (the collector's structure) first, then metric names."""
    vr = VersionRange()
    if state.prerelease:
        vr.at_least((0, 3, 5), "pre-release metric names (label 'name'; PR #1853, never in a PyPI release)")
        vr.at_most((0, 3, 5), "pre-release metric names (label 'name'; PR #1853, never in a PyPI release)")
        state.version = vr
        return vr
    names = state.seen_names
    if names:
        vr.at_least((0, 3, 5), "sglang metrics exist (--enable-metrics, 0.3.5.post1+)")
    sched = state.sched_labels
    for label, low in LABEL_HINTS:
        if label in state.label_names:
            vr.at_least(low, f"label {label}")
    if "prefill" in state.engine_types or "decode" in state.engine_types:
        vr.at_least((0, 5, 7), "engine_type prefill/decode")
    if sched is not None:
        if "engine_type" not in sched:
            vr.at_most((0, 4, 3), "scheduler gauges carry no engine_type label")
        elif "tp_rank" not in sched:
            vr.at_most((0, 4, 9), "scheduler gauges carry no tp_rank label")
        elif "moe_ep_rank" not in sched:
            vr.at_most((0, 5, 6), "scheduler gauges carry no moe_ep_rank label")
    if state.ttft_bounds:
        for bounds, low, high in TTFT_BUCKETS:
            if state.ttft_bounds == bounds:
                what = "the default TTFT histogram buckets of " + (f"{fmt(low)}+" if high is None else f"{fmt(low)}–{fmt(high)}")
                vr.at_least(low, what)
                if high is not None:
                    vr.at_most(high, what)
    for name, low, high in VERSION_HINTS:
        if name in names:
            if low:
                vr.at_least(low, f"metric sglang:{name.removesuffix('_count')}")
            if high:
                vr.at_most(high, f"metric sglang:{name.removesuffix('_count')}")
    state.version = vr
    return vr


def version_from_labels(label_names: set[str], state: Any) -> None:
    state.label_names.update(label_names)
    detect_version(state)
