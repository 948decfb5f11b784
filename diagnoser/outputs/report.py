"""Build the report document (the fixed JSON shape) from a collection and an evaluation.

    {"schema_version": "1.0", "status": "ok"|"problems"|"error", "engine": "sglang", "version": …,
     "inputs": [{"kind", "source", "scrapes"|"lines_read", "lines_recognized", "errors"}],
     "window": {"start", "end"}, "config": {TARGET: {NAME: {"value", "source"}}},
     "signals": {TARGET: {SIGNAL: {"last", "mean", "min", "max", "p50", "p95", "n"}}},
     "findings": [] (the top cause first: evaluate.cause_order), "errors": [],
     "checked": [{"rule", "code", "target", "status": fired|fine|not_judged|error, "why"}],
     "top": {TARGET: {"rule", "severity", "confidence", "summary", "suggestion": {"flag", "current", "proposed"} | null}}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from diagnoser import gcpause
from diagnoser.floor import MARK, is_floor
from diagnoser.model import Severity, iso, owned
from diagnoser.redact import redact, redact_key, redact_owned, redact_string, redact_strings, redact_value
from diagnoser.timeline import SIGNALS, Timeline, summarize
from diagnoser.timeline.derived import window_rate

WINDOW_RATES = ("output_tps", "prompt_tps", "request_rate")
# the report document's schema (diagnoser/schema/report.schema.json): a new key is a minor bump, a key
# removed or changed in meaning a major one
SCHEMA_VERSION = "1.0"


_ORDER = {name: i for i, name in enumerate(SIGNALS)}


def signal_table(tl: Timeline) -> dict[str, dict[str, Any]]:
    """Each series' summary (``Timeline.stats``): the canonical signals first, in :data:`SIGNALS` order, then
    the per-rank series as ``name[rank]``; a quantile's lower-bound readings and a counter's window rate
    beside. (:func:`signal_tables` gives the same for a fleet, faster.)"""
    out: dict[str, dict[str, Any]] = {}
    names = sorted({name for (name, rank) in tl.series if rank == ""}, key=lambda n: (_ORDER.get(n, 999), n))
    wq = tl.meta.get("window_quantiles") or {}
    for name in names:
        out[name] = tl.stats(name)
        floors = _floor_points(tl, name)
        if name in wq:  # a latency quantile over the whole window (histogram difference last - first)
            out[name]["window"] = float(wq[name])
            if is_floor(wq[name]):
                floors.append("window")
        if floors:  # these values are a bucket's lower bound: the quantile is more than they say ("> 100 s")
            out[name]["lower_bounds"] = floors
        elif name in WINDOW_RATES:  # a counter's rate over the whole window (timeline/derived.py)
            rate = window_rate(tl, name).value
            if rate is not None:
                out[name]["window"] = rate
    for (name, rank) in sorted(tl.series):
        if rank:
            out[f"{name}[{rank}]"] = tl.stats(name, rank)
    return out


_QUANTILE_ENDS = ("_p50", "_p90", "_p95", "_p99")


class _Plan:
    """The table of a timeline whose series are ``keys`` (in their order): the table's keys in
    :func:`signal_table`'s order, and for each the series it ends up holding (a ``name[rank]`` key written
    twice keeps its place and the last value), as a position in ``keys``; then the timelines of this plan,
    their tables, and each one's series (in ``keys`` order)."""

    __slots__ = ("keys", "jobs", "tls", "tables", "series")

    def __init__(self, keys: tuple[tuple[str, str], ...]) -> None:
        names = sorted({name for (name, rank) in keys if rank == ""}, key=lambda n: (_ORDER.get(n, 999), n))
        jobs = [(name, name, "") for name in names] + [(f"{name}[{rank}]", name, rank) for (name, rank) in sorted(keys) if rank]
        last = {key: (name, rank) for key, name, rank in jobs}
        at = {k: i for i, k in enumerate(keys)}
        self.keys = list(last)
        self.jobs = [(key, name, rank, at[(name, rank)]) for key, (name, rank) in last.items()]
        self.tls: list[Timeline] = []
        self.tables: list[dict[str, Any]] = []
        self.series: list[list[Any]] = []


_VALUES = attrgetter("values")


def signal_tables(tls: list[Timeline]) -> list[dict[str, dict[str, Any]]]:
    """:func:`signal_table` of each timeline (the same dicts), with the series of one signal and one length
    summarised for all the targets at once (a fleet's targets share the query's time grid). The numbers are
    :func:`diagnoser.timeline.summarize`'s and :func:`window_rate`'s to the bit (tests/test_report_fast.py);
    a timeline with window quantiles, and a series that holds NaN or infinities, takes their own path."""
    tables: list[dict[str, dict[str, Any]]] = []
    plans: dict[tuple[tuple[str, str], ...], _Plan] = {}
    for tl in tls:
        if tl.meta.get("window_quantiles"):
            tables.append(signal_table(tl))
            continue
        sig = tuple(tl.series)
        plan = plans.get(sig)
        if plan is None:
            plan = plans[sig] = _Plan(sig)
        table: dict[str, Any] = dict.fromkeys(plan.keys)
        tables.append(table)
        plan.tls.append(tl)
        plan.tables.append(table)
        plan.series.append(list(tl.series.values()))
    for plan in plans.values():
        columns = list(zip(*plan.series, strict=True))
        for key, name, rank, at in plan.jobs:
            series = columns[at]
            values = list(map(_VALUES, series))
            try:  # one length (else numpy refuses the ragged rows)
                m = np.array(values, dtype=np.float64)
            except ValueError:
                m = None
            if m is not None and m.ndim == 2:
                _fill(key, name, rank, m, values, plan.tls, plan.tables, series)
                continue
            by_len: dict[int, list[int]] = {}
            for i, v in enumerate(values):
                by_len.setdefault(len(v), []).append(i)
            for idx in by_len.values():
                part = [values[i] for i in idx]
                _fill(key, name, rank, np.array(part, dtype=np.float64), part, [plan.tls[i] for i in idx],
                      [plan.tables[i] for i in idx], [series[i] for i in idx])
    return tables


def _fill(key: str, name: str, rank: str, m: np.ndarray, values: list[np.ndarray], tls: list[Timeline],
          tables: list[dict[str, Any]], series: list[Any]) -> None:
    """Write the summaries of ``series`` (of ``name``/``rank``; ``values`` their values, ``m`` as rows) under
    ``key`` in ``tables``, with a quantile's lower-bound readings and a counter's window rate (as
    :func:`signal_table` does)."""
    stats = _summaries(m, values)
    for table, st in zip(tables, stats, strict=True):
        table[key] = st
    n = m.shape[1]
    if rank or not n:
        return
    if name.endswith(_QUANTILE_ENDS):  # (only a quantile's readings can be a bucket's floor)
        marked: dict[int, tuple[list[str], bool]] = {}  # a fleet's series share one table of labels
        for i, (tl, s) in enumerate(zip(tls, series, strict=True)):
            labels = s.sources.parts()[0]
            hit = marked.get(id(labels))
            if hit is None:
                hit = marked[id(labels)] = (labels, any(MARK in label for label in labels))
            floors = _floor_points(tl, name) if hit[1] else []
            if floors:
                stats[i]["lower_bounds"] = floors
    elif name in WINDOW_RATES:
        for st, rate in zip(stats, _window_rates(name, tls, m, series), strict=True):
            if rate is not None:
                st["window"] = rate


def _finite_rows(m: np.ndarray) -> np.ndarray:
    """Rows without NaN or infinities, and without both 0.0 and -0.0 (which sort in the order they came)."""
    ok = np.isfinite(m).all(axis=1)
    zero = m == 0
    if zero.any():
        neg = zero & np.signbit(m)
        ok &= ~(neg.any(axis=1) & (zero & ~neg).any(axis=1))
    return ok  # type: ignore[no-any-return]


_BATCH = 8  # fewer series of one signal and length than this: one by one
# Python's sum() of floats adds left to right (3.11; 3.12 compensates): then a column at a time does the same
_SUM_IN_ORDER = sum([1e16, 1.0, -1e16]) == 0.0


def _summaries(m: np.ndarray, values: list[np.ndarray]) -> list[dict[str, Any]]:
    """:func:`summarize` of each of ``values`` (``m``: the same as rows of one length n). The rows of finite
    values together: the last value, ``sum(row) / n``, and the ends and :func:`quantile` positions of the
    sorted row (any sort gives the same floats: equal finite floats other than ±0 have the same bits)."""
    k, n = m.shape
    if n == 0:
        return [summarize([]) for _ in values]
    if k < _BATCH:
        return list(map(summarize, values))
    ok = _finite_rows(m)
    good = m if ok.all() else m[ok]
    s = np.sort(good, axis=1)
    with np.errstate(all="ignore"):  # (b - a of two huge floats is inf, as in Python)
        cols = (good[:, -1].tolist(), _means(good), s[:, 0].tolist(), s[:, -1].tolist(), _quantiles(s, 0.5), _quantiles(s, 0.95))
    done = [{"last": a, "mean": b, "min": c, "max": d, "p50": e, "p95": f, "n": n} for a, b, c, d, e, f in zip(*cols, strict=True)]
    if len(done) == k:
        return done
    fast = iter(done)
    return [next(fast) if keep else summarize(v) for keep, v in zip(ok.tolist(), values, strict=True)]


def _means(m: np.ndarray) -> list[float]:
    """``sum(row) / n`` of each row, as Python computes it."""
    n = m.shape[1]
    if not _SUM_IN_ORDER:
        return [t / n for t in map(sum, m.tolist())]
    total = 0.0 + m[:, 0]  # (sum starts from the int 0)
    for j in range(1, n):
        total += m[:, j]
    return (total / n).tolist()  # type: ignore[no-any-return]


def _quantiles(s: np.ndarray, q: float) -> list[float]:
    """:func:`quantile` of each row of ``s`` (sorted rows): the same float operations, a column at a time."""
    n = s.shape[1]
    if n == 1:
        return s[:, 0].tolist()  # type: ignore[no-any-return]
    pos = (n - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = s[:, lo], s[:, hi]
    return (a + (b - a) * frac).tolist()  # type: ignore[no-any-return]


def _window_rates(name: str, tls: list[Timeline], v: np.ndarray, series: list[Any]) -> list[float | None]:
    """``window_rate(tl, name).value`` of each timeline (``series``: its ``name`` series, ``v`` their values as
    rows). A rate series of finite values on increasing times: sum(rate x interval) / sum(intervals) after the
    first point, numpy's row sums being its sums of one row (tests/test_report_fast.py); the rest by window_rate."""
    n = v.shape[1]
    if n < 2 or len(tls) < _BATCH:
        return [window_rate(tl, name).value for tl in tls]
    t = np.array([s.ts for s in series], dtype=np.float64)
    dt = np.diff(t, axis=1)
    ok = np.isfinite(v).all(axis=1) & np.isfinite(t).all(axis=1) & (dt > 0).all(axis=1)
    if name == "output_tps":  # (read from the decode-token counter where a target has one)
        ok &= np.array([not _decoded(tl) for tl in tls], dtype=bool)
    with np.errstate(all="ignore"):
        rates = ((v[:, 1:] * dt).sum(axis=1) / dt.sum(axis=1)).tolist()
    return [rate if keep else window_rate(tl, name).value for tl, keep, rate in zip(tls, ok.tolist(), rates, strict=True)]


def _decoded(tl: Timeline) -> bool:
    """Whether window_rate reads output_tps from the decode-token counter (two readings or more)."""
    dec = tl.get("decode_tokens")
    return dec is not None and len(dec) >= 2


def _floor_points(tl: Timeline, name: str) -> list[str]:
    """Which of the series' max/last readings are a quantile's lower bound (their source says so)."""
    s = tl.get(name)
    if s is None or not len(s) or not name.endswith(("_p50", "_p90", "_p95", "_p99")):
        return []
    marks = [is_floor(source=src) for src in s.sources.tolist()]
    out = []
    if any(marks):  # a reading that is "more than f" may have been the largest
        out.append("max")
    if marks[-1]:
        out.append("last")
    return out


def config_table(tl: Timeline) -> dict[str, dict[str, Any]]:
    """Each configuration value and its source, redacted by name: a server argument (``arg.NAME``) under its
    own name (``arg.api_key``'s value is hidden whole), any other as text."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in sorted(tl.config.items()):
        if k.startswith("arg."):  # (what redact({NAME: value}) holds under NAME)
            out[k] = {"value": redact_value(k[4:], v.value, 1), "source": v.source}
        else:  # (what redact({"value": …, "source": …}) gives: neither key is a secret's name)
            out[k] = {"value": _as_text(v.value), "source": _as_text(v.source)}
    return out


def _as_text(value: Any) -> Any:
    """``redact(value, 1)``, numbers and strings first."""
    t = type(value)
    if t is str:
        return redact_string(value, 1)
    return value if t is int or t is float or t is bool or value is None else redact(value, 1)


def top_causes(report: Any, targets: list[str]) -> dict[str, dict[str, Any]]:
    """Per target: the finding that names the bottleneck and the change to make first (evaluate.top_cause)."""
    from diagnoser.evaluate import top_cause

    out: dict[str, dict[str, Any]] = {}
    mine: dict[str, list[Any]] = {}  # findings by target, once (a fleet report has 10,000 targets)
    for f in report.findings:
        mine.setdefault(f.target, []).append(f)
    for t in targets:
        f, s = top_cause(mine.get(t, []), t)
        if f is None:
            continue
        out[t] = {"rule": f.rule, "severity": f.severity.label, "confidence": f.confidence, "summary": f.summary,
                  "suggestion": None if s is None else {"flag": s.flag, "current": owned(s.current), "proposed": owned(s.proposed)}}
    return out


@dataclass(slots=True)
class Prepared:
    """The parts of a report that do not depend on the findings (each timeline's span, signal table and
    config table), built while the rules run (``cli/run.py analyse`` passes :func:`prepare` to
    ``evaluate`` as its ``meanwhile``: this process builds them while worker processes judge targets)."""

    timelines: list[Timeline]  # the list they were built from (build() checks it is the collection's)
    spans: list[tuple[float | None, float | None]]
    tables: list[dict[str, dict[str, Any]]]
    config: dict[str, dict[str, dict[str, Any]]]


def prepare(collection: Any) -> Prepared:
    tls: list[Timeline] = collection.timelines
    return Prepared(list(tls), [tl.span() for tl in tls], signal_tables(tls), {tl.target: config_table(tl) for tl in tls})


@gcpause.paused()  # its dicts and lists hold no cycles: 1.5 s of 4.4 at 10,000 fleet targets (bench/bench_fleet.py)
def build(collection: Any, report: Any, fail_on: Severity = Severity.WARNING, engine: str = "sglang",
          prepared: Prepared | None = None) -> dict[str, Any]:
    tls: list[Timeline] = collection.timelines
    if prepared is None or len(prepared.timelines) != len(tls) or any(a is not b for a, b in zip(prepared.timelines, tls, strict=True)):
        prepared = prepare(collection)
    spans = prepared.spans
    starts = [s for s, _e in spans if s is not None]
    ends = [e for _s, e in spans if e is not None]
    version = next((tl.version for tl in tls if tl.version), None)
    usable = collection.usable()
    from diagnoser.rules import REGISTRY

    notes = {r.name for r in REGISTRY if r.note}  # a note about the inputs never makes a problem on its own
    # nothing was recognised: the input errors say why; a note on what the findings stand on has nothing to qualify
    findings = [f.to_dict() for f in report.findings if usable or f.rule not in notes]
    problems = any(f.severity >= fail_on and f.rule not in notes for f in report.findings)
    status = "error" if not usable else ("problems" if problems else "ok")
    untimed = any(tl.untimed for tl in tls)
    engines = {tl.target: getattr(tl, "engine", "sglang") for tl in tls}
    if engine == "sglang" and engines and set(engines.values()) != {"sglang"}:  # detected per input
        engine = "+".join(sorted(set(engines.values())))
    tables = prepared.tables
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "engine": engine,
        "version": version,
        "inputs": owned([i.to_dict() for i in collection.inputs]),
        "window": {"start": None if untimed else iso(min(starts)) if starts else None, "end": None if untimed else iso(max(ends)) if ends else None},
        "config": prepared.config,
        "signals": None,  # (below)
        "findings": findings,
        "errors": owned([e.to_dict() for e in report.errors] + [{"source": "input", "error": m} for m in collection.errors]),
    }
    if set(engines.values()) != {"sglang"} and engines:
        doc["engines"] = engines  # each target's engine, when one is not SGLang
    doc["top"] = top_causes(report, [tl.target for tl in tls])
    doc["checked"] = list(getattr(report, "checked", []))
    if getattr(collection, "fleet", None) is not None:  # fleet mode (--prometheus)
        from diagnoser.outputs.fleet import fleet_section

        doc["fleet"] = fleet_section(collection, report, tables)
    signals = {tl.target: table for tl, table in zip(tls, tables, strict=True)}
    # the output door: whatever reached the document, no secret leaves in it. Built here, the document owns
    # every part (owned() copies what it took from the inputs), so what redaction leaves unchanged is kept as it
    # is rather than copied (redact_owned); the rules' checked rows are the report's: copied. The signal tables
    # hold numbers computed here (and the names of lower bounds): only their keys (target, signal and rank
    # names) came from an input, so only those are redacted (as redact_strings would; tests/test_report_fast.py)
    checked = doc["checked"]
    doc["checked"] = None
    out = redact_owned(doc)
    out["checked"] = redact_strings(checked, 1)
    clean: set[str] = set()  # keys redaction leaves as they are (most: canonical signal names)
    out["signals"] = {redact_key(t): _clean_keys(table, clean) for t, table in signals.items()}
    return out


def _clean_keys(table: dict[str, Any], clean: set[str]) -> dict[str, Any]:
    """``table`` with its keys redacted as text (itself when none changes; ``clean``: keys known unchanged)."""
    if clean.issuperset(table):
        return table
    for k in table:
        if type(k) is str and k not in clean and redact_key(k) == k:
            clean.add(k)
    if clean.issuperset(table):
        return table
    return {redact_key(k): v for k, v in table.items()}
