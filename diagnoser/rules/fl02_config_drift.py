"""Replicas of one model run different SGLang versions or different flags.

What it detects:
    Among the replicas of one model (same `model_name` label, else same job), any of:
    a version drift — two replicas whose version ranges cannot overlap (read from the metric names
    and label generations each exposes, or from server info when known);
    a flag drift — a known setting (`--page-size` and `--context-length` from the 0.5.11+ gauges;
    from server info also `--mem-fraction-static`, `--chunked-prefill-size`,
    `--max-running-requests`, `--kv-cache-dtype`, `--tp-size`, `--dp-size` …) or the number of
    DP ranks differs from the value most replicas use;
    a pool drift — `max_total_num_tokens` differs by more than `pool_tolerance` (default 10 %)
    from the model's median.

Why it matters:
    Replicas behind one router are meant to be interchangeable. One that runs an older release or
    other flags behaves differently under the same load (other defaults, other capacity), which skews
    routing, hides bugs fixed elsewhere and makes per-replica tuning advice wrong for the rest.

Evidence:
    For each drifted replica: its value and where it was read, against the value of the majority and
    how many replicas use it.

Fix:
    Bring the odd replicas in line with the majority: the rule proposes the majority's value for a
    flag that differs (the spelling for the replica's version). When no value has a majority it says
    so and proposes nothing: the data cannot tell which one was intended. A version drift is fixed by
    upgrading (no flag); a pool drift points at `--mem-fraction-static`, `--max-total-tokens`,
    `--kv-cache-dtype` or different GPUs, which /metrics alone cannot tell apart.

Known false positives:
    A deliberate canary (new version or flags on a few replicas) is reported as drift; ignore the
    rule for that job with `--ignore config_drift` while the canary runs. Version ranges come from
    metric names, so a replica that has not yet exported a lazily created counter can look older
    only if no other hint narrows it; the rule only reports ranges that cannot overlap.

References:
    - How diagnoser reads SGLang: [label generations](docs/sglang.md#labels), [metric names added and
      removed](docs/sglang.md#metric-renames), [start-up constants](docs/sglang.md#metrics-constants)
      (`page_size`, `context_len`, `max_total_num_tokens`), [server info](docs/sglang.md#server-info),
      [flags](docs/sglang.md#flags), [how versions are narrowed](docs/sglang.md#versions).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from diagnoser.mechanism import mechanism_of
from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.rules.base import Rule
from diagnoser.timeline import Timeline

SHOW = 5
# config fact names (server-arg facts first) → flag concept in engines/sglang/flags.py
COMPARE: list[tuple[tuple[str, ...], str]] = [
    (("arg.page_size", "page_size"), "page_size"),
    (("arg.context_length", "context_length", "context_len"), "context_length"),
    (("arg.mem_fraction_static", "mem_fraction_static"), "mem_fraction_static"),
    (("arg.chunked_prefill_size", "chunked_prefill_size"), "chunked_prefill_size"),
    (("arg.max_prefill_tokens", "max_prefill_tokens"), "max_prefill_tokens"),
    (("arg.max_running_requests",), "max_running_requests"),
    (("arg.schedule_conservativeness", "schedule_conservativeness"), "schedule_conservativeness"),
    (("arg.kv_cache_dtype", "kv_cache_dtype"), "kv_cache_dtype"),
    (("arg.tp_size", "tp_size"), "tp_size"),
    (("arg.dp_size", "dp_size"), "dp_size"),
    (("arg.cuda_graph_max_bs", "cuda_graph_max_bs"), "cuda_graph_max_bs"),
    (("arg.disable_radix_cache",), "disable_radix_cache"),
]


def _vrange(tl: Timeline) -> tuple[tuple[int, ...], tuple[int, ...]]:
    vr = tl.meta.get("version_range")
    if vr:
        low, high, exact = vr
        if exact:
            return tuple(exact), tuple(exact)
        return tuple(low), tuple(high)
    return (0, 0, 0), (99, 0, 0)


def _value(tl: Timeline, keys: tuple[str, ...]) -> tuple[Any, str, str] | None:
    for k in keys:
        if k in tl.config:
            v = tl.config[k].value
            if v is None or isinstance(v, dict | list):
                return None
            return v, tl.config[k].source, k
    return None


def _names(tls: list[Timeline]) -> str:
    return ", ".join(t.target for t in tls[:SHOW]) + (f" and {len(tls) - SHOW} more" if len(tls) > SHOW else "")


class ConfigDrift(Rule):
    name = "config_drift"
    code = "FL02"
    title = "Replicas of one model differ in version or flags"
    severity = Severity.WARNING
    scope = "fleet"
    defaults = {"min_replicas": 2, "pool_tolerance": 0.1}
    threshold_help = {
        "min_replicas": "fewest replicas of a model to compare",
        "pool_tolerance": "relative difference of max_total_num_tokens from the model's median that counts as drift",
    }

    def evaluate(self, ctx: Any) -> None:  # fleet rule: see evaluate_fleet
        return None

    def evaluate_fleet(self, timelines: list[Timeline], cfg: dict[str, Any], adapter: Any) -> list[Finding]:
        if len(timelines) < cfg["min_replicas"]:
            return []  # one engine's window: nothing to compare
        # imported here: fleet.capacity pulls in statistics (fractions, decimal, random), which a one-engine
        # `diagnose --once --log` never needs (start-up time, bench/bench_startup.py)
        from diagnoser.fleet.capacity import UNKNOWN_MODEL, group_of

        groups: dict[str, list[Timeline]] = {}
        for tl in timelines:
            groups.setdefault(group_of(tl), []).append(tl)
        out: list[Finding] = []
        for model, tls in sorted(groups.items()):
            if len(tls) < cfg["min_replicas"] or model == UNKNOWN_MODEL:
                continue
            v = self._versions(model, tls)
            if v:
                out.append(v)
            out.extend(self._flags(model, tls, adapter))
            p = self._pool(model, tls, cfg)
            if p:
                out.append(p)
        return out

    # -- version --------------------------------------------------------------------------------
    def _versions(self, model: str, tls: list[Timeline]) -> Finding | None:
        ranges = {tl.target: _vrange(tl) for tl in tls}
        by_text: dict[str, list[Timeline]] = {}
        for tl in tls:
            by_text.setdefault(tl.version or "unknown", []).append(tl)
        texts = sorted(by_text, key=lambda t: -len(by_text[t]))
        major = texts[0]
        lo_m, hi_m = ranges[by_text[major][0].target]
        odd = [tl for tl in tls if _disjoint(ranges[tl.target], (lo_m, hi_m))]
        if not odd:
            return None
        ev = [Evidence(f"version [{tl.target}]", tl.version, f"{major} on {len(by_text[major])} replicas", "",
                       "; ".join(tl.meta.get("version_reasons") or [])[:300]) for tl in odd[:SHOW]]
        odd_groups = Counter(tl.version for tl in odd)
        desc = ", ".join(f"{n} on SGLang {v}" for v, n in odd_groups.most_common())
        summary = (f"{model}: replicas run different SGLang versions — {desc} ({_names(odd)}) while "
                   f"{len(by_text[major])} run {major}.")
        notes = ["Upgrade the odd replicas so that all run one release: defaults, metrics and flag spellings differ between "
                 "releases (e.g. --cuda-graph-max-bs became --cuda-graph-max-bs-decode in 0.5.14)."]
        return Finding(self.name, self.severity, "high", f"fleet/{model}", summary, ev, [], self.docs_ref(), notes=notes)

    # -- flags ----------------------------------------------------------------------------------
    def _flags(self, model: str, tls: list[Timeline], adapter: Any) -> list[Finding]:
        per_target: dict[str, list[tuple[Evidence, Suggestion | None]]] = {}
        split: list[str] = []
        checks: list[tuple[str, dict[str, tuple[Any, str]]]] = []
        for keys, concept in COMPARE:
            vals = {}
            for tl in tls:
                got = _value(tl, keys)
                if got is not None:
                    vals[tl.target] = (got[0], got[1])
            checks.append((concept, vals))
        dp = {tl.target: (max(1, len(tl.ranks("running_reqs"))), "dp_rank labels on sglang:num_running_reqs") for tl in tls
              if tl.get("running_reqs") is not None}
        if not any(c == "dp_size" and v for c, v in checks):
            checks.append(("dp_size", dp))
        by_name = {tl.target: tl for tl in tls}
        for concept, vals in checks:
            if len(vals) < 2:
                continue
            counts = Counter(_key(v) for v, _s in vals.values())
            if len(counts) < 2:
                continue
            top, n_top = counts.most_common(1)[0]
            if n_top * 2 <= len(vals):
                dist = ", ".join(f"{k} on {n}" for k, n in counts.most_common())
                split.append(f"{self._flag(adapter, concept, None)} splits with no majority ({dist} replicas)")
                continue
            major_val = next(v for v, _s in vals.values() if _key(v) == top)
            for target, (v, src) in vals.items():
                if _key(v) == top:
                    continue
                version = _best(by_name[target], adapter)
                flag = self._flag(adapter, concept, version)
                e = Evidence(f"{concept} [{target}]", v, f"{major_val} on {n_top} of {len(vals)} replicas", "", src)
                s = Suggestion(flag=flag, current=v, proposed=major_val,
                               why=f"{n_top} of the {len(vals)} {model} replicas run {flag} {major_val}; this one runs {v}.",
                               effect="This replica then behaves like the others under the same load, so routing and "
                                      "per-replica advice apply to all of them.",
                               assumptions=("the majority's value is the intended one", "same GPU type as the other replicas"))
                per_target.setdefault(target, []).append((e, s))
        out = []
        for target, items in sorted(per_target.items()):
            diffs = "; ".join(f"{s.flag} {s.current} (others {s.proposed})" for _e, s in items if s)
            out.append(Finding(self.name, self.severity, "high", target,
                               f"{target} differs from the other {model} replicas: {diffs}.",
                               [e for e, _s in items], [s for _e, s in items if s], self.docs_ref()))
        if split:
            out.append(Finding(self.name, self.severity, "medium", f"fleet/{model}",
                               f"{model}: " + "; ".join(split) + ". The data cannot tell which value is intended.",
                               [], [], self.docs_ref()))
        return out

    @staticmethod
    def _flag(adapter: Any, concept: str, version: Any) -> str:
        try:
            return str(adapter.flag(concept, version))
        except (KeyError, AttributeError):
            return "--" + concept.replace("_", "-")

    # -- pool -----------------------------------------------------------------------------------
    def _pool(self, model: str, tls: list[Timeline], cfg: dict[str, Any]) -> Finding | None:
        pools = {tl.target: (float(tl.cfg("max_total_tokens")), tl.cfg_source("max_total_tokens")) for tl in tls
                 if isinstance(tl.cfg("max_total_tokens"), int | float) and tl.cfg("max_total_tokens") > 0}
        if len(pools) < 2:
            return None
        from statistics import median

        med = median(v for v, _s in pools.values())
        odd = sorted(((t, v, s) for t, (v, s) in pools.items() if abs(v - med) > cfg["pool_tolerance"] * med), key=lambda x: x[1])
        if not odd:
            return None
        ev = [Evidence(f"max_total_tokens [{t}]", int(v), f"median {int(med):,} ± {cfg['pool_tolerance']:.0%}", "", s) for t, v, s in odd[:SHOW]]
        shown = ", ".join(f"{t} {int(v):,}" for t, v, _s in odd[:SHOW]) + (f" and {len(odd) - SHOW} more" if len(odd) > SHOW else "")
        summary = (f"{model}: the KV pool size differs across replicas — {shown} tokens against a median of {int(med):,} "
                   f"over {len(pools)} replicas.")
        notes = ["/metrics cannot tell why: compare --mem-fraction-static, --max-total-tokens and --kv-cache-dtype on these "
                 "replicas, and their GPU type (server info per replica, or `diagnose --url` on one, shows the flags)."]
        return Finding(self.name, Severity.INFO if len(odd) * 2 > len(pools) else self.severity, "medium", f"fleet/{model}",
                       summary, ev, [], self.docs_ref(), notes=notes)


def _disjoint(a: tuple[tuple[int, ...], tuple[int, ...]], b: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    return a[1] < b[0] or b[1] < a[0]


def _key(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    return str(v).strip().lower()


def _best(tl: Timeline, adapter: Any = None) -> tuple[int, int, int] | None:
    v = tl.meta.get("version_best")
    if v:
        return tuple(v)  # type: ignore[return-value]
    if tl.version:
        return None
    pick = getattr(adapter, "for_timeline", None)  # the target's own engine: its newest release read
    return mechanism_of(pick(tl) if pick is not None else adapter).newest_known

