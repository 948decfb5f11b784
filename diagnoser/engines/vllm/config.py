"""vLLM configuration from its HTTP endpoints (docs/vllm.md#endpoints): ``/version`` (``{"version": X}``,
``vllm/entrypoints/openai/api_server.py``), ``/v1/models`` (the served model, ``max_model_len``,
``owned_by: "vllm"``) and, with ``VLLM_SERVER_DEV_MODE=1``, ``/server_info`` (``{"vllm_config": …}``).
Secrets are redacted by the caller before anything is stored."""

from __future__ import annotations

from typing import Any

from diagnoser.engines.vllm.versions import VersionRange, parse_version
from diagnoser.model import SignalSink

# vllm_config section.key → config fact (the names the rules share with SGLang where the meaning is the same)
SERVER_INFO_FACTS: tuple[tuple[str, str, str], ...] = (
    ("model_config", "max_model_len", "context_len"),
    ("model_config", "model", "model_path"),
    ("model_config", "served_model_name", "served_model_name"),
    ("model_config", "enforce_eager", "enforce_eager"),
    ("model_config", "quantization", "quantization"),
    ("cache_config", "block_size", "block_size"),
    ("cache_config", "gpu_memory_utilization", "gpu_memory_utilization"),
    ("cache_config", "num_gpu_blocks", "num_gpu_blocks"),
    ("cache_config", "num_gpu_blocks_override", "num_gpu_blocks_override"),
    ("cache_config", "cache_dtype", "kv_cache_dtype"),
    ("cache_config", "enable_prefix_caching", "enable_prefix_caching"),
    ("cache_config", "cpu_offload_gb", "cpu_offload_gb"),
    ("cache_config", "kv_cache_memory_bytes", "kv_cache_memory_bytes"),
    ("scheduler_config", "max_num_seqs", "max_running_requests"),
    ("scheduler_config", "max_num_batched_tokens", "max_num_batched_tokens"),
    ("scheduler_config", "enable_chunked_prefill", "enable_chunked_prefill"),
    ("parallel_config", "tensor_parallel_size", "tp_size"),
    ("parallel_config", "pipeline_parallel_size", "pp_size"),
    ("parallel_config", "data_parallel_size", "dp_size"),
)


def is_vllm_server_info(info: dict[str, Any]) -> bool:
    return isinstance(info.get("vllm_config"), dict | str) or "vllm_config_subset" in info


def facts_from_server_info(info: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
    cfg = info.get("vllm_config")
    if not isinstance(cfg, dict):
        cfg = info.get("vllm_config_subset")
    if not isinstance(cfg, dict):
        return
    for section, key, fact in SERVER_INFO_FACTS:
        sec = cfg.get(section)
        if isinstance(sec, dict) and sec.get(key) is not None:
            v = sec[key]
            if isinstance(v, list) and key == "served_model_name":
                v = v[0] if v else None
            if v is not None:
                sink.set_config(fact, v, f"{source} {section}.{key}")
    comp = cfg.get("compilation_config")
    if isinstance(comp, dict):
        sizes = comp.get("cudagraph_capture_sizes")
        if isinstance(sizes, list) and all(isinstance(x, int) for x in sizes):
            sink.set_config("cuda_graph_bs", sizes, f"{source} compilation_config.cudagraph_capture_sizes")
            if sizes:
                sink.set_config("cuda_graph_max_bs_captured", max(sizes), f"{source} compilation_config.cudagraph_capture_sizes")
    blocks, bs = cfg.get("cache_config", {}).get("num_gpu_blocks"), cfg.get("cache_config", {}).get("block_size")
    if isinstance(blocks, int) and isinstance(bs, int):
        sink.set_config("max_total_tokens", blocks * bs, f"{source} cache_config.num_gpu_blocks × block_size")


def facts_from_version(data: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
    v = data.get("version")
    if isinstance(v, str) and parse_version(v):
        sink.set_config("version", v, source)
        version.set_exact(parse_version(v), f"{source}")  # type: ignore[arg-type]
        engine_from_version(v, sink, source)


V1_ONLY_SINCE = (0, 11, 0)  # vllm/engine/llm_engine.py (the V0 engine) is in 0.10.2, gone from 0.11.0
NO_V1_BEFORE = (0, 6, 0)  # vllm/v1/ is absent in 0.4.3 (present, experimental and off by default, in 0.6.6)


def engine_from_version(text: str, sink: SignalSink, source: str) -> None:
    """``vllm_engine`` from the release alone, where it decides: V0 before vLLM had a V1 engine, V1 once
    V0 was removed. Between (0.6–0.10) ``VLLM_USE_V1`` chose, and the stats line or the metric names say which."""
    v = parse_version(text)
    if v is None:
        return
    if v >= V1_ONLY_SINCE:
        sink.set_config("vllm_engine", "V1", f"{source} (vLLM {text} has only the V1 engine)", override=False)
    elif v < NO_V1_BEFORE:
        sink.set_config("vllm_engine", "V0", f"{source} (vLLM {text} has no V1 engine)", override=False)


def facts_from_models(data: dict[str, Any], sink: SignalSink, source: str) -> None:
    models = data.get("data")
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        return
    m = models[0]
    if isinstance(m.get("id"), str):
        sink.set_config("served_model_name", m["id"], source, override=False)
    if isinstance(m.get("max_model_len"), int):
        sink.set_config("context_len", m["max_model_len"], f"{source} max_model_len", override=False)


def models_owner(data: Any) -> str | None:
    """``owned_by`` of the first model in a ``/v1/models`` answer (``vllm``, ``sglang``…)."""
    if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"] and isinstance(data["data"][0], dict):
        owner = data["data"][0].get("owned_by")
        return owner if isinstance(owner, str) else None
    return None
