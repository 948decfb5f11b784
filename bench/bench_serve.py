"""``diagnose serve`` at scale: CPU with 100 loopback targets at a 5 s interval, and memory after a
simulated 24 h for 8 targets.

1. CPU. A helper process serves 100 loopback SGLang endpoints, each playing the REAL 0.5.23 scrapes of
   tests/data/sglang-cpu-real (50–75 KB expositions, all five runs mixed), gzipped when the request
   asks for it as SGLang's prometheus_client exposition does (serve asks for identity). The real
   ``diagnose serve --interval 5`` polls all 100; its own CPU time (utime + stime from /proc, all its
   threads) over a measured stretch gives its share of one core. Target: < 10 %. Printed as a ratio to
   that budget, and against a baseline measured in this run: the bare prometheus_client parse of the
   same 100 scrapes every 5 s (what any exporter-reading tool pays at least).
2. Memory. 8 targets, one scrape every 5 s for a simulated 24 h (and 48 h, to show the bound holds):
   the signal points of real scrapes are fed into LiveMonitor timelines with synthetic timestamps, and
   the monitor's tick (trim, thinning, rules, hysteresis) runs every simulated minute. Reported: the
   bytes held by the kept history (every list, float and string counted once); and the ratio to a
   naive history (every point and its source text kept) of the same 24 h, measured in this run.

Run: ``.venv/bin/python bench/bench_serve.py [--seconds 40] [--targets 100] [--skip-cpu | --skip-memory]``;
exits 1 if CPU ≥ 10 %.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import DATA  # noqa: E402

RUNS = ["kv-full-retract", "long-queue", "client-bound-low-occupancy", "medium-engine-bound-kv-full", "prefill-capped"]
TICKS = os.sysconf("SC_CLK_TCK")


def serve_targets(n: int, port_file: str) -> None:
    """Helper process: n loopback SGLang stand-ins serving real scrapes; writes their URLs, then waits."""
    from tests.browser.samples_server import SampleServer

    servers = [SampleServer(DATA, RUNS[i % len(RUNS)]).start() for i in range(n)]
    Path(port_file).write_text("\n".join(s.url for s in servers))
    while True:
        time.sleep(3600)


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def bench_cpu(n: int, seconds: float, interval: float) -> tuple[float, float]:
    import httpx

    port_file = f"/tmp/bench_serve_urls.{os.getpid()}"
    helper = subprocess.Popen([sys.executable, __file__, "--_serve-targets", str(n), "--_port-file", port_file])
    serve = None
    try:
        for _ in range(300):
            if Path(port_file).exists() and Path(port_file).read_text().count("\n") == n - 1:
                break
            time.sleep(0.1)
        urls = Path(port_file).read_text().split()
        sock = __import__("socket").socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        exe = ROOT / ".venv" / "bin" / "diagnose"
        args = [str(exe), "serve", "--port", str(port), "--interval", str(interval)]
        for u in urls:
            args += ["--url", u]
        serve = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"

        def tick() -> int:
            try:
                return int(httpx.get(base + "/healthz", timeout=5).json()["tick"])
            except (httpx.HTTPError, ValueError, KeyError):
                return -1

        while tick() < 3:  # warm-up: imports, config fetches, first rule passes
            time.sleep(0.5)
        c0, w0, k0 = proc_cpu(serve.pid), time.monotonic(), tick()
        time.sleep(seconds)
        c1, w1, k1 = proc_cpu(serve.pid), time.monotonic(), tick()
        doc = httpx.get(base + "/index.json", timeout=10).json()
        up = sum(1 for t in doc["targets"] if t["health"] != "down")
        print(f"  serve polled {n} targets ({up} up), {k1 - k0} ticks in {w1 - w0:.0f} s")
        share = (c1 - c0) / (w1 - w0)
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(10)
        helper.terminate()
        helper.wait(10)
        Path(port_file).unlink(missing_ok=True)
    # baseline, same run: bare prometheus_client parse of the same scrapes, n per interval
    from prometheus_client.parser import text_string_to_metric_families

    texts = [sorted((DATA / "sglang-cpu-real" / RUNS[i % len(RUNS)] / "metrics").glob("*.prom"))[5].read_text() for i in range(n)]
    t0 = time.process_time()
    for tx in texts:
        list(text_string_to_metric_families(tx))
    base_share = (time.process_time() - t0) / interval
    return share, base_share


def recorded_points() -> list[list[tuple[str, str, float, str]]]:
    """(signal, rank, value, metric) of each real scrape, captured once through the real ingestion."""
    from diagnoser.engines import get_adapter
    from diagnoser.sources.metrics import MetricsTarget

    class Rec:
        def __init__(self) -> None:
            self.points: list[tuple[str, str, float, str]] = []

        def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
            self.points.append((signal, rank, value, source.split(" ", 1)[-1]))

        def add_event(self, e: object) -> None:
            pass

        def set_config(self, *a: object, **k: object) -> None:
            pass

    out = []
    ad = get_adapter("sglang")
    for run in RUNS:
        mt = MetricsTarget("http://sim:30000", ad)
        for i, f in enumerate(sorted((DATA / "sglang-cpu-real" / run / "metrics").glob("*.prom"))):
            r = Rec()
            mt.ingest_text(f.read_text(), 1000.0 + 2 * i, r)
            if r.points:
                out.append(r.points)
    return out


def simulate(n_targets: int, hours: float, scrapes: list[list[tuple[str, str, float, str]]], naive: bool = False) -> tuple[int, int]:
    """Feed ``hours`` of 5 s scrapes into n targets; returns (traced bytes kept, points kept)."""
    from diagnoser.engines import get_adapter
    from diagnoser.live import LiveMonitor
    from diagnoser.model import iso

    gc.collect()
    m = LiveMonitor(get_adapter("sglang"), [f"http://sim-{i}:30000" for i in range(n_targets)], [], interval=5.0, for_seconds=0)
    for t in m.targets:
        t.up = True
    t0 = 1_800_000_000.0
    steps = int(hours * 3600 / 5)
    for k in range(steps):
        ts = t0 + 5.0 * k
        stamp = iso(ts)
        for j, t in enumerate(m.targets):
            for signal, rank, value, metric in scrapes[(k + 7 * j) % len(scrapes)]:
                t.timeline.add(signal, ts, value, f"scrape@{stamp} {metric}", rank)
        if not naive and k % 12 == 11:  # the monitor's pass, once a simulated minute
            m.tick(now=ts, scrape=False)
    gc.collect()
    size = sum(deep_size(t.timeline.series) + deep_size(t.timeline.events) for t in m.targets)
    points = sum(len(s) for t in m.targets for s in t.timeline.series.values())
    m.close()
    del m
    gc.collect()
    return size, points


def deep_size(obj: object) -> int:
    """Bytes held by a container of series (lists, floats, strings), each object counted once."""
    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set):
            stack.extend(o)
        elif hasattr(o, "__slots__"):
            stack.extend(getattr(o, a) for a in o.__slots__ if hasattr(o, a))  # type: ignore[union-attr]
    return total


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--_serve-targets", type=int, default=0, dest="serve_targets")
    ap.add_argument("--_port-file", default="", dest="port_file")
    a = ap.parse_args()
    if a.serve_targets:
        serve_targets(a.serve_targets, a.port_file)
        return 0
    ok = True
    if not a.skip_cpu:
        print(f"CPU: diagnose serve, {a.targets} loopback targets of real SGLang scrapes, every {a.interval:g} s")
        share, base = bench_cpu(a.targets, a.seconds, a.interval)
        ok = share < 0.10
        print(f"  {'serve CPU share of one core':40} {share:8.1%}   budget 10 %  ratio to budget {share / 0.10:5.2f}  {'OK' if ok else 'OVER'}")
        print(f"  {'baseline: bare prometheus_client parse':40} {base:8.1%}   serve / baseline ratio {share / base:5.2f}")
    if a.skip_memory:
        return 0 if ok else 1
    print("Memory: simulated history, one scrape per 5 s per target (signal points of real scrapes)")
    scrapes = recorded_points()
    print(f"  {len(scrapes)} real scrapes, {sum(map(len, scrapes)) / len(scrapes):.0f} signal points each")
    t0 = time.perf_counter()
    naive1, naive_pts = simulate(1, 24, scrapes, naive=True)
    kept1, kept1_pts = simulate(1, 24, scrapes)
    kept8, pts8 = simulate(8, 24, scrapes)
    kept8_48, pts8_48 = simulate(8, 48, scrapes)
    print(f"  {'1 target, 24 h, naive (all points + text)':44} {naive1 / 2**20:8.1f} MB  {naive_pts:>9,} points")
    print(f"  {'1 target, 24 h, LiveMonitor':44} {kept1 / 2**20:8.1f} MB  {kept1_pts:>9,} points   ratio to naive {kept1 / naive1:5.2f}")
    print(f"  {'8 targets, 24 h, LiveMonitor':44} {kept8 / 2**20:8.1f} MB  {pts8:>9,} points")
    print(f"  {'8 targets, 48 h, LiveMonitor (bounded?)':44} {kept8_48 / 2**20:8.1f} MB  {pts8_48:>9,} points   ratio 48 h / 24 h {kept8_48 / kept8:5.2f}")
    print(f"  process RSS now {rss_mb():.0f} MB; simulation took {time.perf_counter() - t0:.0f} s")
    bounded = kept8_48 / kept8 < 1.15
    return 0 if ok and bounded else 1


if __name__ == "__main__":
    sys.exit(main())
