"""``diagnose plan``: the capacity calculator offline (reference §5), from a model config and a few numbers.

    diagnose plan --model-config config.json --tp 8 [--dp N] [--dp-attention] [--kv-cache-dtype …]
                  [--mem-fraction-static F] [--max-total-tokens N] [--gpu-mem-gb G] [--host-mem-gb H]
                  [--avg-tokens-per-request T] [--client-concurrency C] [--job-requests N]
                  [--gen-throughput X --running R] [--log server.log] [--format text|json]

With ``--log`` the server's own numbers (pool, memory split, decode lines) come first and the flags
override them; without it, the pool comes from ``--max-total-tokens`` (what the server reported) or from
``--gpu-mem-gb`` and ``--weights-gb``. Memory sizes are GiB, as SGLang prints them ("GB" in its logs).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any

from diagnoser.capacity.eta import JobProgress
from diagnoser.capacity.kvbytes import (
    CapacityInputError,
    kv_gib,
    load_model_config,
    model_shape,
    tokens_for_budget,
)
from diagnoser.capacity.pool import CUDA_CONTEXT_GIB, PoolFacts, pool_from_timeline, settle
from diagnoser.capacity.throughput import ThroughputModel, decode_points, fit, single_point
from diagnoser.capacity.whatif import Planner, Scenario, Workload
from diagnoser.cli import UsageError

WIDTH = 100
GRAPH_ESTIMATE_GIB = 2.5  # CUDA graphs + NCCL/misc buffers after the pool, when no log says (typical 2-3 GiB)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(f"{message}. See 'diagnose plan --help'.")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="diagnose plan", description="Offline KV capacity and what-if calculator for SGLang (reference §5).")
    p.add_argument("--model-config", help="the model's Hugging Face config.json (or its directory)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default 1, or the log's)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size")
    p.add_argument("--dp-attention", action="store_true", default=None, help="DP attention is on (--enable-dp-attention / --attn-dp-size)")
    p.add_argument("--kv-cache-dtype", default=None, help="auto, bf16, fp16, fp8_e4m3, fp8_e5m2, fp4_e2m1")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None, help="the pool the server reported (max_total_num_tokens)")
    p.add_argument("--gpu-mem-gb", type=float, default=None, help="memory of one GPU, GiB")
    p.add_argument("--weights-gb", type=float, default=None, help="weights per GPU, GiB (the 'Load weight end … mem usage')")
    p.add_argument("--host-mem-gb", type=float, default=None, help="host RAM, GiB (for HiCache)")
    p.add_argument("--avg-tokens-per-request", type=float, default=None, help="prompt + output tokens per request")
    p.add_argument("--avg-output-tokens", type=float, default=None, help="output tokens per request (for the ETA)")
    p.add_argument("--client-concurrency", type=int, default=None)
    p.add_argument("--job-requests", type=int, default=None)
    p.add_argument("--completed", type=int, default=0, help="requests of the job already done")
    p.add_argument("--gen-throughput", type=float, default=None, help="observed gen throughput, tok/s")
    p.add_argument("--running", type=float, default=None, help="observed running requests at that throughput")
    p.add_argument("--log", help="a server log: its pool, memory split and decode lines are used first")
    p.add_argument("--sglang-version", default=None, help="SGLang version for flag spellings (default: the newest known)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    return p


def auto_fraction(gpu_gib: float, tp: int) -> float:
    """SGLang's v0.5.3+ default: reserve 512 + 1.5 × chunk + 2 × graph bs + 1024 × tp / 8 MiB, ≥ 10 GiB above 60 GiB."""
    reserve = (512 + 1.5 * 8192 + 2 * 256 + 1024 * tp / 8) / 1024
    if gpu_gib > 60:
        reserve = max(reserve, 10.0)
    return round((gpu_gib - reserve) / gpu_gib, 3)


def build(args: argparse.Namespace) -> tuple[Planner, list[str]]:
    notes: list[str] = []
    shape = None
    if args.model_config:
        try:
            shape = model_shape(load_model_config(args.model_config))
        except CapacityInputError as e:
            raise UsageError(str(e)) from None
    tl = None
    if args.log:
        from diagnoser.collect import collect_logs
        from diagnoser.engines import get_adapter

        col = collect_logs(get_adapter("sglang"), [args.log])
        tl = col.timelines[0]
        if not col.usable():
            raise UsageError(f"nothing usable was read from {args.log}; pass an SGLang server log")
        pool = pool_from_timeline(tl, None)
        pool.shape = shape
        pool.bpt = None
    else:
        pool = PoolFacts(shape=shape)
    if shape is None and not (tl is not None and pool.kv_gib):
        raise UsageError("pass --model-config config.json (the model's Hugging Face config) to size the KV cache")
    for name, val in (("tp", args.tp), ("dp", args.dp), ("page_size", args.page_size), ("kv_cache_dtype", args.kv_cache_dtype),
                      ("mem_fraction", args.mem_fraction_static)):
        if val is not None:
            setattr(pool, name, val)
    if args.dp_attention:
        pool.dp_attention = True
    if args.dp_attention and not args.dp and pool.dp == 1:
        pool.dp = pool.tp
    pool.pools = max(1, pool.dp if (pool.dp_attention or pool.dp > 1) else 1)
    if args.host_mem_gb is not None:
        pool.host_mem_gib = args.host_mem_gb
    if args.gpu_mem_gb is not None and pool.pre_gib is None:
        pool.pre_gib = args.gpu_mem_gb - CUDA_CONTEXT_GIB
        pool.pre_source = f"--gpu-mem-gb {args.gpu_mem_gb:g} − {CUDA_CONTEXT_GIB} GiB CUDA context (estimate)"
    if pool.mem_fraction is None and args.gpu_mem_gb:
        pool.mem_fraction = auto_fraction(args.gpu_mem_gb, pool.tp)
        notes.append(f"--mem-fraction-static not given: SGLang's v0.5.3+ auto value for this GPU is {pool.mem_fraction} (§5.1)")
    if args.max_total_tokens is not None:
        pool.pool_tokens, pool.pool_source = args.max_total_tokens, "given with --max-total-tokens"
        pool.kv_gib = None
    if args.weights_gb is not None and pool.pre_gib is not None:
        pool.weights_gib = args.weights_gb
        pool.after_weights_gib = pool.pre_gib - args.weights_gb
    settle(pool)
    if pool.bpt and pool.pool_tokens is None and pool.after_weights_gib is not None and pool.mem_fraction is not None:
        budget = pool.after_weights_gib - pool.pre_gib * (1 - pool.mem_fraction)  # type: ignore[operator]
        pool.pool_tokens = tokens_for_budget(budget, pool.bpt, pool.page_size)
        pool.pool_source = "formula: free-after-weights − (1 − f) × free-before-weights (§5.1)"
    if pool.pool_tokens is None:
        raise UsageError("cannot size the pool: pass --max-total-tokens N (what the server reported) or --gpu-mem-gb G with --weights-gb W")
    if pool.kv_gib is None and pool.bpt:
        pool.kv_gib = kv_gib(pool.pool_tokens, pool.bpt)
    if pool.headroom_gib is None and pool.pre_gib is not None and pool.mem_fraction is not None:
        pool.headroom_gib = pool.pre_gib * (1 - pool.mem_fraction) - GRAPH_ESTIMATE_GIB
        pool.headroom_source = f"estimate: (1 − f) × free memory − {GRAPH_ESTIMATE_GIB} GiB for CUDA graphs and buffers"
        notes.append(f"headroom after the pool is estimated ({pool.headroom_source}); --log gives the server's own available_gpu_mem")
    notes.extend(pool.notes)
    notes.extend(shape.notes if shape is not None else ())
    work, model = _workload(args, tl, pool, notes)
    version = None
    if args.sglang_version:
        from diagnoser.engines.sglang.versions import parse_version

        version = parse_version(args.sglang_version)
        if version is None:
            raise UsageError(f"--sglang-version {args.sglang_version!r} is not a version; write it like 0.5.8")
    elif tl is not None and tl.meta.get("version_best"):
        version = tuple(tl.meta["version_best"])
    return Planner(pool, work, model, version), notes  # type: ignore[arg-type]


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
    if out_tokens and not (args.avg_output_tokens or w.output_tokens_per_request):
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


def document(planner: Planner, notes: list[str]) -> dict[str, Any]:
    p, w, now = planner.pool, planner.work, planner.now()
    scen = planner.plan()
    return {
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
        "workload": {"tokens_per_request": w.tokens_per_request, "tokens_per_request_p95": w.tokens_per_request_p95,
                     "tokens_source": w.tokens_source or "--avg-tokens-per-request", "running": w.running, "gen_tps": w.gen_tps,
                     "kv_bound": w.kv_bound, "demand": w.demand, "client_concurrency": w.client_concurrency,
                     "completed": w.progress.completed, "rate_rps": w.progress.rate_rps, "rate_source": w.progress.rate_source},
        "memory": p.to_dict(),
        "throughput_model": planner.model.describe() if planner.model else None,
        "scenarios": [s.to_dict() for s in scen],
        "notes": notes,
    }


def _cell(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _eta(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h / 24:.1f} d" if h >= 48 else f"{h:.1f} h"


def render(planner: Planner, notes: list[str]) -> str:
    p, now = planner.pool, planner.now()
    shape = p.shape
    head = "diagnose plan"
    if shape is not None:
        arch = shape.arch.replace("ForConditionalGeneration", "").replace("ForCausalLM", "")
        head += f" · {arch} ({shape.attention.upper()}, {shape.full_attention_layers} KV layers)"
    head += f" · TP {p.tp}" + (f" DP {p.dp}" if p.dp > 1 else "") + (" dp-attention" if p.dp_attention else "")
    head += f" · kv {p.kv_cache_dtype}" + (f" · mem-fraction {p.mem_fraction}" if p.mem_fraction is not None else "")
    second = (f"KV {p.bpt:,.0f} B/token/rank · pool {p.total_tokens:,} tokens ({p.pool_source})"
              + (f" · headroom {p.headroom_gib:.1f} GiB" if p.headroom_gib is not None else ""))
    out = textwrap.wrap(head, WIDTH, subsequent_indent="  ") + textwrap.wrap(second, WIDTH, subsequent_indent="  ") + [""]
    rows: list[Scenario] = [now, *planner.plan()]
    hdr = f"{'change':<42} {'pool tok':>9} {'max req':>7} {'running':>7} {'gen tok/s':>9} {'ETA':>7} {'conf':>6}"
    out += [hdr, "-" * len(hdr)]
    for i, s in enumerate(rows):
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
        out.extend(textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * len(first)))

    for i, s in enumerate(rows[1:], 1):
        if s.extra_flags:
            line(f"  {i}. ", f"(+) together with {', '.join(s.extra_flags)}")
        for r in s.risks[:1]:
            line(f"  {i}. ", f"! {r}")
        if not s.risks and s.gain is None and s.assumptions:
            line(f"  {i}. ", s.assumptions[0])
    if planner.model is not None:
        line("  ", f"throughput: {planner.model.describe()}")
    for n in notes:
        line("  ", f"note: {n}")
    return "\n".join(out) + "\n"


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.running is not None and args.gen_throughput is None or args.gen_throughput is not None and args.running is None:
        raise UsageError("--gen-throughput and --running go together (the throughput observed at that running batch)")
    try:
        planner, notes = build(args)
    except CapacityInputError as e:
        raise UsageError(str(e)) from None
    if args.format == "json":
        sys.stdout.write(json.dumps(document(planner, notes), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(render(planner, notes))
    return 0


__all__ = ["build", "build_parser", "document", "main", "render"]
