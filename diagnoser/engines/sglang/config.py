"""SGLang configuration from ``/server_info`` (``/get_server_info``, ``/get_server_args``), ``/model_info``
and ``/v1/loads`` (docs/sglang.md#endpoints), normalised into config facts with their source. Secrets are redacted
before anything is stored."""

from __future__ import annotations

from typing import Any

from diagnoser.engines.sglang.versions import VersionRange, parse_version
from diagnoser.model import SignalSink
from diagnoser.redact import redact

# server-arg name → canonical config fact name (same name unless listed)
ARG_FACTS = (
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "mem_fraction_static",
    "context_length",
    "page_size",
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "enable_dp_attention",
    "attn_dp_size",
    "kv_cache_dtype",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_storage_backend",
    "hicache_write_policy",
    "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode",
    "cuda_graph_backend_decode",
    "disable_decode_cuda_graph",
    "cuda_graph_bs",
    "disable_cuda_graph",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "speculative_draft_kv_cache_dtype",
    "schedule_conservativeness",
    "schedule_policy",
    "disable_radix_cache",
    "enable_mixed_chunk",
    "max_total_tokens",
    "cpu_offload_gb",
    "model_path",
    "served_model_name",
    "decode_log_interval",
    "stream_interval",
    "disaggregation_mode",
    "swa_full_tokens_ratio",
    "device",
    "enable_metrics",
)


def facts_from_args(args: dict[str, Any], sink: SignalSink, source: str) -> None:
    args = redact(args)
    for k, v in args.items():
        sink.set_config(f"arg.{k}", v, source)
    for k in ARG_FACTS:
        if k in args and args[k] is not None:
            name = "context_len" if k == "context_length" else k
            sink.set_config(name, args[k], f"{source} {k}")


def derived_facts(args: dict[str, Any], sink: SignalSink, source: str) -> None:
    """Facts that need more than one argument: DP attention, CUDA-graph state, HiCache, speculative."""
    attn_dp = args.get("attn_dp_size")
    if args.get("enable_dp_attention") is not None or attn_dp is not None:
        on = bool(args.get("enable_dp_attention")) or (isinstance(attn_dp, int) and attn_dp > 1)
        why = "enable_dp_attention" if args.get("enable_dp_attention") else "attn_dp_size"
        sink.set_config("dp_attention", on, f"{source} {why}")
    cg = args.get("cuda_graph_config")
    dec = cg.get("decode") if isinstance(cg, dict) else None
    if isinstance(dec, dict):  # 0.5.14+: the resolved decode graph settings
        if dec.get("max_bs") is not None:
            sink.set_config("cuda_graph_max_bs", dec["max_bs"], f"{source} cuda_graph_config.decode.max_bs")
        if dec.get("backend") is not None:
            sink.set_config("cuda_graph_disabled", dec["backend"] == "disabled", f"{source} cuda_graph_config.decode.backend")
    elif args.get("cuda_graph_max_bs_decode") is not None:
        sink.set_config("cuda_graph_max_bs", args["cuda_graph_max_bs_decode"], f"{source} cuda_graph_max_bs_decode")
    if not isinstance(dec, dict) or dec.get("backend") is None:
        off = args.get("disable_cuda_graph")
        if off is not None:
            sink.set_config("cuda_graph_disabled", bool(off) or args.get("cuda_graph_backend_decode") == "disabled",
                            f"{source} disable_cuda_graph")
    if args.get("enable_hierarchical_cache") is not None:
        sink.set_config("hicache", bool(args["enable_hierarchical_cache"]), f"{source} enable_hierarchical_cache")
    if "speculative_algorithm" in args:
        sink.set_config("speculative", args["speculative_algorithm"] not in (None, "", "NONE"), f"{source} speculative_algorithm")


def facts_from_server_info(info: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
    info = redact(info)
    facts_from_args({k: v for k, v in info.items() if not isinstance(v, dict | list) or k == "cuda_graph_bs"}, sink, source)
    derived_facts(info, sink, source)
    v = parse_version(info.get("version"))
    if v:
        version.set_exact(v, f"{source} version")
        sink.set_config("version", info.get("version"), f"{source} version")
    sched = info.get("scheduler_info") or {}
    if isinstance(sched, dict) and sched.get("max_total_num_tokens"):
        sink.set_config("max_total_tokens", int(sched["max_total_num_tokens"]), f"{source} scheduler_info.max_total_num_tokens")
    if info.get("max_total_num_tokens"):
        sink.set_config("max_total_tokens", int(info["max_total_num_tokens"]), f"{source} max_total_num_tokens")
    states = info.get("internal_states") or []
    if isinstance(states, list) and states:
        st = states[0] if isinstance(states[0], dict) else {}
        effs = [s.get("effective_max_running_requests_per_dp") for s in states if isinstance(s, dict)]
        eff = st.get("effective_max_running_requests_per_dp")
        if eff:  # 0.5.8+: what the scheduler really admits, after clamps (docs/sglang.md#server-info)
            dp = len(states)
            total = sum(int(e) for e in effs if e)
            where = f"{source} internal_states[*].effective_max_running_requests_per_dp"
            sink.set_config("max_running_requests", total, where if dp > 1 else where.replace("[*]", "[0]"))
            sink.set_config("max_running_requests_per_dp", int(eff), f"{source} internal_states[0].effective_max_running_requests_per_dp")
            sink.set_config("dp_ranks_reporting", dp, f"{source} internal_states")
        mem = st.get("memory_usage") or {}
        if isinstance(mem, dict):
            if mem.get("token_capacity"):
                sink.set_config("max_total_tokens", int(mem["token_capacity"]), f"{source} internal_states[0].memory_usage.token_capacity")
            if mem.get("weight") is not None:
                sink.set_config("weight_mem_gb", mem["weight"], f"{source} internal_states[0].memory_usage.weight")
            if mem.get("kvcache") is not None:
                sink.set_config("kv_cache_gb", mem["kvcache"], f"{source} internal_states[0].memory_usage.kvcache")
            if mem.get("startup_available") is not None:
                sink.set_config("available_gpu_mem_gb", mem["startup_available"], f"{source} internal_states[0].memory_usage.startup_available")
        if st.get("decode_cuda_graph_bs"):
            bs = st["decode_cuda_graph_bs"]
            if isinstance(bs, list) and bs:
                sink.set_config("cuda_graph_max_bs_captured", max(bs), f"{source} internal_states[0].decode_cuda_graph_bs")
        if st.get("avg_spec_accept_length"):
            sink.set_config("avg_spec_accept_length", st["avg_spec_accept_length"], f"{source} internal_states[0].avg_spec_accept_length")


def facts_from_model_info(info: dict[str, Any], sink: SignalSink, source: str) -> None:
    info = redact(info)
    for k in ("model_path", "served_model_name", "model_type", "architectures", "is_generation", "weight_version"):
        if info.get(k) is not None:
            sink.set_config(f"model.{k}", info[k], f"{source} {k}")


def facts_from_loads(data: dict[str, Any], sink: SignalSink, source: str) -> None:
    """``/v1/loads`` (0.5.8+, docs/sglang.md#loads): accelerator type and count, per-DP-rank capacity. Only fills
    what server info did not already give (``override=False``)."""
    data = redact(data)
    if data.get("accelerator"):
        sink.set_config("accelerator", data["accelerator"], f"{source} accelerator")
    if data.get("num_accelerators") is not None:
        sink.set_config("num_accelerators", data["num_accelerators"], f"{source} num_accelerators")
    loads = [x for x in data.get("loads") or [] if isinstance(x, dict)]
    if not loads:
        return
    mrr = [x.get("max_running_requests") for x in loads]
    if all(isinstance(v, int) and v > 0 for v in mrr):
        sink.set_config("max_running_requests", sum(mrr), f"{source} loads[*].max_running_requests", override=False)
    cap = loads[0].get("max_total_num_tokens")
    if isinstance(cap, int) and cap > 0:
        sink.set_config("max_total_tokens", cap, f"{source} loads[0].max_total_num_tokens", override=False)
    if data.get("version"):
        sink.set_config("version", data["version"], f"{source} version", override=False)


def facts_from_models(data: dict[str, Any], sink: SignalSink, source: str) -> None:
    """``/v1/models`` (OpenAI list; ``max_model_len`` in recent versions): the context length when server
    info leaves ``context_length`` null (it does when the model's own length is used)."""
    models = [m for m in data.get("data") or [] if isinstance(m, dict)]
    if models and isinstance(models[0].get("max_model_len"), int):
        sink.set_config("context_len", models[0]["max_model_len"], f"{source} data[0].max_model_len", override=False)

