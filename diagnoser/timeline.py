"""One canonical timeline of signals per target, whatever the source (scrape, log, replay, Prometheus).

A signal is a named, unit-suffixed series (``running_reqs``, ``token_usage``, ``ttft_seconds_p95`` …).
Each point keeps its source (``server.log:1842`` or ``scrape@<iso> sglang:num_queue_reqs``) so that every
number a rule cites can be traced back.

Per-rank series are kept apart under a rank key (``dp0``, ``dp1``, ``pp1`` …; ``""`` for a single
scheduler). The aggregate series (rank ``""``) is derived with a per-signal rule: counts and rates are
summed across ranks, ratios never are (token usage takes the worst rank, rates of hits are averaged).

Storage is columnar lists for fast ingestion; :meth:`Timeline.to_frame` gives the pandas view
(``ts, signal, rank, value, source``) for analysis and fits. Window statistics are computed in pure
Python (tested against pandas) so that ``diagnose --once --log`` starts without importing pandas.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from diagnoser.model import ConfigFact, InputReport, LogEvent, iso  # noqa: F401  (iso re-exported)

# Canonical signals: name → (unit, how ranks aggregate, help). Later issues and scripts rely on these names.
SIGNALS: dict[str, tuple[str, str, str]] = {
    "running_reqs": ("requests", "sum", "requests in the running (decode) batch"),
    "queue_reqs": ("requests", "sum", "requests waiting in the scheduler queue"),
    "token_usage": ("ratio", "max", "KV pool use, 0-1 (worst pool and worst rank)"),
    "used_tokens": ("tokens", "sum", "KV slots held by live requests"),
    "max_total_tokens": ("tokens", "sum", "KV pool capacity in tokens"),
    "gen_throughput_tps": ("tokens/s", "sum", "decode tokens generated per second"),
    "prefill_new_tokens": ("tokens", "sum", "uncached tokens computed by one prefill batch"),
    "prefill_cached_tokens": ("tokens", "sum", "prefix-cache hits of one prefill batch"),
    "prefill_new_seqs": ("requests", "sum", "requests admitted by one prefill batch"),
    "pending_tokens": ("tokens", "sum", "prompt tokens still waiting for prefill"),
    "input_throughput_tps": ("tokens/s", "sum", "prefill tokens per second (log)"),
    "cache_hit_rate": ("ratio", "mean", "prefix-cache hit rate, 0-1"),
    "retracted_reqs": ("requests", "sum", "requests retracted (KV full) at this point"),
    "cuda_graph": ("bool", "min", "1 when decode ran through a captured graph"),
    "spec_accept_len": ("tokens/step", "mean", "speculative accept length"),
    "spec_accept_rate": ("ratio", "mean", "speculative accept rate"),
    "full_token_usage": ("ratio", "max", "full-attention pool use (hybrid models)"),
    "swa_token_usage": ("ratio", "max", "sliding-window pool use (hybrid models)"),
    "mamba_usage": ("ratio", "max", "Mamba state pool use (hybrid models)"),
    "new_token_ratio": ("ratio", "max", "scheduler reservation ratio for future decode tokens"),
    "ttft_seconds_p50": ("seconds", "max", "time to first token, median over the scrape interval"),
    "ttft_seconds_p95": ("seconds", "max", "time to first token, p95 over the scrape interval"),
    "itl_seconds_p50": ("seconds", "max", "inter-token latency, median"),
    "itl_seconds_p95": ("seconds", "max", "inter-token latency, p95"),
    "e2e_seconds_p95": ("seconds", "max", "end-to-end request latency, p95"),
    "queue_time_seconds_p95": ("seconds", "max", "time in the scheduler queue, p95"),
    "prompt_tps": ("tokens/s", "sum", "prompt tokens of finished requests per second"),
    "output_tps": ("tokens/s", "sum", "generated tokens of finished requests per second (client view)"),
    "request_rate": ("requests/s", "sum", "finished requests per second"),
    "requests_completed": ("requests", "sum", "finished requests since start (counter)"),
    "retractions_total": ("requests", "sum", "retracted requests since start (counter)"),
    "http_requests_active": ("requests", "sum", "in-flight HTTP requests"),
    "decode_sum_seq_lens": ("tokens", "sum", "sum of sequence lengths in the decode batch"),
    "cache_hit_rate_last_prefill": ("ratio", "mean", "prefix-cache hit rate of the last prefill batch (gauge)"),
    "kv_available_tokens": ("tokens", "sum", "free KV slots (0.5.11+)"),
    "kv_evictable_tokens": ("tokens", "sum", "cached, unreferenced KV slots that can be evicted (0.5.11+)"),
    "paused_reqs": ("requests", "sum", "requests paused by async weight sync"),
    "grammar_queue_reqs": ("requests", "sum", "requests waiting for grammar compilation"),
}


@dataclass(slots=True)
class Series:
    ts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def append(self, ts: float, value: float, source: str) -> None:
        if self.ts and ts < self.ts[-1]:
            # keep time order; out-of-order points (multi-source) are inserted in place
            i = len(self.ts)
            while i > 0 and self.ts[i - 1] > ts:
                i -= 1
            self.ts.insert(i, ts)
            self.values.insert(i, value)
            self.sources.insert(i, source)
            return
        self.ts.append(ts)
        self.values.append(value)
        self.sources.append(source)

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: float | None, end: float | None) -> Series:
        lo = 0 if start is None else _bisect_left(self.ts, start)
        hi = len(self.ts) if end is None else _bisect_right(self.ts, end)
        return Series(self.ts[lo:hi], self.values[lo:hi], self.sources[lo:hi])

    def finite(self) -> list[float]:
        return [v for v in self.values if not math.isnan(v)]

    def last_source(self) -> str:
        return self.sources[-1] if self.sources else ""

    def argmax(self) -> int:
        best, idx = -math.inf, -1
        for i, v in enumerate(self.values):
            if not math.isnan(v) and v > best:
                best, idx = v, i
        return idx

    def argmin(self) -> int:
        best, idx = math.inf, -1
        for i, v in enumerate(self.values):
            if not math.isnan(v) and v < best:
                best, idx = v, i
        return idx


def _bisect_left(a: list[float], x: float) -> int:
    import bisect

    return bisect.bisect_left(a, x)


def _bisect_right(a: list[float], x: float) -> int:
    import bisect

    return bisect.bisect_right(a, x)


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile (same as numpy's default / pandas' ``quantile``)."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if n == 1:
        return sorted_values[0]
    pos = (n - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values: Iterable[float]) -> dict[str, Any]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {"last": None, "mean": None, "min": None, "max": None, "p50": None, "p95": None, "n": 0}
    s = sorted(vals)
    return {
        "last": vals[-1],
        "mean": sum(vals) / len(vals),
        "min": s[0],
        "max": s[-1],
        "p50": quantile(s, 0.5),
        "p95": quantile(s, 0.95),
        "n": len(vals),
    }


@dataclass(slots=True)
class Timeline:
    """Everything known about one target: signals over time, discrete events, config facts."""

    target: str
    engine: str = "sglang"
    series: dict[tuple[str, str], Series] = field(default_factory=dict)
    events: list[LogEvent] = field(default_factory=list)
    config: dict[str, ConfigFact] = field(default_factory=dict)
    version: str | None = None  # detected version or range, e.g. "0.5.23" or ">=0.5.11"
    inputs: list[InputReport] = field(default_factory=list)
    untimed: bool = False  # True when the source had no timestamps (positions are line order)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- writing -------------------------------------------------------------------------------
    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        key = (signal, rank)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series()
        s.append(ts, float(value), source)

    def add_many(self, signal: str, ts: list[float], values: list[float], sources: list[str], rank: str = "") -> None:
        """Append columns of points; one ``extend`` per column when they follow the series in time order
        (the bulk log reader's case), else point by point."""
        if not ts:
            return
        s = self.series.get((signal, rank))
        in_order = all(map(operator.le, ts, islice(ts, 1, None)))
        if in_order and (s is None or not s.ts or s.ts[-1] <= ts[0]):
            if s is None:
                s = self.series[(signal, rank)] = Series()
            s.ts.extend(ts)
            s.values.extend(map(float, values))  # map: no generator frame per point
            s.sources.extend(sources)
            return
        for t, v, src in zip(ts, values, sources, strict=True):
            self.add(signal, t, v, src, rank)

    def add_event(self, event: LogEvent) -> None:
        self.events.append(event)

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        if value is None:
            return
        if not override and name in self.config:
            return
        self.config[name] = ConfigFact(value, source)

    # -- reading -------------------------------------------------------------------------------
    def get(self, signal: str, rank: str = "") -> Series | None:
        s = self.series.get((signal, rank))
        return s if s is not None and len(s) else None

    def has(self, signal: str) -> bool:
        return self.get(signal) is not None

    def ranks(self, signal: str) -> list[str]:
        return sorted(r for (name, r) in self.series if name == signal and r)

    def cfg(self, name: str, default: Any = None) -> Any:
        fact = self.config.get(name)
        return default if fact is None else fact.value

    def cfg_source(self, name: str) -> str:
        fact = self.config.get(name)
        return "" if fact is None else fact.source

    def stats(self, signal: str, rank: str = "") -> dict[str, Any]:
        s = self.get(signal, rank)
        return summarize(s.values if s else [])

    def span(self) -> tuple[float | None, float | None]:
        """(first, last) time over every series and event; (None, None) when empty. Built-in min/max
        over the firsts and lasts (C loops; same values, same order as comparing them one by one)."""
        live = [s.ts for s in self.series.values() if s.ts]
        ets = [e.ts for e in self.events]
        firsts = [ts[0] for ts in live] + ets
        if not firsts:
            return None, None
        return min(firsts), max([ts[-1] for ts in live] + ets)

    def events_of(self, *kinds: str) -> list[LogEvent]:
        return [e for e in self.events if e.kind in kinds]

    def window(self, start: float | None = None, end: float | None = None) -> Timeline:
        """A copy restricted to ``[start, end]``; config and version are kept whole."""
        tl = Timeline(
            target=self.target,
            engine=self.engine,
            config=dict(self.config),
            version=self.version,
            inputs=self.inputs,
            untimed=self.untimed,
            meta=dict(self.meta),
        )
        for key, s in self.series.items():
            part = s.slice(start, end)
            if len(part):
                tl.series[key] = part
        tl.events = [
            e for e in self.events if (start is None or e.ts >= start) and (end is None or e.ts <= end)
        ]
        return tl

    def iter_points(self) -> Iterator[tuple[float, str, str, float, str]]:
        for (signal, rank), s in self.series.items():
            for t, v, src in zip(s.ts, s.values, s.sources, strict=True):
                yield t, signal, rank, v, src

    def to_frame(self) -> Any:
        """The timeline as a long pandas DataFrame: ts (UTC), signal, rank, value, source."""
        import pandas as pd

        rows = list(self.iter_points())
        df = pd.DataFrame(rows, columns=["ts", "signal", "rank", "value", "source"])
        df["ts"] = pd.to_datetime(df["ts"], unit="s", utc=True)
        return df.sort_values(["signal", "rank", "ts"], kind="stable").reset_index(drop=True)

    def wide(self, rank: str = "") -> Any:
        """One column per signal (rank-filtered), indexed by time: handy for fits and plots."""
        df = self.to_frame()
        df = df[df["rank"] == rank]
        return df.pivot_table(index="ts", columns="signal", values="value", aggfunc="last")

    # -- aggregation ---------------------------------------------------------------------------
    def aggregate_ranks(self) -> None:
        """Derive the rank-``""`` series from per-rank series, with each signal's own rule.

        Ranks report at different moments, so the aggregate at time t combines each rank's latest
        value at or before t (a rank that has not reported yet does not count).
        """
        by_signal: dict[str, list[str]] = {}
        for name, rank in self.series:
            # pipeline stages after the first hold the same requests as stage 0: keep them apart only
            if rank and "pp" not in rank:
                by_signal.setdefault(name, []).append(rank)
        for name, ranks in by_signal.items():
            if (name, "") in self.series or not ranks:
                continue
            how = SIGNALS.get(name, ("", "mean", ""))[1]
            pts: list[tuple[float, str, float, str]] = []
            for r in ranks:
                s = self.series[(name, r)]
                pts.extend((t, r, v, src) for t, v, src in zip(s.ts, s.values, s.sources, strict=True))
            pts.sort(key=lambda p: p[0])
            latest: dict[str, float] = {}
            out = Series()
            i = 0
            while i < len(pts):
                t = pts[i][0]
                srcs = []
                while i < len(pts) and pts[i][0] == t:
                    latest[pts[i][1]] = pts[i][2]
                    srcs.append(pts[i][3])
                    i += 1
                vals = [v for v in latest.values() if not math.isnan(v)]
                if not vals:
                    continue
                if how == "sum":
                    agg = sum(vals)
                elif how == "max":
                    agg = max(vals)
                elif how == "min":
                    agg = min(vals)
                else:
                    agg = sum(vals) / len(vals)
                out.append(t, agg, srcs[-1])
            self.series[(name, "")] = out

    def merge(self, other: Timeline) -> None:
        """Fold another timeline of the same target into this one (e.g. a log and a scrape)."""
        for key, s in other.series.items():
            for t, v, src in zip(s.ts, s.values, s.sources, strict=True):
                self.add(key[0], t, v, src, key[1])
        self.events.extend(other.events)
        self.events.sort(key=lambda e: (e.ts, e.line_no))
        for k, fact in other.config.items():
            self.config.setdefault(k, fact)
        if other.version and not self.version:
            self.version = other.version
        self.inputs.extend(other.inputs)
        self.untimed = self.untimed or other.untimed
