"""Fleet mode at scale: one evaluation pass over 1,000, 3,000 and 10,000 targets read from a real Prometheus.

Backfills one generated 10,000-target fleet (tests/fleet_fixtures.py, ``promtool tsdb
create-blocks-from openmetrics``) into the Debian ``prometheus`` on loopback; its jobs nest, so
``job=~"f1"`` selects the first 1,000 targets, ``job=~"f1|f3"`` the first 3,000 and ``job=~"f1|f3|f10"``
all 10,000. For each size, a pass runs in a fresh child process, through the code ``diagnose --once
--prometheus URL --selector SEL --range 10m --end END`` runs: ``gather`` (``collect_prometheus``) then
``analyse`` (the rules, split over worker processes above 500 targets with more than one CPU, the advice and
the report document). The child reports its wall times, its CPU and its workers' CPU, the targets it
judged and its peak RSS (``ru_maxrss``: the interpreter and imports included); the text report's render is
timed apart. While the child runs, this process samples the memory of the child and its workers
(``/proc/PID/smaps_rollup``) every 20 ms: the peak of their summed PSS (each shared page counted once over
the processes sharing it) is the pass's memory, workers included. Baselines measured in the same run: the
same HTTP queries sent raw (same concurrency, bodies read, nothing parsed: what the store and the
transfer cost by themselves), the pass and peak memory at 1,000 targets, and with ``--compare DIR`` another
checkout's pass (interleaved); ``--workers 1`` measures the pass in one process.

Target (issue 26): at 10,000 targets all 10,000 judged, a pass under 10 s, peak memory under 1 GB; time
and memory growing about linearly with the fleet.

    .venv/bin/python bench/bench_fleet.py [--sizes 1000,3000,10000] [--repeat 3] [--data DIR] [--workers N]

``--data DIR`` keeps the backfilled TSDB in DIR (made on the first run, reused after; the Prometheus here
keeps it whatever its age).
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
import threading
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
    """One pass in this process, as ``diagnose --once --prometheus`` makes it; prints its figures as JSON."""
    from diagnoser.cli.run import analyse, build_parser, gather
    from diagnoser.engines import get_adapter
    from diagnoser.outputs.term import term_for
    from diagnoser.outputs.text import render

    args = build_parser().parse_args(["--once", "--prometheus", url, "--selector", sel, "--range", "600s", "--end", str(end),
                                      "--timeout", "30"])
    adapter = get_adapter("auto")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0, c0 = time.perf_counter(), time.process_time()
    col = gather(args, adapter)
    t1, c1 = time.perf_counter(), time.process_time()
    report, doc = analyse(args, col, adapter)
    t2, c2 = time.perf_counter(), time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = render(doc, verbose=False, term=term_for(None, "never", 100))
    t3 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"pass": t2 - t0, "collect": t1 - t0, "evaluate": t2 - t1, "cpu_collect": c1 - c0, "cpu_evaluate": c2 - c1,
                      "cpu_workers": kids.ru_utime + kids.ru_stime, "render": t3 - t2, "text_lines": text.count("\n"),
                      "timelines": len(col.timelines), "findings": len(doc["findings"]), "failed": col.fleet.get("failed_queries", {}),
                      "messages": col.inputs[0].messages, "rss": rss, "rss_imports": base, "bytes": col.fleet.get("bytes", 0),
                      "query_seconds": col.fleet.get("query_seconds", 0.0)}))


def tree_memory(pid: int) -> tuple[int, int]:
    """(summed PSS, summed RSS) in bytes of ``pid`` and its children (its workers), from smaps_rollup."""
    pids = [pid]
    try:
        pids += [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    pss = rss = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
    return pss, rss


def proc_cpu(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROM_PID = 0  # the Prometheus measured (its CPU during each pass is the store's cost of that pass)


def run_child(url: str, end: float, sel: str, root: Path | None = None, workers: str = "") -> dict[str, object]:
    extra = ["--root", str(root)] if root else []
    env = dict(os.environ, **({"DIAGNOSER_WORKERS": workers} if workers else {}))
    p0 = proc_cpu(PROM_PID) if PROM_PID else 0.0
    proc = subprocess.Popen([sys.executable, __file__, "--child", url, str(end), sel, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=root or ROOT, env=env)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            pss, rss = tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], pss), max(peak[1], rss)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out_text, err_text = proc.communicate()
    done.set()
    th.join()
    if proc.returncode != 0:
        raise RuntimeError(f"child pass failed: {err_text[-3000:]}")
    out: dict[str, object] = json.loads(out_text.strip().splitlines()[-1])
    out["prom_cpu"] = proc_cpu(PROM_PID) - p0 if PROM_PID else 0.0
    out["tree_pss"], out["tree_rss"] = peak
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
    ap.add_argument("--workers", default="", help="DIAGNOSER_WORKERS for the pass (1: one process; default: by the CPUs)")
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
    prom = start_prometheus(work, scrape_config({}), data_dir=work / "data", retention="100y")
    global PROM_PID
    PROM_PID = prom.proc.pid
    rows = []
    try:
        run_child(prom.url, end, selector(sizes[0]), workers=a.workers)  # warm-up: Prometheus' page cache, imports
        other = Path(a.compare).resolve() if a.compare else None
        for n in sizes:
            raws, passes, olds = [], [], []
            for _ in range(a.repeat):
                raws.append(raw_pass(prom.url, end, selector(n))[0])
                passes.append(run_child(prom.url, end, selector(n), workers=a.workers))
                if other:
                    olds.append(run_child(prom.url, end, selector(n), other, workers=a.workers))
            rows.append((n, statistics.median(raws), passes, olds))
    finally:
        prom.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores (other work shares this machine); "
          f"workers: {a.workers or 'default'}")
    print(f"{'targets':>8s} {'judged':>7s} {'raw s':>7s} {'pass s':>7s} {'collect':>8s} {'eval+rep':>8s} {'× raw':>6s} "
          f"{'× 1k':>6s} {'MiB ans':>8s} {'peak MiB':>9s} {'× 1k':>6s} {'KiB/tgt':>8s} {'render':>7s}")
    base_pass = base_mem = None
    ok = True

    def cpu(p: dict[str, object]) -> float:
        return float(p["cpu_collect"]) + float(p["cpu_evaluate"]) + float(p.get("cpu_workers", 0.0))  # type: ignore[arg-type]

    for n, raw, passes, olds in rows:
        def med(k: str, passes: list[dict[str, object]] = passes) -> float:
            return statistics.median(float(p[k]) for p in passes)  # type: ignore[arg-type]

        ps, mem = med("pass"), max(float(p["tree_pss"]) for p in passes)  # type: ignore[arg-type]
        base_pass = base_pass or ps
        base_mem = base_mem or mem
        judged = min(int(p["timelines"]) for p in passes)  # type: ignore[call-overload]
        per = (mem - float(passes[0]["rss_imports"])) / n / 1024  # type: ignore[arg-type]
        print(f"{n:8d} {judged:7d} {raw:7.2f} {ps:7.2f} {med('collect'):8.2f} {med('evaluate'):8.2f} {ps / raw:6.2f} "
              f"{ps / base_pass:6.2f} {float(passes[0]['bytes']) / 2**20:8.1f} {mem / 2**20:8.0f}M {mem / base_mem:6.2f} {per:8.1f} "
              f"{med('render'):7.2f}   CPU: collect {med('cpu_collect'):.2f} s, eval+rep {med('cpu_evaluate'):.2f} s here + "
              f"{med('cpu_workers'):.2f} s in workers, Prometheus {med('prom_cpu'):.2f} s; parent peak RSS "
              f"{max(float(p['rss']) for p in passes) / 2**20:.0f}M, summed RSS of the processes "
              f"{max(float(p['tree_rss']) for p in passes) / 2**20:.0f}M (counts the pages they share twice)")  # type: ignore[arg-type]
        bad = [p for p in passes if p["failed"] or int(p["timelines"]) != n]  # type: ignore[call-overload]
        if bad:
            ok = False
            print(f"  {n}: not every target judged or queries failed: {bad[0]['failed']} {bad[0]['messages'][:3]}")  # type: ignore[index]
        if olds:
            def omed(k: str, olds: list[dict[str, object]] = olds) -> float:
                return statistics.median(float(p[k]) for p in olds)  # type: ignore[arg-type]

            ops, omem = omed("pass"), max(float(p["tree_pss"]) for p in olds)  # type: ignore[arg-type]
            occ = statistics.median(cpu(p) for p in olds)
            print(f"{'':8s} {a.compare}: pass {ops:.2f} s (collect {omed('collect'):.2f}, eval+rep {omed('evaluate'):.2f}; "
                  f"CPU {occ:.2f} s), peak {omem / 2**20:.0f}M; this / that: pass {ps / ops:.2f}x, collect "
                  f"{med('collect') / omed('collect'):.2f}x (CPU {med('cpu_collect') / omed('cpu_collect'):.2f}x), eval+rep "
                  f"{med('evaluate') / omed('evaluate'):.2f}x, our CPU {statistics.median(cpu(p) for p in passes) / occ:.2f}x, "
                  f"memory {mem / omem:.2f}x; Prometheus CPU {omed('prom_cpu'):.2f} s there, this / that {med('prom_cpu') / omed('prom_cpu'):.2f}x")
        if n >= 10000 and (ps >= TARGET_S or mem >= TARGET_RSS):
            ok = False
    print(f"target: at 10,000 all judged, a pass < {TARGET_S:g} s, peak memory < {TARGET_RSS / 1e9:g} GB (median of {a.repeat}; "
          "memory: the largest summed PSS of the pass's processes, workers included; KiB/tgt excludes the interpreter and imports; "
          "render: the text report, after the pass)")
    if not any(n >= 10000 for n, *_rest in rows):
        print("target not checked (it is at 10,000 targets)" if ok else "NOT EVERY TARGET JUDGED")
        return 0 if ok else 1
    print("target met" if ok else "TARGET MISSED (see the load average: the ratios are the stable figures)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
