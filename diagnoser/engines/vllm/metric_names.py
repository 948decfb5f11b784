"""vLLM metric names → canonical signals, and what each name says about the version (docs/vllm.md#metrics).

Names are read without their prefix (``vllm:x`` as served, ``vllm_x`` after a Prometheus or router hop).
Two engines export them:

* V0 (``vllm/engine/metrics.py``, 0.2.7 … 0.10.x): gauges ``num_requests_running`` / ``_waiting`` /
  ``_swapped``, ``gpu_cache_usage_perc`` (a 0–1 fraction despite the name), ``cpu_cache_usage_perc``
  (the swap space), ``gpu_prefix_cache_hit_rate`` (by 0.6.6), the deprecated throughput gauges
  ``avg_prompt_throughput_toks_per_s`` / ``avg_generation_throughput_toks_per_s`` (0.2.7–0.6.6), counters
  ``prompt_tokens_total``, ``generation_tokens_total``, ``request_success_total{finished_reason}``,
  ``num_preemptions_total`` (0.4+), histograms ``time_to_first_token_seconds``,
  ``time_per_output_token_seconds``, ``e2e_request_latency_seconds``, ``request_queue_time_seconds``.
* V1 (``vllm/v1/metrics/loggers.py``, in 0.8.5, not in 0.6.6): the same request gauges and counters with label ``engine``
  (the data-parallel engine index) beside ``model_name``; ``gpu_cache_usage_perc`` renamed
  ``kv_cache_usage_perc``; the prefix-cache counters ``gpu_prefix_cache_queries`` / ``_hits`` renamed
  ``prefix_cache_queries`` / ``_hits`` (tokens, not requests); ``inter_token_latency_seconds`` beside
  (later instead of) ``time_per_output_token_seconds``; ``cache_config_info`` (an info gauge whose labels
  are the cache configuration: ``block_size``, ``num_gpu_blocks``, ``gpu_memory_utilization``…).

Data tables only; parsing and ingestion live in :mod:`diagnoser.engines.vllm.metrics`.
"""

from __future__ import annotations

# gauge → canonical signal
GAUGES: dict[str, str] = {
    "num_requests_running": "running_reqs",
    "num_requests_waiting": "queue_reqs",
    "num_requests_swapped": "swapped_reqs",  # V0 only (swap preemption)
    "gpu_cache_usage_perc": "token_usage",  # V0, and V1 before the rename; a fraction 0–1
    "kv_cache_usage_perc": "token_usage",  # V1 after the rename
    "cpu_cache_usage_perc": "cpu_cache_usage",  # V0: the CPU swap space
    "gpu_prefix_cache_hit_rate": "cache_hit_rate",  # V0 (a fraction)
    "avg_prompt_throughput_toks_per_s": "prompt_tps",  # V0 deprecated gauges
    "avg_generation_throughput_toks_per_s": "gen_throughput_tps",
}
# counter (exposed name, with _total) → (rate signal, running-total signal)
COUNTERS: dict[str, tuple[str | None, str | None]] = {
    "prompt_tokens_total": ("prompt_tps", None),
    "generation_tokens_total": ("output_tps", None),
    "request_success_total": ("request_rate", "requests_completed"),
    "num_preemptions_total": (None, "retractions_total"),
    # prefix cache: tokens queried and hit (V1; renamed from gpu_prefix_cache_* in later releases)
    "prefix_cache_queries_total": (None, None),
    "prefix_cache_hits_total": (None, None),
    "gpu_prefix_cache_queries_total": (None, None),
    "gpu_prefix_cache_hits_total": (None, None),
}
# histogram base name → signal stem (the same stems SGLang's adapter uses)
HISTOGRAMS: dict[str, str] = {
    "time_to_first_token_seconds": "ttft_seconds",
    "inter_token_latency_seconds": "itl_seconds",
    "time_per_output_token_seconds": "itl_seconds",  # the older name (kept as an alias for a while)
    "e2e_request_latency_seconds": "e2e_seconds",
    "request_queue_time_seconds": "queue_time_seconds",
}
HISTOGRAM_QUANTILES: dict[str, tuple[float, ...]] = {
    "ttft_seconds": (0.5, 0.95),
    "itl_seconds": (0.5, 0.95),
    "e2e_seconds": (0.95,),
    "queue_time_seconds": (0.95,),
}
# cache_config_info label → config fact
CACHE_INFO_FACTS: dict[str, str] = {
    "block_size": "block_size",
    "num_gpu_blocks": "num_gpu_blocks",
    "num_cpu_blocks": "num_cpu_blocks",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching",
    "kv_cache_size_tokens": "kv_pool_tokens",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "kv_cache_max_concurrency": "kv_max_concurrency",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "swap_space": "swap_space_gb",
}
# (sample name, first release with it, last release with it): version evidence from names alone
VERSION_HINTS: list[tuple[str, tuple[int, int, int] | None, tuple[int, int, int] | None]] = [
    # from the catalogue of vllm/engine/metrics.py and vllm/v1/metrics/loggers.py at 0.2.7, 0.4.3, 0.6.6,
    # 0.8.5, 0.10.2, 0.11.0 and 0.32.0 (scripts/vllm_catalogue.py; tests/data/vllm/catalogue.json): a bound
    # is just past the last checked release that lacks the name, or just before the first one that lacks it
    ("num_requests_swapped", None, (0, 10, 1)),  # V0 only: in 0.8.5, not in 0.10.2
    ("avg_prompt_throughput_toks_per_s", None, (0, 8, 4)),  # in 0.6.6's V0 metrics, gone by 0.8.5
    ("gpu_prefix_cache_hit_rate", (0, 4, 4), (0, 10, 1)),  # not in 0.4.3, in 0.6.6 and 0.8.5, not in 0.10.2
    ("num_preemptions_total", (0, 2, 8), None),  # in 0.4.3, not in 0.2.7
    ("prompt_tokens_total", (0, 2, 8), None),  # 0.2.7 exports gauges only
    ("inter_token_latency_seconds_count", (0, 8, 6), None),  # in 0.10.2, not in 0.8.5
    ("kv_cache_usage_perc", (0, 8, 6), None),  # in 0.10.2 (beside the old name), not in 0.8.5
    ("prefix_cache_queries_total", (0, 8, 6), None),  # in 0.10.2, not in 0.8.5 (gpu_prefix_cache_queries then)
]
# every sample name the reader keeps (others are skipped)
WANTED: frozenset[str] = frozenset(
    [*GAUGES, *COUNTERS, "cache_config_info", "num_requests_waiting_by_reason"]
    + [f"{h}_bucket" for h in HISTOGRAMS]
    + [h[0] for h in VERSION_HINTS]
)
