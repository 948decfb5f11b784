"""Fleet mode: read every SGLang target from an existing Prometheus into one timeline per target (and
every vLLM target beside them, read by :mod:`diagnoser.fleet.vllm`).

One pass = one ``series`` call (discovery, spelling, version hints), one coarse range query (config
gauges) and one ``query_range`` per canonical signal for the whole fleet, run a few at a time. Targets
are ``(job, instance, model_name)``; ``dp_rank``/``pp_rank`` become rank keys (``dp0``…) exactly as in
the direct path (``engines/sglang/metrics.rank_key``), so every rule runs unchanged.

A failed query (timeout, 5xx, partial answer) costs only its signal: the pass goes on and the
collection lists, per target, which signals are missing and why.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from diagnoser import gcpause
from diagnoser.collect import Collection, finalize
from diagnoser.engines.sglang import metrics as M
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.fleet import queries as Q
from diagnoser.fleet.bounds import (
    bound_quantiles,
    bucket_query,
    quiet_targets,
    shared_bounds,
    totals_from_zero,
)
from diagnoser.fleet.promapi import DEADLINE_GRACE_S, PromAPI, PromError
from diagnoser.fleet.quantiles import Columns, quantile_columns, quantile_rows
from diagnoser.model import InputReport, iso
from diagnoser.timeline import Series, Timeline

_first = itemgetter(0)
_second = itemgetter(1)
QUERY_TIMEOUT_MIN = 30.0
MAX_TARGETS = 20000  # targets per pass (more are named as cut); one holds about 60 KiB (bench/bench_fleet.py)
MAX_POINTS = 500  # per series and pass: keeps memory bounded whatever --range/--step say
AUTO_POINTS = 200  # points per series when the step follows the data
WORKERS = 4
HELD_ANSWERS = WORKERS  # answers in flight or read and waiting to be parsed (each at most MAX_ANSWER_BYTES)
_BATCH = True  # _values_batch first (tests/test_fleet_speed.py turns it off for the reference path)
_LOCAL_QUANTILES = True  # quantiles computed from one bucket-rate answer per histogram (off: asked of Prometheus)
PASS_QUERIES = 3  # a pass may take as long as this many queries' deadlines, whatever is left then is missing and said


@dataclass(slots=True)
class FleetCollection(Collection):
    """A Collection plus what fleet outputs need (``fleet`` is the JSON ``fleet`` key's raw part)."""

    fleet: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Window:
    start: float
    end: float
    step: float
    rate_window: float
    # which of range / step / rate window the user gave (the others follow the data, see fit_to_data)
    given: tuple[bool, bool, bool] = (True, True, True)
    scrape_interval: float | None = None
    history: float | None = None

    @classmethod
    def from_args(cls, rng: float | None, step: float | None, rate_window: float | None, end: float | None) -> tuple[Window, list[str]]:
        notes: list[str] = []
        given = (rng is not None, step is not None, rate_window is not None)
        rng = float(rng or 600.0)
        end = float(end if end is not None else time.time())
        st = float(step or max(15.0, round(rng / 20.0)))
        if rng / st > MAX_POINTS:
            st = math.ceil(rng / MAX_POINTS)
            notes.append(f"--step raised to {st:g} s to keep at most {MAX_POINTS} points per series.")
        rw = float(rate_window or max(60.0, 2 * st))
        return cls(end - rng, end, st, rw, given), notes

    def fit_to_data(self, interval: float | None, first: float | None) -> str:
        """Follow the data where the user gave nothing: the range no longer than the history there is
        (plus one scrape), the step one scrape interval (at most ``AUTO_POINTS`` points), the rate window
        four scrapes (at least two steps). Returns a note saying so, empty when nothing changed."""
        if interval is None or interval <= 0:
            return ""
        self.scrape_interval = interval
        rng = self.end - self.start
        if first is not None:
            self.history = max(0.0, self.end - first)
            if not self.given[0]:
                rng = min(rng, max(self.history + interval, 2 * interval))
                self.start = self.end - rng
        if not self.given[1]:
            self.step = max(float(interval), math.ceil(rng / AUTO_POINTS))
        if not self.given[2]:
            self.rate_window = max(4 * float(interval), 2 * self.step)
        if all(self.given):
            return ""
        hist = f", {self.history:.0f} s of history" if self.history is not None else ""
        return (f"Query range {rng:.0f} s, step {self.step:g} s, rate window {self.rate_window:g} s from the data "
                f"(scrape interval {interval:g} s{hist}); --range/--step/--rate-window set them.")


def parse_end(text: Any) -> float | None:
    """``--end``: epoch seconds, an ISO time (``2026-11-29T10:00:00Z``) or ``now``."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "now")):
        return None
    if isinstance(text, int | float):
        return float(text)
    t = str(text).strip()
    try:
        return float(t)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--end {t!r} is not a time; use epoch seconds or an ISO time such as 2026-11-29T10:00:00Z") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


class _Targets:
    """(job, instance, model_name) → Timeline, with readable names (instance; job/instance or
    instance model when an instance is shared)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str, str], Timeline] = {}
        self.by_instance: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        self.labels: dict[tuple[str, str, str], set[str]] = {}
        self.names: dict[tuple[str, str, str], set[str]] = {}
        self.spellings: dict[tuple[str, str, str], set[str]] = {}
        self.sched: dict[tuple[str, str, str], set[str]] = {}
        self.frozen = False  # past MAX_TARGETS: series of other targets are ignored
        self.engine_types: dict[tuple[str, str, str], set[str]] = {}
        # values and results dropped, by kind: nan, inf (±Inf, 1e309), junk (not a number), shape (a result
        # that is not {"metric": {…}, "values": […]})
        self.dropped: dict[str, int] = {}
        # series written a time grid at a time (rank ""): signal → (timelines, their series, the grid's times,
        # their values a row each), for bounds.quiet_targets
        self.rows: dict[str, list[tuple[list[Timeline], list[Series], np.ndarray, np.ndarray]]] = {}

    def drop(self, kind: str, n: int = 1) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + n

    @staticmethod
    def key_of(metric: dict[str, str]) -> tuple[str, str, str]:
        return (_label(metric, "job"), _label(metric, "instance"), _label(metric, "model_name") or _label(metric, "name"))

    def add(self, key: tuple[str, str, str]) -> Timeline:
        tl = self.keys.get(key)
        if tl is None:
            tl = self.keys[key] = Timeline(target="")
            tl.meta["labels"] = {k: v for k, v in zip(Q.TARGET_LABELS, key, strict=True) if v}
            self.by_instance.setdefault(key[:2], []).append(key)
        return tl

    def resolve(self, metric: dict[str, str]) -> Timeline | None:
        if not isinstance(metric, dict):
            return None
        key = self.key_of(metric)
        tl = self.keys.get(key)
        if tl is not None:
            return tl
        if not key[2]:  # a model-less series (http_requests_active): the instance's only model
            same = self.by_instance.get(key[:2], [])
            if len(same) == 1:
                return self.keys[same[0]]
            return None
        return None if self.frozen else self.add(key)

    def name_all(self) -> None:
        jobs_per_instance: dict[str, set[str]] = {}
        for job, inst in self.by_instance:
            jobs_per_instance.setdefault(inst, set()).add(job)
        for key, tl in self.keys.items():
            job, inst, model = key
            name = inst or job or model or "prometheus"
            if len(jobs_per_instance.get(inst, ())) > 1 and job:
                name = f"{job}/{name}"
            if len(self.by_instance.get((job, inst), [])) > 1 and model:
                name = f"{name} {model}"
            tl.target = name


def _discover(found: list[dict[str, str]], targets: _Targets) -> None:
    """The targets of a ``series`` answer's label sets (dicts of strings; model-less ones last), with what
    each tells of its target: label names, spellings, metric names, scheduler labels, engine types."""
    per: dict[tuple[str, str, str], list[dict[str, str]]] = {}  # the series with a model label, by target
    rest: list[dict[str, str]] = []
    for metric in found:
        get = metric.get
        key = (get("job", ""), get("instance", ""), get("model_name") or get("name", ""))  # (_Targets.key_of)
        if key[2]:
            have = per.get(key)
            if have is None:
                per[key] = [metric]
            else:
                have.append(metric)
        else:
            rest.append(metric)
    probe = M.SCHEDULER_PROBE
    told: dict[str, tuple[str, str | None, bool]] = {}  # metric name → (spelling, base, a scheduler gauge)
    for key, ms in per.items():  # (in order of appearance)
        targets.add(key)
        targets.labels[key] = set().union(*ms)
        tells = []
        for m in ms:
            name = m.get("__name__", "")
            tell = told.get(name)
            if tell is None:
                base = M.normalise(name)
                tell = told[name] = (name[:7], base, bool(base) and base in probe)
            tells.append(tell)
        targets.spellings[key] = {t[0] for t in tells}
        bases = {t[1] for t in tells if t[1]}
        if bases:
            targets.names[key] = bases  # type: ignore[assignment]
            sched = next((m for m, t in zip(ms, tells, strict=True) if t[2]), None)
            if sched is not None:
                targets.sched[key] = set(sched)
        kinds = [m["engine_type"] for m in ms if m.get("engine_type")]
        if kinds:
            targets.engine_types[key] = set(kinds)
    _discover_reference(rest, targets)  # the model-less series (radix-cache, HTTP collectors): each its instance's only model


def _discover_reference(found: list[dict[str, str]], targets: _Targets) -> None:
    """:func:`_discover` a series at a time (the reference; tests/test_fleet_speed_paths.py)."""
    for metric in found:
        key = targets.key_of(metric)
        if not key[2]:
            same = targets.by_instance.get(key[:2], [])
            if len(same) > 1:
                continue  # ambiguous: several models behind one instance
            key = same[0] if same else key
        targets.add(key)
        targets.labels.setdefault(key, set()).update(metric)
        name = metric.get("__name__", "")
        targets.spellings.setdefault(key, set()).add(name[:7])
        base = M.normalise(name)
        if base:
            targets.names.setdefault(key, set()).add(base)
            if base in M.SCHEDULER_PROBE and key not in targets.sched:
                targets.sched[key] = set(metric)
        if metric.get("engine_type"):
            targets.engine_types.setdefault(key, set()).add(metric["engine_type"])


def _label(metric: dict[str, Any], name: str) -> str:
    v = metric.get(name, "")
    return v if isinstance(v, str) else ""


def _label_sets(found: list[Any], targets: _Targets) -> list[dict[str, str]]:
    """A ``series`` answer's label sets, each a dict of strings (anything else is dropped and counted)."""
    if (_BATCH and isinstance(found, list) and set(map(type, found)) <= {dict}
            and set(map(type, chain.from_iterable(found))) | set(map(type, chain.from_iterable(map(dict.values, found)))) <= {str}):
        return list(found)  # (every label set plain: checked a column at a time)
    out: list[dict[str, str]] = []
    for m in found:
        if isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
            out.append(m)
        else:
            targets.drop("shape")
    return out


_EMPTY = np.zeros(0)
_NUMBER = {int, float}


def _values(values: Any, targets: _Targets) -> tuple[np.ndarray, np.ndarray]:
    """``[[t, "v"], …]`` → (times, values), float64, finite values only. Values that are NaN, ±Inf (also
    ``1e309``) or not a number, and malformed pairs, are dropped and counted, as in an exposition."""
    if not isinstance(values, list) or not values:
        if values not in (None, []):
            targets.drop("shape")
        return _EMPTY, _EMPTY
    try:
        ts = np.array([float(p[0]) for p in values])
        vs = np.array([float(p[1]) for p in values])
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        t_ok: list[float] = []
        v_ok: list[float] = []
        for p in values:
            try:
                t, v = float(p[0]), float(p[1])
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                targets.drop("junk" if isinstance(p, list | tuple) and len(p) == 2 else "shape")
                continue
            t_ok.append(t)
            v_ok.append(v)
        ts, vs = np.array(t_ok), np.array(v_ok)
    good = np.isfinite(vs) & np.isfinite(ts)
    if not good.all():
        bad = ~good
        nan = int(np.isnan(vs[bad]).sum())
        if nan:
            targets.drop("nan", nan)
        if int(bad.sum()) - nan:
            targets.drop("inf", int(bad.sum()) - nan)
        ts, vs = ts[good], vs[good]
    if len(ts) > 1 and bool((ts[1:] < ts[:-1]).any()):  # Prometheus answers in time order; anything else is put in it
        order = np.argsort(ts, kind="stable")
        ts, vs = ts[order], vs[order]
    return ts, vs


def _values_flat(lists: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every point of ``lists`` (one ``values`` list per series) as two flat float64 columns and each
    series' end in them, with :func:`_values_batch`'s checks; None when anything is not plain."""
    got = _converted(lists)
    if got is None or not (np.isfinite(got[0]).all() and np.isfinite(got[1]).all()) or not _in_order(got[0], got[2]):
        return None
    return got


def _values_kept(lists: list[Any], targets: _Targets) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`_values_flat`, NaN and infinite points dropped and counted as :func:`_values` drops them
    series by series; None (nothing counted) when a point does not convert or a series is out of order."""
    got = _converted(lists)
    return None if got is None else _kept(*got, targets)


def _kept(ts: np.ndarray, vs: np.ndarray, ends: np.ndarray, targets: _Targets) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Flat columns (series k ending at ``ends[k]``) less their NaN and infinite points, counted as
    :func:`_values` counts them; None (nothing counted) when a series is out of order."""
    good = np.isfinite(ts) & np.isfinite(vs)
    if good.all():
        return (ts, vs, ends) if _in_order(ts, ends) else None
    n = np.diff(ends, prepend=0)
    which = np.repeat(np.arange(len(n)), n)
    kept = np.cumsum(np.bincount(which[good], minlength=len(n)), dtype=np.int64)
    if not _in_order(ts[good], kept):
        return None
    _count_dropped(vs, good, which, targets)
    return ts[good], vs[good], kept


def _count_dropped(vs: np.ndarray, good: np.ndarray, which: np.ndarray, targets: _Targets) -> None:
    """Count the points not ``good`` as :func:`_values` does, series by series (``which``: each point's
    series): a NaN value as "nan", any other as "inf" (each kind first counted where its first series is)."""
    nan = np.isnan(vs)  # (a point whose time is not finite, its value finite, counts as infinite)
    inf = ~good & ~nan
    first = {kind: int(which[mask].min()) for kind, mask in (("nan", nan), ("inf", inf)) if mask.any()}
    for kind in sorted(first, key=lambda kind: (first[kind], kind != "nan")):
        targets.drop(kind, int((nan if kind == "nan" else inf).sum()))


def _converted(lists: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every point of ``lists`` converted as :func:`_values` converts it (``float`` of the time and of the
    value), as flat float64 columns and each series' end in them; None when a point does not convert or a
    ``values`` is not a list."""
    if not set(map(type, lists)) <= {list}:
        return None
    n = list(map(len, lists))
    total = sum(n)
    flat = list(chain.from_iterable(lists))
    try:
        times = list(map(_first, flat))
        k = n[0] if n else 0
        grid = times[:k]
        if k and n.count(k) == len(n) and set(map(type, grid)) <= _NUMBER and 0 not in grid and times == grid * len(n):
            # every series on one time grid (the usual range answer): its k times converted once (equal
            # numbers, none of them zero, so no -0.0 among them: the same floats as converting each)
            ts = np.tile(np.array(grid, np.float64), len(n))
        elif set(map(type, times)) <= _NUMBER:  # JSON numbers: numpy converts them as float() does, in one call
            ts = np.array(times, np.float64)
        else:
            ts = np.fromiter(map(float, times), np.float64, total)
        del times, grid
        vs = np.fromiter(map(float, map(_second, flat)), np.float64, total)
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return None
    return ts, vs, np.cumsum(n, dtype=np.int64)


def _in_order(ts: np.ndarray, ends: np.ndarray) -> bool:
    """Each series' times (series k ends at ``ends[k]``) in order (equal times too)."""
    total = len(ts)
    if total < 2:
        return True
    back = ts[1:] < ts[:-1]
    inner = ends[:-1][(ends[:-1] > 0) & (ends[:-1] < total)] - 1  # a series' last point before the next one's first
    back[inner] = False
    return not bool(back.any())


def _values_batch(lists: list[Any]) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """:func:`_values` for every series of one answer at once: one pass over all its points (``float`` on
    each time and value, as :func:`_values` does), the finiteness and time-order checks done once on the
    whole answer. None when anything is not plain (a ``values`` that is not a list, a pair that does not
    convert, a value that is not finite, points out of order): the caller then takes :func:`_values` per
    series, which counts what it drops. Same arrays as :func:`_values` (tests/test_fleet_speed.py)."""
    got = _values_flat(lists)
    if got is None:
        return None
    ts, vs, ends = got
    out: list[tuple[np.ndarray, np.ndarray]] = []
    a = 0
    for b in ends.tolist():
        out.append((ts[a:b], vs[a:b]) if b > a else (_EMPTY, _EMPTY))
        a = b
    return out


def _dropped_message(dropped: dict[str, int]) -> str:
    """One sentence for what was dropped (NaN alone is not said: an empty histogram's quantile is NaN)."""
    parts = []
    if dropped.get("inf"):
        parts.append(f"{dropped['inf']:,} infinite (+Inf, -Inf or out of range)")
    if dropped.get("junk"):
        parts.append(f"{dropped['junk']:,} not a number")
    if dropped.get("shape"):
        parts.append(f"{dropped['shape']:,} malformed result(s) or point(s)")
    if not parts:
        return ""
    return f"Prometheus answered values diagnoser cannot use, dropped: {', '.join(parts)}."


def collect_prometheus(args: Any, adapter: Any, api: PromAPI | None = None) -> FleetCollection:
    """Read the fleet selected by ``args`` (``prometheus``, ``selector``, ``range``, ``step``,
    ``rate_window``, ``end``, ``timeout`` and the auth options) from Prometheus."""
    from diagnoser.fleet.promapi import auth_headers

    col = FleetCollection()
    rep = InputReport(kind="prometheus", source="")
    col.inputs.append(rep)
    try:
        matchers = Q.parse_selector(getattr(args, "selector", ""))
        headers = auth_headers(getattr(args, "bearer_token", None), getattr(args, "basic_auth", None), getattr(args, "header", None))
    except ValueError as e:
        rep.source = str(args.prometheus)
        rep.errors += 1
        rep.messages.append(str(e))
        return col
    own = api is None
    # a fleet-wide query does more work than one scrape: never less than QUERY_TIMEOUT_MIN (Prometheus'
    # own default is 2 min); the value is also sent as the query's `timeout`
    timeout = max(float(getattr(args, "timeout", 0.0) or 0.0), QUERY_TIMEOUT_MIN)
    api = api or PromAPI(args.prometheus, timeout=timeout, headers=headers)
    rep.source = api.shown
    if getattr(args, "url", None) or getattr(args, "log", None):
        rep.messages.append("--url and --log are not read with --prometheus (fleet mode); run them as a separate diagnose.")
    try:
        end = parse_end(getattr(args, "end", None))
    except ValueError as e:
        rep.errors += 1
        rep.messages.append(str(e))
        return col
    win, notes = Window.from_args(getattr(args, "range", None), getattr(args, "step", None),
                                  getattr(args, "rate_window", None), end)
    rep.messages.extend(notes)
    t0 = time.perf_counter()
    try:
        with gcpause.paused():  # the answers' millions of lists and dicts hold no cycles (diagnoser/gcpause.py)
            _collect(api, adapter, matchers, win, col, rep)
    finally:
        if own:
            api.close()
    col.fleet.update({
        "prometheus": api.shown, "selector": getattr(args, "selector", "") or "",
        "range": {"start": iso(win.start), "end": iso(win.end), "step_s": win.step, "rate_window_s": win.rate_window,
                  "scrape_interval_s": win.scrape_interval, "history_s": None if win.history is None else round(win.history, 1),
                  "from_data": [k for k, g in zip(("range", "step", "rate_window"), win.given, strict=True) if not g]},
        "queries": api.calls, "bytes": api.bytes_read, "query_seconds": round(api.seconds, 3),
        "collect_seconds": round(time.perf_counter() - t0, 3),
    })
    rep.scrapes = api.calls
    for w in api.warnings:
        if w not in rep.messages:
            rep.messages.append(w)
    return col


def _collect(api: PromAPI, adapter: Any, matchers: str, win: Window, col: FleetCollection, rep: InputReport) -> None:
    targets = _Targets()
    # the pass's deadline: a few queries' worth; past it no answer is waited for (the sockets still open are shut)
    api.pass_deadline = time.monotonic() + PASS_QUERIES * (api.timeout + DEADLINE_GRACE_S)
    api.cut = 0
    try:
        found = _label_sets(api.series(Q.discovery_match(matchers), win.start, win.end), targets)
    except PromError as e:
        rep.errors += 1
        rep.messages.append(str(e))
        col.fleet["pass_failed"] = str(e)
        return
    # series with a model label first: a model-less one (radix-cache, HTTP collectors) then joins its
    # instance's only model instead of making a target of its own
    found.sort(key=lambda m: not (m.get("model_name") or m.get("name")))
    (_discover if _BATCH else _discover_reference)(found, targets)
    if not targets.keys:
        if not _add_vllm(api, matchers, win, col, rep):  # a fleet of vLLM servers only
            rep.errors += 1
            rep.messages.append(_no_match(api, matchers, win))
        return
    if len(targets.keys) > MAX_TARGETS:  # memory stays bounded: per target, and in targets
        extra = sorted(targets.keys)[MAX_TARGETS:]
        for key in extra:
            del targets.keys[key]
            targets.by_instance[key[:2]].remove(key)
        targets.frozen = True
        rep.messages.append(f"{MAX_TARGETS + len(extra)} targets match; the first {MAX_TARGETS} (by job and instance) are read. "
                            f"Narrow --selector to see the others.")
    targets.frozen = True
    if not all(win.given):  # the step and range follow the data: its scrape interval and the history there is
        interval, first = _probe(api, found, win)
        note = win.fit_to_data(interval, first)
        if note:
            rep.messages.append(note)
    failed: dict[str, str] = {}
    plan = Q.plan(matchers, win.step, win.rate_window)

    del found  # (the discovery answer: the targets hold what they need of it)

    # answers read and not yet parsed and ingested (this thread parses them, one at a time): a worker
    # waits for a slot before it sends its query
    gate = threading.Semaphore(HELD_ANSWERS)

    timed: set[str] = set()  # queries that ran out of time (a bucket-rate query's quantiles are then not asked again)

    def run(q: Q.SignalQuery) -> list[Any]:
        # a list, emptied once ingested: the future keeps its result, the answer is not kept with it
        if not gate.acquire(timeout=max(0.0, api.pass_deadline - time.monotonic())):
            timed.add(q.signal)
            return [q, None, f"its query was not sent before the pass's deadline ({PASS_QUERIES} query timeouts)", False]
        try:
            step = max(win.step, win.rate_window) if q.kind in ("quantile", "buckets") else win.step
            return [q, api.query_range(q.promql, win.start, win.end, step, raw=True), "", True]
        except PromError as e:
            gate.release()
            if e.timeout:
                timed.add(q.signal)
            return [q, None, str(e), False]

    def side(query: str, step: float) -> list[Any]:
        """A side query (config gauges, bucket bounds), held as the others are: [answer, None] or [None, the error]."""
        if not gate.acquire(timeout=max(0.0, api.pass_deadline - time.monotonic())):
            return [None, PromError("its query was not sent before the pass's deadline")]
        try:
            return [api.query_range(query, win.start, win.end, step, raw=True), None]
        except PromError as e:
            gate.release()
            return [None, e]

    def group(q: Q.SignalQuery) -> str:  # queries whose ingestion order matters go together
        return "cache_hit_rate" if q.signal in ("cache_hit_rate", Q.PREFILL) else q.signal

    size: dict[str, int] = {}
    for q in plan:
        size[group(q)] = size.get(group(q), 0) + 1
    used = 0
    have: dict[str, set[int]] = {}  # signal → ids of timelines that got it from a higher-priority query
    ok: set[str] = set()
    # a group's answers wait here unparsed (bytes, not the 3.5-8x larger parsed lists) until all are in,
    # then are parsed and ingested one at a time in priority order
    waiting: dict[str, list[tuple[Q.SignalQuery, Any, str]]] = {}
    config: list[dict[str, Any]] = []
    buckets: dict[str, tuple[float, ...]] = {}
    # the slow bucket queries go first; each signal is ingested as soon as its queries are in, while
    # Prometheus still works on the others
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        # the quantiles from one bucket-rate answer per histogram (diagnoser/fleet/quantiles.py), or each
        # asked of Prometheus (the reference, and the way back when that answer cannot be used)
        rates = Q.bucket_rates(plan, matchers, win.rate_window) if _LOCAL_QUANTILES else {}
        jobs = [q for q in plan if not (q.kind == "quantile" and q.base in rates)] + [job for job, _qs in rates.values()]
        ordered = sorted(jobs, key=lambda q: q.kind not in ("quantile", "buckets"))
        slow = [q for q in ordered if q.kind in ("quantile", "buckets")]
        futures = [pool.submit(run, q) for q in slow]
        # config gauges: a few points over the whole range (an instant query would see only the last 5 min)
        # (a step of the whole range could evaluate at the start alone: Prometheus rounds the times to ms,
        # and start + step may land past the end). Sent right after the slow bucket queries, beside them: they
        # are needed only at the end, and sent last they were the pass's last 0.6 s at 10,000 targets
        cfg_step = min(max((win.end - win.start) / 4, 1.0), 240.0)
        # Both are read unparsed and parsed here as they come in, one parse at a time with the others: parsed
        # in a worker they could be parsed beside this thread's parse (tests/test_fleet_hostile.py's peak)
        cfg_future = pool.submit(side, Q.config_query(matchers), cfg_step)
        bkt_future = pool.submit(side, bucket_query(matchers), cfg_step)  # the bucket bounds
        side_got: dict[Any, Any] = {}  # future → the parsed result, or the PromError
        futures += [pool.submit(run, q) for q in ordered[len(slow):]]
        plan_of = dict(zip(futures, ordered, strict=True))

        def side_done(fut: Any) -> None:
            box = fut.result()
            raw, err = box
            box.clear()
            if err is None:
                try:
                    side_got[fut] = api.finish(raw)
                except PromError as e:
                    side_got[fut] = e
                finally:
                    del raw
                    gate.release()
            else:
                side_got[fut] = err

        def handle(q: Q.SignalQuery, raw: Any, err: str) -> None:
            nonlocal used
            if q.kind == "buckets":
                _quantiles_from_rates(q, raw, err)
                return
            g = group(q)
            waiting.setdefault(g, []).append((q, raw, err))
            if len(waiting[g]) < size[g]:
                return
            for q, raw, err in sorted(waiting.pop(g), key=lambda r: (r[0].signal != "cache_hit_rate", r[0].priority)):
                res = None  # (the previous answer's parsed lists are let go before this one is parsed)
                if isinstance(raw, list | Columns):  # rows computed here (_quantiles_from_rates)
                    res = raw
                elif raw is not None:
                    try:
                        res = api.finish(raw)
                    except PromError as e:
                        err = str(e)
                if res is None:
                    failed.setdefault(q.signal, err)
                    rep.errors += 1
                    continue
                ok.add(q.signal)
                used += _ingest(q, res, targets, have.setdefault(q.signal, set()))

        def _quantiles_from_rates(job: Q.SignalQuery, raw: Any, err: str) -> None:
            """A histogram's bucket rates → its quantile queries' rows; when the answer is missing for
            another reason than time, or cannot be used, those queries are asked of Prometheus here."""
            sqs = rates[job.base][1]
            rows = None
            timed_out = False
            if raw is not None:
                try:
                    rows = (quantile_columns if _BATCH else quantile_rows)(api.finish(raw), tuple(sorted({sq.q for sq in sqs})))
                except PromError as e:
                    err, timed_out = str(e), e.timeout
            elif job.signal in timed or "deadline" in err:  # (its own time, or the pass's, ran out)
                timed_out = True
            raw = None
            for sq in sqs:
                if rows is not None:
                    handle(sq, rows[sq.q], "")
                elif timed_out:
                    handle(sq, None, err)
                else:
                    try:
                        step = max(win.step, win.rate_window)
                        handle(sq, api.query_range(sq.promql, win.start, win.end, step, raw=True), "")
                    except PromError as e:
                        handle(sq, None, str(e))

        done_futs: set[Any] = set()
        sides = (cfg_future, bkt_future)
        try:  # every call ends by the pass deadline (its socket is shut then): the extra time is a safety net
            for fut in as_completed([*futures, *sides], timeout=max(0.0, api.pass_deadline - time.monotonic()) + 2.0):
                if fut in sides:
                    side_done(fut)
                    continue
                done_futs.add(fut)
                box = fut.result()
                q, answer, err, held = box
                box.clear()
                try:
                    handle(q, answer, err)  # (parsed there, when its group is complete)
                finally:
                    del answer
                    if held:
                        gate.release()
        except FuturesTimeout:
            pass
        late = [f for f in futures if f not in done_futs]
        for fut in late:
            fut.cancel()
            handle(plan_of[fut], None, f"its query was not answered before the pass's deadline ({PASS_QUERIES} query timeouts)")
        for fut in sides:  # (both are in unless the pass's deadline came first)
            if fut not in side_got:
                try:
                    fut.result(timeout=max(0.0, api.pass_deadline - time.monotonic()) + 2.0)
                    side_done(fut)
                except FuturesTimeout:
                    side_got[fut] = None
        got = side_got.get(cfg_future)
        if isinstance(got, list):
            config = got
        else:
            rep.errors += 1
            rep.messages.append(f"Config gauges (pool size, page size, context length) are missing: {got}" if isinstance(got, PromError) else
                                "Config gauges (pool size, page size, context length) are missing: their query was not answered "
                                "before the pass's deadline.")
        got = side_got.get(bkt_future)  # without them a quantile keeps Prometheus' value (TTFT: the release's default buckets)
        buckets = shared_bounds(got) if isinstance(got, list) else {}
        side_got.clear()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        # handle and _quantiles_from_rates call each other: unbound here, their cycle does not keep this
        # pass's locals (the targets' tables, the plan) alive until the next cyclic collection
        handle = _quantiles_from_rates = None  # type: ignore[assignment]
    if late or api.cut:
        col.fleet["pass_failed"] = (f"Prometheus at {api.shown} did not answer {len(late) + api.cut} of {len(futures) + 2} queries before the "
                                    f"pass's deadline ({PASS_QUERIES} x {api.timeout + DEADLINE_GRACE_S:g} s); their signals are missing.")
        rep.messages.append(col.fleet["pass_failed"])
    failed = {s: e for s, e in failed.items() if s not in ok}
    if failed and not ok and "pass_failed" not in col.fleet:
        col.fleet["pass_failed"] = f"every query failed ({len(failed)} signals), e.g. {next(iter(failed.values()))}"
    _ingest_config(config, targets)
    said = _dropped_message(targets.dropped)
    if said:
        rep.messages.append(said)
    col.fleet["dropped"] = dict(targets.dropped)
    targets.name_all()
    for key, tl in targets.keys.items():
        if key[2]:
            tl.set_config("served_model_name", key[2], "prometheus label model_name", override=False)
    missing_core = _missing(targets, failed)
    totals = {q.signal for q in plan if q.kind == "total"}
    detected: dict[tuple[Any, ...], VersionRange] = {}  # what a target's names and labels tell, once per kind of target
    versions: dict[int, VersionRange] = {}
    for key, tl in targets.keys.items():
        names = targets.names.get(key, set())
        labels, sched, engine_types = targets.labels.get(key, set()), targets.sched.get(key), targets.engine_types.get(key, set())
        kind = (frozenset(names), frozenset(labels), None if sched is None else frozenset(sched), frozenset(engine_types))
        vr = detected.get(kind) if _BATCH else None
        if vr is None:
            state = M.MetricsState(seen_names=names, label_names=labels, sched_labels=sched, engine_types=engine_types,
                                   prerelease=bool(names & M.PRERELEASE_NAMES))
            vr = detected[kind] = M.detect_version(state)
        vr = versions[id(tl)] = VersionRange(vr.low, vr.high, vr.exact, None if vr.reasons is None else list(vr.reasons),
                                             None if vr.conflicts is None else list(vr.conflicts))  # (each target's own: finalize narrows it)
        finalize(tl, vr)
    # a quantile past the time since the target was idle is "> its bucket's floor": the targets none of whose
    # quantiles can be are found a time grid at a time (bounds.quiet_targets), the others each looked at
    quiet = quiet_targets(list(targets.keys.values()), targets.rows, versions, buckets) if _BATCH else set()  # type: ignore[arg-type]
    targets.rows.clear()
    for key, tl in targets.keys.items():
        vr = versions[id(tl)]
        if id(tl) not in quiet:
            bound_quantiles(tl, vr, buckets)
        totals_from_zero(tl, totals)  # a labelled counter that appears in the range was 0 before
        tl.meta["version_range"] = [list(vr.low), list(vr.high), list(vr.exact) if vr.exact else None]
        tl.meta["spelling"] = sorted(targets.spellings.get(key, set()))
        tl.meta["fleet"] = True
        tl.inputs.append(rep)
        col.versions[tl.target] = vr
        col.timelines.append(tl)
    _add_vllm(api, matchers, win, col, rep)  # a mixed fleet: its vLLM targets beside the SGLang ones
    col.timelines.sort(key=lambda t: t.target)
    rep.lines_recognized = used
    for sig, err in failed.items():
        rep.messages.append(f"{sig} is missing for all {len(targets.keys)} targets: {err}")
    rep.messages.extend(missing_core)
    col.fleet["failed_queries"] = dict(failed)
    col.fleet["missing"] = {tl.target: tl.meta["missing_signals"] for tl in col.timelines if tl.meta.get("missing_signals")}


def _probe(api: PromAPI, found: list[dict[str, str]], win: Window) -> tuple[float | None, float | None]:
    """(scrape interval, time of the first sample) from the raw samples of a few targets' core gauge in the
    range: one range-vector query (``{…}[R]`` at the end time), as Prometheus stored them."""
    picked: list[dict[str, str]] = []
    for m in found:
        if M.normalise(m.get("__name__", "")) in Q.CORE_GAUGES[:2] and m.get("instance"):
            if all(p.get("instance") != m.get("instance") for p in picked):
                picked.append(m)
        if len(picked) >= 3:
            break
    if not picked:
        return None, None
    names = sorted({p["__name__"] for p in picked})
    insts = sorted({p["instance"] for p in picked})
    sel = ('{__name__=~"' + "|".join(_rx(n) for n in names) + '", instance=~"' + "|".join(_rx(i) for i in insts) + '"}')
    span = max(1, int(round(win.end - win.start)))
    try:
        res = api.query(f"{sel}[{span}s]", win.end)
    except PromError:
        return None, None
    gaps: list[float] = []
    first: float | None = None
    for r in res:
        if not isinstance(r, dict):
            continue
        t_arr, _v = _values(r.get("values"), _Targets())
        ts = sorted(t_arr.tolist())
        if ts:
            first = ts[0] if first is None else min(first, ts[0])
        gaps.extend(b - a for a, b in zip(ts, ts[1:], strict=False) if b > a)
    if not gaps:
        return None, first
    gaps.sort()
    return round(gaps[len(gaps) // 2], 3), first


def _rx(text: str) -> str:
    """A literal for a PromQL regex inside a double-quoted string (regex and string escapes)."""
    import re as _re

    return _re.escape(text).replace("\\", "\\\\").replace('"', '\\"')


def _points(value_lists: list[tuple[np.ndarray, np.ndarray]], how: str) -> dict[float, float]:
    merged: dict[float, float] = {}
    for ts_arr, vs_arr in value_lists:
        for t, x in zip(ts_arr.tolist(), vs_arr.tolist(), strict=True):
            if t in merged:
                merged[t] = merged[t] + x if how == "sum" else max(merged[t], x)
            else:
                merged[t] = x
    return merged


def deltas(values: list[float]) -> list[float]:
    """Per-step increase of a cumulative series; a drop means a restart, so the count is from 0."""
    out = []
    for prev, cur in zip(values, values[1:], strict=False):
        out.append(cur - prev if cur >= prev else cur)
    return out


def _hold(points: dict[float, float], ts: list[float]) -> list[float]:
    """Values at ``ts``, holding the previous one where a series has no point (0 before the first)."""
    out, last = [], 0.0
    for t in ts:
        last = points.get(t, last)
        out.append(last)
    return out


def _tp(metric: dict[str, str]) -> int:
    try:
        return int(metric.get("tp_rank") or 0)
    except ValueError:
        return 0


def _rank(metric: dict[str, str]) -> str:
    """:func:`M.rank_key` without its call for the common single-scheduler series."""
    dp, pp = metric.get("dp_rank"), metric.get("pp_rank")
    if not dp and (not pp or pp == "0"):
        return ""
    return M.rank_key(metric)


def _pick_reference(result: list[Any], targets: _Targets, done: set[int]) -> list[tuple[dict[str, str], Timeline, Any]]:
    """Each result's (labels, timeline, values) for the timelines that take this answer; a result that is
    not ``{"metric": {label: string}, …}`` is dropped and counted. The reference for :func:`_pick`."""
    picked: list[tuple[dict[str, str], Timeline, Any]] = []
    for r in result:
        if not isinstance(r, dict):
            targets.drop("shape")
            continue
        metric = r.get("metric")
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            targets.drop("shape")
            continue
        tl = targets.resolve(metric)
        if tl is None or id(tl) in done:
            continue
        picked.append((metric, tl, r.get("values")))
    return picked


def _pick(result: list[Any], targets: _Targets, done: set[int]) -> list[tuple[dict[str, str], Timeline, Any]] | None:
    """:func:`_pick_reference` for a plain answer, the types checked once over all of it (every result a
    dict with a ``metric`` dict of strings) and each target looked up by its key directly (the labels read
    a column at a time). None when anything is not plain: the caller then takes the reference, which
    counts what it drops. Nothing is changed here (targets are frozen while the answers are read:
    :meth:`_Targets.resolve` adds none)."""
    if not result:
        return []
    metrics = _plain_metrics(result)
    if metrics is None:
        return None
    return _picked(metrics, list(_column(result, "values")), targets, done)


def _plain_metrics(result: list[Any]) -> list[dict[str, str]] | None:
    """Each result's ``metric`` when every result is a dict whose ``metric`` is a dict of strings, else None."""
    if set(map(type, result)) != {dict}:
        return None
    try:
        metrics = list(map(_metric_of, result))
    except KeyError:
        return None
    if set(map(type, metrics)) != {dict} or not set(map(type, chain.from_iterable(map(dict.values, metrics)))) <= {str}:
        return None
    return metrics


def _picked(metrics: list[dict[str, str]], values: list[Any], targets: _Targets, done: set[int]) -> list[tuple[dict[str, str], Timeline, Any]]:
    """(labels, timeline, values) of each series whose target is known and not ``done`` (:func:`_pick`)."""
    tls = _timelines(metrics, targets)
    if all(tls) and not done:  # (a Timeline is always true)
        return list(zip(metrics, tls, values, strict=True))
    return [(m, tl, v) for m, tl, v in zip(metrics, tls, values, strict=True) if tl is not None and id(tl) not in done]


def _timelines(metrics: list[dict[str, str]], targets: _Targets) -> list[Timeline | None]:
    """:meth:`_Targets.resolve` of each label set (dicts of strings), looked up a column at a time."""
    try:
        keys = list(map(_job_instance_model, metrics))  # (a KeyError: some label is missing)
        if not all(map(_third, keys)):  # an empty model_name: the pre-release `name` label
            raise KeyError
    except KeyError:
        models = [m or n for m, n in zip(_column(metrics, "model_name"), _column(metrics, "name", ""), strict=True)]
        keys = list(zip(_column(metrics, "job", ""), _column(metrics, "instance", ""), models, strict=True))
    tls = list(map(targets.keys.get, keys))
    if not all(tls):
        resolve = targets.resolve
        tls = [tl if tl is not None else resolve(m) for tl, m in zip(tls, metrics, strict=True)]  # a model-less series
    return tls


_metric_of = itemgetter("metric")
_job_instance_model = itemgetter("job", "instance", "model_name")
_third = itemgetter(2)


def _column(dicts: list[dict[str, Any]], key: str, default: Any = None) -> Iterator[Any]:
    """``d.get(key, default)`` of each dict, a column at a time (map over ``dict.get``: no Python call each)."""
    return map(dict.get, dicts, repeat(key), repeat(default))


def _ranks(metrics: list[dict[str, str]]) -> list[str]:
    """:func:`_rank` of each label set (one pass per label while every series is of a single scheduler)."""
    if not any(_column(metrics, "dp_rank")) and set(_column(metrics, "pp_rank")) <= {None, "", "0"}:
        return [""] * len(metrics)
    return [_rank(m) for m in metrics]


def _ingest(q: Q.SignalQuery, result: list[dict[str, Any]] | Columns, targets: _Targets, done: set[int]) -> int:
    """Write one query's series into the timelines (an answer's results, or quantiles computed here as
    :class:`Columns`). Returns the number of series used.

    Like the direct path: series of one (target, rank) combine with the signal's rule, and only the
    lowest TP rank of each DP rank counts (with --enable-metrics-for-all-schedulers every TP rank
    exports the same numbers)."""
    if isinstance(result, Columns):
        return _ingest_columns(q, result, targets, done)
    picked = _pick(result, targets, done) if _BATCH else None
    if picked is None:
        picked = _pick_reference(result, targets, done)
    flat = _values_kept([p[2] for p in picked], targets) if _BATCH else None
    return _write(q, picked, flat, targets, done)


def _ingest_columns(q: Q.SignalQuery, cols: Columns, targets: _Targets, done: set[int]) -> int:
    """:func:`_ingest` of quantiles computed here (:func:`quantile_columns`), as it reads their rows
    (:meth:`Columns.rows`): NaN and infinite points dropped and counted as :func:`_values` does, series by series."""
    picked = _picked(cols.metrics, list(range(len(cols.metrics))), targets, done)
    sizes = np.diff(cols.ends, prepend=0)
    ts, vs = cols.ts, cols.vs
    if len(picked) < len(cols.metrics):  # the points of the picked series only, in order
        k = np.array([p[2] for p in picked], dtype=np.int64)
        n = sizes[k]
        ends = np.cumsum(n, dtype=np.int64)
        take = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - n - (cols.ends[k] - n), n)
        ts, vs = ts[take], vs[take]
    else:
        ends = cols.ends
    kept = _kept(ts, vs, ends, targets)
    if kept is None:
        return _ingest(q, cols.rows(), targets, done)  # not in time order (never, from quantile_columns): as rows
    ts, vs, ends = kept
    return _write(q, picked, (ts, vs, ends), targets, done)


class _Grids:
    """The sources and time grids of one query's series: range results sit on the step grid, so the series
    of one grid share its times and sources (encoded once), each holding only its values
    (:meth:`Series.with_values`, :meth:`Series.with_rows`)."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.cache: dict[float, str] = {}
        self.grids: dict[bytes, Series] = {}

    def source(self, t: float) -> str:
        s = self.cache.get(t)
        if s is None:
            s = self.cache[t] = f"prometheus@{iso(t)} {self.shown}"
        return s

    def grid(self, ts: np.ndarray) -> Series:
        key = ts.tobytes()
        grid = self.grids.get(key)
        if grid is None:
            grid = self.grids[key] = Series(ts, np.zeros(len(ts)), [self.source(t) for t in ts.tolist()])
        return grid

    def on_grid(self, ts: np.ndarray, vals: Any) -> Series:
        return self.grid(ts).with_values(vals)


def _write(q: Q.SignalQuery, picked: list[tuple[dict[str, str], Timeline, Any]],
           flat: tuple[np.ndarray, np.ndarray, np.ndarray] | None, targets: _Targets, done: set[int]) -> int:
    """:func:`_ingest` once the series are picked: their points are the flat columns ``flat`` (see
    :func:`_values_flat`: one pass over the answer), or, without them, each series' ``values`` read by
    :func:`_values` (the reference, which counts what it drops)."""
    ranks = _ranks([p[0] for p in picked]) if q.per_rank else [""] * len(picked)
    grids = _Grids(q.shown)
    if flat is not None and q.kind != "prefill" and len(set(zip(map(id, map(_second, picked)), ranks, strict=True))) == len(picked):
        return _write_singles(q, [p[1] for p in picked], ranks, flat, grids, done, targets.rows)
    if flat is not None:
        ts_all, vs_all, ends = flat
        size_l, end_l = np.diff(ends, prepend=0).tolist(), ends.tolist()

    def points(k: Any) -> tuple[np.ndarray, np.ndarray]:
        # a series' arrays: sliced from the flat columns (k: its index), or already read (k: the arrays)
        if flat is None:
            return k  # type: ignore[no-any-return]
        a, b = end_l[k] - size_l[k], end_l[k]
        return (ts_all[a:b], vs_all[a:b]) if b > a else (_EMPTY, _EMPTY)

    # (target, rank) → [timeline, its series by (TP rank, mode), or None while it has one series: then that
    # series (its index in the flat columns, or its arrays) and labels]; one series, the common case, is
    # written as it is (what the grouping gives)
    groups: dict[tuple[int, str], list[Any]] = {}
    for k, (metric, tl, values) in enumerate(picked):
        if flat is not None:
            if not size_l[k]:
                continue
            pts: Any = k
        else:
            pts = _values(values, targets)
            if not len(pts[0]):
                continue
        rank = ranks[k]
        g = groups.get((id(tl), rank))
        if g is None:
            groups[(id(tl), rank)] = [tl, None, pts, metric]
            continue
        if g[1] is None:
            g[1] = {(_tp(g[3]), _label(g[3], "mode")): [points(g[2])]}
        g[1].setdefault((_tp(metric), _label(metric, "mode")), []).append(points(pts))
    used = 0
    fresh: set[int] = set()
    on_grid = grids.on_grid
    made: list[Series | None] = []
    if flat is not None and q.kind != "prefill":  # the single series of a target and rank: a time grid at a time
        made, steps, _n = _made(q, [p[1] for p in picked], ranks, flat, [g[2] for g in groups.values() if g[1] is None], grids, targets.rows)
    for (tid, rank), (tl, by_tp, one, metric) in groups.items():
        if by_tp is None and made and made[one] is not None:
            whole, step = made[one], steps[one]
            if q.kind == "delta":
                if q.total:
                    tl.series[(q.total, rank)] = whole  # type: ignore[assignment]
                if step is None:
                    continue
                whole = step
            tl.series[(q.signal, rank)] = whole  # type: ignore[assignment]
            fresh.add(tid)
            used += 1
            continue
        if by_tp is None:
            one = points(one)
            if q.kind == "prefill":  # (split by mode)
                by_tp = {(_tp(metric), _label(metric, "mode")): [one]}
            else:
                t_arr, v_arr = one
                n_used = 1
        if by_tp is not None:
            low = min(tp for tp, _m in by_tp)
            parts = {mode: vals for (tp, mode), vals in by_tp.items() if tp == low}
            if q.kind == "prefill":
                used += _prefill(tl, rank, q, parts, grids.source)
                fresh.add(tid)
                continue
            lists = [v for vals in parts.values() for v in vals]
            if len(lists) == 1:  # one series of the lowest TP rank, already in time order
                t_arr, v_arr = lists[0]
            else:
                merged = _points(lists, q.how)
                t_arr = np.array(sorted(merged))
                v_arr = np.array([merged[t] for t in t_arr.tolist()])
            n_used = sum(len(v) for v in parts.values())
        if not len(t_arr):
            continue
        if q.kind == "delta":
            if q.total:
                tl.series[(q.total, rank)] = on_grid(t_arr, v_arr)
            if len(t_arr) < 2:
                continue
            t_arr, v_arr = t_arr[1:], np.array(deltas(v_arr.tolist()))
        tl.series[(q.signal, rank)] = on_grid(t_arr, v_arr)
        fresh.add(tid)
        used += n_used
    done.update(fresh)
    return used


def _write_singles(q: Q.SignalQuery, tls: list[Timeline], ranks: list[str], flat: tuple[np.ndarray, np.ndarray, np.ndarray],
                   grids: _Grids, done: set[int], rows: dict[str, list[Any]]) -> int:
    """:func:`_write` when each picked series is the only one of its (target, rank) and the points are
    flat columns (``q.kind`` is not "prefill"): what its grouping gives, the series of each time grid
    written at once (:func:`_same_times`, :meth:`Series.with_rows`, the per-step counts of a "delta" query
    from a whole matrix). The grids of rank "" are noted in ``rows`` (:attr:`_Targets.rows`)."""
    ts_all, vs_all, ends = flat
    delta = q.kind == "delta"
    made, steps, filled = _made(q, tls, ranks, flat, range(len(tls)), grids, rows)
    if not delta and filled == len(tls):  # every series on a shared grid (the usual answer)
        keys = {rank: (q.signal, rank) for rank in set(ranks)}  # (one key per rank: fewer objects to hold)
        for tl, rank, whole in zip(tls, ranks, made, strict=True):
            tl.series[keys[rank]] = whole  # type: ignore[assignment]
        done.update(map(id, tls))
        return len(tls)
    used = 0
    fresh: set[int] = set()
    a = 0
    for k, b in enumerate(ends.tolist()):
        tl, rank, whole, step = tls[k], ranks[k], made[k], steps[k]
        if whole is None:  # a series no other shares its times with, or an empty one
            if b == a:
                continue
            t_arr, v_arr = ts_all[a:b], vs_all[a:b]
            whole = grids.on_grid(t_arr, v_arr)
            if delta and b - a > 1:
                step = grids.on_grid(t_arr[1:], np.array(deltas(v_arr.tolist())))
        a = b
        if delta:
            if q.total:
                tl.series[(q.total, rank)] = whole
            if step is None:
                continue
            whole = step
        tl.series[(q.signal, rank)] = whole
        fresh.add(id(tl))
        used += 1
    done.update(fresh)
    return used


def _made(q: Q.SignalQuery, tls: list[Timeline], ranks: list[str], flat: tuple[np.ndarray, np.ndarray, np.ndarray],
          which: Sequence[int], grids: _Grids, rows: dict[str, list[Any]]) -> tuple[list[Series | None], list[Series | None], int]:
    """The series ``which`` (each the only one of its target and rank) made a time grid at a time
    (:func:`_same_times`, :meth:`Series.with_rows`): each series (for a "delta" query its running total),
    a "delta" query's per-step counts (None: one point; the differences of a whole matrix), and how many
    were made; those of a grid no other series shares are left None. The grids of rank "" are noted in
    ``rows`` (:attr:`_Targets.rows`)."""
    ts_all, vs_all, ends = flat
    made: list[Series | None] = [None] * len(tls)
    steps: list[Series | None] = [None] * len(tls)
    delta = q.kind == "delta"
    filled = 0
    for members, times, vals in _same_times(ts_all, vs_all, ends, which):
        filled += len(members)
        series = grids.grid(times).with_rows(vals)
        for k, s in zip(members, series, strict=True):
            made[k] = s
        if not delta:
            pick = list(range(len(members))) if not any(ranks) else [j for j, k in enumerate(members) if not ranks[k]]
            if pick:
                rows.setdefault(q.signal, []).append(([tls[members[j]] for j in pick], [series[j] for j in pick], times,
                                                      vals if len(pick) == len(members) else vals[pick]))
        if delta and len(times) > 1:
            cur, prev = vals[:, 1:], vals[:, :-1]
            for k, s in zip(members, grids.grid(times[1:]).with_rows(np.where(cur >= prev, cur - prev, cur)), strict=True):
                steps[k] = s
    return made, steps, filled


def _same_times(ts: np.ndarray, vs: np.ndarray, ends: np.ndarray, which: Sequence[int]) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """The series ``which`` (indexes into the flat columns ``ts``/``vs``, series ``k`` ending at
    ``ends[k]``) grouped by their times, compared exactly: ``(indexes, their times, their values a row
    each)`` for each time grid two or more of them share. Empty series, and a series whose times no other
    has, are left out."""
    if len(which) < 2:
        return []
    k = np.asarray(which, dtype=np.int64)
    size = ends[k] - np.where(k > 0, ends[k - 1], 0)
    k, size = k[size > 0], size[size > 0]
    start = ends[k] - size
    first = ts[start]
    order = np.lexsort((first, size))  # (stable: each grid's series stay in their order)
    k, size, start, first = k[order], size[order], start[order], first[order]
    cut = np.flatnonzero((size[1:] != size[:-1]) | (first[1:] != first[:-1])) + 1
    out: list[tuple[list[int], np.ndarray, np.ndarray]] = []
    for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(k)], strict=True):
        if b - a < 2:
            continue
        at = start[a:b, None] + np.arange(int(size[a]))
        times = ts[at]
        same = (times == times[0]).all(axis=1)
        if int(same.sum()) < 2:
            continue
        out.append((k[a:b][same].tolist(), times[0].copy(), vs[at[same]]))
    return out


def _prefill(tl: Timeline, rank: str, q: Q.SignalQuery, by_mode: dict[str, list[tuple[np.ndarray, np.ndarray]]], source: Any) -> int:
    """Prefill tokens per step from a by-mode counter family → new / cached tokens and hit rate."""
    fam = "prefill_effective_tokens_total" if "prefill_effective" in q.shown else "realtime_tokens_total"
    new_modes, hit_modes = M.PREFILL_MODES[fam]
    new = _points([v for m, vals in by_mode.items() if m in new_modes for v in vals], "sum")
    hit = _points([v for m, vals in by_mode.items() if m in hit_modes for v in vals], "sum")
    ts = sorted(set(new) | set(hit))
    if len(ts) < 2:
        return 0
    n = deltas(_hold(new, ts))
    h = deltas(_hold(hit, ts))
    ts = ts[1:]
    srcs = [source(t) for t in ts]
    tl.series[("prefill_new_tokens", rank)] = Series(ts, n, srcs)
    tl.series[("prefill_cached_tokens", rank)] = Series(list(ts), h, list(srcs))
    gauge = tl.series.pop(("cache_hit_rate", rank), None)
    if gauge is not None:  # the windowed hits/all is the better hit rate; keep the gauge beside it
        tl.series[("cache_hit_rate_last_prefill", rank)] = gauge
    rate = [(t, hh / (nn + hh), s) for t, nn, hh, s in zip(ts, n, h, srcs, strict=True) if nn + hh > 0]
    if rate:
        tl.series[("cache_hit_rate", rank)] = Series([r[0] for r in rate], [r[1] for r in rate], [r[2] + " (hits/all)" for r in rate])
    return sum(len(v) for v in by_mode.values())


def _ingest_config(result: list[dict[str, Any]], targets: _Targets) -> None:
    facts = _config_facts(result, targets) if _BATCH else None
    if facts is not None:
        for tl, name, val, src in facts:
            tl.set_config(name, val, src)
        return
    for r in result:
        if not isinstance(r, dict) or not isinstance(r.get("metric"), dict):
            targets.drop("shape")
            continue
        metric = r["metric"]
        tl = targets.resolve(metric)
        base = M.normalise(_label(metric, "__name__"))
        if tl is None or base not in M.CONFIG_GAUGES or M.rank_key(metric) not in ("", "dp0"):
            continue
        t_arr, v_arr = _values(r.get("values") or ([r["value"]] if "value" in r else []), targets)
        if not len(t_arr):
            continue
        ts, x = float(t_arr[-1]), float(v_arr[-1])
        val: Any = int(x) if x.is_integer() else x
        tl.set_config(M.CONFIG_GAUGES[base], val, f"prometheus@{iso(ts)} sglang:{base}")


def _config_facts(result: list[Any], targets: _Targets) -> list[tuple[Timeline, str, Any, str]] | None:
    """The config facts :func:`_ingest_config` sets, in its order, for a plain answer (its series' labels
    strings, every series it reads a non-empty list of finite points in time order, :func:`_values_flat`);
    None otherwise: the caller then takes the loop, which counts what it drops."""
    if not result:
        return []
    metrics = _plain_metrics(result)
    if metrics is None:
        return None
    keep: list[tuple[Timeline, str]] = []
    lists: list[Any] = []
    names = list(_column(metrics, "__name__", ""))
    bases = {name: M.normalise(name) for name in set(names)}
    for r, name, tl, rank in zip(result, names, _timelines(metrics, targets), _ranks(metrics), strict=True):
        base = bases[name]
        if tl is None or base not in M.CONFIG_GAUGES or rank not in ("", "dp0"):
            continue
        keep.append((tl, base))  # type: ignore[arg-type]
        lists.append(r.get("values"))
    flat = _values_flat(lists)
    if flat is None or (len(lists) and not bool((np.diff(flat[2], prepend=0) > 0).all())):
        return None  # (an empty list: the loop reads the result's "value" instead)
    ts, vs, ends = flat
    last = ends - 1
    shown: dict[float, str] = {}
    out: list[tuple[Timeline, str, Any, str]] = []
    for (tl, base), t, x in zip(keep, ts[last].tolist(), vs[last].tolist(), strict=True):
        when = shown.get(t)
        if when is None:
            when = shown[t] = f"prometheus@{iso(t)}"
        out.append((tl, M.CONFIG_GAUGES[base], int(x) if x.is_integer() else x, f"{when} sglang:{base}"))
    return out


def _missing(targets: _Targets, failed: dict[str, str]) -> list[str]:
    """Per target, the core signals it lacks while others have them; messages grouped by signal set."""
    present = {sig for tl in targets.keys.values() for (sig, _rank) in tl.series}
    core = [s for s in Q.CORE_SIGNALS if s in present]
    by_set: dict[tuple[str, ...], list[str]] = {}
    for tl in targets.keys.values():
        have = {sig for (sig, _r) in tl.series}
        lack = tuple(s for s in core if s not in have)
        miss = sorted(set(lack) | set(failed))
        if miss:
            tl.meta["missing_signals"] = miss
        if lack:
            by_set.setdefault(lack, []).append(tl.target)
    msgs = []
    for lack, names in sorted(by_set.items(), key=lambda kv: -len(kv[1])):
        names.sort()
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        msgs.append(f"{len(names)} target(s) have no {', '.join(lack)} in the range ({shown}); their other signals are used.")
    return msgs


def _add_vllm(api: PromAPI, matchers: str, win: Window, col: FleetCollection, rep: InputReport) -> int:
    """The vLLM targets (diagnoser.fleet.vllm), judged with vLLM's reader; how many there were."""
    from diagnoser.fleet.vllm import collect_vllm

    tls, versions = collect_vllm(api, matchers, win.start, win.end, win.step, rep)
    for tl in tls:
        vr = versions[tl.target]
        finalize(tl, vr)
        col.versions[tl.target] = vr
        col.timelines.append(tl)
    col.timelines.sort(key=lambda t: t.target)
    return len(tls)


def _no_match(api: PromAPI, matchers: str, win: Window) -> str:
    sel = "{" + matchers + "}" if matchers else "(no selector)"
    span = f"between {iso(win.start)} and {iso(win.end)}"
    try:
        with_sglang = sorted({r.get("metric", {}).get("job", "") for r in api.query(Q.any_sglang(""), win.end)} - {""})
    except PromError:
        with_sglang = []
    try:
        jobs = api.label_values("job")
    except PromError as e:
        return f"The selector {sel} matches no SGLang series (sglang:* or sglang_*) {span}, and the job list could not be read: {e}"
    others = [j for j in jobs if j not in with_sglang]
    parts = [f"The selector {sel} matches no SGLang series (sglang:* or sglang_*) {span}."]
    if with_sglang:
        parts.append(f"Jobs with SGLang series: {', '.join(with_sglang[:20])}; try --selector '{{job=\"{with_sglang[0]}\"}}'.")
    else:
        parts.append("No job in this Prometheus has SGLang series: check that SGLang runs with --enable-metrics and is scraped.")
    if others:
        parts.append(f"Other jobs: {', '.join(others[:20])}{' …' if len(others) > 20 else ''}.")
    return " ".join(parts)
