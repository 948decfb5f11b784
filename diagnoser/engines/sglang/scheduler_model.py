"""SGLang's scheduler and KV memory, as one model the rules, the capacity model and the checks share.

Every behaviour here is read from SGLang's own source at a release tag, named on the behaviour
(:data:`BEHAVIOURS`). v0.5.23 is the release the project's engine tests run; where a behaviour
changed, the releases that were read are named and the model is split by version range. The
boundaries between two releases that were read are not pinned: a version between them takes the
newer behaviour it is closest to, and says so.

What it encodes (``python/sglang/srt/...`` at the tag):

* **Pool** = min(profiled capacity, ``--max-total-tokens``): the profile is what memory holds at
  ``--mem-fraction-static``; a cap above it logs ``max_total_tokens=N is larger than the profiled value
  M`` and the profile is used (``mem_cache/kv_cache_configurator.py`` ``_apply_token_constraints`` at
  v0.5.23; ``model_executor/model_runner.py`` ``profile_max_num_token`` at v0.4.10 and v0.5.2). So while
  the cap binds, nothing that grows the profile (a larger fraction, FP8 KV, DP attention) grows the pool.
* **Admission** (``managers/schedule_policy.py`` ``PrefillAdder`` and ``mem_cache/prefill_budget.py``
  at v0.5.23): a new request needs its uncached prompt + min(max_new_tokens, 4096) + one page free
  beyond what the running requests still reserve, each min(max_new_tokens - generated, 4096) x
  new_token_ratio (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` = 4096); an ``ignore_eos`` request reserves
  at ratio 1.0 whatever the ratio (``1.0 if req.sampling_params.ignore_eos else self.new_token_ratio``,
  the same line at v0.4.10, v0.5.2, v0.5.10 and v0.5.23).
* **new_token_ratio** (``managers/scheduler_components/new_token_ratio_tracker.py`` and
  ``environ.py`` at v0.5.23; ``managers/scheduler.py`` at v0.4.10): initial = min(0.7 x
  ``--schedule-conservativeness``, 1.0); floor = initial x 0.14; it falls by (initial - floor) / 600
  each decode step without a retraction; a retraction sets it to min(1, (decoded + 20 x n) /
  (sum of max_new_tokens + 1)) over the running requests; an idle scheduler resets it to the initial
  value (``managers/scheduler.py`` ``update_running_batch`` and the idle path). Above 1/0.7 = 1.43
  the conservativeness changes neither the start, the floor nor the decay.
* **Prefill** (``managers/scheduler.py`` and ``schedule_policy.py`` at v0.5.23):
  ``--chunked-prefill-size`` <= 0 turns chunking off; a prompt longer than the chunk is computed in
  chunks of that size; ``--max-prefill-tokens`` is the token budget of one prefill batch, checked after a
  request is added, so the first request of a batch always gets its chunk.
* **max_running_requests** per DP worker (``mem_cache/kv_cache_configurator.py``
  ``resolve_max_num_reqs`` at v0.5.16, v0.5.20, v0.5.23; ``model_runner_kv_cache_mixin.py`` at v0.5.10;
  ``managers/tp_worker.py`` + ``model_runner.py`` at v0.4.10, v0.5.2): with the flag unset, min(clamp(pool
  / context_len x 512, 2048, 4096), pool // 2); with it set, requested // attention-DP size, then bounded
  by pool // 2 (0.5.16+), by the clamp above (0.5.10) or by nothing more (<= 0.5.2). A bound below the
  request logs ``max_running_requests was reduced from the requested A to B`` (0.5.23).
* **Graphs**: on CPU no CUDA graph is captured; only ``--enable-torch-compile`` captures CPU graphs, and
  the CUDA-graph flags are not read (``model_executor/model_runner_components/cuda_graph_setup.py`` at
  v0.5.23), so CUDA-graph advice is irrelevant there, as is FP8 KV.

:func:`vet` applies the model to one suggested change: ``ok``, ``noop`` (drop it, with the reason),
``capped`` (the same flag at the value SGLang would actually use) or ``rewrite`` (the flag that binds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagnoser.engines.sglang.versions import NEWEST_KNOWN, Version, fmt
from diagnoser.mechanism import OK, Verdict

TAG = "v0.5.23"

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (environ.py)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
SATURATING_CONSERVATIVENESS = 1.0 / INIT_NEW_TOKEN_RATIO  # 1.43: the ratio starts at its cap of 1.0 from here up
REQ_SLOTS_MIN, REQ_SLOTS_MAX = 2048, 4096  # the request-slot clamp (context-derived estimate)


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One behaviour of SGLang the model encodes, and where it is written."""

    key: str
    text: str
    source: str  # file (and function) at the release(s) read

    def cite(self) -> str:
        return f"{self.source}"


BEHAVIOURS: dict[str, Behaviour] = {b.key: b for b in (
    Behaviour("pool_min", "the KV pool is min(profiled capacity, --max-total-tokens); a cap above the profile is ignored",
              f"python/sglang/srt/mem_cache/kv_cache_configurator.py _apply_token_constraints at {TAG}"),
    Behaviour("profile", "the profiled capacity is what --mem-fraction-static leaves for KV after the weights, at the KV dtype's bytes per "
              "token: (free after the weights - free before them x (1 - fraction)) x 2^30 // bytes per token, the same at every release read",
              f"python/sglang/srt/mem_cache/kv_cache_configurator.py _profile_available_bytes at {TAG}; "
              "model_executor/model_runner_kv_cache_mixin.py profile_max_num_token at v0.5.10; "
              "model_executor/model_runner.py profile_max_num_token at v0.5.2 and v0.4.6"),
    Behaviour("admission", "a new request needs prompt + min(max_new_tokens, 4096) + a page beyond what running requests still reserve "
              "(min(max_new_tokens - generated, 4096) x new_token_ratio each)",
              f"python/sglang/srt/managers/schedule_policy.py PrefillAdder, mem_cache/prefill_budget.py at {TAG}"),
    Behaviour("ignore_eos", "an ignore_eos request reserves its remaining max_new_tokens at ratio 1.0, whatever new_token_ratio is",
              f"python/sglang/srt/managers/schedule_policy.py _get_running_request_total_token_offset at {TAG} (same at v0.4.10)"),
    Behaviour("ratio", "new_token_ratio starts at min(0.7 x --schedule-conservativeness, 1.0), falls linearly to 0.14 x that over 600 decode "
              "steps, jumps after a retraction to (decoded + 20 x retracted) / (sum of max_new_tokens + 1), and resets when idle",
              f"python/sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py, environ.py, managers/scheduler.py at {TAG}"),
    Behaviour("chunk", "--chunked-prefill-size <= 0 disables chunking; longer prompts are computed in chunks of that size; "
              "--max-prefill-tokens is one prefill batch's budget, checked after each request is added",
              f"python/sglang/srt/managers/scheduler.py, schedule_policy.py add_one_req / add_chunked_req / budget_state at {TAG}"),
    Behaviour("max_running", "max_running_requests per DP worker: unset = min(clamp(pool / context_len x 512, 2048, 4096), pool // 2); "
              "set = requested // attention-DP size bounded by pool // 2 (0.5.16+), by the clamp (0.5.10), by nothing (<= 0.5.2)",
              f"python/sglang/srt/mem_cache/kv_cache_configurator.py resolve_max_num_reqs at {TAG} and v0.5.16; "
              "model_executor/model_runner_kv_cache_mixin.py at v0.5.10; managers/tp_worker.py at v0.5.2"),
    Behaviour("graphs_cpu", "a CPU server captures no CUDA graph and reads no CUDA-graph flag; only --enable-torch-compile captures CPU graphs",
              f"python/sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py at {TAG}"),
    Behaviour("auto_fraction", "with --mem-fraction-static unset, fraction = (memory - reserved) / memory, reserved (MB) = 512 + "
              "1.5 x max(--chunked-prefill-size, 2048) (--max-prefill-tokens when chunking is off) + tp x pp / 8 x 1024 + the graph reserve; "
              "it can come out negative, and then no KV pool fits",
              f"python/sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings at {TAG}"),
    Behaviour("radix", "--disable-radix-cache frees each request's KV at its end, so no prefix is ever reused (#cached-token stays 0)",
              f"python/sglang/srt/mem_cache/radix_cache.py and schedule_policy.py at {TAG}"),
)}


def cite(*keys: str) -> str:
    return "; ".join(BEHAVIOURS[k].cite() for k in keys)


# -- the numbers -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RatioSchedule:
    """new_token_ratio for one --schedule-conservativeness."""

    conservativeness: float
    init: float
    floor: float
    decay_per_step: float

    @property
    def capped(self) -> bool:
        """The initial ratio sits at its cap of 1.0: a larger conservativeness changes nothing."""
        return self.init >= 1.0


def new_token_ratio(conservativeness: float) -> RatioSchedule:
    init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
    floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return RatioSchedule(conservativeness, init, floor, (init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS)


def ratio_after_retraction(decoded_tokens: float, max_new_tokens_total: float, retracted: int) -> float:
    """The ratio a retraction sets: (decoded + 20 x retracted) / (sum of max_new_tokens + 1), at most 1."""
    return min(1.0, (decoded_tokens + RETRACT_DECODE_STEPS * retracted) / (max_new_tokens_total + 1))


def reserved_tokens(max_new_tokens: float, generated: float, ratio: float, ignore_eos: bool = False) -> float:
    """What a running request still reserves for its future decode tokens at admission."""
    left = max(0.0, min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS))
    return left * (1.0 if ignore_eos else ratio)


def admission_need(prompt_tokens: float, max_new_tokens: float, page_size: int = 1) -> float:
    """Tokens a new request must find free beyond the running requests' reservations."""
    return prompt_tokens + min(max_new_tokens, CLIP_MAX_NEW_TOKENS) + page_size


def effective_pool(profiled: int | None, cap: int | None) -> tuple[int | None, str]:
    """(pool tokens, what binds: "max_total_tokens" | "memory" | "") = min(profiled, cap)."""
    if cap is None:
        return (profiled, "memory") if profiled is not None else (None, "")
    if profiled is None or cap <= profiled:
        return cap, "max_total_tokens"
    return profiled, "memory"


def _range(version: Version | None) -> str:
    v = version or NEWEST_KNOWN
    if v >= (0, 5, 16):
        return "pool"
    if v >= (0, 5, 3):
        return "clamp"
    return "none"


def request_slot_estimate(pool: int, context_len: int) -> int:
    return max(min(int(pool / max(1, context_len) * 512), REQ_SLOTS_MAX), REQ_SLOTS_MIN)


def effective_max_running_requests(requested: int | None, pool: int | None, context_len: int | None,
                                   version: Version | None = None, attn_dp: int = 1) -> tuple[int | None, str]:
    """(max_running_requests per DP worker, what bounds it: "flag" | "pool" | "context" | "").

    ``requested`` is the --max-running-requests value (None when unset)."""
    kind = _range(version)
    if requested is None:
        if pool is None:
            return None, ""
        est = request_slot_estimate(pool, context_len) if context_len else REQ_SLOTS_MAX
        half = pool // 2
        return (half, "pool") if half < est else (est, "context")
    per = max(1, requested // max(1, attn_dp))
    if kind == "pool" and pool is not None and pool // 2 < per:
        return pool // 2, "pool"
    if kind == "clamp" and pool is not None and context_len:
        est = request_slot_estimate(pool, context_len)
        if est < per:
            return est, "context"
    return per, "flag"


def prefill_chunk(chunked_prefill_size: int | None) -> int | None:
    """The chunk a long prompt is split into (None: chunking off)."""
    if chunked_prefill_size is None or chunked_prefill_size <= 0:
        return None
    return int(chunked_prefill_size)


DEFAULT_MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens default (server_args at v0.5.23)
CPU_DEFAULT_CHUNK = 4096  # the chunk handle_gpu_memory_settings picks when no GPU class applies (CPU)


def auto_mem_fraction(memory_mb: float, chunked_prefill_size: int | None, max_prefill_tokens: int | None = None,
                      tp: int = 1, pp: int = 1, graph_reserve_mb: float = 0.0) -> float:
    """SGLang's automatic --mem-fraction-static (unset) at v0.5.23: (memory - reserved) / memory, where
    reserved = 512 + 1.5 x activation tokens + tp x pp / 8 x 1024 + the graph reserve (MB), and the
    activation tokens are max(chunk, 2048), or max(--max-prefill-tokens, 2048) with chunking off (<= 0).
    It is negative when the reserve passes the memory (``--chunked-prefill-size -1`` on a small machine)."""
    chunk = CPU_DEFAULT_CHUNK if chunked_prefill_size is None else chunked_prefill_size
    act = max(chunk, 2048) if chunk > 0 else max(max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS, 2048)
    reserved = 512 + act * 1.5 + tp * pp / 8 * 1024 + graph_reserve_mb
    return round((memory_mb - reserved) / memory_mb, 3)


def profiled_pool_tokens(before_gib: float, after_gib: float, fraction: float, cell_bytes: float) -> int:
    """SGLang's profiled KV capacity in tokens (``profile_max_num_token``), 0 when nothing is left.

    rest = free memory after the weights - free memory before them x (1 - ``--mem-fraction-static``) (GiB,
    the ``Load weight begin/end. avail mem=`` figures); tokens = rest x 2^30 // bytes per token (K + V of
    every layer). The same at v0.4.6 and v0.5.2 (``model_executor/model_runner.py``), v0.5.10
    (``model_runner_kv_cache_mixin.py``) and v0.5.23 (``mem_cache/kv_cache_configurator.py``
    ``_profile_available_bytes``, which also subtracts a multimodal reservation and, when rest <= 0, stops
    with "Raise --mem-fraction-static above 1 - available/pre"; the older ones fail later on a pool <= 0)."""
    rest = after_gib - before_gib * (1.0 - fraction)
    if rest <= 0 or cell_bytes <= 0:
        return 0
    return int(rest * (1 << 30) // cell_bytes)


def least_fraction(before_gib: float, after_gib: float, tokens: float = 0.0, cell_bytes: float = 0.0) -> float:
    """The smallest ``--mem-fraction-static`` whose profiled pool holds ``tokens`` (0: any pool at all),
    by :func:`profiled_pool_tokens`' formula; above 1 when the weights leave too little."""
    return 1.0 - (after_gib - tokens * cell_bytes / (1 << 30)) / before_gib


# -- the server as the model sees it -----------------------------------------------------------------
def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0"):
        return v.strip().lower() in ("true", "1")
    if isinstance(v, int | float):
        return bool(v)
    return None


def args_known(cfg: Callable[[str], Any]) -> bool:
    """Whether the server's arguments were read (so an absent flag is unset, not unknown): :attr:`ServerState.args_known`."""
    return cfg("arg.model_path") is not None or cfg("arg.mem_fraction_static") is not None or cfg("arg.tp_size") is not None


@dataclass(slots=True)
class ServerState:
    """What the model knows about one server; None is "not in the inputs"."""

    version: Version | None = None
    args_known: bool = False  # the server args were read (so an absent flag is unset, not unknown)
    device: str | None = None  # "cpu", "cuda", … (None: not in the inputs)
    pool_tokens: int | None = None  # the pool SGLang allocated, per rank
    cap_tokens: int | None = None  # --max-total-tokens as given (args) or as logged
    profiled_tokens: int | None = None  # the profile, when the engine said it ("larger than the profiled value")
    mem_fraction: float | None = None
    weights_gib: float | None = None
    kv_gib: float | None = None
    free_after_gib: float | None = None  # free memory after the pool (available_gpu_mem / startup_available)
    conservativeness: float | None = None
    max_running_requests: int | None = None  # effective, per server
    max_running_requests_arg: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    context_len: int | None = None
    page_size: int = 1
    attn_dp: int = 1
    radix_cache: bool | None = None  # True: on, False: --disable-radix-cache
    hybrid_swa: bool | None = None
    ignore_eos: bool | None = None  # the workload's requests set ignore_eos (known only when told)
    prompt_tokens: float | None = None  # mean prompt length of the requests (uncached + cached)
    notes: list[str] = field(default_factory=list)

    @property
    def on_cpu(self) -> bool:
        return (self.device or "").lower() == "cpu"

    @classmethod
    def from_config(cls, cfg: Callable[[str], Any], version: Version | None = None) -> ServerState:
        """From config facts (the names the timeline keeps: ``max_total_tokens``, ``arg.*`` …)."""
        def arg(name: str) -> Any:
            return cfg(f"arg.{name}")

        s = cls(version=version)
        s.args_known = args_known(cfg)
        dev = cfg("device") or arg("device")
        s.device = str(dev).lower() if dev else None
        s.pool_tokens = _int(cfg("max_total_tokens")) or _int(cfg("kv_pool_tokens_log"))
        s.cap_tokens = _int(arg("max_total_tokens")) or _int(cfg("max_total_tokens_requested"))
        s.profiled_tokens = _int(cfg("max_total_tokens_profiled"))
        if s.profiled_tokens is None and s.cap_tokens and s.pool_tokens and s.pool_tokens < s.cap_tokens * 0.99:
            s.profiled_tokens = s.pool_tokens  # the pool is below the cap: memory sized it
        s.mem_fraction = _num(cfg("mem_fraction_static")) or _num(arg("mem_fraction_static"))
        s.weights_gib = _num(cfg("weight_mem_gb"))
        s.kv_gib = _num(cfg("kv_cache_gb"))
        s.free_after_gib = _num(cfg("available_gpu_mem_gb"))
        c = _num(cfg("schedule_conservativeness"))
        s.conservativeness = c if c is not None else _num(arg("schedule_conservativeness"))
        if s.conservativeness is None and s.args_known:
            s.conservativeness = 1.0
        s.max_running_requests = _int(cfg("max_running_requests"))
        s.max_running_requests_arg = _int(arg("max_running_requests"))
        s.chunked_prefill_size = _int(cfg("chunked_prefill_size")) if cfg("chunked_prefill_size") is not None else _int(arg("chunked_prefill_size"))
        s.max_prefill_tokens = _int(cfg("max_prefill_tokens")) or _int(arg("max_prefill_tokens"))
        s.context_len = _int(cfg("context_len"))
        s.page_size = _int(cfg("page_size")) or 1
        s.attn_dp = _int(cfg("attn_dp_size")) or 1
        if s.attn_dp <= 1 and _bool(cfg("enable_dp_attention")):
            s.attn_dp = _int(cfg("dp_size")) or 1
        dr = _bool(cfg("disable_radix_cache"))
        if dr is None:
            dr = _bool(arg("disable_radix_cache"))
        s.radix_cache = None if dr is None else not dr
        if _int(cfg("max_total_tokens_swa")):
            s.hybrid_swa = True
        return s

    # -- what binds the pool -------------------------------------------------------------------------
    def static_share(self) -> float | None:
        """(weights + KV) / (weights + KV + free after the pool): the share of the device the static
        allocation took. When memory sized the pool it is close to --mem-fraction-static."""
        if self.kv_gib is None or self.free_after_gib is None:
            return None
        w = self.weights_gib or 0.0
        total = w + self.kv_gib + self.free_after_gib
        return (w + self.kv_gib) / total if total > 0 else None

    def pool_pinned(self) -> tuple[bool | None, str]:
        """Whether --max-total-tokens (not memory) sizes the pool, and why: True / False / None (cannot tell)."""
        if self.cap_tokens:
            if self.profiled_tokens is not None and self.profiled_tokens < self.cap_tokens:
                return False, f"the engine's profile ({self.profiled_tokens:,} tokens) is below --max-total-tokens {self.cap_tokens:,}: memory sizes the pool"
            if self.pool_tokens is None or self.pool_tokens >= self.cap_tokens * 0.99:
                return True, f"--max-total-tokens {self.cap_tokens:,} sizes the pool (SGLang takes min(profile, cap))"
        if self.args_known and not self.cap_tokens:
            return False, "--max-total-tokens is not set: memory sizes the pool"
        share = self.static_share()
        if share is not None and self.pool_tokens:
            f = self.mem_fraction
            low = (f - 0.15) if f is not None else 0.3
            if share < low:
                what = "weights and KV take" if self.weights_gib else "the KV pool takes"
                unknown = "" if self.weights_gib else "; the weights' size is not in the inputs"
                return True, (f"{what} {_share(share)} of the memory ({_size((self.weights_gib or 0) + (self.kv_gib or 0))}, "
                              f"{self.free_after_gib:.1f} GiB free after the pool{unknown}), far below what --mem-fraction-static "
                              + (f"{f:g}" if f is not None else "(0.6 or more by default)")
                              + " gives: a --max-total-tokens cap, not memory, sizes the pool")
            if f is not None and share >= f - 0.1:
                what = "weights and KV take" if self.weights_gib else "the KV pool takes"
                return False, f"{what} {share:.0%} of the memory, about --mem-fraction-static {f:g}: memory sizes the pool"
        return None, ""


def _share(x: float) -> str:
    """A share of the memory as printed: ``8.7%``, ``under 0.1%`` (never ``0.0%``)."""
    return "under 0.1%" if x < 0.001 else f"{x:.1%}"


def _size(gib: float) -> str:
    """``1.90 GiB``, or ``12 MiB`` below 0.1 GiB (never ``0.00 GiB``)."""
    return f"{gib:.2f} GiB" if gib >= 0.1 else f"{gib * 1024:.0f} MiB" if gib * 1024 >= 1 else "under 1 MiB"


# -- the checks --------------------------------------------------------------------------------------
# Verdict and OK are the engine-neutral ones (diagnoser/mechanism.py): every engine's vet answers in them

_GRAPH_FLAGS = {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-bs", "--disable-cuda-graph",
                "--cuda-graph-backend-decode", "--cuda-graph-max-bs-prefill"}
_POOL_GROWERS = {"--mem-fraction-static", "--kv-cache-dtype", "--enable-dp-attention", "--attn-dp-size"}


def _next_pow2(n: float) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _up(current: Any, proposed: Any) -> bool | None:
    c, p = _num(current), _num(proposed)
    if c is None or p is None:
        return None
    return p > c


def vet(flag: str, current: Any, proposed: Any, state: ServerState) -> Verdict:
    """Whether SGLang's own code makes this change do anything, on this server."""
    if flag in _GRAPH_FLAGS and state.on_cpu:
        return Verdict("noop", "a CPU server runs no CUDA graph and does not read the CUDA-graph flags "
                       "(only --enable-torch-compile captures CPU graphs)", cites=cite("graphs_cpu"))
    if flag in _POOL_GROWERS:
        return _vet_pool_grower(flag, current, proposed, state)
    if flag == "--max-total-tokens":
        return _vet_cap(current, proposed, state)
    if flag == "--schedule-conservativeness":
        return _vet_conservativeness(current, proposed, state)
    if flag == "--max-running-requests":
        return _vet_max_running(current, proposed, state)
    if flag == "--chunked-prefill-size":
        return _vet_chunk(current, proposed, state)
    if flag == "--swa-full-tokens-ratio" and state.hybrid_swa is False:
        return Verdict("noop", "the model has no sliding-window KV pool, so the SWA/full split does not apply", cites=cite("pool_min"))
    if flag == "--context-length":
        return _vet_context(current, proposed, state)
    return OK


def _vet_pool_grower(flag: str, current: Any, proposed: Any, state: ServerState) -> Verdict:
    if flag == "--kv-cache-dtype" and state.on_cpu:
        return Verdict("noop", "FP8 KV is a GPU feature: a CPU server keeps its KV dtype", cites=cite("graphs_cpu"))
    if flag == "--mem-fraction-static" and _up(current, proposed) is False:
        return OK
    pinned, why = state.pool_pinned()
    if pinned:
        cap = state.cap_tokens or state.pool_tokens
        what = {"--mem-fraction-static": "a larger static fraction", "--kv-cache-dtype": "FP8 KV",
                }.get(flag, "DP attention")
        reason = (f"{what} grows the profiled capacity, but {why}, so the pool stays at {cap:,} tokens" if cap else
                  f"{what} grows the profiled capacity, but {why}")
        if cap:
            return Verdict("rewrite", reason, flag="--max-total-tokens", current=cap, proposed=_next_pow2(2 * cap), cites=cite("pool_min"))
        return Verdict("noop", reason, cites=cite("pool_min"))
    return OK


def _vet_cap(current: Any, proposed: Any, state: ServerState) -> Verdict:
    p = _int(proposed)
    prof = state.profiled_tokens
    if p is None or prof is None:
        return OK
    cur = _int(current) or state.cap_tokens
    if cur is not None and prof <= cur and _up(cur, p):
        return Verdict("rewrite", f"memory, not the cap, sizes the pool: SGLang's profile is {prof:,} tokens, below --max-total-tokens {cur:,}, "
                       "so a larger cap changes nothing; a larger --mem-fraction-static grows the profile",
                       flag="--mem-fraction-static", current=state.mem_fraction, proposed=None, cites=cite("pool_min", "profile"))
    if p > prof:
        return Verdict("capped", f"SGLang uses min(profile, cap): above the profiled {prof:,} tokens a larger cap is ignored",
                       flag="--max-total-tokens", current=cur, proposed=prof, cites=cite("pool_min"))
    return OK


def _vet_conservativeness(current: Any, proposed: Any, state: ServerState) -> Verdict:
    p = _num(proposed)
    c = _num(current)
    if c is None:
        c = state.conservativeness
    if p is None:
        return OK
    if state.ignore_eos:
        return Verdict("noop", "the requests set ignore_eos, and SGLang reserves an ignore_eos request's whole max_new_tokens "
                       "(ratio 1.0) whatever --schedule-conservativeness is", cites=cite("ignore_eos"))
    if c is None:
        return OK
    now, new = new_token_ratio(c), new_token_ratio(p)
    if abs(now.init - new.init) < 1e-9:
        return Verdict("noop", f"new_token_ratio starts at min(0.7 x conservativeness, 1.0) = {now.init:.2f} at {c:g} and at {p:g} alike "
                       f"(it reaches its cap of 1.0 at {SATURATING_CONSERVATIVENESS:.2f}; the floor and the decay follow the start), "
                       "so the change does nothing", cites=cite("ratio"))
    if p > c and new.capped and p > SATURATING_CONSERVATIVENESS + 0.005:
        smallest = math.ceil(SATURATING_CONSERVATIVENESS * 100) / 100
        return Verdict("capped", f"new_token_ratio is capped at 1.0, which {smallest:g} already reaches; a larger value does nothing more",
                       flag="--schedule-conservativeness", current=c, proposed=smallest, cites=cite("ratio"))
    return OK


def _vet_max_running(current: Any, proposed: Any, state: ServerState) -> Verdict:
    p = _int(proposed)
    if p is None or state.pool_tokens is None:
        return OK
    eff, bound = effective_max_running_requests(p, state.pool_tokens, state.context_len, state.version, state.attn_dp)
    if eff is None or bound == "flag":
        return OK
    now = state.max_running_requests
    per_now = None if now is None else now // max(1, state.attn_dp)
    if per_now is not None and eff <= per_now:
        what = "pool // 2" if bound == "pool" else "the context-length slot estimate"
        return Verdict("noop", f"SGLang bounds --max-running-requests by {what} = {eff:,} per worker "
                       f"({fmt(state.version or NEWEST_KNOWN)}), which the server already runs at: a larger value changes nothing",
                       cites=cite("max_running"))
    value = eff * max(1, state.attn_dp)
    return Verdict("capped", f"SGLang bounds --max-running-requests by {'pool // 2' if bound == 'pool' else 'the context-length slot estimate'} "
                   f"= {eff:,} per worker: a larger value runs as {value:,}", flag="--max-running-requests", current=current,
                   proposed=value, cites=cite("max_running"))


def _vet_chunk(current: Any, proposed: Any, state: ServerState) -> Verdict:
    cur = _int(current) if current is not None else state.chunked_prefill_size
    if not _up(cur, proposed):
        return OK
    chunk = prefill_chunk(cur)
    if cur is not None and chunk is None:
        return Verdict("noop", f"chunked prefill is off (--chunked-prefill-size {cur}): prompts are not split, so a chunk size changes nothing",
                       cites=cite("chunk"))
    if chunk is not None and state.prompt_tokens is not None and state.prompt_tokens <= chunk:
        return Verdict("noop", f"the prompts ({state.prompt_tokens:,.0f} tokens on average) already fit in one {chunk:,}-token chunk",
                       cites=cite("chunk"))
    return OK


def _vet_context(current: Any, proposed: Any, state: ServerState) -> Verdict:
    """A smaller --context-length raises the request slots only where the slot estimate bounds them (a
    larger one, to admit longer prompts, is not a slot lever)."""
    if state.max_running_requests_arg is None or not state.args_known or _up(current, proposed):
        return OK
    if _range(state.version) == "clamp":
        return OK
    bound = "pool // 2" if _range(state.version) == "pool" else "nothing but the flag"
    return Verdict("noop", f"--max-running-requests is set, and SGLang {fmt(state.version or NEWEST_KNOWN)} bounds a set value by {bound}, "
                   "not by the context length: a smaller --context-length adds no slot", cites=cite("max_running"))


__all__ = ["BEHAVIOURS", "Behaviour", "CLIP_MAX_NEW_TOKENS", "auto_mem_fraction", "least_fraction", "profiled_pool_tokens", "RatioSchedule", "ServerState", "Verdict", "admission_need", "cite",
           "effective_max_running_requests", "effective_pool", "new_token_ratio", "prefill_chunk", "ratio_after_retraction",
           "reserved_tokens", "vet"]
