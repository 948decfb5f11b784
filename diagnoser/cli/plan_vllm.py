"""``diagnose plan --engine vllm``: a vLLM server's KV cache, maximum concurrency, tok/s and job ETA, from a
model config, a GPU and vLLM's flags, or beside a vLLM start-up log's own numbers.

    diagnose plan --engine vllm --model-config config.json [--gpu H100 | --gpu-mem-gb G] [--tp N] [--pp N] [--dp N]
                  [--gpu-memory-utilization F | --kv-cache-memory-bytes B] [--kv-cache-dtype fp8] [--block-size N]
                  [--max-model-len L] [--num-gpu-blocks-override N] [--weights-gb W] [--activation-gb A]
                  [--device cpu] [--log server.log] [--vllm-version V] [--avg-tokens-per-request T]
                  [--client-concurrency C] [--max-num-seqs S] [--job-requests N] [--gen-throughput X --running R]

The arithmetic is vLLM's own (:mod:`diagnoser.engines.vllm.memory`, docs/vllm.md#memory). With ``--log``
the engine's numbers ("KV cache size: N tokens", "Maximum concurrency…", "Available KV cache memory",
"Overriding num_gpu_blocks…") are what the plan stands on, and the estimate from the config is set
beside them. The output has the shapes of the SGLang plan (text, or JSON with the same top-level keys)
plus ``engine: "vllm"`` and the ``kv_cache`` chain.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from diagnoser.capacity.kvbytes import (
    GIB,
    CapacityInputError,
    load_model_config,
    model_shape,
    resolve_model_config,
)
from diagnoser.capacity.throughput import ThroughputModel, decode_points, fit, single_point
from diagnoser.capacity.weights import estimate_weights
from diagnoser.cli import UsageError
from diagnoser.engines.vllm import memory as M

# non-KV memory when neither a log nor a flag says (per rank): stated as estimates in the notes
ACTIVATION_ESTIMATE_GIB = 1.0  # the profiling pass's activation peak at max_num_batched_tokens (a few hundred MiB to a few GiB)
NON_TORCH_ESTIMATE_GIB = 0.5  # NCCL buffers, CUDA-context growth after vLLM's start-up snapshot
CUDAGRAPH_ESTIMATE_GIB = 0.5  # profiled CUDA graphs (taken out of the budget from 0.21)

SGLANG_ONLY = {"mem_fraction_static": "--gpu-memory-utilization", "page_size": "--block-size",
               "max_total_tokens": "--num-gpu-blocks-override (or --log)", "dp_attention": None, "ep": None,
               "chunked_prefill_size": "--max-num-batched-tokens", "cuda_graph_max_bs": None,
               "json_model_override_args": None, "host_mem_gb": None, "sglang_version": "--vllm-version"}

_SIZE_RE = re.compile(r"^\s*([\d.]+)\s*([kmgt]?)(i?)b?\s*$", re.I)


def parse_bytes(text: str) -> int:
    """``--kv-cache-memory-bytes``: an integer, or with a suffix (1G = 10⁹, 1GiB = 2³⁰)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"--kv-cache-memory-bytes {text!r} is not a size; write it like 1073741824, 8GiB or 8G")
    n, unit, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    power = "kmgt".find(unit) + 1 if unit else 0
    return int(n * ((1024 if binary else 1000) ** power))


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM (with --engine vllm)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of the whole GPU for weights, activations and KV (default: vLLM's, 0.92 at 0.32, 0.9 before)")
    g.add_argument("--kv-cache-memory-bytes", default=None, help="the KV cache per GPU, bytes (8GiB, 8G…); the utilization is "
                                                                 "then not used (on CPU: VLLM_CPU_KVCACHE_SPACE GiB)")
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: vLLM's, 16 on GPU, 128 on CPU)")
    g.add_argument("--max-model-len", type=int, default=None, help="vLLM's --max-model-len (default: the log's, else the config's)")
    g.add_argument("--pp", type=int, default=None, help="pipeline-parallel size")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=None, help="the running-request cap (default: the log's)")
    g.add_argument("--activation-gb", type=float, default=None,
                   help=f"activation peak of vLLM's profiling pass per GPU, GiB (default {ACTIVATION_ESTIMATE_GIB:g}, an estimate)")
    g.add_argument("--non-torch-gb", type=float, default=None,
                   help=f"memory outside torch per GPU (NCCL…), GiB (default {NON_TORCH_ESTIMATE_GIB:g}, an estimate)")
    g.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs (their memory is not reserved)")
    g.add_argument("--cpu-offload-gb", type=float, default=None, help="weights kept in host memory per GPU (a slowdown, see docs)")
    g.add_argument("--device", choices=("cuda", "cpu"), default=None, help="cuda (default) or cpu (the vllm-cpu build)")
    g.add_argument("--vllm-version", default=None, help="vLLM version for its defaults and checks (default: the log's, else 0.32.0)")


def _reject_sglang_only(args: argparse.Namespace, argv: list[str]) -> None:
    for name, instead in SGLANG_ONLY.items():
        v = getattr(args, name, None)
        if v not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} is an SGLang option; with --engine vllm " + (f"use {instead}" if instead else "vLLM has none"))


def _positive(args: argparse.Namespace) -> None:
    for name in ("tp", "pp", "dp", "block_size", "max_model_len", "gpu_mem_gb", "free_mem_gb", "weights_gb", "num_gpu_blocks_override",
                 "max_num_seqs", "avg_tokens_per_request", "client_concurrency", "job_requests"):
        v = getattr(args, name, None)
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive (got {v:g})")
    for name in ("activation_gb", "non_torch_gb", "cpu_offload_gb"):
        v = getattr(args, name, None)
        if v is not None and v < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative (got {v:g})")
    u = args.gpu_memory_utilization
    if u is not None and not 0 < u <= 1:
        raise UsageError(f"--gpu-memory-utilization must be above 0 and at most 1 (got {u:g}), as vLLM checks")


def _version(args: argparse.Namespace, tl: Any, notes: list[str]) -> M.Version:
    from diagnoser.engines.vllm.versions import parse_version

    if args.vllm_version:
        v = parse_version(args.vllm_version)
        if v is None:
            raise UsageError(f"--vllm-version {args.vllm_version!r} is not a version; write it like 0.11.0")
        return v
    if tl is not None and tl.meta.get("version_best"):
        return tuple(tl.meta["version_best"])  # type: ignore[return-value]
    notes.append("vLLM version not given: 0.32.0's defaults and checks are used (pass --vllm-version)")
    return M.NEWEST


def _log(path: str) -> Any:
    from pathlib import Path

    from diagnoser.collect import collect_logs
    from diagnoser.engines import get_adapter

    if not Path(path).is_file():
        raise UsageError(f"{path} is not a readable file; pass the vLLM server's log")
    col = collect_logs(get_adapter("auto"), [path])
    if not col.timelines or not col.usable():
        raise UsageError(f"nothing usable was read from {path}; pass a vLLM server log")
    tl = col.timelines[0]
    if tl.engine != "vllm":
        raise UsageError(f"{path} is not a vLLM log (it reads as {tl.engine or 'no engine'}'s); "
                         "drop --engine vllm or pass the vLLM server's log")
    return tl


def build(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    _reject_sglang_only(args, argv or [])
    _positive(args)
    notes: list[str] = []
    tl = _log(args.log) if args.log else None
    facts = M.StartupFacts.from_config(tl.cfg, tl.cfg_source) if tl is not None else M.StartupFacts()
    version = _version(args, tl, notes)
    shape = cfg = None
    if args.model_config:
        try:
            path = resolve_model_config(args.model_config)
            cfg = load_model_config(path)
            shape = model_shape(cfg)
        except CapacityInputError as e:
            raise UsageError(str(e)) from None
        notes.extend(shape.assumed)
        if shape.hybrid:
            notes.append(f"{shape.full_attention_layers} of {shape.layers} layers are full attention: vLLM's hybrid allocator "
                         "sizes the groups on one page size, so the estimate counts the full-attention layers only")
    if shape is None and tl is None:
        raise UsageError("pass --model-config config.json (the model's Hugging Face config) to size the KV cache")
    device = args.device or facts.device or "cuda"
    tp = args.tp or facts.tp or 1
    pp = args.pp or facts.pp or 1
    dp = args.dp or facts.dp or 1
    cache_dtype = args.kv_cache_dtype or facts.cache_dtype or "auto"
    mla = shape is not None and shape.attention == "mla"
    block = args.block_size or facts.block_size or M.default_block_size(device, mla, version)
    mml = args.max_model_len or facts.max_model_len or (shape.context_length if shape is not None else None)
    if not mml:
        raise UsageError("pass --max-model-len L (or a --log that states it, or a model config with max_position_embeddings)")
    override = args.num_gpu_blocks_override if args.num_gpu_blocks_override is not None else (
        facts.num_blocks if facts.num_blocks_profiled is not None else None)
    # bytes per token: the config's formula, else what the engine's own budget and blocks imply
    try:
        bpt = M.bytes_per_token(shape, tp, cache_dtype, pp) if shape is not None else None
    except M.MemoryInputError as e:
        raise UsageError(str(e)) from None
    engine_bpt = facts.implied_bytes_per_token()
    bpt_source = "the model config (docs/vllm.md#memory)"
    if bpt is None:
        if engine_bpt is None:
            raise UsageError("pass --model-config config.json (the model's Hugging Face config) to size the KV cache")
        bpt, bpt_source = int(round(engine_bpt)), "the engine: Available KV cache memory / (blocks × block size)"
    elif engine_bpt and abs(engine_bpt / bpt - 1) > 0.02:
        notes.append(f"the engine's budget over its blocks implies {engine_bpt:,.0f} B/token, the config gives {bpt:,}")

    # the memory of one rank
    gpu = None
    if args.gpu:
        from diagnoser.capacity.gpus import find_gpu

        try:
            gpu = find_gpu(args.gpu)
        except CapacityInputError as e:
            raise UsageError(str(e)) from None
    total = args.gpu_mem_gb * GIB if args.gpu_mem_gb is not None else (gpu.usable_mib * 2**20 if gpu is not None else None)
    util = args.gpu_memory_utilization or facts.gpu_memory_utilization or M.default_gpu_memory_utilization(version)
    util_source = ("--gpu-memory-utilization" if args.gpu_memory_utilization else
                   facts.sources.get("gpu_memory_utilization", "") if facts.gpu_memory_utilization else "vLLM's default")
    kvmb = parse_bytes(args.kv_cache_memory_bytes) if args.kv_cache_memory_bytes is not None else facts.kv_cache_memory_bytes
    if kvmb is None and device == "cpu" and M.cpu_default_kv_bytes(version) and not facts.kv_tokens:
        kvmb = M.cpu_default_kv_bytes(version)
        notes.append(f"CPU at {'.'.join(map(str, version))}: VLLM_CPU_KVCACHE_SPACE unset gives {kvmb // 2**30} GiB of KV cache "
                     "(pass --kv-cache-memory-bytes for another)")
    elif kvmb is None and device == "cpu" and total is not None:
        notes.append("CPU: --gpu-mem-gb is taken as the NUMA node's memory; with VLLM_CPU_KVCACHE_SPACE unset vLLM gives the KV "
                     "cache the utilization of it less what the process holds (the weights and the rest, estimated)")
    weights_src = ""
    weights = 0.0
    if args.weights_gb is not None:
        weights, weights_src = args.weights_gb * GIB, "--weights-gb"
    elif facts.weights_bytes is not None:
        weights, weights_src = facts.weights_bytes, f"engine: {facts.sources.get('weights_bytes', 'Model loading took')}"
    elif cfg is not None:
        try:
            est = estimate_weights(cfg, tp, 1, tp)
            weights, weights_src = est.bytes_per_rank / pp, est.source() + (f", / PP {pp}" if pp > 1 else "")
        except CapacityInputError as e:
            if total is not None and not kvmb and not facts.available_kv_bytes:
                raise UsageError(str(e)) from None
            notes.append(f"weights not estimated: {str(e).split('; ')[0]}")
    eager = bool(args.enforce_eager) or device == "cpu"
    act = (args.activation_gb if args.activation_gb is not None else ACTIVATION_ESTIMATE_GIB) * GIB
    nontorch = (args.non_torch_gb if args.non_torch_gb is not None else NON_TORCH_ESTIMATE_GIB) * GIB
    graphs = 0.0 if eager else CUDAGRAPH_ESTIMATE_GIB * GIB
    offload = (args.cpu_offload_gb or 0.0) * GIB
    free = args.free_mem_gb * GIB if args.free_mem_gb is not None else None  # vLLM refuses when below the request
    mem = M.Memory(total, util, weights, act, nontorch, graphs, kvmb, free, offload)
    budget_given = total is not None or kvmb is not None  # sized from memory, not read back from the engine
    if facts.available_kv_bytes and total is not None and not kvmb:
        # the engine's budget: what its profiling left; the non-KV part is read back from it
        requested = math.ceil(total * util)
        rest = requested - facts.available_kv_bytes - max(0.0, weights - offload)
        mem.activation_bytes, mem.non_torch_bytes, mem.cudagraph_bytes = max(0.0, rest), 0.0, 0.0
        notes.append(f"non-KV memory besides the weights read back from the engine: {max(0.0, rest) / GIB:.2f} GiB "
                     "(requested − Available KV cache memory − weights)")
    elif total is not None and not kvmb:
        used = [f"activation peak {act / GIB:g} GiB" + ("" if args.activation_gb is not None else " (estimate; --activation-gb)"),
                f"non-torch {nontorch / GIB:g} GiB" + ("" if args.non_torch_gb is not None else " (estimate; --non-torch-gb)")]
        if graphs and version >= M.CUDAGRAPH_PROFILED_SINCE:
            used.append(f"CUDA graphs {graphs / GIB:g} GiB (estimate; --enforce-eager for none)")
        notes.append("the KV budget takes out " + ", ".join(used) + "; a vLLM log's 'Available KV cache memory' replaces them")
    if total is None and not kvmb:
        if facts.available_kv_bytes:
            mem.kv_cache_memory_bytes = facts.available_kv_bytes
            notes.append("the budget is the engine's 'Available KV cache memory' (no --gpu given: utilization what-ifs need it)")
        elif facts.kv_tokens:
            blocks = facts.num_blocks or math.ceil(facts.kv_tokens / block)
            mem.kv_cache_memory_bytes = blocks * block * bpt
            notes.append(f"the budget is read back from the engine's KV cache size ({facts.kv_tokens:,} tokens → {blocks:,} blocks "
                         f"× {block} × {bpt:,} B); pass --gpu or --kv-cache-memory-bytes to size other settings from memory")
        elif override is None:
            if device == "cpu":
                raise UsageError("on CPU pass --kv-cache-memory-bytes (VLLM_CPU_KVCACHE_SPACE GiB, e.g. 1GiB) or --gpu-mem-gb "
                                 "(the NUMA node's memory)")
            raise UsageError("pass --gpu NAME or --gpu-mem-gb G (or --kv-cache-memory-bytes B) to size the KV cache")
    if override is not None and total is None and not mem.kv_cache_memory_bytes:
        mem.kv_cache_memory_bytes = override * bpt * block  # only the blocks matter
    try:
        estimate = sizing = M.size(mem, bpt, block, mml, version, override, dp)
    except M.MemoryInputError as e:
        raise UsageError(str(e)) from None
    # the engine's numbers win: the budget is anchored on the blocks behind its KV cache size, so every
    # what-if moves the server's own figure (the estimate is kept for the comparison)
    engine_blocks = None if facts.kv_tokens is None else (
        facts.num_blocks if facts.num_blocks is not None and override is None else M.blocks_from_size(facts.kv_tokens, block, mml, version))
    if engine_blocks is not None and override is None and engine_blocks != sizing.blocks:
        target = engine_blocks * block * bpt
        have = M.kv_budget(mem, version).bytes
        if mem.kv_cache_memory_bytes:
            mem.kv_cache_memory_bytes = target
        else:
            mem.activation_bytes += have - target
        sizing = M.size(mem, bpt, block, mml, version, override, dp)
        notes.insert(0, f"the engine's KV cache size ({facts.kv_tokens:,} tokens, {engine_blocks:,} blocks) differs from the estimate "
                        f"({estimate.tokens:,}): the plan stands on the engine's, the budget taken as {target / M.GIB:.2f} GiB "
                        f"at {bpt:,} B/token")

    # the workload and the throughput
    max_seqs = args.max_num_seqs or (int(tl.cfg("max_running_requests")) if tl is not None and tl.cfg("max_running_requests") else None)
    if max_seqs is None:
        max_seqs = M.default_max_num_seqs(device, total, gpu.name if gpu is not None else "", tp * pp)
        if max_seqs is not None:
            notes.append(f"--max-num-seqs unset: vLLM's API-server default for this device, {max_seqs}, is the running cap")
    tokens_req = args.avg_tokens_per_request
    model: ThroughputModel | None = None
    obs_run = obs_tps = None
    kv_bound = False
    if tl is not None:
        from diagnoser.capacity.build import workload_from_timeline

        pts = decode_points(tl)
        model = fit(*pts)
        work = workload_from_timeline(tl, {"avg_tokens_per_request": tokens_req}, pts)
        obs_run, obs_tps, kv_bound = work.running, work.gen_tps, work.kv_bound
        if obs_run is not None and obs_run != obs_run:
            obs_run = None
    if args.running is not None and args.gen_throughput is not None:
        obs_run, obs_tps, kv_bound = args.running, args.gen_throughput, True
        model = single_point(args.running, args.gen_throughput)
        notes.append("--running given: the KV cache is taken to be the limit, so the running batch grows with it")

    def slots_of(s: M.KVSizing) -> int:
        if not s.start.ok or s.budget.error:
            return 0  # vLLM would not start
        per_req = tokens_req or s.max_model_len
        return s.total_tokens // max(1, int(math.ceil(per_req / s.block_size)) * s.block_size) if s.total_tokens else 0

    base_slots = slots_of(sizing)

    def project(s: M.KVSizing) -> dict[str, Any]:
        slots = slots_of(s)
        if not slots:
            kv_running, kv_name = 0.0, "the KV cache (vLLM would not start)"
        elif obs_run is not None:  # anchored on the server as observed; the KV cache moves it only when it was the limit
            kv_running = obs_run * slots / base_slots if kv_bound and base_slots else obs_run
            kv_name = "the KV cache" if kv_bound else "the observed load"
        else:
            kv_running, kv_name = float(slots), "the KV cache"
        limits = [(kv_name, kv_running)]
        if max_seqs:
            limits.append(("--max-num-seqs", float(max_seqs * s.dp)))
        if args.client_concurrency:
            limits.append(("the client's concurrency", float(args.client_concurrency)))
        limit, running = min(limits, key=lambda x: x[1])
        out: dict[str, Any] = {"max_concurrent_requests": slots, "projected_running": round(running, 1), "limit": limit,
                               "gen_tps": None, "gen_tps_range": None, "eta_hours": None}
        if model is not None and obs_run and obs_tps and running:
            upper = obs_tps * running / obs_run  # the step time held constant: the most it can give
            mid = model.tps(running) if model.projectable else None
            vals = [v for v in (min(obs_tps, upper), mid, upper) if v is not None]
            out["gen_tps"] = mid if mid is not None else upper
            out["gen_tps_range"] = [round(min(vals)), round(max(vals))]
            if args.job_requests and args.avg_output_tokens:
                done = args.completed or 0
                out["eta_hours"] = max(0, args.job_requests - done) * args.avg_output_tokens / max(1e-9, out["gen_tps"]) / 3600
        return out

    now = project(sizing)
    rows: list[dict[str, Any]] = [{"change": "now", "flag": "", "current": None, "proposed": None, **_row(sizing, now),
                                   "fits": sizing.start.ok and not sizing.budget.error,
                                   "assumptions": [], "risks": []}]
    prefix_or_chunked = True
    weights_at = None
    if cfg is not None and args.weights_gb is None and facts.weights_bytes is None:
        def weights_at(t: int) -> float:  # noqa: E306
            return estimate_weights(cfg, t, 1, t).bytes_per_rank / pp
    elif weights:
        def weights_at(t: int) -> float:  # noqa: E306
            return weights * tp / t  # the measured weights split further (replicated parts ignored)
    longest = None
    if tl is not None:
        from diagnoser.capacity.serverstate import prompt_tokens

        pt = prompt_tokens(tl)
        longest = int(pt) if pt else None
    wis = M.what_ifs(mem, shape, bpt, block, mml, tp=tp, pp=pp, cache_dtype=cache_dtype, version=version, device=device, dp=dp,
                     longest_request=tokens_req and int(tokens_req) or longest, weights_at_tp=weights_at,
                     prefix_or_chunked=prefix_or_chunked, override=override)
    for w in wis:
        if w.sizing is None:
            continue
        p = project(w.sizing)
        rows.append({"change": w.change, "flag": w.flag, "current": w.current, "proposed": w.proposed, **_row(w.sizing, p),
                     "fits": w.starts, "assumptions": [w.why, *w.assumptions],
                     "risks": ([] if w.starts else ["vLLM would not start: " + (w.sizing.budget.error or w.sizing.start.message)])
                     + list(w.risks)})
    if args.cpu_offload_gb:
        notes.insert(0, M.cpu_offload_cost(args.cpu_offload_gb)["text"])
    verdict = ""
    if sizing.budget.error:
        verdict = "vLLM would not start: " + sizing.budget.error
    elif not sizing.start.ok:
        verdict = "vLLM would not start: " + sizing.start.message
    comparison = []
    if facts.kv_tokens is not None:
        comparison.append(_cmp("KV cache tokens", facts.kv_tokens, estimate.tokens))
    if facts.concurrency is not None:
        comparison.append(_cmp(f"concurrency @ {mml:,}", facts.concurrency, round(estimate.concurrency, 2)))
    if facts.num_blocks_profiled is not None and budget_given and not facts.available_kv_bytes:
        est_blocks = M.num_blocks(M.kv_budget(mem, version).bytes, bpt, block)
        comparison.append(_cmp("blocks before override", facts.num_blocks_profiled, est_blocks))
    return {
        "engine": "vllm",
        "version": ".".join(map(str, version)),
        "model": None if shape is None else {"arch": shape.arch, "attention": shape.attention, "layers": shape.layers,
                                             "full_attention_layers": shape.full_attention_layers},
        "device": device, "tp": tp, "pp": pp, "dp": dp, "kv_cache_dtype": cache_dtype,
        "bytes_per_token_per_rank": bpt, "bytes_per_token_source": bpt_source,
        "pool_tokens": sizing.total_tokens, "pool_tokens_per_rank": sizing.tokens,
        "pool_source": ("engine: " + facts.sources.get("kv_tokens", "the log")) if facts.kv_tokens is not None else
                       "vLLM's arithmetic: blocks × block size (vllm/v1/core/kv_cache_utils.py)",
        "max_concurrency": round(sizing.concurrency, 2),
        "max_concurrent_requests": now["max_concurrent_requests"], "projected_running": now["projected_running"],
        "gen_throughput_tps": None if now["gen_tps"] is None else round(now["gen_tps"]),
        "gen_throughput_tps_range": now["gen_tps_range"], "job_eta_hours": None if now["eta_hours"] is None else round(now["eta_hours"], 3),
        "weights_bytes_per_rank": round(weights) if weights else None, "weights_source": weights_src,
        "gpu": None if gpu is None else {"name": gpu.name, "marketed": gpu.marketed, "usable_gib": round(gpu.usable_gib, 2)},
        "gpu_memory_utilization": None if kvmb else util, "gpu_memory_utilization_source": None if kvmb else util_source,
        "kv_cache": sizing.to_dict(),
        "memory": {"total_gib": None if total is None else round(total / GIB, 2),
                   "requested_gib": None if sizing.budget.requested_bytes is None else round(sizing.budget.requested_bytes / GIB, 2),
                   "non_kv_gib": None if sizing.budget.non_kv_bytes is None else round(sizing.budget.non_kv_bytes / GIB, 2),
                   "kv_budget_gib": round(sizing.budget.bytes / GIB, 3), "kv_budget_source": sizing.budget.source},
        "fits": sizing.start.ok and not sizing.budget.error, "verdict": verdict or None,
        "engine_vs_estimate": comparison,
        "requests_basis": f"at {tokens_req:,.0f} tokens per request" if tokens_req else f"at max_model_len ({mml:,} tokens)",
        "throughput_model": None if model is None else model.describe(),
        "scenarios": rows[1:], "now": rows[0], "notes": notes,
    }


def _row(s: M.KVSizing, p: dict[str, Any]) -> dict[str, Any]:
    return {"pool_tokens": s.total_tokens, "pool_tokens_per_rank": s.tokens, "num_blocks": s.blocks,
            "max_concurrency": round(s.concurrency, 2), "max_concurrent_requests": p["max_concurrent_requests"],
            "projected_running": p["projected_running"], "limit": p["limit"],
            "projected_gen_throughput_tps": None if p["gen_tps"] is None else round(p["gen_tps"]),
            "gen_throughput_tps_range": p["gen_tps_range"],
            "job_eta_hours": None if p["eta_hours"] is None else round(p["eta_hours"], 3)}


def _eta(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h / 24:.1f} d" if h >= 48 else f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def _cmp(what: str, engine: float, est: float) -> dict[str, Any]:
    return {"what": what, "engine": engine, "estimate": est, "difference": None if not engine else round(est / engine - 1, 4)}


def _cell(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(doc: dict[str, Any], width: int = 100) -> str:
    import textwrap

    def wrap(text: str, first: str = "", rest: str = "  ") -> list[str]:
        return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False)

    m = doc["model"]
    head = f"diagnose plan · vLLM {doc['version']}"
    if m is not None:
        arch = m["arch"].replace("ForConditionalGeneration", "").replace("ForCausalLM", "")
        head += f" · {arch} ({m['attention'].upper()}, {m['full_attention_layers']} KV layers)"
    if doc["gpu"]:
        head += f" · {doc['gpu']['name']}"
    elif doc["device"] == "cpu":
        head += " · CPU"
    head += f" · TP {doc['tp']}" + (f" PP {doc['pp']}" if doc["pp"] > 1 else "") + (f" DP {doc['dp']}" if doc["dp"] > 1 else "")
    head += f" · kv {doc['kv_cache_dtype']}" + (f" · gpu-memory-utilization {doc['gpu_memory_utilization']:g}"
                                                if doc["gpu_memory_utilization"] is not None and doc["device"] != "cpu" else "")
    kv = doc["kv_cache"]
    out = wrap(head)
    out += wrap(f"KV {doc['bytes_per_token_per_rank']:,} B/token/rank · budget {kv['kv_budget_gib']:.2f} GiB ({kv['kv_budget_source']}) · "
                f"{kv['num_blocks']:,} blocks of {kv['block_size']} · KV cache size {kv['kv_cache_tokens']:,} tokens · "
                f"maximum concurrency {kv['max_concurrency']:.2f}x for {kv['max_model_len']:,} tokens per request")
    if doc["weights_bytes_per_rank"]:
        wg = doc["weights_bytes_per_rank"] / GIB
        amount = f"{wg:.2f} GiB" if wg >= 0.1 else f"{wg * 1024:.1f} MiB"
        out += wrap(f"weights {amount}/rank ({doc['weights_source']})")
    if doc["verdict"]:
        out += wrap("! " + doc["verdict"])
    out.append("")
    if doc["engine_vs_estimate"]:
        hdr = f"{'engine vs estimate':<26}{'engine':>14}{'estimate':>14}{'diff':>9}"
        out += [hdr, "-" * len(hdr)]
        for r in doc["engine_vs_estimate"]:
            nd = "{:,.2f}" if "concurrency" in r["what"] else "{:,.0f}"
            d = "-" if r["difference"] is None else f"{r['difference']:+.1%}"
            out.append(f"{r['what']:<26}{_cell(r['engine'], nd):>14}{_cell(r['estimate'], nd):>14}{d:>9}")
        out.append("")
    hdr = f"{'change':<44} {'KV tok':>10} {'conc.':>8} {'running':>7} {'gen tok/s':>11} {'ETA':>7}"
    out += [hdr, "-" * len(hdr)]
    for i, r in enumerate([doc["now"], *doc["scenarios"]]):
        label = ("now" if i == 0 else f"{i}. {r['change']}") + ("" if r["fits"] else " ✗")
        rng = r["gen_throughput_tps_range"]
        tps = "-" if not rng else (f"{rng[0]:,}" if rng[0] == rng[1] else f"{rng[0]:,}–{rng[1]:,}")
        eta = _eta(r["job_eta_hours"])
        out.append(f"{label[:44]:<44} {_cell(r['pool_tokens']):>10} {r['max_concurrency']:>7.2f}x {_cell(r['projected_running']):>7} "
                   f"{tps:>11} {eta:>7}")
    out.append("")
    for i, r in enumerate(doc["scenarios"], 1):
        for t in ([r["risks"][0]] if r["risks"] else []) + r["assumptions"][:1]:
            out += wrap(t, f"  {i}. ", "     ")
    if doc["now"]["limit"]:
        out += wrap(f"running is bound by {doc['now']['limit']} ({doc['requests_basis']})", "  ")
    if doc["throughput_model"]:
        out += wrap(f"throughput: {doc['throughput_model']}", "  ")
    for n in doc["notes"][:6]:
        out += wrap(f"note: {n}", "  ")
    if len(doc["notes"]) > 6:
        out += wrap(f"({len(doc['notes']) - 6} more notes with --format json)", "  ")
    return "\n".join(out) + "\n"


__all__ = ["add_arguments", "build", "parse_bytes", "render"]
