"""Fleet mode at scale: one evaluation pass over 1,000, 3,000 and 10,000 targets read from a real Prometheus.

Backfills one generated 10,000-target fleet (tests/fleet_fixtures.py, ``promtool tsdb
create-blocks-from openmetrics``) into the Debian ``prometheus`` on loopback; its jobs nest, so
``job=~"f1"`` selects the first 1,000 targets, ``job=~"f1|f3"`` the first 3,000 and ``job=~"f1|f3|f10"``
all 10,000. For each size, a pass (``collect_prometheus`` + ``evaluate`` + the report) runs in a fresh
child process, which reports its wall times, the targets it judged and its peak RSS (``ru_maxrss``:
everything the process held, the interpreter and imports included). Baselines measured in the same run:
the same HTTP queries sent raw (same concurrency, bodies read, nothing parsed: what the store and the
transfer cost by themselves), and the pass and peak RSS at 1,000 targets.

Target (issue 26): at 10,000 targets all 10,000 judged, a pass under 10 s, peak RSS under 1 GB; time
and memory growing about linearly with the fleet.

    .venv/bin/python bench/bench_fleet.py [--sizes 1000,3000,10000] [--repeat 3] [--data DIR]

``--data DIR`` keeps the backfilled TSDB in DIR (made on the first run, reused after).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--root" in sys.argv:  # a child measuring another checkout (--compare): its code, this bench
    ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
sys.path.insert(0, str(ROOT))

TARGET_S = 10.0
TARGET_RSS = 1e9
JOBS = ((1000, "f1"), (3000, "f3"), (10000, "f10"))


def selector(n: int) -> str:
    names = [name for upto, name in JOBS if upto <= n]
    return '{job=~"' + "|".join(names) + '"}'


def ns(url: str, end: float, sel: str) -> argparse.Namespace:
    return argparse.Namespace(prometheus=url, selector=sel, range=600.0, step=None, rate_window=None, end=end,
                              timeout=30.0, bearer_token=None, basic_auth=None, header=[])


def child(url: str, end: float, sel: str) -> None:
    """One pass in this process; prints its figures as JSON."""
    from diagnoser.engines import get_adapter
    from diagnoser.evaluate import evaluate
    from diagnoser.fleet import collect_prometheus
    from diagnoser.outputs.report import build

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0, c0 = time.perf_counter(), time.process_time()
    col = collect_prometheus(ns(url, end, sel), get_adapter())
    t1, c1 = time.perf_counter(), time.process_time()
    report = evaluate(col.timelines, get_adapter())
    doc = build(col, report)
    t2, c2 = time.perf_counter(), time.process_time()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"pass": t2 - t0, "collect": t1 - t0, "evaluate": t2 - t1, "cpu_collect": c1 - c0, "cpu_evaluate": c2 - c1, "timelines": len(col.timelines),
                      "findings": len(doc["findings"]), "failed": col.fleet.get("failed_queries", {}),
                      "messages": col.inputs[0].messages, "rss": rss, "rss_imports": base, "bytes": col.fleet.get("bytes", 0),
                      "query_seconds": col.fleet.get("query_seconds", 0.0)}))


def proc_cpu(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROM_PID = 0  # the Prometheus measured (its CPU during each pass is the store's cost of that pass)


def run_child(url: str, end: float, sel: str, root: Path | None = None) -> dict[str, object]:
    extra = ["--root", str(root)] if root else []
    p0 = proc_cpu(PROM_PID) if PROM_PID else 0.0
    p = subprocess.run([sys.executable, __file__, "--child", url, str(end), sel, *extra], capture_output=True, text=True, cwd=root or ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"child pass failed: {p.stderr[-3000:]}")
    out: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    out["prom_cpu"] = proc_cpu(PROM_PID) - p0 if PROM_PID else 0.0
    return out


def raw_pass(url: str, end: float, sel: str) -> tuple[float, int]:
    """The same requests, raw: series + config + bucket bounds + every range query the pass sends (this
    checkout's plan), as many at a time, bodies read only."""
    import httpx

    from diagnoser.fleet import queries as Q
    from diagnoser.fleet import source as S
    from diagnoser.fleet.bounds import bucket_query

    win, _ = S.Window.from_args(600.0, None, None, end)
    m = Q.parse_selector(sel)
    win.fit_to_data(30.0, win.start)  # the fleet's scrape interval: the step the pass picks
    reqs = [("/api/v1/series", {"match[]": Q.discovery_match(m), "start": win.start, "end": win.end}),
            ("/api/v1/query_range", {"query": Q.config_query(m), "start": win.start, "end": win.end,
                                     "step": min(max((win.end - win.start) / 4, 1.0), 240.0)})]
    plan = Q.plan(m, win.step, win.rate_window)
    rates = Q.bucket_rates(plan, m, win.rate_window) if S._LOCAL_QUANTILES else {}  # the queries the pass sends
    reqs.append(("/api/v1/query_range", {"query": bucket_query(m), "start": win.start, "end": win.end,
                                         "step": min(max((win.end - win.start) / 4, 1.0), 240.0)}))
    for q in [q for q in plan if not (q.kind == "quantile" and q.base in rates)] + [job for job, _qs in rates.values()]:
        step = max(win.step, win.rate_window) if q.kind in ("quantile", "buckets") else win.step
        reqs.append(("/api/v1/query_range", {"query": q.promql, "start": win.start, "end": win.end, "step": step}))
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as c, ThreadPoolExecutor(S.WORKERS) as pool:
        sizes = list(pool.map(lambda r: len(c.post(url + r[0], data=r[1]).content), reqs))
    return time.perf_counter() - t0, sum(sizes)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,3000,10000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", default=None, help="keep (or reuse) the backfilled TSDB here")
    ap.add_argument("--compare", default=None, metavar="DIR", help="also measure the checkout in DIR (e.g. a main worktree) in the same run")
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=3, metavar=("URL", "END", "SELECTOR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], float(a.child[1]), a.child[2])
        return 0
    from tests.fleet_fixtures import (
        FleetSpec,
        backfill,
        scrape_config,
        start_prometheus,
        write_fleet_openmetrics,
    )

    sizes = [int(x) for x in a.sizes.split(",")]
    work = Path(a.data) if a.data else Path(tempfile.mkdtemp(prefix="diagnoser-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    meta = work / "spec.json"
    t0 = time.perf_counter()
    if not meta.exists():
        spec = FleetSpec(n=JOBS[-1][0], end=float(int(time.time()) - 60), jobs=JOBS)
        write_fleet_openmetrics(work / "fleet.om", spec)
        took = backfill(work / "fleet.om", work / "data")
        (work / "fleet.om").unlink()
        meta.write_text(json.dumps({"end": spec.end}))
        print(f"fleet of {spec.n} targets written and backfilled in {time.perf_counter() - t0:.1f} s (promtool {took:.1f} s)")
    end = json.loads(meta.read_text())["end"]
    prom = start_prometheus(work, scrape_config({}), data_dir=work / "data")
    global PROM_PID
    PROM_PID = prom.proc.pid
    rows = []
    try:
        run_child(prom.url, end, selector(sizes[0]))  # warm-up: Prometheus' page cache, imports
        other = Path(a.compare).resolve() if a.compare else None
        for n in sizes:
            raws, passes, olds = [], [], []
            for _ in range(a.repeat):
                raws.append(raw_pass(prom.url, end, selector(n))[0])
                passes.append(run_child(prom.url, end, selector(n)))
                if other:
                    olds.append(run_child(prom.url, end, selector(n), other))
            rows.append((n, statistics.median(raws), passes, olds))
    finally:
        prom.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores (other work shares this machine)")
    print(f"{'targets':>8s} {'judged':>7s} {'raw s':>7s} {'pass s':>7s} {'collect':>8s} {'eval+rep':>8s} {'× raw':>6s} "
          f"{'× 1k':>6s} {'MiB ans':>8s} {'peak RSS':>9s} {'× 1k':>6s} {'KiB/tgt':>8s}")
    base_pass = base_rss = None
    ok = True
    for n, raw, passes, olds in rows:
        def med(k: str, passes: list[dict[str, object]] = passes) -> float:
            return statistics.median(float(p[k]) for p in passes)  # type: ignore[arg-type]

        ps, rss = med("pass"), max(float(p["rss"]) for p in passes)
        base_pass = base_pass or ps
        base_rss = base_rss or rss
        judged = min(int(p["timelines"]) for p in passes)
        per = (rss - float(passes[0]["rss_imports"])) / n / 1024
        print(f"{n:8d} {judged:7d} {raw:7.2f} {ps:7.2f} {med('collect'):8.2f} {med('evaluate'):8.2f} {ps / raw:6.2f} "
              f"{ps / base_pass:6.2f} {float(passes[0]['bytes']) / 2**20:8.1f} {rss / 2**20:8.0f}M {rss / base_rss:6.2f} {per:8.1f}"
              f"   CPU: collect {med('cpu_collect'):.2f} s, eval+rep {med('cpu_evaluate'):.2f} s, Prometheus {med('prom_cpu'):.2f} s")
        bad = [p for p in passes if p["failed"] or int(p["timelines"]) != n]
        if bad:
            ok = False
            print(f"  {n}: not every target judged or queries failed: {bad[0]['failed']} {bad[0]['messages'][:3]}")
        if olds:
            ops = statistics.median(float(p["pass"]) for p in olds)  # type: ignore[arg-type]
            orss = max(float(p["rss"]) for p in olds)  # type: ignore[arg-type]
            oc = statistics.median(float(p["collect"]) for p in olds)  # type: ignore[arg-type]
            oe = statistics.median(float(p["evaluate"]) for p in olds)  # type: ignore[arg-type]
            occ = statistics.median(float(p["cpu_collect"]) for p in olds)  # type: ignore[arg-type]
            oce = statistics.median(float(p["cpu_evaluate"]) for p in olds)  # type: ignore[arg-type]
            opc = statistics.median(float(p["prom_cpu"]) for p in olds)  # type: ignore[arg-type]
            print(f"{'':8s} {a.compare}: pass {ops:.2f} s (collect {oc:.2f}, eval+rep {oe:.2f}; CPU {occ:.2f} + {oce:.2f}), "
                  f"{ops / raw:.2f}x raw, peak RSS {orss / 2**20:.0f}M; this / that: pass {ps / ops:.2f}x, collect {med('collect') / oc:.2f}x "
                  f"(CPU {med('cpu_collect') / occ:.2f}x), eval+rep {med('evaluate') / oe:.2f}x (CPU {med('cpu_evaluate') / oce:.2f}x), "
                  f"RSS {rss / orss:.2f}x; Prometheus CPU {opc:.2f} s there, this / that {med('prom_cpu') / opc:.2f}x")
        if n >= 10000 and (ps >= TARGET_S or rss >= TARGET_RSS):
            ok = False
    print(f"target: at 10,000 all judged, a pass < {TARGET_S:g} s, peak RSS < {TARGET_RSS / 1e9:g} GB "
          f"(median of {a.repeat}; RSS the largest; KiB/tgt excludes the interpreter and imports)")
    if not any(n >= 10000 for n, *_rest in rows):
        print("target not checked (it is at 10,000 targets)" if ok else "NOT EVERY TARGET JUDGED")
        return 0 if ok else 1
    print("target met" if ok else "TARGET MISSED (see the load average: the ratios are the stable figures)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
