"""Column storage of the Timeline: numpy-backed :class:`Series`, :class:`Sources` (label ids + line
numbers, formatted on read), :meth:`Timeline.add_columns`, growth, and views that never change under
their holders. The point-by-point list implementation the columns replaced is kept here as the reference."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from diagnoser.engines import get_adapter
from diagnoser.sources.logs import read_log
from diagnoser.timeline import Series, Sources, Timeline, summarize

ODD_SOURCES = [
    "server.log:1842", "server.log:1", "server.log:0", "x:0123", "x:00", "a:b:12", "stdin:5", "log:-3", "log:+3",
    "log:\u0661\u0662", "log:\u00b2", ":7", "x:", "", "plain", "x:99999999999999999999", "x:999999999999999999",
    "scrape@2026-11-29T10:00:00.123000Z sglang:num_queue_reqs", "scrape@12:00:05", "scrape@12:00:15",
    "promql sum(rate(x[1m])) (hits/all)", "server.log:1842 ",
]


class ListSeries:
    """The former list-backed series (append inserts an out-of-order point after the points at or
    before its time): the reference the columns must reproduce."""

    def __init__(self) -> None:
        self.ts: list[float] = []
        self.values: list[float] = []
        self.sources: list[str] = []

    def append(self, ts: float, value: float, source: str) -> None:
        i = len(self.ts)
        while i > 0 and self.ts[i - 1] > ts:
            i -= 1
        self.ts.insert(i, ts)
        self.values.insert(i, value)
        self.sources.insert(i, source)


def _cols(s: Series) -> tuple[list[float], list[float], list[str]]:
    return s.ts.tolist(), s.values.tolist(), s.sources.tolist()


def test_sources_give_back_the_exact_strings() -> None:
    s = Series(list(range(len(ODD_SOURCES))), [0.0] * len(ODD_SOURCES), ODD_SOURCES)
    src = s.sources
    assert isinstance(src, Sources) and len(src) == len(ODD_SOURCES)
    assert src.tolist() == ODD_SOURCES and list(src) == ODD_SOURCES and src == ODD_SOURCES
    assert [src[i] for i in range(len(src))] == ODD_SOURCES
    assert src[-1] == ODD_SOURCES[-1] and src[-len(src)] == ODD_SOURCES[0] and src[np.int64(2)] == ODD_SOURCES[2]
    part = src[2:7]
    assert isinstance(part, Sources) and part == ODD_SOURCES[2:7] and part[-1] == ODD_SOURCES[6]
    assert src[::-1].tolist() == ODD_SOURCES[::-1]
    assert src != ODD_SOURCES[:-1] and src != ["x"] * len(src) and src == tuple(ODD_SOURCES)
    assert "a:b:12" in src and "a:b:13" not in src
    with pytest.raises(IndexError):
        src[len(src)]
    with pytest.raises(TypeError):
        src[0] = "y"  # type: ignore[index]
    # a log source is one label and line numbers: no str is kept per point
    logs = Series([1.0, 2.0, 3.0], [0.0] * 3, ["server.log:10", "server.log:11", "server.log:12"]).sources
    assert logs._labels == ["server.log"] and logs._line.tolist() == [10, 11, 12]


def test_sources_of_real_logs_round_trip(data_dir: Path) -> None:
    """Every source string read from the real logs comes back unchanged, and it is the log line's own number."""
    adapter = get_adapter("sglang")
    logs = sorted((data_dir / "sglang-cpu-real").glob("*/server.log"))[:2] + sorted((data_dir / "cases").glob("*/server.log"))[:6]
    assert len(logs) >= 6
    checked = 0
    for log in logs:
        tl = Timeline(target="t")
        read_log(adapter, tl, str(log))
        lines = log.read_bytes().splitlines()
        for s in tl.series.values():
            strs = s.sources.tolist()
            again = Series(s.ts, s.values, strs)
            assert again.sources.tolist() == strs and Series(s.ts, s.values, s.sources).sources == strs
            for src in strs[:: max(1, len(strs) // 20)]:
                name, _, n = src.rpartition(":")
                assert name == log.name and 1 <= int(n) <= len(lines)
                checked += 1
    assert checked > 300


def test_columns_are_read_only_float64_views() -> None:
    tl = Timeline(target="t")
    for i in range(100):
        tl.add("running_reqs", float(i), i % 7, f"server.log:{i + 1}")
    s = tl.get("running_reqs")
    assert s is not None
    for col in (s.ts, s.values):
        assert col.dtype == np.float64 and not col.flags.writeable and len(col) == 100
        with pytest.raises(ValueError):
            col[0] = 1.0
    assert s.values.tolist()[:8] == [0, 1, 2, 3, 4, 5, 6, 0] and type(s.values.tolist()[0]) is float
    part = s.slice(10.0, 19.0)
    assert len(part) == 10 and np.shares_memory(part.ts, s._t) and part.sources[0] == "server.log:11"
    assert part.ts.tolist() == [float(i) for i in range(10, 20)]


def test_views_never_change_after_appends_growth_inserts_and_drops() -> None:
    s = Series()
    ref = ListSeries()
    rng = random.Random(3)
    held: list[tuple[object, list[float], list[float], list[str]]] = []
    t = 0.0
    for step in range(3000):
        t += rng.choice((0.0, 0.5, 1.0))
        ts = t - rng.choice((0.0, 0.0, 0.0, 3.0))  # now and then a point from the past (a second source)
        src = f"server.log:{step + 1}" if step % 3 else f"scrape@{ts} sglang:num_running_reqs"
        s.append(ts, float(step), src)
        ref.append(ts, float(step), src)
        if step % 97 == 0:  # hand out views, some of them slices
            v = s.slice(ts - 20, None) if step % 2 else s.slice(None, None)
            held.append((v, v.ts.tolist(), v.values.tolist(), v.sources.tolist()))
            keep = (v.ts, v.values, v.sources)
            held.append((keep, keep[0].tolist(), keep[1].tolist(), keep[2].tolist()))
    assert _cols(s) == (ref.ts, ref.values, ref.sources)
    s.drop_before(1000)
    assert _cols(s) == (ref.ts[1000:], ref.values[1000:], ref.sources[1000:])
    s.thin(0, 500, list(range(0, 500, 5)))
    for obj, ts_, vs_, ss_ in held:
        if isinstance(obj, tuple):
            assert (obj[0].tolist(), obj[1].tolist(), obj[2].tolist()) == (ts_, vs_, ss_)
        else:
            assert _cols(obj) == (ts_, vs_, ss_)  # type: ignore[arg-type]


def test_writing_to_a_slice_never_touches_the_series() -> None:
    s = Series([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], ["a:1", "a:2", "a:3", "a:4"])
    part = s.slice(1.0, 2.0)
    part.append(2.5, 9.0, "b:1")
    part.blank_sources(0, 1)
    assert _cols(s) == ([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], ["a:1", "a:2", "a:3", "a:4"])
    assert _cols(part) == ([1.0, 2.0, 2.5], [1.0, 2.0, 9.0], ["", "a:2", "b:1"])


def test_add_many_and_add_columns_keep_the_point_by_point_order() -> None:
    rng = random.Random(7)
    for trial in range(40):
        tl = Timeline(target="t")
        ref = ListSeries()
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(0, 60)
            base = rng.uniform(0, 50)
            ts = sorted(base + rng.choice((0.0, 0.5, 1.0)) * k for k in range(n))
            if rng.random() < 0.3:
                rng.shuffle(ts)  # not even in order among themselves
            vals = [rng.uniform(0, 9) for _ in ts]
            lines = [rng.randint(1, 10_000) for _ in ts]
            if trial % 2 and ts == sorted(ts):
                tl.add_columns("x", "", np.array(ts), np.array(vals), "server.log", np.array(lines, dtype=np.int64))
                srcs = [f"server.log:{k}" for k in lines]
            else:
                srcs = [f"s{k}" if k % 2 else f"server.log:{k}" for k in lines]
                tl.add_many("x", ts if trial % 4 < 2 else np.array(ts), vals, srcs)
            for t, v, src in zip(ts, vals, srcs, strict=True):
                ref.append(t, v, src)
        s = tl.series.get(("x", ""))
        assert (_cols(s) if s is not None else ([], [], [])) == (ref.ts, ref.values, ref.sources), trial


def test_add_columns_writes_whole_columns() -> None:
    tl = Timeline(target="t")
    tl.add_columns("running_reqs", "dp1", np.zeros(0), np.zeros(0), "server.log", np.zeros(0, dtype=np.int64))
    assert ("running_reqs", "dp1") not in tl.series  # empty columns add nothing
    tl.add("running_reqs", 0.5, 1.0, "scrape@x sglang:num_running_reqs", "dp1")
    tl.add_columns("running_reqs", "dp1", np.array([1.0, 1.0, 2.0]), np.array([3.0, 4.0, 5.0]), "server.log", np.array([7, 8, 9]))
    s = tl.get("running_reqs", "dp1")
    assert s is not None and s.sources._labels.count("server.log") == 1
    assert _cols(s) == ([0.5, 1.0, 1.0, 2.0], [1.0, 3.0, 4.0, 5.0], ["scrape@x sglang:num_running_reqs", "server.log:7", "server.log:8", "server.log:9"])
    # columns from before the series' last point: merged, each after the points at or before its time
    tl.add_columns("running_reqs", "dp1", np.array([1.0, 1.5]), np.array([6.0, 7.0]), "other.log", np.array([1, 2]))
    assert _cols(s)[2] == ["scrape@x sglang:num_running_reqs", "server.log:7", "server.log:8", "other.log:1", "other.log:2", "server.log:9"]
    with pytest.raises(ValueError):
        tl.add_columns("running_reqs", "", np.array([1.0]), np.array([1.0, 2.0]), "a", np.array([1]))


def test_drop_before_and_growth_keep_memory_bounded() -> None:
    """A long-lived series (one point in, one point out, as the live loop's trim) does not keep a
    doubled buffer nor the labels of points long gone."""
    s = Series()
    for i in range(20_000):
        s.append(float(i), 1.0, f"scrape@{i} sglang:num_running_reqs")
        if len(s) > 1000:
            s.drop_before(len(s) - 1000)
        if i % 50 == 0:
            s.blank_sources(0, max(0, len(s) - 100))
    assert len(s) == 1000 and s.ts[0] == 19_000.0 and s.sources[-1] == "scrape@19999 sglang:num_running_reqs"
    assert s.sources[0] == "" and len(s._t) <= 1.125 * 1000 + 16
    assert len(s._labels) <= 2 * len(set(s.sources)) + 64  # blanked points' labels are gone (~150 live, not ~20,000)
    s.drop_before(990)
    assert len(s) == 10 and len(s._t) <= 64  # shrunk once mostly dead


def test_summaries_and_extremes_match_the_list_path(data_dir: Path) -> None:
    adapter = get_adapter("sglang")
    n = 0
    for log in sorted((data_dir / "sglang-cpu-real").glob("*/server.log")):
        tl = Timeline(target="t")
        read_log(adapter, tl, str(log))
        for s in tl.series.values():
            vals = s.values.tolist()
            assert summarize(s.values) == summarize(vals)  # same numbers to the bit (== on floats)
            best = max((v for v in vals if not math.isnan(v)), default=None)
            low = min((v for v in vals if not math.isnan(v)), default=None)
            assert s.argmax() == (vals.index(best) if best is not None else -1)
            assert s.argmin() == (vals.index(low) if low is not None else -1)
            assert s.finite().tolist() == [v for v in vals if not math.isnan(v)]
            n += 1
    assert n > 50
    nan = Series([1.0, 2.0], [math.nan, math.nan], ["a:1", "a:2"])
    assert nan.argmax() == -1 and nan.argmin() == -1 and summarize(nan.values)["n"] == 0


def test_points_appended_out_of_order_are_sorted_before_any_read() -> None:
    tl = Timeline(target="t")
    ref = ListSeries()
    for t, v in ((5.0, 1.0), (7.0, 2.0), (6.0, 3.0), (7.0, 4.0), (1.0, 5.0), (6.0, 6.0)):
        tl.add("queue_reqs", t, v, f"server.log:{int(v)}")
        ref.append(t, v, f"server.log:{int(v)}")
    s = tl.series[("queue_reqs", "")]
    assert s._unsorted and tl.span() == (1.0, 7.0) and not s._unsorted  # the span read sorted it
    assert _cols(s) == (ref.ts, ref.values, ref.sources)
    tl.add("queue_reqs", 0.5, 7.0, "b:1")
    ref.append(0.5, 7.0, "b:1")
    tl.settle()  # what collect.finalize calls when a read ends
    assert not s._unsorted and _cols(s) == (ref.ts, ref.values, ref.sources)


def test_search_equals_numpy_searchsorted() -> None:
    """Series.search answers the ends without a search and the rest with numpy: the same positions as
    numpy.searchsorted on the read view, both sides, equal times included."""
    rnd = np.random.default_rng(3)
    for n in (0, 1, 2, 5, 40):
        ts = np.sort(rnd.integers(0, 20, n).astype(float))
        s = Series(ts.tolist(), [1.0] * n, ["x"] * n)
        for t in np.arange(-1.0, 21.5, 0.5).tolist():
            for side in ("left", "right"):
                assert s.search(t, side) == int(np.searchsorted(s.ts, t, side)), (n, t, side)
        probe = [-1.0, 3.0, 7.5, 25.0]
        assert s.search_many(probe) == np.searchsorted(s.ts, probe).tolist()
