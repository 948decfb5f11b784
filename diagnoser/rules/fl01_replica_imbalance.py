"""Load is concentrated on a few replicas of a model while other replicas of it have headroom.

What it detects:
    Among the replicas of one model (same `model_name` label, else same job) read in fleet mode,
    some are under pressure — requests wait (mean `queue_reqs` >= `hot_queue`, default 1), the KV
    pool is nearly full (mean `token_usage` >= `hot_usage`, default 0.9), or the running batch sits
    at the known `max_running_requests` — while others have room: nothing waits (mean queue <
    `cold_queue`) and their KV use stays below `cold_usage` (default 0.5). It names both sets.
    One sample per replica is enough to judge, at low confidence (medium from a few, high from a
    window): a Prometheus with seconds of history names the saturated replica.

Why it matters:
    Each replica schedules only the requests the router sends it. If the router (or a client pinned to
    some replicas) keeps sending work to the busy ones, requests queue there and TTFT grows while the
    fleet as a whole has capacity to spare: adding replicas or tuning server flags does not help,
    routing does.

Evidence:
    Per busy replica: mean queue_reqs, mean running_reqs and mean token_usage over the range; per
    replica with room: the same, plus its headroom in requests (free KV tokens / KV tokens per running
    request, see `diagnoser/fleet/capacity.py`). Every number cites the Prometheus series it came
    from.

    On each engine: Engine-neutral over the fleet: queue and running requests per replica, from `sglang:`
    or `vllm:` series through Prometheus (`model_name` label on both).

Fix:
    Route by load. With sglang-router / the SGLang model gateway, check the routing policy and the
    worker list (prefix/session affinity concentrates traffic that shares prefixes or sessions); with
    another balancer, prefer least-outstanding-requests over round-robin or hashing, and check for
    clients pinned to one replica. This is not a server flag, so the rule proposes no flag change.

Known false positives:
    A replica that has just started or was just added has no load yet. Replicas of one model name on
    different hardware can have different capacities (see `config_drift`). Averages over a range
    that straddles a traffic shift can mix two states; narrow `--range`.

References:
    - How diagnoser reads SGLang: [scheduler gauges](docs/sglang.md#metrics-scheduler) (`num_queue_reqs`,
      `num_running_reqs`, `token_usage`), [router metrics](docs/sglang.md#router), [what `/metrics` cannot
      show](docs/sglang.md#sources) (`max_running_requests`), [the same idea within one
      server](docs/sglang.md#metrics-dp).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import WINDOW_READINGS, Rule, min_confidence, readings_confidence
from diagnoser.timeline import Timeline

if TYPE_CHECKING:
    from diagnoser.fleet.capacity import TargetLoad

SHOW = 5


def _src(tl: Timeline, signal: str) -> str:
    s = tl.get(signal)
    return s.source_at(-1) if s is not None else ""


def _names(rows: list[TargetLoad]) -> str:
    shown = ", ".join(r.target for r in rows[:SHOW])
    return shown + (f" and {len(rows) - SHOW} more" if len(rows) > SHOW else "")


def _load_text(r: TargetLoad) -> str:
    parts = []
    if r.queue is not None:
        parts.append(f"queue {r.queue:.0f}")
    if r.running is not None:
        parts.append(f"running {r.running:.1f}")
    if r.usage is not None:
        parts.append(f"KV {r.usage:.2f}")
    return ", ".join(parts)


class ReplicaImbalance(Rule):
    name = "replica_imbalance"
    code = "FL01"
    title = "Load concentrated on a few replicas"
    severity = Severity.WARNING
    scope = "fleet"
    needs = ("queue_reqs", "running_reqs")
    defaults = {"min_replicas": 2, "hot_queue": 1.0, "hot_usage": 0.9, "cold_queue": 0.5, "cold_usage": 0.5, "min_points": 1, "slot_share": 0.9}
    threshold_help = {
        "min_replicas": "fewest replicas of a model with data to compare",
        "hot_queue": "mean waiting requests at or above which a replica is under pressure",
        "hot_usage": "mean KV token usage at or above which a replica is under pressure (0-1)",
        "cold_queue": "mean waiting requests below which a replica has room",
        "cold_usage": "mean KV token usage below which a replica has room (0-1)",
        "min_points": "fewest running_reqs points a replica needs to be judged (one sample judges, at low confidence)",
        "slot_share": "running / max_running_requests at or above which a replica is full (when known)",
    }

    def evaluate(self, ctx: Any) -> None:  # fleet rule: see evaluate_fleet
        return None

    def evaluate_fleet(self, timelines: list[Timeline], cfg: dict[str, Any], adapter: Any) -> list[Finding]:
        if len(timelines) < cfg["min_replicas"]:
            return []  # one engine's window: nothing to compare (and no per-target load to compute)
        # imported here: fleet.capacity pulls in statistics (fractions, decimal, random), which a one-engine
        # `diagnose --once --log` never needs (start-up time, bench/bench_startup.py)
        from diagnoser.fleet.capacity import UNKNOWN_MODEL, loads

        by_target = {tl.target: tl for tl in timelines}
        rows = [r for r in loads(timelines) if self._judged(by_target[r.target], cfg)]
        groups: dict[str, list[TargetLoad]] = {}
        for r in rows:
            groups.setdefault(r.model, []).append(r)
        out = []
        for model, rs in sorted(groups.items()):
            if len(rs) < cfg["min_replicas"] or model == UNKNOWN_MODEL:
                continue
            hot = sorted((r for r in rs if self._hot(r, by_target[r.target], cfg)), key=lambda r: (-(r.queue or 0), -(r.usage or 0)))
            cold = sorted((r for r in rs if self._cold(r, cfg)), key=lambda r: ((r.usage or 0), (r.running or 0)))
            if hot and cold:
                out.append(self._finding(model, rs, hot, cold, by_target, cfg))
        return out

    @staticmethod
    def _judged(tl: Timeline, cfg: dict[str, Any]) -> bool:
        s = tl.get("running_reqs")
        return s is not None and len(s) >= cfg["min_points"]

    @staticmethod
    def _hot(r: TargetLoad, tl: Timeline, cfg: dict[str, Any]) -> bool:
        if (r.queue or 0) >= cfg["hot_queue"] or (r.usage or 0) >= cfg["hot_usage"]:
            return True
        mrr = tl.cfg("max_running_requests")
        return bool(mrr) and (r.running or 0) >= cfg["slot_share"] * float(mrr)

    @staticmethod
    def _cold(r: TargetLoad, cfg: dict[str, Any]) -> bool:
        return (r.queue or 0) < cfg["cold_queue"] and (r.usage is None or r.usage < cfg["cold_usage"])

    def _finding(self, model: str, rs: list[TargetLoad], hot: list[TargetLoad], cold: list[TargetLoad],
                 by_target: dict[str, Timeline], cfg: dict[str, Any]) -> Finding:
        from diagnoser.fleet.capacity import SATURATED_QUEUE

        queued = sum(r.queue or 0 for r in hot)
        head_rows = [r for r in cold if r.headroom_reqs is not None]
        headroom = sum(r.headroom_reqs or 0 for r in head_rows)
        window = by_target[hot[0].target]
        start, end = window.span()
        win = f"{end - start:.0f} s" if start is not None and end is not None else ""
        ev: list[Evidence] = []
        for r in hot[:SHOW]:
            tl = by_target[r.target]
            if (r.queue or 0) >= cfg["hot_queue"]:
                ev.append(Evidence(f"queue_reqs mean [{r.target}]", round(r.queue or 0, 2), f">= {cfg['hot_queue']}", win, _src(tl, "queue_reqs")))
            if r.usage is not None:
                ev.append(Evidence(f"token_usage mean [{r.target}]", round(r.usage, 3), f">= {cfg['hot_usage']} is full", win, _src(tl, "token_usage")))
        for r in cold[:SHOW]:
            tl = by_target[r.target]
            ev.append(Evidence(f"queue_reqs mean [{r.target}]", round(r.queue or 0, 2), f"< {cfg['cold_queue']}", win, _src(tl, "queue_reqs")))
            if r.usage is not None:
                ev.append(Evidence(f"token_usage mean [{r.target}]", round(r.usage, 3), f"< {cfg['cold_usage']}", win, _src(tl, "token_usage")))
            if r.running is not None:
                ev.append(Evidence(f"running_reqs mean [{r.target}]", round(r.running, 2), None, win, _src(tl, "running_reqs")))
        ev.append(Evidence("requests waiting on the busy replicas (sum of mean queues)", round(queued, 1), None, win, ""))
        if head_rows:
            ev.append(Evidence("headroom of the replicas with room, requests", headroom, None, win, head_rows[0].headroom_basis))
        hot_txt = "; ".join(f"{r.target} ({_load_text(r)})" for r in hot[:SHOW]) + (f"; and {len(hot) - SHOW} more" if len(hot) > SHOW else "")
        summary = (f"{model}: load is concentrated on {len(hot)} of {len(rs)} replicas — {hot_txt} — while "
                   f"{len(cold)} have room ({_names(cold)}: nothing waits, KV use "
                   f"{max((r.usage or 0) for r in cold):.2f} or less).")
        if queued >= SATURATED_QUEUE and head_rows:
            summary += (f" About {queued:.0f} requests wait on the busy replicas while those with room could take about "
                        f"{headroom:,} more (KV estimate).")
        notes = [
            "This is a routing problem, not a server flag: route by load (least outstanding requests), check the "
            "router's policy and worker list (prefix or session affinity concentrates traffic), and look for clients "
            "pinned to the busy replicas.",
        ]
        if head_rows and any("KV only" in r.headroom_basis for r in head_rows):
            notes.append("Headroom counts free KV tokens only: max_running_requests is not in /metrics, so the slot limit "
                         "of the replicas with room is unknown.")
        conf = "high" if any((r.queue or 0) >= cfg["hot_queue"] for r in hot) else "medium"
        fewest = min(len(by_target[r.target].get("running_reqs") or []) for r in hot + cold)
        conf = min_confidence(conf, readings_confidence(fewest))  # one sample per replica: low
        if fewest < WINDOW_READINGS:
            notes.append(f"Judged from {fewest} sample(s) per replica: a longer range (more history) firms it up.")
        return Finding(rule=self.name, severity=self.severity, confidence=conf, target=f"fleet/{model}", summary=summary,
                       evidence=ev, suggestions=[], docs=self.docs_ref(), notes=notes,
                       basis={"readings": fewest, "span_s": round(end - start, 1) if start is not None and end is not None else None,
                              "signal": "running_reqs per replica (fewest)", "uncapped": True})
