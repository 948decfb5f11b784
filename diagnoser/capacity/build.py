"""Build a :class:`~diagnoser.capacity.whatif.Planner` for one target from its timeline and the CLI extras."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from diagnoser.capacity.eta import progress_from_timeline
from diagnoser.capacity.kvbytes import CapacityInputError, ModelShape, load_model_config, model_shape
from diagnoser.capacity.pool import PoolFacts, pool_from_timeline
from diagnoser.capacity.throughput import decode_points, fit, same_points, source_keys
from diagnoser.capacity.whatif import Planner, Workload
from diagnoser.timeline import Timeline


def shape_for(tl: Timeline | None, model_config: str | None) -> tuple[ModelShape | None, str]:
    """The model shape from --model-config, else a local model path in server info; (None, why) if neither."""
    path = model_config
    if not path and tl is not None:
        mp = tl.cfg("model_path") or tl.cfg("arg.model_path")
        if isinstance(mp, str) and mp and Path(mp, "config.json").is_file():
            path = str(Path(mp, "config.json"))
    if not path:
        return None, "no model config: pass --model-config config.json to size changes with the formula"
    try:
        return _cached_shape(str(path), Path(path).stat().st_mtime if Path(path).exists() else 0.0), ""
    except CapacityInputError as e:
        return None, str(e)


@lru_cache(maxsize=16)
def _cached_shape(path: str, mtime: float) -> ModelShape:
    """Live mode re-plans every pass: read each config once (until the file changes)."""
    return model_shape(load_model_config(path))


def _mean(vals: list[float]) -> float | None:
    vals = [v for v in vals if v == v]
    return sum(vals) / len(vals) if vals else None


def _demand(tl: Timeline) -> float | None:
    """Most requests in flight at one moment: running + waiting read from the same line or scrape."""
    run, queue = tl.get("running_reqs"), tl.get("queue_reqs")
    if run is None or queue is None:
        return None
    (kr, _), (kq, _) = source_keys(run, queue)  # a scrape's key is -1: joined by time alone
    if same_points(run.ts, kr, queue.ts, kq):  # read at the same points: the join is by position
        total = run.values + queue.values
        total = total[~np.isnan(total)]
        return float(total.max()) if len(total) else None
    by_key = dict(zip(zip(run.ts.tolist(), kr.tolist(), strict=True), run.values.tolist(), strict=True))
    best = None
    for t, q, k in zip(queue.ts.tolist(), queue.values.tolist(), kq.tolist(), strict=True):
        r = by_key.get((t, k))
        if r is not None and r == r and q == q:
            best = r + q if best is None else max(best, r + q)
    return best


def workload_from_timeline(tl: Timeline, extras: dict[str, Any],
                           points: tuple[list[float], list[float]] | None = None) -> Workload:
    w = Workload(client_concurrency=extras.get("client_concurrency"))
    bs, xs = points if points is not None else decode_points(tl)
    if bs:
        w.running, w.gen_tps = _mean(bs), _mean(xs)
    else:
        w.running = tl.stats("running_reqs")["mean"]
        w.gen_tps = tl.stats("gen_throughput_tps")["mean"]
    w.demand = _demand(tl)
    w.usage = tl.stats("token_usage")["mean"]
    q = tl.stats("queue_reqs")
    w.queue = q["mean"]
    waiting = (q["max"] or 0) > 0 or bool(tl.events_of("retraction"))
    w.kv_bound = bool(w.usage is not None and w.usage >= 0.9 and waiting)
    from diagnoser.timeline.derived import window_rate

    # per finished request: the completions' own counters, over the window (timeline/derived.py)
    rate = window_rate(tl, "request_rate").value
    out_tps, in_tps = window_rate(tl, "output_tps", decoded=False).value, window_rate(tl, "prompt_tps").value
    if rate:
        if out_tps is not None:
            w.output_tokens_per_request = out_tps / rate
    avg = extras.get("avg_tokens_per_request")
    if avg:
        w.tokens_per_request = w.tokens_per_request_p95 = float(avg)
        w.tokens_source = "--avg-tokens-per-request (one average: p50 = p95)"
    elif rate and out_tps is not None and in_tps is not None:
        w.tokens_per_request = w.tokens_per_request_p95 = (out_tps + in_tps) / rate
        w.tokens_source = "prompt + generation token counters / finished requests (mean only: p50 = p95)"
    if w.output_tokens_per_request is None and w.tokens_per_request:
        new, cached, seqs = (tl.get(s) for s in ("prefill_new_tokens", "prefill_cached_tokens", "prefill_new_seqs"))
        if new is not None and seqs is not None and sum(seqs.values.tolist()) > 0:
            prompt = (sum(new.values.tolist()) + (sum(cached.values.tolist()) if cached is not None else 0)) / sum(seqs.values.tolist())
            w.output_tokens_per_request = max(1.0, w.tokens_per_request - prompt)
    w.progress = progress_from_timeline(tl, extras.get("job_requests"), w.output_tokens_per_request, w.gen_tps)
    return w


def planner_for(tl: Timeline, extras: dict[str, Any], version: tuple[int, int, int] | None = None) -> tuple[Planner, list[str]]:
    """A planner for a live/logged target, and notes on what is missing or extrapolated."""
    shape, why = shape_for(tl, extras.get("model_config"))
    pool: PoolFacts = pool_from_timeline(tl, shape)
    if extras.get("host_mem_gb"):
        pool.host_mem_gib = float(extras["host_mem_gb"])
    notes = (list(shape.assumed) if shape is not None else []) + list(pool.notes) + (list(shape.notes) if shape is not None else [])
    if why:
        notes.append(why)
    points = decode_points(tl)
    model = fit(*points)
    if model is not None and model.method != "fit":
        notes.append(model.note)
    from diagnoser.capacity.serverstate import server_state

    return Planner(pool, workload_from_timeline(tl, extras, points), model, version, server_state(tl, extras)), notes
