"""``diagnose plan``: how many tokens and concurrent requests a model gets on a GPU, and with which flags,
before a server exists — or beside a server's own start-up numbers.

    diagnose plan --model-config config.json|DIR|org/name [--gpu H100 | --gpu-mem-gb G | --free-mem-gb F]
                  [--tp N] [--ep N] [--dp N] [--dp-attention] [--kv-cache-dtype …] [--mem-fraction-static F]
                  [--avg-tokens-per-request T] [--weights-gb W] [--max-total-tokens N] [--log server.log]
                  [--client-concurrency C] [--job-requests N] [--gen-throughput X --running R]
                  [--json-model-override-args JSON] [--sglang-version V] [--format text|json]

From the config alone: KV bytes per token and the weights per rank (:mod:`diagnoser.capacity.weights`).
With the GPU's memory: SGLang's pool formula at the given fraction or SGLang's own automatic one for that
GPU and version (:mod:`diagnoser.capacity.gpus`), the headroom for activations and graphs, the tokens and
the requests that fit, and the what-ifs side by side (fraction, fp8 KV, DP attention, TP). With ``--log``
(or ``--max-total-tokens``, the pool a server reported) the engine's numbers win and the estimate is shown
beside them with the difference. Memory sizes are GiB, as SGLang prints them ("GB" in its logs).

A size the weight count needs and the config lacks is not guessed: the plan stops and names it, with
``--weights-gb`` (the weights per rank) or ``--json-model-override-args`` (the size itself, as SGLang
takes it) to supply it; a size taken from an architecture's or transformers' default is listed first
among the notes. With no GPU memory given, such a gap leaves the weights out and says why.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any

from diagnoser.capacity.estimate import GRAPH_ESTIMATE_GIB, MemoryPlan, compare, fraction_from_engine
from diagnoser.capacity.eta import JobProgress
from diagnoser.capacity.gpus import AutoFraction, Gpu, auto_mem_fraction, find_gpu, gpu_help
from diagnoser.capacity.kvbytes import (
    GIB,
    CapacityInputError,
    ModelShape,
    apply_model_overrides,
    attention_weight_gib_per_rank,
    bytes_per_token,
    kv_dtype_bytes,
    kv_gib,
    load_model_config,
    model_shape,
    resolve_model_config,
    tokens_for_budget,
)
from diagnoser.capacity.pool import CUDA_CONTEXT_GIB, PoolFacts, pool_from_timeline, settle
from diagnoser.capacity.throughput import ThroughputModel, decode_points, fit, single_point
from diagnoser.capacity.weights import WeightEstimate, checkpoint_bytes, estimate_weights
from diagnoser.capacity.whatif import Planner, Scenario, Workload
from diagnoser.cli import UsageError
from diagnoser.jsonout import dumps
from diagnoser.outputs.term import columns

WIDTH = min(100, columns(default=100))  # the terminal's width (outputs/term), at most 100; 100 into a pipe


def _tw_wrap(text: str, width: int, **kw: object) -> list[str]:
    """textwrap.wrap between words only: a long word or path is never split (outputs/term's rule)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False, **kw)  # type: ignore[arg-type]


def _tw_fill(text: str, width: int, **kw: object) -> str:
    return "\n".join(_tw_wrap(text, width, **kw))
TP_STEPS = (1, 2, 4, 8, 16)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(f"{message}. See 'diagnose plan --help'.")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="diagnose plan", formatter_class=argparse.RawDescriptionHelpFormatter,
                description=_tw_fill("KV capacity, weights and what-ifs for SGLang (or vLLM, with --engine vllm) from a model config and a "
                                                     "GPU, no server needed.", WIDTH),
                epilog=_tw_fill(
                    "--gpu knows: " + gpu_help() + ". 'Usable' is what the driver reports as the device's total "
                    "(nvidia-smi memory.total; rocminfo on AMD), a little below the marketed figure, and what SGLang's "
                    f"automatic --mem-fraction-static reads; the free memory before weights is taken as {CUDA_CONTEXT_GIB} GiB "
                    "less (CUDA context, NCCL) unless --free-mem-gb or --log says.", WIDTH))
    p.add_argument("--model-config", help="the model's Hugging Face config.json, its directory, a Hugging Face cache entry "
                                          "(models--org--name) or org/name in the local cache; nothing is downloaded")
    p.add_argument("--gpu", default=None, help="the accelerator, e.g. H100, H200, H20, B200, A100-80GB, A100-40GB, L40S, MI300X "
                                               "(list below)")
    p.add_argument("--gpu-mem-gb", type=float, default=None, help="usable memory of one GPU, GiB (nvidia-smi memory.total / 1024)")
    p.add_argument("--free-mem-gb", type=float, default=None,
                   help="free memory of one GPU before weights load, GiB (the 'Load weight begin. avail mem' of a start-up)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default 1, or the log's)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (divides --tp; weights per rank stay the same)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size")
    p.add_argument("--dp-attention", action="store_true", default=None, help="DP attention is on (--enable-dp-attention / --attn-dp-size)")
    p.add_argument("--kv-cache-dtype", default=None, help="auto, bf16, fp16, fp8_e4m3, fp8_e5m2, fp4_e2m1")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None, help="default: SGLang's automatic value for the GPU and version")
    p.add_argument("--chunked-prefill-size", type=int, default=None, help="for the automatic fraction (default: SGLang's for the GPU)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="for the automatic fraction (default: SGLang's for the GPU)")
    p.add_argument("--max-total-tokens", type=int, default=None, help="the pool the server reported (max_total_num_tokens)")
    p.add_argument("--weights-gb", type=float, default=None, help="weights per GPU, GiB (the 'Load weight end … mem usage'); "
                                                                  "default: estimated from the config")
    p.add_argument("--json-model-override-args", default=None, metavar="JSON",
                   help="sizes to add to or change in the model config, as SGLang's flag of that name does, e.g. "
                        "'{\"moe_intermediate_size\": 2048}' (default: the log's server_args, if any)")
    p.add_argument("--host-mem-gb", type=float, default=None, help="host RAM, GiB (for HiCache)")
    p.add_argument("--avg-tokens-per-request", type=float, default=None, help="prompt + output tokens per request")
    p.add_argument("--avg-output-tokens", type=float, default=None, help="output tokens per request (for the ETA)")
    p.add_argument("--client-concurrency", type=int, default=None)
    p.add_argument("--job-requests", type=int, default=None)
    p.add_argument("--completed", type=int, default=0, help="requests of the job already done")
    p.add_argument("--gen-throughput", type=float, default=None, help="observed gen throughput, tok/s")
    p.add_argument("--running", type=float, default=None, help="observed running requests at that throughput")
    p.add_argument("--log", help="a server log: its pool, memory split and decode lines are used first")
    p.add_argument("--sglang-version", default=None, help="SGLang version for flag spellings and the automatic fraction "
                                                          "(default: the log's, else the newest known)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--engine", choices=("sglang", "vllm"), default=None,
                   help="the engine to plan for: sglang (default) or vllm (vLLM's own memory arithmetic and flags); "
                        "with --log, the log's engine")
    from diagnoser.cli.plan_vllm import add_arguments

    add_arguments(p)
    return p


VLLM_ONLY = ("gpu_memory_utilization", "kv_cache_memory_bytes", "block_size", "max_model_len", "pp", "num_gpu_blocks_override",
             "max_num_seqs", "activation_gb", "non_torch_gb", "enforce_eager", "cpu_offload_gb", "device", "vllm_version")


def _engine_of(args: argparse.Namespace) -> str:
    """--engine, else the --log's engine (a vLLM log plans as vLLM), else SGLang."""
    if args.engine:
        return str(args.engine)
    if args.log:
        from diagnoser.engines.detect import log_engine

        try:
            with open(args.log, "rb") as f:
                head = f.read(1 << 20)
        except OSError:
            return "sglang"  # the SGLang path names the unreadable file
        found = log_engine(head)
        if found:
            return found[0]
    return "sglang"


def auto_fraction(gpu_gib: float, tp: int) -> float:
    """SGLang's automatic mem_fraction_static for a GPU of ``gpu_gib`` at TP ``tp`` (newest known version)."""
    return auto_mem_fraction(gpu_gib * 1024, tp).fraction


class ConfigOnly(Exception):
    """No GPU memory was given: what the config alone says (KV bytes per token, weights per rank)."""

    def __init__(self, pool: PoolFacts, weights: WeightEstimate | None, weights_source: str, notes: list[str]) -> None:
        super().__init__("config only")
        self.pool, self.weights, self.weights_source, self.notes = pool, weights, weights_source, notes


NEEDS_MEMORY = ("pass --gpu NAME (see --help), --gpu-mem-gb G or --free-mem-gb F to size the pool, the headroom and the "
                "requests that fit; or --max-total-tokens N, the pool a server reported")


def config_only_document(c: ConfigOnly) -> dict[str, Any]:
    p, s, w = c.pool, c.pool.shape, c.weights
    assert s is not None
    return {
        "engine": "sglang",
        "model": {"arch": s.arch, "attention": s.attention, "layers": s.layers, "full_attention_layers": s.full_attention_layers},
        "bytes_per_token_per_rank": p.bpt, "bytes_per_token_per_rank_fp8": bytes_per_token(s, p.attention_tp, "fp8_e4m3"),
        "pool_tokens": None, "pool_tokens_per_rank": None, "pool_source": None, "max_concurrent_requests": None,
        "weights_bytes_per_rank": None if w is None else round(w.bytes_per_rank), "weights_source": c.weights_source,
        "weights_estimate": None if w is None else w.to_dict(), "memory": p.to_dict(), "scenarios": [],
        "notes": [NEEDS_MEMORY, *c.notes],
    }


def render_config_only(c: ConfigOnly) -> str:
    p, s, w = c.pool, c.pool.shape, c.weights
    assert s is not None and p.bpt
    arch = s.arch.replace("ForConditionalGeneration", "").replace("ForCausalLM", "")
    out = [f"diagnose plan · {arch} ({s.attention.upper()}, {s.full_attention_layers} KV layers) · TP {p.tp}"
           + (" dp-attention" if p.dp_attention else "") + f" · kv {p.kv_cache_dtype}"]
    text = f"KV {p.bpt:,.0f} B/token/rank"
    fp8 = bytes_per_token(s, p.attention_tp, "fp8_e4m3")
    if fp8 < p.bpt:
        text += f" ({fp8:,.0f} with --kv-cache-dtype fp8_e4m3)"
    if w is not None:
        text += f" · weights {w.gib_per_rank:.2f} GiB/rank ({c.weights_source})"
    out += _tw_wrap(text, WIDTH, subsequent_indent="  ")
    if w is not None:
        parts = " · ".join(f"{q.name} {q.per_rank * q.bytes_per_param / GIB:.2f}" for q in w.parts if q.params)
        out += _tw_wrap(f"by part, GiB/rank: {parts}", WIDTH, subsequent_indent="  ")
    out.append("")
    for n in [NEEDS_MEMORY, *c.notes][:MAX_TEXT_NOTES]:
        out += _tw_wrap(f"note: {n}", WIDTH, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(out) + "\n"


@dataclass(slots=True)
class Column:
    """One configuration of the side-by-side sizing table (per GPU rank unless named total)."""

    label: str
    change: str
    fraction: float | None
    weights_gib: float | None
    kv_gib: float | None
    headroom_gib: float | None
    tokens_per_rank: int | None
    pool_tokens: int | None
    requests: int | None
    fits: bool = True

    def to_dict(self) -> dict[str, Any]:
        r = (lambda v: None if v is None else round(v, 2))  # noqa: E731
        return {"label": self.label, "change": self.change, "mem_fraction_static": self.fraction, "weights_gib": r(self.weights_gib),
                "kv_gib": r(self.kv_gib), "headroom_gib": r(self.headroom_gib), "pool_tokens_per_rank": self.tokens_per_rank,
                "pool_tokens": self.pool_tokens, "max_concurrent_requests": self.requests, "fits": self.fits}


@dataclass(slots=True)
class Plan:
    planner: Planner
    notes: list[str]
    scenarios: list[Scenario] = field(default_factory=list)
    weights: WeightEstimate | None = None
    weights_bytes_per_rank: float | None = None
    weights_source: str = ""
    memory: MemoryPlan | None = None  # the estimate: the sizing itself offline, the comparison beside a log
    comparison: list[dict[str, Any]] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    gpu: Gpu | None = None
    auto: AutoFraction | None = None
    fraction_source: str = ""
    engine: bool = False  # the pool is the engine's (log or --max-total-tokens)
    requests_at: float | None = None  # tokens per request the requests row counts
    requests_basis: str = ""
    verdict: str = ""  # one sentence when the model does not fit
    tp_memory: dict[int, MemoryPlan] = field(default_factory=dict)  # the TP scenarios' sizing


def _version(args: argparse.Namespace, tl: Any) -> tuple[int, int, int] | None:
    if args.sglang_version:
        from diagnoser.engines.sglang.versions import parse_version

        version = parse_version(args.sglang_version)
        if version is None:
            raise UsageError(f"--sglang-version {args.sglang_version!r} is not a version; write it like 0.5.8")
        return version
    if tl is not None and tl.meta.get("version_best"):
        return tuple(tl.meta["version_best"])  # type: ignore[return-value]
    return None


def _gpu_mib(args: argparse.Namespace, gpu: Gpu | None, notes: list[str]) -> float | None:
    if args.gpu_mem_gb is not None:
        if gpu is not None:
            notes.append(f"--gpu-mem-gb {args.gpu_mem_gb:g} is used instead of the {gpu.name}'s {gpu.usable_gib:.1f} GiB")
        return args.gpu_mem_gb * 1024
    return None if gpu is None else float(gpu.usable_mib)


def _positive(args: argparse.Namespace) -> None:
    for name in ("tp", "ep", "dp", "page_size", "gpu_mem_gb", "free_mem_gb", "weights_gb", "max_total_tokens",
                 "avg_tokens_per_request", "chunked_prefill_size", "cuda_graph_max_bs"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive (got {v:g})")
    f = args.mem_fraction_static
    if f is not None and not 0 < f < 1:
        raise UsageError(f"--mem-fraction-static must be between 0 and 1 (got {f:g})")


def _estimate(cfg: dict[str, Any], pool: PoolFacts, ep: int, notes: list[str], needed: bool, supply: bool) -> WeightEstimate | None:
    try:
        return estimate_weights(cfg, pool.tp, ep, pool.attention_tp)
    except CapacityInputError as e:
        if needed:
            raise UsageError(str(e)) from None
        text = str(e) if supply else str(e).split("; ")[0]  # the weights come from elsewhere: no need to ask for them
        notes.insert(0, f"weights not estimated: {text}")
        return None


def _auto(pool: PoolFacts, gpu_mib: float | None, gpu: Gpu | None, version: Any, args: argparse.Namespace,
          tp: int | None = None) -> AutoFraction | None:
    if gpu_mib is None:
        return None
    mla = pool.shape is not None and pool.shape.attention == "mla"
    return auto_mem_fraction(gpu_mib, tp or pool.tp, version, chunked_prefill_size=args.chunked_prefill_size or pool.chunked_prefill_size,
                             cuda_graph_max_bs=args.cuda_graph_max_bs, attn_dp=pool.dp if pool.dp_attention else 1, mla=mla,
                             platform=gpu.platform if gpu is not None else "cuda", max_running_requests=pool.max_running_requests)


def build(args: argparse.Namespace) -> Plan:
    _positive(args)
    notes: list[str] = []
    shape: ModelShape | None = None
    cfg: dict[str, Any] | None = None
    cfg_path = None
    tl = None
    if args.log:
        from diagnoser.collect import collect_logs
        from diagnoser.engines import get_adapter

        col = collect_logs(get_adapter("sglang"), [args.log])
        tl = col.timelines[0]
        if not col.usable():
            raise UsageError(f"nothing usable was read from {args.log}; pass an SGLang server log")
    if args.model_config:
        try:
            cfg_path = resolve_model_config(args.model_config)
            cfg = load_model_config(cfg_path)
            overrides, src = args.json_model_override_args, "--json-model-override-args"
            if overrides is None and tl is not None and tl.cfg("arg.json_model_override_args") not in (None, "", "{}", {}):
                overrides, src = tl.cfg("arg.json_model_override_args"), "the log's json_model_override_args"
            if overrides is not None:
                cfg = apply_model_overrides(cfg, overrides)
                keys = sorted(apply_model_overrides({}, overrides))
                if keys:
                    notes.append(f"model config with {', '.join(keys)} from {src}")
            shape = model_shape(cfg)
        except CapacityInputError as e:
            raise UsageError(str(e)) from None
    elif args.json_model_override_args is not None:
        raise UsageError("--json-model-override-args changes the model config: pass --model-config too")
    gpu = None
    if args.gpu:
        try:
            gpu = find_gpu(args.gpu)
        except CapacityInputError as e:
            raise UsageError(str(e)) from None
    if tl is not None:
        pool = pool_from_timeline(tl, None)
        pool.shape = shape
        pool.bpt = None
    else:
        pool = PoolFacts(shape=shape)
    if shape is None and not (tl is not None and pool.kv_gib):
        raise UsageError("pass --model-config config.json (the model's Hugging Face config) to size the KV cache")
    if tl is not None and args.tp is None and tl.cfg("tp_size") is None:
        notes.append("the log does not show the server's --tp-size (no server_args line): TP 1 taken, SGLang's default; "
                     "pass --tp if it ran with more")
    for name, val in (("tp", args.tp), ("dp", args.dp), ("page_size", args.page_size), ("kv_cache_dtype", args.kv_cache_dtype),
                      ("mem_fraction", args.mem_fraction_static)):
        if val is not None:
            setattr(pool, name, val)
    if args.dp_attention:
        pool.dp_attention = True
    if args.dp_attention and not args.dp and pool.dp == 1:
        pool.dp = pool.tp
    if pool.dp_attention and pool.tp % max(1, pool.dp):
        raise UsageError(f"DP attention needs --dp ({pool.dp}) to divide --tp ({pool.tp})")
    pool.pools = max(1, pool.dp if (pool.dp_attention or pool.dp > 1) else 1)
    if args.host_mem_gb is not None:
        pool.host_mem_gib = args.host_mem_gb
    version = _version(args, tl)
    ep = args.ep or (int(tl.cfg("ep_size") or 1) if tl is not None else 1)
    fraction_source = "--mem-fraction-static" if args.mem_fraction_static is not None else (
        (tl.cfg_source("mem_fraction_static") or "the log") if pool.mem_fraction is not None else "")

    engine_pool = pool.pool_tokens is not None or args.max_total_tokens is not None
    engine_weights = pool.weights_gib
    plan = Plan(planner=None, notes=notes, gpu=gpu)  # type: ignore[arg-type]
    # the weights are needed to size the pool from a GPU's memory; from the config alone they are one more
    # figure, and a size the config lacks leaves them out with the reason (a note) instead of stopping
    memory_given = args.gpu is not None or args.gpu_mem_gb is not None or args.free_mem_gb is not None or tl is not None
    need_weights = memory_given and not engine_pool and args.weights_gb is None and engine_weights is None
    est = (_estimate(cfg, pool, ep, notes, need_weights, supply=args.weights_gb is None and engine_weights is None)
           if cfg is not None else None)
    plan.weights = est
    attn = est.part("attention") if est is not None and est.quantization else None
    if attn is not None:
        pool.attn_weight_bytes = attn.bytes_per_param
    if est is not None:
        ck = checkpoint_bytes(cfg_path)
        if ck is not None:
            d = est.bytes_total / ck[0] - 1
            notes.append(f"the checkpoint index says {ck[0] / 1e9:.2f} GB of tensors; the config estimate {est.bytes_total / 1e9:.2f} GB "
                         f"({d:+.1%}; MTP layers, if any, are in the checkpoint but not loaded)")

    # free memory before weights: the engine's, else --free-mem-gb, else the GPU less the CUDA context
    gpu_mib = _gpu_mib(args, gpu, notes)
    if pool.pre_gib is None:
        if args.free_mem_gb is not None:
            pool.pre_gib, pool.pre_source = args.free_mem_gb, "--free-mem-gb"
        elif gpu_mib is not None:
            pool.pre_gib = gpu_mib / 1024 - CUDA_CONTEXT_GIB
            what = f"--gpu-mem-gb {args.gpu_mem_gb:g}" if args.gpu_mem_gb is not None else f"the {gpu.name}'s {gpu_mib / 1024:.1f} GiB"  # type: ignore[union-attr]
            pool.pre_source = f"{what} − {CUDA_CONTEXT_GIB} GiB CUDA context (estimate)"
    if gpu_mib is None and args.free_mem_gb is not None:
        gpu_mib = (args.free_mem_gb + CUDA_CONTEXT_GIB) * 1024  # for the automatic fraction only
    # the fraction: given, the log's, recovered from the engine's memory lines, else SGLang's automatic one
    if pool.mem_fraction is None and tl is not None:
        f = fraction_from_engine(pool)
        if f is not None:
            pool.mem_fraction, fraction_source = f, "recovered from the engine's memory lines: 1 − (free after weights − KV) / free before"
    auto = None
    if pool.mem_fraction is None:
        auto = _auto(pool, gpu_mib, gpu, version, args)
        if auto is not None:
            pool.mem_fraction = auto.fraction
            fraction_source = f"SGLang's automatic value ({auto.era})"
            notes.append(auto.formula + ("" if args.gpu or args.gpu_mem_gb else f" (GPU taken as --free-mem-gb + {CUDA_CONTEXT_GIB} GiB)"))
    plan.auto, plan.fraction_source = auto, fraction_source

    if args.max_total_tokens is not None:
        pool.pool_tokens, pool.pool_source = args.max_total_tokens, "given with --max-total-tokens"
        pool.kv_gib = None
    # weights used for the sizing: --weights-gb, the engine's, else the estimate
    if args.weights_gb is not None:
        w_gib, w_src = args.weights_gb, "--weights-gb"
    elif engine_weights is not None:
        w_gib, w_src = engine_weights, f"engine: {tl.cfg_source('weight_mem_gb') or 'Load weight end … mem usage'}"  # type: ignore[union-attr]
    elif est is not None:
        w_gib, w_src = est.gib_per_rank, est.source()
    else:
        w_gib, w_src = None, ""
    plan.weights_source = w_src
    plan.weights_bytes_per_rank = None if w_gib is None else round(w_gib * GIB)
    if pool.pre_gib is not None and w_gib is not None and (args.weights_gb is not None or (not engine_pool and pool.after_weights_gib is None)):
        pool.weights_gib = w_gib
        pool.after_weights_gib = pool.pre_gib - w_gib
    settle(pool)
    if pool.bpt and pool.pool_tokens is None and pool.after_weights_gib is not None and pool.mem_fraction is not None:
        budget = pool.after_weights_gib - pool.pre_gib * (1 - pool.mem_fraction)  # type: ignore[operator]
        pool.pool_tokens = tokens_for_budget(budget, pool.bpt, pool.page_size)
        pool.pool_source = "SGLang's formula: (free before weights − weights) − (1 − f) × free before weights"
    if not engine_pool and pool.pool_tokens is not None:
        pool.pool_source = "SGLang's formula: (free before weights − weights) − (1 − f) × free before weights"
        pool.notes = [n for n in pool.notes if not n.startswith("pool size extrapolated")]
    if pool.pool_tokens is None and shape is not None and pool.bpt and not engine_pool and tl is None:
        first = [*(shape.assumed if shape is not None else ()), *(est.assumed if est is not None else ())]
        raise ConfigOnly(pool, est, w_src, list(dict.fromkeys(first + notes + (est.notes if est is not None else []))))
    if pool.pool_tokens is None:
        raise UsageError("cannot size the pool: pass --gpu NAME or --gpu-mem-gb G (or --free-mem-gb F), "
                         "or --max-total-tokens N (what the server reported)")
    if pool.kv_gib is None and pool.bpt:
        pool.kv_gib = kv_gib(pool.pool_tokens, pool.bpt)
    if pool.headroom_gib is None and pool.pre_gib is not None and pool.mem_fraction is not None:
        pool.headroom_gib = pool.pre_gib * (1 - pool.mem_fraction) - GRAPH_ESTIMATE_GIB
        pool.headroom_source = f"estimate: (1 − f) × free memory − {GRAPH_ESTIMATE_GIB} GiB for CUDA graphs and buffers"
        notes.append(f"headroom after the pool is estimated ({pool.headroom_source}); --log gives the server's own available_gpu_mem")
    notes.extend(pool.notes)
    notes.extend(shape.notes if shape is not None else ())
    if est is not None:
        notes.extend(est.notes)
    # what the config lacked and was taken for it: first, never under "more notes"
    notes[:] = list(dict.fromkeys([*(shape.assumed if shape is not None else ()), *(est.assumed if est is not None else ()), *notes]))

    # the estimate: the sizing itself offline; beside the engine's numbers otherwise
    plan.engine = engine_pool
    if pool.pre_gib is not None and pool.mem_fraction is not None and pool.bpt:
        if engine_pool and est is not None:
            plan.memory = MemoryPlan(pool.pre_gib, pool.mem_fraction, est.gib_per_rank, pool.bpt, pool.page_size, pool.pools,
                                     pool.pre_source, fraction_source, est.source())
            implied = None
            if pool.weights_gib is None and pool.kv_gib:
                implied = pool.pre_gib * pool.mem_fraction - pool.kv_gib  # SGLang's formula read backwards
                if implied > 0:
                    plan.weights_source = "implied by the pool: f × free before weights − KV size"
                    plan.weights_bytes_per_rank = round(implied * GIB)
                else:
                    implied = None
            plan.comparison = compare(pool, plan.memory, implied)
            engine_w = pool.weights_gib if pool.weights_gib is not None else implied
            if engine_w and abs(est.gib_per_rank / engine_w - 1) > 0.1:
                notes.insert(0, f"the config's weights ({est.gib_per_rank:.1f} GiB/rank) differ from the server's ({engine_w:.1f}) by "
                                f"{est.gib_per_rank / engine_w - 1:+.0%}: a quantization the config does not describe, another "
                                "dtype or other memory figures; the server's numbers are used")
        elif not engine_pool and w_gib is not None:
            plan.memory = MemoryPlan(pool.pre_gib, pool.mem_fraction, w_gib, pool.bpt, pool.page_size, pool.pools,
                                     pool.pre_source, fraction_source, w_src)
    work, model = _workload(args, tl, pool, notes)
    planner = Planner(pool, work, model, version)  # type: ignore[arg-type]
    plan.planner = planner
    _requests_basis(plan, args)
    plan.scenarios = planner.plan()
    if not engine_pool and plan.memory is not None and cfg is not None:
        plan.scenarios.extend(_tp_scenarios(plan, cfg, ep, gpu_mib, gpu, version, args))
    if not engine_pool and plan.memory is not None:
        _fit_verdict(plan)
    plan.columns = _columns(plan)
    emb = est.part("embedding") if est is not None else None
    if emb is not None and any(c.label.startswith("DP attn") for c in plan.columns):
        notes.append(f"DP attention also keeps the whole input embedding on every rank (SGLang splits it over the attention-TP "
                     f"group): about {emb.params * emb.bytes_per_param / GIB * (1 - 1 / pool.tp):.1f} GiB more per rank than "
                     "its column counts")
    return plan


def _requests_basis(plan: Plan, args: argparse.Namespace) -> None:
    p, w = plan.planner.pool, plan.planner.work
    if w.tokens_per_request:
        plan.requests_at, plan.requests_basis = w.tokens_per_request, f"at {w.tokens_per_request:,.0f} tokens per request"
    elif p.context_len or (p.shape is not None and p.shape.context_length):
        ctx = p.context_len or p.shape.context_length  # type: ignore[union-attr]
        plan.requests_at, plan.requests_basis = float(ctx), f"at the full context ({ctx:,} tokens; give --avg-tokens-per-request)"  # type: ignore[arg-type]


def _fit_verdict(plan: Plan) -> None:
    m, p = plan.memory, plan.planner.pool
    assert m is not None
    ctx = p.context_len or (p.shape.context_length if p.shape is not None else None)
    if not m.fits:
        need = m.fraction_for(max(ctx or 0, 1))
        tps = [s for s in plan.scenarios if s.flag == "--tp-size" and s.fits]
        fix = [f"--tp-size {tps[0].proposed}"] if tps else []
        if need < 0.95:
            fix.append(f"--mem-fraction-static ≥ {need:.2f} (with less headroom)")
        plan.verdict = (f"does not fit: {m.weights_gib:.1f} GiB of weights per rank leave no KV pool in "
                        f"{m.fraction:g} × {m.pre_gib:.1f} GiB" + (f"; try {' or '.join(fix)}" if fix else "; use more GPUs (TP) or a quantized checkpoint"))
    elif ctx and m.tokens_per_rank < ctx:
        plan.verdict = (f"fits, but the pool ({m.tokens_per_rank:,} tokens per rank) is smaller than one request at the full context "
                        f"({ctx:,}): lower --context-length or add memory")


def _tp_scenarios(plan: Plan, cfg: dict[str, Any], ep: int, gpu_mib: float | None, gpu: Gpu | None, version: Any,
                  args: argparse.Namespace) -> list[Scenario]:
    """The next TP size (or the smallest that fits when this one does not): weights and KV per rank
    re-sized from the config, SGLang's automatic fraction re-computed when the fraction was automatic."""
    p, m = plan.planner.pool, plan.memory
    assert m is not None and p.shape is not None
    if p.dp_attention or args.weights_gb is not None:
        return []
    bigger = [t for t in TP_STEPS if t > p.tp]
    if m.fits:
        bigger = bigger[:1]
    out: list[Scenario] = []
    for tp in bigger:
        e = ep if tp % ep == 0 else 1
        try:
            w = estimate_weights(cfg, tp, e, tp)
        except CapacityInputError:
            return []
        fraction = p.mem_fraction
        auto = None
        if plan.auto is not None:
            auto = _auto(p, gpu_mib, gpu, version, args, tp=tp)
            fraction = auto.fraction if auto else fraction
        bpt = bytes_per_token(p.shape, tp, p.kv_cache_dtype)
        mp = MemoryPlan(m.pre_gib, fraction, w.gib_per_rank, bpt, p.page_size, p.pools)  # type: ignore[arg-type]
        q = replace(p, tp=tp, mem_fraction=fraction, bpt=bpt, weights_gib=w.gib_per_rank, after_weights_gib=m.pre_gib - w.gib_per_rank,
                    pool_tokens=mp.tokens_per_rank, kv_gib=mp.kv_gib, headroom_gib=mp.headroom_gib, notes=[])
        work = replace(plan.planner.work, running=None, gen_tps=None, kv_bound=False, progress=JobProgress())
        sc = Planner(q, work, None, plan.planner.version).now()
        sc.change, sc.flag, sc.current, sc.proposed = f"--tp-size {p.tp} → {tp}", "--tp-size", p.tp, tp
        sc.lever, sc.gain, sc.confidence = True, None, "medium"
        sc.headroom_gib = mp.headroom_gib
        sc.fits = mp.fits
        sc.assumptions.insert(0, f"weights {w.gib_per_rank:.1f} GiB and {bpt:,.0f} KV B/token per rank at TP {tp} (from the config); "
                                 + (f"SGLang's automatic fraction at TP {tp} is {fraction}" if auto else f"fraction {fraction} kept"))
        sc.assumptions.append("throughput is not projected across a TP change (the step time changes)")
        if not mp.fits:
            sc.risks.append(f"{w.gib_per_rank:.1f} GiB of weights per rank still leave no KV pool")
        out = [sc]  # only the last one tried: the smallest that fits, or the largest when none does
        plan.tp_memory[tp] = mp
        if mp.fits:
            break
    return out


def _columns(plan: Plan) -> list[Column]:
    """The side-by-side sizing: now, then fraction / fp8 KV / DP attention / TP (those that apply)."""
    p = plan.planner.pool
    if p.pool_tokens is None or not p.bpt:
        return []
    w_now = None if plan.weights_bytes_per_rank is None else plan.weights_bytes_per_rank / GIB  # the weights the sizing uses
    at = plan.requests_at

    def req(total: int | None) -> int | None:
        return None if total is None or not at else int(total // at)

    cols = [Column("now", "current settings", p.mem_fraction, w_now, kv_gib(p.pool_tokens, p.bpt), p.headroom_gib,
                   p.pool_tokens, p.total_tokens, req(p.total_tokens), fits=p.pool_tokens > 0)]
    picked: dict[str, Scenario] = {}
    for s in plan.scenarios:
        kind = {"--mem-fraction-static": "fraction", "--kv-cache-dtype": "fp8 KV", "--tp-size": "TP"}.get(s.flag)
        if s.flag in ("--attn-dp-size", "--enable-dp-attention"):
            kind = "DP attn"
        if kind and kind not in picked and ((s.fits and not s.risky) or kind == "TP"):
            picked[kind] = s
    s_now = kv_dtype_bytes(p.kv_cache_dtype, p.shape.model_dtype_bytes if p.shape else 2.0)
    for kind in ("fraction", "fp8 KV", "DP attn", "TP"):
        s = picked.get(kind)
        if s is None:
            continue
        frac, w, bpt, head = p.mem_fraction, w_now, p.bpt, s.headroom_gib if s.headroom_gib is not None else p.headroom_gib
        label = kind
        if kind == "fraction":
            frac = float(s.proposed)
            label = f"f {frac:.2f}"
        elif kind == "fp8 KV":
            bpt = p.bpt * kv_dtype_bytes("fp8_e4m3") / s_now
        elif kind == "DP attn" and p.shape is not None and w is not None:
            dp = int(s.proposed) if not isinstance(s.proposed, bool) else p.tp
            wb = p.attn_weight_bytes
            w = w + attention_weight_gib_per_rank(p.shape, max(1, p.tp // dp), wb) - attention_weight_gib_per_rank(p.shape, p.attention_tp, wb)
            label = f"DP attn {dp}"
        elif kind == "TP":
            tp = int(s.proposed)
            label = f"TP {tp}"
            mp = plan.tp_memory[tp]
            bpt, frac, w = mp.bpt, mp.fraction, mp.weights_gib
        per_rank = s.pool_tokens_per_rank
        cols.append(Column(label, s.change, frac, w, None if per_rank is None else kv_gib(per_rank, bpt), head, per_rank,
                           s.pool_tokens, req(s.pool_tokens), fits=s.fits and bool(per_rank)))
    return cols


def _workload(args: argparse.Namespace, tl: Any, pool: PoolFacts, notes: list[str]) -> tuple[Workload, ThroughputModel | None]:
    w = Workload(client_concurrency=args.client_concurrency)
    model = None
    if tl is not None:
        from diagnoser.capacity.build import workload_from_timeline

        extras = {"client_concurrency": args.client_concurrency, "job_requests": args.job_requests,
                  "avg_tokens_per_request": args.avg_tokens_per_request}
        w = workload_from_timeline(tl, extras)
        model = fit(*decode_points(tl))
    if args.avg_tokens_per_request:
        w.tokens_per_request = w.tokens_per_request_p95 = args.avg_tokens_per_request
    if args.running is not None:
        w.running = args.running
        w.kv_bound = True
        notes.append("--running given: the pool is taken to be the limit, so the running batch grows with the pool")
    if args.gen_throughput is not None:
        w.gen_tps = args.gen_throughput
    if model is None and w.running and w.gen_tps:
        model = single_point(w.running, w.gen_tps)
    out_tokens = args.avg_output_tokens or w.output_tokens_per_request or args.avg_tokens_per_request
    if out_tokens and args.job_requests and not (args.avg_output_tokens or w.output_tokens_per_request):
        notes.append("output tokens per request taken as --avg-tokens-per-request (no --avg-output-tokens): the ETA is an upper bound")
    if args.job_requests:
        jp = w.progress if tl is not None else JobProgress(args.job_requests)
        jp.job_requests = args.job_requests
        if args.completed:
            jp.completed, jp.completed_source = args.completed, "--completed"
        if jp.rate_rps is None and w.gen_tps and out_tokens:
            jp.rate_rps = w.gen_tps / out_tokens
            jp.rate_source = f"{w.gen_tps:.0f} tok/s / {out_tokens:,.0f} output tokens per request"
        w.progress = jp
    return w, model


def document(plan: Plan) -> dict[str, Any]:
    planner = plan.planner
    p, w, now = planner.pool, planner.work, planner.now()
    g = plan.gpu
    return {
        "engine": "sglang",
        "model": None if p.shape is None else {"arch": p.shape.arch, "attention": p.shape.attention, "layers": p.shape.layers,
                                               "full_attention_layers": p.shape.full_attention_layers},
        "bytes_per_token_per_rank": p.bpt,
        "pool_tokens": p.total_tokens,
        "pool_tokens_per_rank": p.pool_tokens,
        "pool_source": p.pool_source,
        "max_concurrent_requests": now.max_concurrent_requests,
        "max_concurrent_requests_p95": now.max_concurrent_requests_p95,
        "projected_running": now.to_dict()["projected_running"],
        "gen_throughput_tps": now.to_dict()["projected_gen_throughput_tps"],
        "job_eta_hours": now.to_dict()["job_eta_hours"],
        "headroom_gib": None if p.headroom_gib is None else round(p.headroom_gib, 2),
        "weights_bytes_per_rank": plan.weights_bytes_per_rank,
        "weights_source": plan.weights_source,
        "weights_estimate": plan.weights.to_dict() if plan.weights is not None else None,
        "gpu": None if g is None else {"name": g.name, "marketed": g.marketed, "usable_gib": round(g.usable_gib, 2), "approx": g.approx},
        "mem_fraction_static": p.mem_fraction,
        "mem_fraction_source": plan.fraction_source,
        "auto_mem_fraction": None if plan.auto is None else {"fraction": plan.auto.fraction, "reserved_mib": round(plan.auto.reserved_mib),
                                                             "chunked_prefill_size": plan.auto.chunked_prefill_size,
                                                             "cuda_graph_max_bs": plan.auto.cuda_graph_max_bs,
                                                             "formula": plan.auto.formula, "versions": plan.auto.era},
        "estimate": plan.memory.to_dict() if plan.memory is not None else None,
        "engine_vs_estimate": plan.comparison,
        "fits": (p.pool_tokens or 0) > 0,
        "verdict": plan.verdict or None,
        "requests_basis": plan.requests_basis or None,
        "sizing": [c.to_dict() for c in plan.columns],
        "workload": {"tokens_per_request": w.tokens_per_request, "tokens_per_request_p95": w.tokens_per_request_p95,
                     "tokens_source": w.tokens_source or "--avg-tokens-per-request", "running": w.running, "gen_tps": w.gen_tps,
                     "kv_bound": w.kv_bound, "demand": w.demand, "client_concurrency": w.client_concurrency,
                     "completed": w.progress.completed, "rate_rps": w.progress.rate_rps, "rate_source": w.progress.rate_source},
        "memory": p.to_dict(),
        "throughput_model": planner.model.describe() if planner.model else None,
        "scenarios": [s.to_dict() for s in plan.scenarios],
        "notes": plan.notes,
    }


def _cell(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _eta(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h / 24:.1f} d" if h >= 48 else f"{h:.1f} h"


def _pct(d: float | None) -> str:
    return "-" if d is None else f"{d:+.1%}"


MAX_TEXT_NOTES = 6


def render(plan: Plan) -> str:
    planner = plan.planner
    p, now = planner.pool, planner.now()
    shape = p.shape
    head = "diagnose plan"
    if shape is not None:
        arch = shape.arch.replace("ForConditionalGeneration", "").replace("ForCausalLM", "")
        head += f" · {arch} ({shape.attention.upper()}, {shape.full_attention_layers} KV layers)"
    if plan.gpu is not None:
        head += f" · {plan.gpu.name}"
    head += f" · TP {p.tp}" + (f" DP {p.dp}" if p.dp > 1 else "") + (" dp-attention" if p.dp_attention else "")
    head += f" · kv {p.kv_cache_dtype}" + (f" · mem-fraction {p.mem_fraction}" if p.mem_fraction is not None else "")
    second = (f"KV {p.bpt:,.0f} B/token/rank · pool {p.total_tokens:,} tokens ({p.pool_source})"
              + (f" · headroom {p.headroom_gib:.1f} GiB" if p.headroom_gib is not None else ""))
    third = []
    if plan.weights_bytes_per_rank is not None:
        third.append(f"weights {plan.weights_bytes_per_rank / GIB:.2f} GiB/rank ({plan.weights_source})")
    if p.pre_gib is not None:
        third.append(f"free before weights {p.pre_gib:.2f} GiB ({p.pre_source or 'estimate'})")
    if plan.fraction_source:
        third.append(f"fraction {p.mem_fraction} ({plan.fraction_source})")
    out = _tw_wrap(head, WIDTH, subsequent_indent="  ") + _tw_wrap(second, WIDTH, subsequent_indent="  ")
    if third:
        out += _tw_wrap(" · ".join(third), WIDTH, subsequent_indent="  ")
    if plan.verdict:
        out += _tw_wrap("! " + plan.verdict, WIDTH, subsequent_indent="  ")
    out.append("")
    if plan.comparison:
        hdr = f"{'engine vs estimate':<22}{'engine':>12}{'estimate':>12}{'diff':>9}"
        out += [hdr, "-" * len(hdr)]
        for r in plan.comparison:
            nd = "{:,.0f}" if "tokens" in r["what"] else "{:,.2f}"
            out.append(f"{r['what']:<22}{_cell(r['engine'], nd):>12}{_cell(r['estimate'], nd):>12}{_pct(r['difference']):>9}")
        out.append("")
    if plan.columns:
        cols = plan.columns
        hdr = f"{'per GPU rank':<24}" + "".join(f"{c.label + (' ✗' if not c.fits else ''):>12}" for c in cols)
        out += [hdr, "-" * len(hdr)]
        rows = [("mem fraction", [c.fraction for c in cols], "{:.3f}"), ("weights GiB", [c.weights_gib for c in cols], "{:,.2f}"),
                ("KV pool GiB", [c.kv_gib for c in cols], "{:,.1f}"), ("headroom GiB", [c.headroom_gib for c in cols], "{:,.1f}"),
                ("pool tokens", [c.tokens_per_rank for c in cols], "{:,.0f}")]
        if p.pools > 1 or any(c.pool_tokens != c.tokens_per_rank for c in cols):
            rows.append(("pool tokens, all ranks", [c.pool_tokens for c in cols], "{:,.0f}"))
        if plan.requests_at:
            rows.append((f"requests @ {plan.requests_at:,.0f} tok", [c.requests for c in cols], "{:,.0f}"))
        for name, vals, fmt in rows:
            out.append(f"{name:<24}" + "".join(f"{_cell(v, fmt):>12}" for v in vals))
        out.append("")
    w = planner.work
    show_changes = not plan.columns or w.running is not None or w.gen_tps is not None or bool(w.progress.job_requests) or plan.engine
    rows_s: list[Scenario] = [now, *plan.scenarios]
    if show_changes:
        hdr = f"{'change':<42} {'pool tok':>9} {'max req':>7} {'running':>7} {'gen tok/s':>9} {'ETA':>7} {'conf':>6}"
        out += [hdr, "-" * len(hdr)]
        for i, s in enumerate(rows_s):
            label = s.change if i == 0 else f"{i}. {s.change}"
            if s.extra_flags:
                label += " (+)"
            if not s.fits:
                label += " ✗"
            if len(label) > 42:
                label = label[:41] + "…"
            out.append(f"{label:<42} {_cell(s.pool_tokens):>9} {_cell(s.max_concurrent_requests):>7} {_cell(s.projected_running):>7} "
                       f"{_cell(s.projected_gen_throughput_tps):>9} {_eta(s.job_eta_hours):>7} {s.confidence:>6}")
        out.append("")

    def line(first: str, text: str) -> None:
        out.extend(_tw_wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * len(first)))

    for i, s in enumerate(rows_s[1:], 1):
        tag = f"  {i}. " if show_changes else f"  {s.change}: "
        if s.extra_flags:
            line(tag, f"(+) together with {', '.join(s.extra_flags)}")
        for r in s.risks[:1]:
            line(tag, f"! {r}")
        if not s.risks and s.gain is None and s.assumptions and show_changes:
            line(tag, s.assumptions[0])
    if planner.model is not None:
        line("  ", f"throughput: {planner.model.describe()}")
    for n in plan.notes[:MAX_TEXT_NOTES]:
        line("  ", f"note: {n}")
    if len(plan.notes) > MAX_TEXT_NOTES:
        line("  ", f"({len(plan.notes) - MAX_TEXT_NOTES} more notes with --format json)")
    return "\n".join(out) + "\n"


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if _engine_of(args) == "vllm":
        from diagnoser.cli import plan_vllm

        if args.running is not None and args.gen_throughput is None or args.gen_throughput is not None and args.running is None:
            raise UsageError("--gen-throughput and --running go together (the throughput observed at that running batch)")
        vdoc = plan_vllm.build(args, argv)
        sys.stdout.write(dumps(vdoc, indent=2) + "\n" if args.format == "json" else plan_vllm.render(vdoc, WIDTH))
        return 0
    for name in VLLM_ONLY:
        if getattr(args, name) not in (None, False):
            raise UsageError(f"--{name.replace('_', '-')} is a vLLM option: add --engine vllm")
    if args.running is not None and args.gen_throughput is None or args.gen_throughput is not None and args.running is None:
        raise UsageError("--gen-throughput and --running go together (the throughput observed at that running batch)")
    try:
        plan = build(args)
    except CapacityInputError as e:
        raise UsageError(str(e)) from None
    except ConfigOnly as c:
        sys.stdout.write(dumps(config_only_document(c), indent=2) + "\n" if args.format == "json" else render_config_only(c))
        return 0
    if args.format == "json":
        sys.stdout.write(dumps(document(plan), indent=2) + "\n")
    else:
        sys.stdout.write(render(plan))
    return 0


__all__ = ["Column", "ConfigOnly", "Plan", "build", "build_parser", "document", "main", "render"]
