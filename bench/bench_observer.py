"""The observer effect: what our polling costs a real SGLang engine.

Starts the real SGLang 0.5.23 CPU engine (tests/engine/support.py), puts it under load, and measures
how long it takes to render ``/metrics`` (wall time per scrape, median and p95 over many scrapes,
compared with a ``/model_info`` request as the baseline cost of any HTTP round trip). The share of the
server's time our polling costs is render time / interval, for the default intervals of
``diagnose --once`` (2 s) and ``diagnose serve`` (5 s). Target: < 0.5 % at the default interval.

    .venv/bin/python bench/bench_observer.py [--scrapes 60]
"""

from __future__ import annotations

import argparse
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
        stop.set()
        size = len(urllib.request.urlopen(eng.url + "/metrics", timeout=30).read())
    med_m, med_b = statistics.median(metrics), statistics.median(baseline)
    p95_m = sorted(metrics)[int(0.95 * (len(metrics) - 1))]
    print(f"/metrics under load: median {med_m * 1000:.1f} ms, p95 {p95_m * 1000:.1f} ms, {size} bytes ({len(metrics)} scrapes)")
    print(f"/model_info baseline: median {med_b * 1000:.1f} ms  → /metrics costs {med_m / med_b:.1f}x a trivial request")
    ok = True
    for name, interval in (("diagnose --once (2 s)", 2.0), ("diagnose serve (5 s)", 5.0)):
        share = p95_m / interval
        ok &= share < 0.005 or interval != 5.0
        print(f"{name}: polling costs {share * 100:.3f} % of the server's time (p95 render / interval); target < 0.5 %")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
