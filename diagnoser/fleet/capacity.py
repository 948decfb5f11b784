"""Fleet capacity: per-target load and headroom, and the fleet summary (total pool, use, headroom in
requests). Pure functions over timelines; the fleet rules and the fleet report both use them.

Headroom in requests of one replica = free KV tokens / KV tokens per running request:
    free = max_total_tokens × (1 − mean token_usage)           (docs/sglang.md#metrics-scheduler: token_usage = used / pool)
    tokens per request = mean used_tokens / mean running_reqs  (this replica; else the model's median)
and, when ``max_running_requests`` is known, never more than the free request slots. Averages are over
the queried range. Metrics do not expose ``max_running_requests`` (docs/sglang.md#sources), so in fleet mode the
slot limit is usually unknown and the headroom is a KV-only upper bound; the row says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from diagnoser.timeline import Timeline, summarize

SATURATED_QUEUE = 1.0  # mean waiting requests at or above this: requests wait here
SATURATED_USAGE = 0.9  # mean KV usage at or above this: the pool is (nearly) full
IDLE_RUNNING = 1.0  # mean running below this, and nothing waits: idle


@dataclass(slots=True)
class TargetLoad:
    target: str
    model: str
    running: float | None
    queue: float | None
    usage: float | None
    usage_max: float | None
    pool: float | None
    used_tokens: float | None
    gen_tps: float | None
    tokens_per_req: float | None = None
    headroom_reqs: int | None = None
    headroom_basis: str = ""
    state: str = "no data"

    def to_dict(self) -> dict[str, Any]:
        """The row, floats rounded to 4 decimals."""
        r = _round4
        return {"target": r(self.target), "model": r(self.model), "state": r(self.state), "running": r(self.running),
                "queue": r(self.queue), "token_usage": r(self.usage), "token_usage_max": r(self.usage_max),
                "pool_tokens": r(self.pool), "used_tokens": r(self.used_tokens), "gen_throughput_tps": r(self.gen_tps),
                "tokens_per_request": r(self.tokens_per_req), "headroom_requests": r(self.headroom_reqs),
                "headroom_basis": r(self.headroom_basis)}


def _round4(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


UNKNOWN_MODEL = "(unknown model)"


def group_of(tl: Timeline) -> str:
    """Replicas of one model on one engine compare with each other: the model name, else the job (with the
    engine when it is not SGLang). Targets with neither (e.g. two unrelated logs) are never compared (the fleet rules skip UNKNOWN_MODEL)."""
    labels = tl.meta.get("labels", {})
    model = str(labels.get("model_name") or tl.cfg("served_model_name") or labels.get("job") or UNKNOWN_MODEL)
    engine = getattr(tl, "engine", None) or "sglang"
    # replicas of one model on two engines are not replicas of each other: their pools, flags and versions
    # mean different things (a vLLM pool of blocks beside SGLang's token pool is not drift)
    return model if engine == "sglang" or model == UNKNOWN_MODEL else f"{model} ({engine})"


_NO_STATS = summarize([])


def target_load(tl: Timeline, table: Mapping[str, Mapping[str, Any]] | None = None) -> TargetLoad:
    """The load of one target from its signals' summaries: ``tl.stats``, or ``table`` when given (the
    report's :func:`~diagnoser.outputs.report.signal_table` of ``tl``, which holds the same numbers)."""
    st = tl.stats if table is None else (lambda signal: table.get(signal, _NO_STATS))
    usage_st = st("token_usage")
    pool = tl.cfg("max_total_tokens")
    if pool is None:
        pool = st("max_total_tokens")["last"]
    row = TargetLoad(tl.target, group_of(tl), st("running_reqs")["mean"], st("queue_reqs")["mean"], usage_st["mean"],
                     usage_st["max"], float(pool) if pool else None, st("used_tokens")["mean"], st("gen_throughput_tps")["mean"])
    if row.running is not None and row.running >= 0.5:
        used = row.used_tokens
        if used is None and row.usage is not None and row.pool:
            used = row.usage * row.pool
        if used:
            row.tokens_per_req = used / row.running
    if row.running is None and row.queue is None and row.usage is None:
        row.state = "no data"
    elif (row.queue or 0) >= SATURATED_QUEUE or (row.usage or 0) >= SATURATED_USAGE:
        row.state = "saturated"
    elif (row.running or 0) < IDLE_RUNNING and (row.queue or 0) < 0.5:
        row.state = "idle"
    else:
        row.state = "serving"
    return row


def fill_headroom(rows: list[TargetLoad], timelines: dict[str, Timeline]) -> None:
    """Headroom in requests per row; replicas without running requests borrow the model's median
    tokens per request."""
    per_model: dict[str, list[float]] = {}
    for r in rows:
        if r.tokens_per_req:
            per_model.setdefault(r.model, []).append(r.tokens_per_req)
    medians: dict[str, float] = {}  # (once per model: a fleet has thousands of idle replicas of one model)
    for r in rows:
        tpr = r.tokens_per_req
        basis = "own tokens/request"
        if not tpr and per_model.get(r.model):
            tpr = medians.get(r.model)
            if tpr is None:
                tpr = medians[r.model] = median(per_model[r.model])
            basis = "model median tokens/request"
        if not tpr or not r.pool or r.usage is None:
            r.headroom_basis = "unknown: needs pool size, token usage and a running request on some replica of the model"
            continue
        free = max(0.0, r.pool * (1.0 - r.usage))
        head = int(math.floor(free / tpr))
        mrr = timelines[r.target].cfg("max_running_requests") if r.target in timelines else None
        if mrr:
            head = min(head, max(0, int(mrr - (r.running or 0))))
            basis += ", capped by max_running_requests"
        else:
            basis += "; KV only (max_running_requests unknown from metrics)"
        if (r.queue or 0) >= SATURATED_QUEUE:
            head = 0  # requests already wait here: no room, whatever the pool says
            basis = "requests wait here"
        r.headroom_reqs = head
        r.headroom_basis = basis


def loads(timelines: list[Timeline], tables: Sequence[Mapping[str, Mapping[str, Any]]] | None = None) -> list[TargetLoad]:
    """Each timeline's load (``tables``: each one's signal table, when the caller has them) and headroom."""
    rows = [target_load(tl) for tl in timelines] if tables is None else [
        target_load(tl, t) for tl, t in zip(timelines, tables, strict=True)]
    fill_headroom(rows, {tl.target: tl for tl in timelines})
    return rows


def _sum(vals: list[float | None]) -> float | None:
    xs = [v for v in vals if v is not None]
    return sum(xs) if xs else None


def summarize(rows: list[TargetLoad]) -> dict[str, Any]:
    """The fleet capacity summary, whole fleet and per model."""

    def block(rs: list[TargetLoad]) -> dict[str, Any]:
        pool = _sum([r.pool for r in rs])
        used = _sum([r.usage * r.pool if r.usage is not None and r.pool else None for r in rs])
        states = {s: sum(1 for r in rs if r.state == s) for s in ("saturated", "serving", "idle", "no data")}
        head_known = [r.headroom_reqs for r in rs if r.headroom_reqs is not None]
        return {
            "targets": len(rs),
            "states": states,
            "pool_tokens": int(pool) if pool is not None else None,
            "used_tokens": int(used) if used is not None else None,
            "token_usage": round(used / pool, 4) if used is not None and pool else None,
            "running_reqs": _r(_sum([r.running for r in rs])),
            "queue_reqs": _r(_sum([r.queue for r in rs])),
            "gen_throughput_tps": _r(_sum([r.gen_tps for r in rs])),
            "headroom_requests": sum(head_known) if head_known else None,
            "headroom_known_targets": len(head_known),
        }

    models: dict[str, list[TargetLoad]] = {}
    for r in rows:
        models.setdefault(r.model, []).append(r)
    out = block(rows)
    out["models"] = {m: block(rs) for m, rs in sorted(models.items())}
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
