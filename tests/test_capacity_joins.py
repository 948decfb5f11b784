"""The capacity model's joins on int source keys (``source_keys``) against the joins on source texts
they replace, on every real log and on the cpu-real windows read with their scrapes."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from diagnoser.capacity.build import _demand
from diagnoser.capacity.throughput import decode_points
from diagnoser.collect import collect_logs, finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.sources.logs import read_log
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline


def _ref_decode_points(tl: Timeline, rank: str = "") -> tuple[list[float], list[float]]:
    run, gen = tl.get("running_reqs", rank), tl.get("gen_throughput_tps", rank)
    if run is None or gen is None:
        return [], []
    rv = run.values.tolist()
    by_src = {s: v for s, v in zip(run.sources.tolist(), rv, strict=True) if ":" in s and "@" not in s}
    by_ts = dict(zip(run.ts.tolist(), rv, strict=True))
    bs, xs = [], []
    for t, x, s in zip(gen.ts.tolist(), gen.values.tolist(), gen.sources.tolist(), strict=True):
        b = by_src.get(s)
        if b is None:
            b = by_ts.get(t)
        if b is None or x != x or b != b:
            continue
        bs.append(b)
        xs.append(x)
    return bs, xs


def _ref_demand(tl: Timeline) -> float | None:
    run, queue = tl.get("running_reqs"), tl.get("queue_reqs")
    if run is None or queue is None:
        return None
    by_key = {(t, s if "@" not in s else ""): v for t, v, s in zip(run.ts.tolist(), run.values.tolist(), run.sources.tolist(), strict=True)}
    best = None
    for t, q, s in zip(queue.ts.tolist(), queue.values.tolist(), queue.sources.tolist(), strict=True):
        r = by_key.get((t, s if "@" not in s else ""))
        if r is not None and r == r and q == q:
            best = r + q if best is None else max(best, r + q)
    return best


def _windows(data_dir: Path) -> list[Timeline]:
    out = [tl for log in sorted(data_dir.rglob("*.log")) for tl in collect_logs(ADAPTER, [str(log)]).timelines]
    for run in sorted(glob.glob(str(data_dir / "sglang-cpu-real" / "*"))):  # scrapes and the log in one timeline
        tl = Timeline(target=os.path.basename(run))
        mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
        for f in sorted(glob.glob(os.path.join(run, "metrics", "*.prom"))):
            mt.ingest_text(Path(f).read_text(), float(f.rsplit("_", 1)[1][: -len(".prom")]), tl)
        vr = VersionRange()
        vr.merge(mt.state.version)
        vr.merge(read_log(ADAPTER, tl, os.path.join(run, "server.log")).parser.version)
        finalize(tl, vr)
        out.append(tl)
    return out


def test_joins_match_the_source_text_joins(data_dir: Path) -> None:
    windows = _windows(data_dir)
    assert len(windows) >= 20
    points = demands = 0
    for tl in windows:
        for rank in ["", *tl.ranks("running_reqs")]:
            got = decode_points(tl, rank)
            assert got == _ref_decode_points(tl, rank), (tl.target, rank)
            points += len(got[0])
        want = _ref_demand(tl)
        assert _demand(tl) == want, tl.target
        demands += want is not None
    assert points > 1000 and demands >= 10, (points, demands)


def test_position_join_only_for_the_same_distinct_points() -> None:
    import numpy as np

    from diagnoser.capacity.throughput import same_points

    ts = np.array([1.0, 2.0, 2.0, 3.0])
    key = np.array([5, 6, 7, 8], dtype=np.int64)
    assert same_points(ts, key, ts.copy(), key.copy())
    assert not same_points(ts, key, ts[:3], key[:3])  # other points
    assert not same_points(ts, key, ts, key[::-1].copy())  # other sources
    dup = np.array([5, 6, 6, 8], dtype=np.int64)
    assert not same_points(ts, dup, ts, dup)  # (2.0, 6) twice: a dict keeps the last, positions would not
    nan = np.array([1.0, np.nan, 2.0, 3.0])
    assert not same_points(nan, key, nan, key)  # a NaN time joins nothing by time
