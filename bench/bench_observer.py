"""The observer effect: what our polling costs a real SGLang engine.

Starts the real SGLang 0.5.23 CPU engine (tests/engine/support.py), puts it under load, and measures
how long it takes to render ``/metrics`` (wall time per scrape, median and p95 over many scrapes,
compared with a ``/model_info`` request as the baseline cost of any HTTP round trip). The share of the
server's time our polling costs is render time / interval, for the default intervals of
``diagnose --once`` (a 10 s burst at 2 s) and the continuous modes, watch and ``diagnose serve`` (10 s).
Target: < 0.5 % at the default interval of continuous polling. The share is measured as CPU time of the
serving process per scrape (back-to-back scrapes against an equal stretch without, same load), divided by
the interval; the wall-time view (render latency / interval) is printed beside it.

    .venv/bin/python bench/bench_observer.py [--scrapes 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine import support  # noqa: E402


def timed_get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
    return time.perf_counter() - t0


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_scrape(url: str, pid: int, seconds: float = 8.0) -> tuple[float, int]:
    """CPU seconds the serving process spends per /metrics scrape: back-to-back scrapes for ``seconds``
    against the same process's CPU over an equal stretch without scrapes (same load), differenced."""
    c0 = proc_cpu_s(pid)
    time.sleep(seconds)
    quiet = proc_cpu_s(pid) - c0
    n = 0
    c1 = proc_cpu_s(pid)
    t_end = time.time() + seconds
    while time.time() < t_end:
        timed_get(url + "/metrics")
        n += 1
    busy = proc_cpu_s(pid) - c1
    return max(0.0, busy - quiet) / max(n, 1), n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=60)
    args = ap.parse_args()
    py = support.ensure_venv()
    model = support.ensure_model(py)
    work = Path("/tmp") / f"diagnoser-observer-{int(time.time())}"
    with support.Engine(py, model, ["--max-total-tokens", "4096"], work) as eng:
        stop = threading.Event()
        load = threading.Thread(target=support.run_load, args=(eng.url, 100000, 16, 128), kwargs={"ignore_eos": True, "timeout": 600, "stop": stop}, daemon=True)
        load.start()
        time.sleep(5)
        metrics, baseline = [], []
        for _ in range(args.scrapes):
            metrics.append(timed_get(eng.url + "/metrics"))
            baseline.append(timed_get(eng.url + "/model_info"))
            time.sleep(0.25)
        cpu_scrape, n_cpu = cpu_per_scrape(eng.url, eng.proc.pid)  # type: ignore[union-attr]
        stop.set()
        size = len(urllib.request.urlopen(eng.url + "/metrics", timeout=30).read())
    med_m, med_b = statistics.median(metrics), statistics.median(baseline)
    p95_m = sorted(metrics)[int(0.95 * (len(metrics) - 1))]
    print(f"/metrics under load: median {med_m * 1000:.1f} ms, p95 {p95_m * 1000:.1f} ms, {size} bytes ({len(metrics)} scrapes)")
    print(f"/model_info baseline: median {med_b * 1000:.1f} ms  → /metrics costs {med_m / med_b:.1f}x a trivial request")
    print(f"CPU of the serving process per scrape (differenced over {n_cpu} back-to-back scrapes under the same load): "
          f"{cpu_scrape * 1000:.1f} ms")
    ok = True
    for name, interval, judged in (("diagnose --once (a 10 s burst every 2 s)", 2.0, False),
                                   ("watch / serve, default interval (10 s)", 10.0, True),
                                   ("watch / serve at --interval 5", 5.0, False)):
        share = cpu_scrape / interval
        ok &= share < 0.005 or not judged
        print(f"{name}: polling costs {share * 100:.3f} % of the serving process's CPU time "
              f"(wall-time view: p95 render / interval = {p95_m / interval * 100:.2f} %); target < 0.5 %")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
