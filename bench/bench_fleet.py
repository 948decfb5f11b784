"""Fleet mode at scale: one evaluation pass over 1,000 targets read from a real Prometheus.

Backfills a generated 1,000-target fleet (tests/fleet_fixtures.py, ``promtool tsdb
create-blocks-from openmetrics``) into the Debian ``prometheus`` on loopback, then times
``collect_prometheus`` + ``evaluate`` + the report, against a baseline measured in the same run: the
same HTTP queries sent raw (same concurrency, bodies read, nothing parsed) — what the store and the
transfer cost by themselves. Memory: tracemalloc peak of one pass, against the bytes Prometheus sent.

Target (issue 8): a pass < 5 s on this machine, memory bounded (points per series are capped).

    .venv/bin/python bench/bench_fleet.py [--targets 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from diagnoser.engines import get_adapter  # noqa: E402
from diagnoser.evaluate import evaluate  # noqa: E402
from diagnoser.fleet import collect_prometheus  # noqa: E402
from diagnoser.fleet import queries as Q  # noqa: E402
from diagnoser.fleet import source as S  # noqa: E402
from diagnoser.outputs.report import build  # noqa: E402
from tests.fleet_fixtures import fleet_prometheus  # noqa: E402

TARGET_S = 5.0


def ns(url: str, end: float) -> argparse.Namespace:
    return argparse.Namespace(prometheus=url, selector='{job="sglang"}', range=600.0, step=None, rate_window=None, end=end,
                              timeout=30.0, bearer_token=None, basic_auth=None, header=[])


def raw_pass(url: str, end: float) -> tuple[float, int]:
    """The same requests, raw: series + config + every range query, 4 at a time, bodies read only."""
    win, _ = S.Window.from_args(600.0, None, None, end)
    m = Q.parse_selector('{job="sglang"}')
    reqs = [("/api/v1/series", {"match[]": Q.discovery_match(m), "start": win.start, "end": win.end}),
            ("/api/v1/query_range", {"query": Q.config_query(m), "start": win.start, "end": win.end,
                                     "step": min(win.end - win.start, 240.0)})]
    for q in Q.plan(m, win.step, win.rate_window):
        step = max(win.step, win.rate_window) if q.kind == "quantile" else win.step
        reqs.append(("/api/v1/query_range", {"query": q.promql, "start": win.start, "end": win.end, "step": step}))
    t0 = time.perf_counter()
    with httpx.Client(timeout=60) as c, ThreadPoolExecutor(S.WORKERS) as pool:
        sizes = list(pool.map(lambda r: len(c.post(url + r[0], data=r[1]).content), reqs))
    return time.perf_counter() - t0, sum(sizes)


def full_pass(url: str, end: float) -> tuple[float, float, float, int, int]:
    t0 = time.perf_counter()
    col = collect_prometheus(ns(url, end), get_adapter())
    t1 = time.perf_counter()
    report = evaluate(col.timelines, get_adapter())
    doc = build(col, report)
    t2 = time.perf_counter()
    assert len(col.timelines) and not col.fleet["failed_queries"], col.inputs[0].messages
    return t2 - t0, t1 - t0, t2 - t1, len(col.timelines), len(doc["findings"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="diagnoser-bench-fleet-"))
    t0 = time.perf_counter()
    prom, spec = fleet_prometheus(work, a.targets)
    print(f"fleet of {a.targets} targets backfilled and served in {time.perf_counter() - t0:.1f} s "
          f"(promtool {prom.extra['backfill_s']:.1f} s)")
    try:
        full_pass(prom.url, spec.end)  # warm-up: Prometheus page cache, imports
        raws, fulls, cols, evals = [], [], [], []
        n = findings = 0
        body = 0
        for _ in range(a.repeat):
            r, body = raw_pass(prom.url, spec.end)
            f, c, e, n, findings = full_pass(prom.url, spec.end)
            raws.append(r)
            fulls.append(f)
            cols.append(c)
            evals.append(e)
        tracemalloc.start()
        full_pass(prom.url, spec.end)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        prom.stop()
    raw, full, col, ev = (statistics.median(x) for x in (raws, fulls, cols, evals))
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores (other work shares this machine)")
    print(f"{'measure':44s} {'median s':>9s} {'× raw':>7s}")
    print(f"{'raw queries (baseline: store + transfer)':44s} {raw:9.2f} {1.0:7.2f}")
    print(f"{'collect (queries + JSON + timelines)':44s} {col:9.2f} {col / raw:7.2f}")
    print(f"{'evaluate + report (' + str(n) + ' targets)':44s} {ev:9.2f} {ev / raw:7.2f}")
    print(f"{'one full pass':44s} {full:9.2f} {full / raw:7.2f}")
    print(f"pass / 5 s target = {full / TARGET_S:.2f}; {findings} findings; {len(Q.plan('', 15, 60))} range queries + 2 per pass")
    print(f"memory: tracemalloc peak {peak / 2**20:.1f} MiB for {body / 2**20:.1f} MiB of answers "
          f"(× {peak / max(body, 1):.2f}); {peak / n / 1024:.0f} KiB per target; points per series capped at {S.MAX_POINTS}")
    ok = full < TARGET_S
    print("target met" if ok else "TARGET MISSED (see the load average: the ratio to the raw baseline is the stable figure)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
