"""One canonical timeline of signals per target, whatever the source (scrape, log, replay, Prometheus).

A signal is a named, unit-suffixed series (``running_reqs``, ``token_usage``, ``ttft_seconds_p95`` …).
Each point keeps its source (``server.log:1842`` or ``scrape@<iso> sglang:num_queue_reqs``) so that every
number a rule cites can be traced back.

Per-rank series are kept apart under a rank key (``dp0``, ``dp1``, ``pp1`` …; ``""`` for a single
scheduler). The aggregate series (rank ``""``) is derived with a per-signal rule: counts and rates are
summed across ranks, ratios never are (token usage takes the worst rank, rates of hits are averaged).

Storage is columnar: each series keeps float64 numpy columns (times, values) and its sources as label
ids plus line numbers (:class:`Sources`), written in place by the scrape, line and bulk-column writers
(:meth:`Timeline.add`, :meth:`Timeline.add_many`, :meth:`Timeline.add_columns`), so the rules read
arrays without converting anything. :meth:`Timeline.to_frame` gives the pandas view
(``ts, signal, rank, value, source``) for analysis and fits; window statistics are computed with numpy
(tested against pandas) so that ``diagnose --once --log`` starts without importing pandas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnoser.model import ConfigFact, InputReport, LogEvent, iso  # noqa: F401  (iso re-exported)
from diagnoser.timeline.series import Series, Sources, _narrow

__all__ = ["SIGNALS", "Series", "Sources", "Timeline", "quantile", "series_summary", "summarize", "iso"]

# Canonical signals: name → (unit, how ranks aggregate, help). Later issues and scripts rely on these names.
SIGNALS: dict[str, tuple[str, str, str]] = {
    "running_reqs": ("requests", "sum", "requests in the running (decode) batch"),
    "prefill_running_reqs": ("requests", "sum", "a Prefill batch line's #running-req: the decode batch beside that prefill, "
                             "before its new requests join (not a running-batch reading; 0 when the batch had just emptied)"),
    "queue_reqs": ("requests", "sum", "requests waiting in the scheduler queue"),
    "token_usage": ("ratio", "max", "KV pool use, 0-1 (worst pool and worst rank)"),
    "used_tokens": ("tokens", "sum", "KV slots held by live requests"),
    "max_total_tokens": ("tokens", "sum", "KV pool capacity in tokens"),
    "gen_throughput_tps": ("tokens/s", "sum", "decode tokens generated per second"),
    "prefill_new_tokens": ("tokens", "sum", "uncached tokens computed by one prefill batch"),
    "output_floor_tokens": ("tokens", "max", "a lower bound on one request's output so far: tokens generated since the last reading "
                            "that admitted a prompt, over the requests running then (none waiting); the engine's reader derives it"),
    "decode_tokens": ("tokens", "sum", "tokens decoded since the previous reading (realtime counter, 0.5.7+)"),
    "prefill_passes": ("passes", "sum", "prefill forward passes (batches) since the previous reading (0.5.7+)"),
    "decode_passes": ("passes", "sum", "decode forward passes (steps) since the previous reading (0.5.7+)"),
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
    "http_responses_total": ("requests", "sum", "POST answers since start (sglang:http_responses_total, counter)"),
    "http_errors_total": ("requests", "sum", "POST answers with a 4xx/5xx status since start (counter)"),
    "http_400_total": ("requests", "sum", "POST answers 400 since start: bad requests, prompts longer than the context (counter)"),
    "http_429_total": ("requests", "sum", "POST answers 429 since start: rate limited (counter)"),
    "http_503_total": ("requests", "sum", "POST answers 503 since start: the waiting queue full (counter)"),
    "aborted_total": ("requests", "sum", "aborted requests since start: client disconnects, timeouts, queue-full rejections (counter)"),
    "http_requests_active": ("requests", "sum", "in-flight HTTP requests"),
    "decode_sum_seq_lens": ("tokens", "sum", "sum of sequence lengths in the decode batch"),
    "cache_hit_rate_last_prefill": ("ratio", "mean", "prefix-cache hit rate of the last prefill batch (gauge)"),
    "kv_available_tokens": ("tokens", "sum", "free KV slots (0.5.11+)"),
    "kv_evictable_tokens": ("tokens", "sum", "cached, unreferenced KV slots that can be evicted (0.5.11+)"),
    "paused_reqs": ("requests", "sum", "requests paused by async weight sync"),
    "grammar_queue_reqs": ("requests", "sum", "requests waiting for grammar compilation"),
    "pd_bootstrap_reqs": ("requests", "sum", "PD prefill: requests waiting for the decode side's handshake (bootstrap queue)"),
    "pd_inflight_reqs": ("requests", "sum", "PD prefill: prefilled requests whose KV is being sent to decode"),
    "pd_prealloc_reqs": ("requests", "sum", "PD decode: requests waiting for KV space to be pre-allocated"),
    "pd_transfer_reqs": ("requests", "sum", "PD decode: requests waiting for their KV to arrive"),
    "pd_prealloc_usage": ("ratio", "max", "PD decode: share of the pool reserved for incoming transfers"),
}


def quantile(sorted_values: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated quantile (same as numpy's default / pandas' ``quantile``)."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if n == 1:
        return sorted_values[0]  # type: ignore[return-value]
    pos = (n - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    return a + (b - a) * frac  # type: ignore[no-any-return]


_EMPTY_SUMMARY = {"last": None, "mean": None, "min": None, "max": None, "p50": None, "p95": None, "n": 0}


def _order_stats(arr: np.ndarray) -> np.ndarray:
    """``arr`` (no NaN) with the positions :func:`summarize` reads (the ends, and both sides of the p50
    and p95 positions) holding what the sorted array holds there: a partition, a few passes instead of
    a sort. Equal floats are the same number except 0.0 and -0.0, whose order a sort keeps and a
    partition does not: with both present the array is sorted (stably, as ``sorted()`` orders them)."""
    n = len(arr)
    zero = arr == 0
    if zero.any() and np.signbit(arr[zero]).any() and not np.signbit(arr[zero]).all():
        return np.sort(arr, kind="stable")
    kth = {0, n - 1}
    for q in (0.5, 0.95):
        lo = math.floor((n - 1) * q)
        kth.update((lo, min(lo + 1, n - 1)))
    return np.partition(arr, sorted(kth))


def summarize(values: Iterable[float] | np.ndarray) -> dict[str, Any]:
    """last, mean, min, max, p50, p95 and n of the non-NaN values. A numpy column is summarised with
    numpy (NaN filter, a partition for the order statistics) but the same arithmetic as the list path:
    the mean is Python's left-to-right ``sum`` and the quantiles :func:`quantile`, so both give the same
    numbers to the bit."""
    if isinstance(values, np.ndarray):
        if len(values) < 64:
            values = values.tolist()
        else:
            arr = values[~np.isnan(values)]
            n = len(arr)
            if not n:
                return dict(_EMPTY_SUMMARY)
            s = _order_stats(arr)
            return {"last": float(arr[-1]), "mean": sum(arr.tolist()) / n, "min": float(s[0]), "max": float(s[-1]),
                    "p50": float(quantile(s, 0.5)), "p95": float(quantile(s, 0.95)), "n": n}
    vals = values if isinstance(values, list) else list(values)
    total = sum(vals)
    if total != total:  # a NaN is in it (or both infinities): drop the NaNs
        vals = [v for v in vals if not math.isnan(v)]
        total = sum(vals)
    if not vals:
        return dict(_EMPTY_SUMMARY)
    s2 = sorted(vals)
    return {
        "last": vals[-1],
        "mean": total / len(vals),
        "min": s2[0],
        "max": s2[-1],
        "p50": quantile(s2, 0.5),
        "p95": quantile(s2, 0.95),
        "n": len(vals),
    }


def series_summary(s: Series) -> dict[str, Any]:
    """:func:`summarize` of a series' values, computed once per state of the series (:meth:`Series.memo`):
    shared, so callers must not change it (:meth:`Timeline.stats` hands out copies)."""
    memo = s.memo()
    hit = memo.get("summary")
    if hit is None:
        hit = memo["summary"] = summarize(s.values)
    return hit  # type: ignore[no-any-return]


# a configuration number beyond this (or NaN, ±Inf) is garbage, not a setting: dropped by set_config
MAX_NUMBER = float(2**63)


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
        self._series(signal, rank).append(ts, float(value), source)

    def _series(self, signal: str, rank: str) -> Series:
        """The series of (signal, rank), created empty when new."""
        s = self.series.get((signal, rank))
        if s is None:
            s = self.series[(signal, rank)] = Series()
        return s

    def add_many(self, signal: str, ts: Any, values: Any, sources: Any, rank: str = "") -> None:
        """Add columns of points (lists or arrays; ``sources`` a list of str or a :class:`Sources`): one
        write per column when they follow the series in time order (the bulk log reader's case), else
        merged as adding them one by one would (each after the points at or before its time)."""
        n = len(ts)
        if not n:
            return
        s = self._series(signal, rank)
        t = np.asarray(ts, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        if v.shape != t.shape:
            raise ValueError(f"add_many needs as many values as times (got {len(v)} and {n})")
        lab, line = s._encode_many(sources, n)
        s.merge_columns(t, v, lab, line)

    def add_columns(self, signal: str, rank: str, ts: np.ndarray, values: np.ndarray, source_name: str, line_nos: np.ndarray) -> None:
        """Add whole columns read from one source (the bulk log reader): float64 ``ts`` (time order) and
        ``values``, int64 ``line_nos`` (each >= 0); point i's source is ``f"{source_name}:{line_nos[i]}"``,
        stored as one label and the line numbers (no str, no Python float per point)."""
        n = len(ts)
        if not n:
            return
        s = self._series(signal, rank)
        t = np.asarray(ts, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        line = _narrow(np.asarray(line_nos, dtype=np.int64))
        if v.shape != t.shape or line.shape != t.shape:
            raise ValueError(f"add_columns needs columns of one length (got {len(t)}, {len(v)} and {len(line)})")
        s.merge_columns(t, v, np.full(n, s._intern(source_name), np.int32), line)

    def settle(self) -> None:
        """Sort every series that took points out of time order (each does it on its next read anyway);
        the readers call it when a read ends, so that reading, not the rule pass, pays for it."""
        for s in self.series.values():
            if s._unsorted:
                s._settle()

    def add_event(self, event: LogEvent) -> None:
        self.events.append(event)

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        if value is None or (type(value) in (int, float) and not -MAX_NUMBER <= value <= MAX_NUMBER):
            return  # no configuration is NaN, infinite or a 400-digit number (the source was garbled)
        if not override and name in self.config:
            return
        self.config[name] = ConfigFact(value, source)

    # -- reading -------------------------------------------------------------------------------
    def get(self, signal: str, rank: str = "") -> Series | None:
        s = self.series.get((signal, rank))
        return s if s is not None and s._hi != s._lo else None  # not empty (len without its call)

    def has(self, signal: str) -> bool:
        return self.get(signal) is not None

    def ranks(self, signal: str) -> list[str]:
        return sorted([r for name, r in self.series if r and name == signal])  # most keys have no rank

    def cfg(self, name: str, default: Any = None) -> Any:
        fact = self.config.get(name)
        return default if fact is None else fact.value

    def cfg_source(self, name: str) -> str:
        fact = self.config.get(name)
        return "" if fact is None else fact.source

    def stats(self, signal: str, rank: str = "") -> dict[str, Any]:
        """:func:`summarize` of the series (a new dict: callers may add to it), computed once per state of
        the series (:meth:`Series.memo`)."""
        s = self.get(signal, rank)
        return dict(series_summary(s)) if s is not None else dict(_EMPTY_SUMMARY)

    def span(self) -> tuple[float | None, float | None]:
        """(first, last) time over every series and event; (None, None) when empty. Built-in min/max
        over the firsts and lasts (C loops; same values, same order as comparing them one by one)."""
        firsts = []
        lasts = []
        for s in self.series.values():
            b = s.bounds()
            if b is not None:
                firsts.append(b[0])
                lasts.append(b[1])
        ets = [e.ts for e in self.events]
        if not firsts and not ets:
            return None, None
        return min(firsts + ets), max(lasts + ets)

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
            for t, v, src in zip(s.ts.tolist(), s.values.tolist(), s.sources.tolist(), strict=True):
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
            parts = [self.series[(name, r)] for r in ranks]
            labels: list[str] = []
            labs = []
            for s in parts:  # one label table for all ranks: each rank's ids shifted past the ones before
                labs.append(s.sources._lab + len(labels))
                labels.extend(s._labels)
            t_all = np.concatenate([s.ts for s in parts])
            order = np.argsort(t_all, kind="stable")  # as a stable sort of the ranks' points, rank by rank
            tl_ = t_all[order].tolist()
            vl = np.concatenate([s.values for s in parts])[order].tolist()
            rl = np.repeat(np.arange(len(parts)), [len(s) for s in parts])[order].tolist()
            latest: dict[int, float] = {}
            out_t: list[float] = []
            out_v: list[float] = []
            out_at: list[int] = []
            i, n = 0, len(tl_)
            while i < n:
                t = tl_[i]
                while i < n and tl_[i] == t:
                    latest[rl[i]] = vl[i]
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
                out_t.append(t)
                out_v.append(agg)
                out_at.append(i - 1)  # the source of the last point read at t
            pick = order[np.asarray(out_at, dtype=np.intp)]
            self.series[(name, "")] = Series._from_columns(
                np.asarray(out_t, dtype=np.float64), np.asarray(out_v, dtype=np.float64), labels,
                np.concatenate(labs)[pick], np.concatenate([s.sources._line for s in parts])[pick])

    def merge(self, other: Timeline) -> None:
        """Fold another timeline of the same target into this one (e.g. a log and a scrape)."""
        for (signal, rank), s in other.series.items():
            self.add_many(signal, s.ts, s.values, s.sources, rank)
        self.events.extend(other.events)
        self.events.sort(key=lambda e: (e.ts, e.line_no))
        for k, fact in other.config.items():
            self.config.setdefault(k, fact)
        if other.version and not self.version:
            self.version = other.version
        self.inputs.extend(other.inputs)
        self.untimed = self.untimed or other.untimed
