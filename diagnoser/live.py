"""Live mode: poll many targets and logs continuously, keep a bounded history, evaluate with hysteresis.

Used by ``diagnose`` watch mode and ``diagnose serve``. One :class:`LiveMonitor` owns every target:

* each target is scraped by a worker thread with its own HTTP timeout; a target whose previous scrape
  is still running is skipped for that tick, so one slow target never stalls the others;
* a log file is followed (:class:`~diagnoser.sources.logs.LogFollower`, survives rotation);
* history is trimmed by age (``history_s``) and size (``max_points`` per series, ``max_events``); history
  older than an hour is thinned to one point per 30 s, and per-point source text is kept only for the
  window the rules judge (evidence cites it), so 24 h of 8 targets stays small;
* the rules judge the last ``window_s`` seconds of each target every ``eval_interval`` (default 3 polls,
  at most 15 s; targets are staggered across ticks, and a target is judged at once when it goes down
  or comes back), ``advice.enrich`` runs when it exists, and every tick passes the current findings
  through :class:`Hysteresis`;
* the result is published as an immutable :class:`Snapshot` that readers (web, exporter, terminal) take
  without locking.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnoser import gcpause
from diagnoser.collect import finalize
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.evaluate import Hysteresis, Report, cause_order, evaluate
from diagnoser.floor import is_floor
from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules import REGISTRY, Rule
from diagnoser.sources.http import DEFAULT_MAX_BYTES, PlainTarget, fetch, make_client
from diagnoser.sources.logs import LogFollower, open_log_reader
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.sources.serverinfo import fetch_config
from diagnoser.timeline import Timeline

DEFAULT_HISTORY_S = 24 * 3600.0
DEFAULT_MAX_POINTS = 20_000  # per series: 24 h at a 5 s interval is 17,280
DEFAULT_MAX_EVENTS = 5_000
CONFIG_REFRESH_S = 300.0
WINDOW_STATS = ("running_reqs", "queue_reqs", "token_usage", "gen_throughput_tps", "ttft_seconds_p95", "cache_hit_rate")
FULL_RES_S = 3600.0  # history older than this is thinned …
COARSE_S = 30.0  # … to one point per 30 s (a 24 h chart shows ~600 points anyway)


@dataclass(slots=True)
class LiveTarget:
    """One monitored target: a URL (with optional logs) or a log alone."""

    name: str
    timeline: Timeline
    version: VersionRange = field(default_factory=VersionRange)
    metrics: MetricsTarget | None = None
    client: Any = None  # this target's own HTTP client (None: the monitor's shared one)
    followers: list[LogFollower] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: bool = False
    busy_since: float = 0.0  # time.monotonic() when the scrape in flight started
    up: bool | None = None
    last_error: str = ""
    scrape_errors: int = 0
    scrapes: int = 0
    last_scrape_ts: float | None = None
    last_duration_s: float = 0.0
    config_at: float = 0.0
    raw_config: dict[str, Any] = field(default_factory=dict)
    compacted_until: float = -math.inf
    blanked_until: float = -math.inf

    @property
    def is_url(self) -> bool:
        return self.metrics is not None


@dataclass(frozen=True, slots=True)
class TargetView:
    """What readers need of one target, copied at the end of a tick."""

    index: int
    name: str
    is_url: bool
    up: bool | None
    last_error: str
    scrapes: int
    scrape_errors: int
    last_scrape_ts: float | None
    last_duration_s: float
    version: str | None
    latest: dict[str, float]
    config: dict[str, Any]  # name → ConfigFact
    model_name: str
    window: tuple[float | None, float | None]
    # over the judged window, per headline signal (WINDOW_STATS): n, median, max, last and its time;
    # "_data": the first and last reading of any signal in the window (how much data the window had)
    window_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    engine: str = "sglang"  # the engine the target's inputs named (diagnoser.engines.auto): "sglang" or "vllm"


@dataclass(frozen=True, slots=True)
class Snapshot:
    ts: float
    tick: int
    targets: list[TargetView]
    findings: list[Finding]  # pending and firing, after hysteresis
    resolved: list[tuple[float, Finding]]  # recent resolutions, newest last
    errors: list[dict[str, str]]
    rule_pass_s: float
    dropped: list[dict[str, Any]] = field(default_factory=list)
    # when findings fired: {"target", "rule", "severity", "start", "end"} in the target's clock (its
    # recording or log time for replays and logs); "end" is None while it still fires. Oldest first.
    episodes: list[dict[str, Any]] = field(default_factory=list)
    # every rule of each target's last pass: {"rule", "code", "target", "status", "why"} (evaluate.Report.checked)
    checked: list[dict[str, Any]] = field(default_factory=list)

    def firing(self, target: str | None = None) -> list[Finding]:
        return [f for f in self.findings if f.state == "firing" and (target is None or f.target == target)]

    def for_target(self, target: str) -> list[Finding]:
        return [f for f in self.findings if f.target == target]


def trim(tl: Timeline, oldest: float, max_points: int, max_events: int) -> int:
    """Drop points older than ``oldest`` and keep at most ``max_points`` per series. Returns the count dropped."""
    dropped = 0
    for key in list(tl.series):
        s = tl.series[key]
        cut = max(s.search(oldest), len(s) - max_points)
        if cut > 0:
            s.drop_before(cut)
            dropped += cut
        if not len(s):
            del tl.series[key]
    if tl.events:
        cut = 0
        while cut < len(tl.events) and tl.events[cut].ts < oldest:
            cut += 1
        cut = max(cut, len(tl.events) - max_events)
        if cut > 0:
            del tl.events[:cut]
            dropped += cut
    return dropped


def compact(tl: Timeline, start: float, end: float, step: float, blank_until: float, blank_from: float) -> None:
    """Bound what old history costs: thin ``[start, end)`` to one point per ``step`` seconds, and drop the
    per-point source text of points in ``[blank_from, blank_until)`` (rules cite only the recent window)."""
    thin_, blank = end > start and step > 0, blank_until > blank_from
    for s in tl.series.values():
        if not len(s) or s.first_ts() >= max(end if thin_ else -math.inf, blank_until if blank else -math.inf):
            continue  # nothing old enough yet
        lo, hi, b_lo, b_hi = s.search_many([start, end, blank_from, blank_until])
        if thin_:
            if hi > lo:
                keep: list[int] = []
                times = s.times(lo - 1 if lo > 0 else lo, hi)
                last = times.pop(0) if lo > 0 else -math.inf  # the range continues the one thinned last tick
                for i, t in enumerate(times, lo):
                    if t - last >= step:
                        keep.append(i)
                        last = t
                if len(keep) < hi - lo:
                    s.thin(lo, hi, keep)
                    b_lo, b_hi = s.search_many([blank_from, blank_until])
        if blank:
            s.blank_sources(b_lo, b_hi)


def _reaggregate(tl: Timeline) -> None:
    """Rebuild the rank-"" series of signals that have per-rank series (they grow every tick)."""
    ranked = {name for (name, rank) in tl.series if rank}
    for name in ranked:
        tl.series.pop((name, ""), None)
    if ranked:
        tl.aggregate_ranks()


def window_stats(tl: Timeline, start: float, end: float) -> dict[str, dict[str, float]]:
    """The headline signals over ``[start, end]`` (see :attr:`TargetView.window_stats`)."""
    out: dict[str, dict[str, float]] = {}
    first, last = math.inf, -math.inf
    for (name, rank), s in tl.series.items():
        if rank:
            continue
        part = s.slice(start, end)
        if not len(part):
            continue
        first, last = min(first, float(part.ts[0])), max(last, float(part.ts[-1]))
        if name not in WINDOW_STATS:
            continue
        v = part.values
        ok = ~np.isnan(v)
        if not ok.any():
            continue
        vals, ts = v[ok], part.ts[ok]
        out[name] = {"n": int(len(vals)), "median": float(np.median(vals)), "max": float(vals.max()),
                     "last": float(vals[-1]), "last_ts": float(ts[-1])}
        if name.endswith("_p95"):  # a reading that is only a bucket's floor ("> 100 s") bounds what the tile may say
            srcs = [src for src, good in zip(part.sources.tolist(), ok.tolist(), strict=True) if good]
            floors = [float(x) for x, src in zip(vals.tolist(), srcs, strict=True) if is_floor(source=src)]
            if floors:
                out[name]["floor"] = {"max": True, "last": is_floor(source=srcs[-1]),
                                      "median": min(floors) <= out[name]["median"]}
    if first <= last:
        out["_data"] = {"first": first, "last": last}
    out["_window"] = {"start": start, "end": end}
    return out


def unreachable_finding(target: str, error: str) -> Finding:
    """Fallback when the catalogue has no ``source_unreachable`` rule yet."""
    return Finding(
        rule="source_unreachable",
        severity=Severity.CRITICAL,
        confidence="high",
        target=target,
        summary=error or f"{target} did not answer.",
        evidence=[Evidence("scrape", "failed", None, "last scrape", target)],
        docs="diagnose explain source_unreachable",
    )


class LiveMonitor:
    """Polls targets and logs; call :meth:`tick` yourself or :meth:`start` a background loop."""

    def __init__(
        self,
        adapter: Any,
        urls: list[str] | None = None,
        logs: list[str] | None = None,
        *,
        interval: float = 5.0,
        timeout: float = 5.0,
        window_s: float = 300.0,
        history_s: float = DEFAULT_HISTORY_S,
        max_points: int = DEFAULT_MAX_POINTS,
        max_events: int = DEFAULT_MAX_EVENTS,
        full_res_s: float = FULL_RES_S,
        coarse_s: float = COARSE_S,
        for_seconds: float | None = None,
        eval_interval: float | None = None,
        thresholds: dict[str, dict[str, Any]] | None = None,
        rules: list[type[Rule]] | None = None,
        extras: dict[str, Any] | None = None,
        client: Any = None,
        workers: int = 16,
        follow_from_start: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.adapter = adapter
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.window_s = float(window_s)
        self.history_s = float(history_s)
        self.max_points = int(max_points)
        self.max_events = int(max_events)
        self.full_res_s = max(float(full_res_s), float(window_s))
        self.coarse_s = float(coarse_s)
        self.thresholds = thresholds or {}
        self.rules = rules if rules is not None else list(REGISTRY)
        self.extras = dict(extras or {})
        rule_names = [r.name for r in REGISTRY]
        holds = {n: float(for_seconds) for n in rule_names} if for_seconds is not None else {r.name: r.for_seconds for r in REGISTRY}
        holds.setdefault("source_unreachable", 0.0)
        self.hysteresis = Hysteresis(holds)
        self.default_hold = 0.0 if for_seconds is None else float(for_seconds)
        self._own_client = client is None
        self.client = client or make_client(timeout=timeout, headers=headers)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="diagnoser-scrape")
        self.targets: list[LiveTarget] = []
        self.resolved: deque[tuple[float, Finding]] = deque(maxlen=200)
        self.episodes: deque[dict[str, Any]] = deque(maxlen=500)  # when findings fired (charts mark them)
        self._open_episodes: dict[tuple[str, str], dict[str, Any]] = {}
        self.tick_no = 0
        self._futures: dict[int, Future[Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot = Snapshot(time.time(), 0, [], [], [], [], 0.0)
        self.listeners: list[Any] = []  # callables(snapshot) run after each tick
        self.eval_interval = float(eval_interval) if eval_interval is not None else max(self.interval, min(15.0, 3 * self.interval))
        self._eval_every = max(1, round(self.eval_interval / self.interval))
        self._findings: dict[int, list[Finding]] = {}
        self._checked: dict[int, list[dict[str, Any]]] = {}  # per target: every rule of its last pass and why
        self._last_state: dict[int, tuple[bool | None, bool]] = {}
        self._windows: dict[str, Timeline] = {}
        self._fleet_findings: list[Finding] = []
        self._fleet_done = False
        self._rule_pass_s = 0.0
        self.last_tick_at: float | None = None  # time.monotonic() at the end of the last tick that completed
        self.tick_error: tuple[float, str] | None = None  # (time.time(), error) of the last tick that failed
        self.died: tuple[float, str] | None = None  # (time.time(), why) when the background thread ended
        urls = list(urls or [])
        logs = list(logs or [])
        for u in urls:
            mt = MetricsTarget(u, adapter)
            # a connection per target over http.client, httpx for https and redirects (see sources/http.py);
            # a client passed in (auth headers, a test transport) serves every target
            own = PlainTarget(timeout=timeout, headers=headers) if self._own_client else None
            self.targets.append(LiveTarget(mt.report.source, Timeline(target=mt.report.source), metrics=mt, client=own))
        for path in logs:
            if len(urls) == 1:
                owner = self.targets[0]
            else:
                owner = LiveTarget(path, Timeline(target=path))
                self.targets.append(owner)
            reader = open_log_reader(adapter, owner.timeline, path)
            owner.timeline.inputs.append(reader.report)
            owner.followers.append(LogFollower(reader, path, from_start=follow_from_start))
        for t in self.targets:
            if t.metrics is not None:
                t.timeline.inputs.insert(0, t.metrics.report)

    # -- polling -------------------------------------------------------------------------------
    def _scrape(self, t: LiveTarget) -> None:
        assert t.metrics is not None
        client = t.client or self.client
        try:
            now = time.time()
            if now - t.config_at >= CONFIG_REFRESH_S or (not t.raw_config and t.up is False):
                t.config_at = now
                scratch = Timeline(target=t.name)
                rng = VersionRange()
                rep, raw = fetch_config(client, t.metrics.url, self.adapter, scratch, rng, deadline=time.monotonic() + 2 * self.timeout)
                with t.lock:
                    if raw:
                        t.raw_config = raw
                        t.timeline.config.update(scratch.config)
                        t.version.merge(rng)
            # fetch outside the lock (readers never wait on the network), ingest under it
            t0 = time.perf_counter()
            ts = time.time()
            f = fetch(client, t.metrics.metrics_url, DEFAULT_MAX_BYTES, "metrics", time.monotonic() + self.timeout)
            t.metrics.last_duration_s = time.perf_counter() - t0
            with t.lock:
                if not f.ok:
                    ok = t.metrics._fail(f.error)
                else:
                    if f.truncated:
                        t.metrics.report.messages.append(f"The exposition from {t.name} exceeded {DEFAULT_MAX_BYTES} bytes and was cut.")
                    ok = t.metrics.ingest_text(f.text, ts, t.timeline, f)
            t.last_duration_s = t.metrics.last_duration_s
            t.up = bool(ok)
            t.scrapes += 1
            t.last_scrape_ts = time.time()
            if not ok:
                t.scrape_errors += 1
                t.last_error = t.metrics.last_error
                t.config_at = 0.0 if not t.raw_config else t.config_at
            else:
                t.last_error = ""
        except Exception as e:  # a bug on one target must not stop the loop
            t.up = False
            t.scrape_errors += 1
            t.last_error = f"Scraping {t.name} failed unexpectedly ({type(e).__name__}: {e})."
        finally:
            t.busy = False

    def poll(self) -> None:
        """Start a scrape for every idle URL target, follow the logs, and wait up to the timeout."""
        started: list[Future[Any]] = []
        for t in self.targets:
            if t.metrics is None:
                continue
            if t.busy:  # still waiting on the previous scrape: skip this tick for it only
                continue
            t.busy = True
            t.busy_since = time.monotonic()
            started.append(self.pool.submit(self._scrape, t))
        for t in self.targets:
            for fol in t.followers:
                with t.lock:
                    fol.poll()
        # wait for fresh data, but never longer than most of an interval: a slow target stays "busy"
        # and is picked up on a later tick while the others keep updating
        deadline = time.monotonic() + min(self.timeout + 0.5, max(0.2, 0.8 * self.interval))
        for fut in started:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                fut.result(timeout=remaining)
            except Exception:  # noqa: S110 — _scrape records its own errors
                pass

    def _stuck(self, t: LiveTarget) -> str:
        """One sentence when ``t``'s scrape has been in flight well past its deadline (every fetch has one;
        this is the backstop for a request that ignores it, e.g. headers trickled over https)."""
        if not (t.is_url and t.busy):
            return ""
        late = time.monotonic() - t.busy_since
        if late <= 3 * self.timeout + self.interval + 1.0:  # config (2 x timeout) and /metrics (timeout)
            return ""
        return (f"{t.name} has not finished answering for {late:.0f} s (a scrape is still in flight, far past --timeout "
                f"{self.timeout:g} s); its last numbers are stale. Check the server.")

    def _ref_now(self, t: LiveTarget, now: float) -> float:
        if t.is_url:
            return now
        end = t.timeline.span()[1]
        return now if end is None else end

    def _due(self, i: int, up: bool | None, err: str) -> bool:
        """Rules judge each target every ``eval_interval`` (targets staggered across ticks), and at once
        when it is new or its health changed."""
        state = (up, bool(err))
        if self._last_state.get(i) != state or i not in self._findings:
            self._last_state[i] = state
            return True
        return (self.tick_no + i) % self._eval_every == 0

    @gcpause.paused()  # (a fleet's tick makes millions of acyclic objects: windows, findings, checks)
    def tick(self, now: float | None = None, scrape: bool = True) -> Snapshot:
        """One pass: poll (optionally), trim, evaluate the due windows, hysteresis, publish a snapshot."""
        if scrape:
            self.poll()
        now = time.time() if now is None else now
        windows: list[Timeline] = []
        due_names: set[str] = set()
        unreachable: dict[str, str] = {}
        views: list[TargetView] = []
        refs: dict[str, float] = {}
        for i, t in enumerate(self.targets):
            ref = refs[t.name] = self._ref_now(t, now)
            up, err = t.up, t.last_error  # read once: a scrape thread may finish mid-tick
            stuck = self._stuck(t)
            if stuck:  # a scrape in flight far past its deadline: its last numbers are stale, not healthy
                up, err = False, stuck
            due = self._due(i, up, err)
            with t.lock:
                trim(t.timeline, ref - self.history_s, self.max_points, self.max_events)
                coarse_end = ref - self.full_res_s
                blank_end = ref - self.window_s - self.interval
                compact(t.timeline, max(t.compacted_until, ref - self.history_s), coarse_end, self.coarse_s,
                        blank_end, max(t.blanked_until, ref - self.history_s))
                t.compacted_until = max(t.compacted_until, coarse_end)
                t.blanked_until = max(t.blanked_until, blank_end)
                _reaggregate(t.timeline)
                rng = VersionRange()
                rng.merge(t.version)
                if t.metrics is not None:
                    rng.merge(t.metrics.state.version)
                for fol in t.followers:
                    rng.merge(fol.reader.parser.version)
                finalize(t.timeline, rng)
                win = t.timeline.window(ref - self.window_s, ref) if due else None
                latest = {name: s.last_value() for (name, rank), s in t.timeline.series.items() if not rank and len(s)}
                cfg = dict(t.timeline.config)
                span = (ref - self.window_s, ref) if win is None else win.span()
                wstats = window_stats(t.timeline, ref - self.window_s, ref)
            if t.is_url and up is False:
                unreachable[t.name] = err
                if win is not None:
                    win.meta["unreachable"] = err
            if win is not None:
                windows.append(win)
                due_names.add(t.name)
                self._windows[t.name] = win
            views.append(TargetView(
                index=i, name=t.name, is_url=t.is_url, up=up, last_error=err, scrapes=t.scrapes,
                scrape_errors=t.scrape_errors, last_scrape_ts=t.last_scrape_ts, last_duration_s=t.last_duration_s,
                version=t.timeline.version, latest=latest, config=cfg, model_name=self._model_name(t, cfg),
                window=span, window_stats=wstats, engine=str(getattr(t.timeline, "engine", "sglang") or "sglang"),
            ))
        extras = dict(self.extras)
        extras["unreachable"] = unreachable
        target_rules = [r for r in self.rules if r.scope != "fleet"]
        fleet_rules = [r for r in self.rules if r.scope == "fleet"]
        report = evaluate(windows, self.adapter, self.thresholds, target_rules, extras) if windows else Report()
        if fleet_rules and (windows and self.tick_no % self._eval_every == 0 or not self._fleet_done):
            self._fleet_done = True
            fleet = evaluate(list(self._windows.values()), self.adapter, self.thresholds, fleet_rules, extras)
            self._fleet_findings = fleet.findings
            report.errors.extend(fleet.errors)
            report.duration_s += fleet.duration_s
        try:
            from diagnoser.advice import enrich  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            enrich = None
        if enrich is not None and windows:
            try:
                enrich(report, windows, extras)
            except Exception as e:  # advice is optional: a failure is shown, not fatal
                report.errors.append(_rule_error("advice", f"{type(e).__name__}: {e}"))
        have = {(f.target, f.rule) for f in report.findings}
        for name, err in unreachable.items():
            if name in due_names and (name, "source_unreachable") not in have:
                report.findings.insert(0, unreachable_finding(name, err))
        by_target: dict[str, list[Finding]] = {}  # grouped once (a fleet has 10,000 targets and 230,000 checks)
        for f in report.findings:
            by_target.setdefault(f.target, []).append(f)
        checks: dict[str, list[dict[str, Any]]] = {}
        for c in report.checked:
            checks.setdefault(c["target"], []).append(c)
        for i, t in enumerate(self.targets):
            if t.name in due_names:
                self._findings[i] = by_target.get(t.name, [])
                self._checked[i] = checks.get(t.name, [])
        current = [f for i in sorted(self._findings) for f in self._findings[i]] + list(self._fleet_findings)
        findings = cause_order(self.hysteresis.update(current, now))  # the report's one order (evaluate.cause_order)
        for f in self.hysteresis.resolved:
            self.resolved.append((now, f))
        self._track_episodes(findings, self.hysteresis.resolved, refs, now)
        self.tick_no += 1
        if report.duration_s:
            self._rule_pass_s = report.duration_s
        snap = Snapshot(
            ts=now, tick=self.tick_no, targets=views, findings=findings, resolved=list(self.resolved),
            errors=[e.to_dict() for e in report.errors], rule_pass_s=self._rule_pass_s, dropped=list(report.dropped),
            episodes=[dict(e) for e in self.episodes], checked=[c for i in sorted(self._checked) for c in self._checked[i]],
        )
        self.snapshot = snap
        self.last_tick_at = time.monotonic()
        for cb in list(self.listeners):
            try:
                cb(snap)
            except Exception:  # noqa: S110 — a display error must not stop polling
                pass
        return snap

    def _track_episodes(self, findings: list[Finding], resolved: list[Finding], refs: dict[str, float], now: float) -> None:
        """Open an episode when a finding starts firing, close it when it resolves (at the target's clock)."""
        for f in findings:
            key = (f.target, f.rule)
            ep = self._open_episodes.get(key)
            if f.state != "firing":
                continue
            if ep is None:
                ep = {"target": f.target, "rule": f.rule, "severity": f.severity.label, "start": refs.get(f.target, now), "end": None}
                self._open_episodes[key] = ep
                self.episodes.append(ep)
            elif Severity[ep["severity"].upper()] < f.severity:  # it got worse while firing: the band shows the worst
                ep["severity"] = f.severity.label
        for f in resolved:
            ep = self._open_episodes.pop((f.target, f.rule), None)
            if ep is not None:
                ep["end"] = max(ep["start"], refs.get(f.target, now))

    @staticmethod
    def _model_name(t: LiveTarget, cfg: dict[str, Any]) -> str:
        for key in ("served_model_name", "model_path"):
            fact = cfg.get(key)
            if fact is not None and fact.value:
                return str(fact.value)
        if t.metrics is not None and t.metrics.state.model_names:
            return sorted(t.metrics.state.model_names)[0]
        return ""

    # -- reading -------------------------------------------------------------------------------
    def target(self, index: int) -> LiveTarget:
        return self.targets[index]

    def series(self, index: int, signals: list[str], start: float, end: float | None = None, max_points: int = 600) -> dict[str, Any]:
        """Downsampled series of one target for charts: ``{"t": [...], signal: [...]}`` per signal."""
        t = self.targets[index]
        out: dict[str, Any] = {}
        with t.lock:
            parts = {name: t.timeline.series.get((name, "")) for name in signals}
            cut = {name: s.slice(start, end) for name, s in parts.items() if s is not None}
        for name, s in cut.items():
            out[name] = downsample(s.ts.tolist(), s.values.tolist(), max_points)
        return out

    # -- loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Tick every interval until ``stop``. A tick that raises (out of memory, a bug) is recorded in
        :attr:`tick_error` and retried at the next interval: readers keep the last good snapshot, and
        :meth:`health` says the data is stale."""
        stop = stop or self._stop
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.tick()
                self.tick_error = None
            except Exception as e:  # noqa: BLE001 — kept for /healthz and the pages, then retried
                self.tick_error = (time.time(), f"{type(e).__name__}: {e}"[:300])
            stop.wait(max(0.05, self.interval - (time.monotonic() - t0)))

    def _loop(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 — the thread ends either way: say why, for /healthz
            self.died = (time.time(), f"{type(e).__name__}: {e}"[:300])
            return
        if not self._stop.is_set():
            self.died = (time.time(), "the polling loop returned")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="diagnoser-live", daemon=True)
        self._thread.start()

    def health(self) -> tuple[bool, str]:
        """``(healthy, one sentence)``: unhealthy when the polling thread has died, when ticks fail, or
        when no tick has completed for a while (about three intervals plus the scrape timeouts)."""
        from diagnoser.model import iso

        if self.died is not None:
            return False, (f"The polling thread stopped at {iso(self.died[0])} ({self.died[1]}); every number shown is from "
                           "before then. Restart diagnose serve.")
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return False, "The polling thread is not running; every number shown is stale. Restart diagnose serve."
        if self.tick_error is not None:
            return False, (f"Polling failed at {iso(self.tick_error[0])} ({self.tick_error[1]}); the numbers shown are from the last "
                           "poll that worked. It is retried every interval.")
        if self._thread is not None and self.last_tick_at is not None:
            age = time.monotonic() - self.last_tick_at
            if age > 3 * self.interval + 3 * self.timeout + 10.0:
                return False, f"No poll has completed for {age:.0f} s; the numbers shown are stale."
        return True, ""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + self.interval + 2)
        self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for t in self.targets:
            for fol in t.followers:
                fol.close()
            if t.client is not None:
                t.client.close()
        if self._own_client:
            self.client.close()


def _rule_error(rule: str, msg: str) -> Any:
    from diagnoser.evaluate import RuleError

    return RuleError(rule, "all", msg)


def downsample(ts: list[float], values: list[float], max_points: int) -> dict[str, list[Any]]:
    """Bucket a series into at most ``max_points`` points: mean, min and max per bucket (NaN-free)."""
    n = len(ts)
    if n <= max_points:
        vals = [None if v != v else v for v in values]
        return {"t": list(ts), "v": vals}
    lo_t, hi_t = ts[0], ts[-1]
    width = (hi_t - lo_t) / max_points or 1.0
    out_t: list[float] = []
    out_v: list[float | None] = []
    out_min: list[float | None] = []
    out_max: list[float | None] = []
    i = 0
    for b in range(max_points):
        edge = lo_t + (b + 1) * width
        acc: list[float] = []
        t_acc = 0.0
        k = 0
        while i < n and (ts[i] <= edge or b == max_points - 1):
            k += 1
            t_acc += ts[i]
            if values[i] == values[i]:
                acc.append(values[i])
            i += 1
        if k == 0:
            continue
        out_t.append(t_acc / k)
        out_v.append(sum(acc) / len(acc) if acc else None)
        out_min.append(min(acc) if acc else None)
        out_max.append(max(acc) if acc else None)
    return {"t": out_t, "v": out_v, "min": out_min, "max": out_max}


class ReplayMonitor(LiveMonitor):
    """A LiveMonitor fed by a recording (:class:`diagnoser.replay.ReplayFeed`) instead of live scrapes.

    Records due by wall time go through :class:`diagnoser.replay.ReplayIngest` (the live ingestion
    path); the monitor's clock is the recording's clock, so windows, charts and hysteresis follow the
    recorded timestamps.
    """

    def __init__(self, feed: Any, adapter: Any, **kw: Any) -> None:
        from diagnoser.replay import ReplayIngest

        kw.pop("client", None)
        super().__init__(adapter, [], [], client=_NoClient(), **kw)
        self.feed = feed
        self.ingest = ReplayIngest(adapter, feed.source)
        self._known: set[str] = set()
        self._sync_targets()

    def _sync_targets(self) -> None:
        for name, it in self.ingest.targets.items():
            if name in self._known:
                continue
            self._known.add(name)
            self.targets.append(LiveTarget(name, it.tl, version=it.version, metrics=it.metrics))

    def clock(self) -> float:
        n, pos = self.feed.position()
        if not self.feed.loop:  # a finished recording stays at its end
            pos = min(pos, self.feed.period)
        return float(self.feed.t0 + n * self.feed.period + pos)

    def poll(self) -> None:
        recs = self.feed.due()
        locks = {t.name: t.lock for t in self.targets}
        for rec in recs:
            lock = locks.get(str(rec.get("target") or ""))
            if lock is None:
                self.ingest.apply(rec)
                self._sync_targets()
                locks = {t.name: t.lock for t in self.targets}
            else:
                with lock:
                    self.ingest.apply(rec)
        for t in self.targets:
            it = self.ingest.targets.get(t.name)
            if it is not None and t.metrics is None and it.metrics is not None:
                t.metrics = it.metrics
            if t.metrics is not None:
                t.scrapes = t.metrics.report.scrapes
                t.scrape_errors = t.metrics.report.errors
                t.last_error = t.metrics.last_error
                t.up = None if not t.scrapes and not t.last_error else not t.metrics.last_error

    def tick(self, now: float | None = None, scrape: bool = True) -> Snapshot:
        if scrape:
            self.poll()
        return super().tick(self.clock() if now is None else now, scrape=False)


class _NoClient:
    def close(self) -> None:
        pass
