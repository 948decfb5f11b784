"""Real components for the fleet tests and bench/bench_fleet.py: the Debian ``prometheus`` started on
loopback, tiny replica servers replaying real SGLang scrapes, and a 1,000-target fleet backfilled
into a TSDB with ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.helpers import Prom, free_port, need_binary, start_prometheus  # noqa: E402,F401  (re-exported)


def need_prometheus() -> tuple[str, str]:
    return need_binary("prometheus"), need_binary("promtool")


# -- replica servers replaying real scrapes ----------------------------------------------------------
class ReplayReplica:
    """Serves ``DIR/metrics/*.prom`` in order, one file per GET /metrics (then the last one again)."""

    def __init__(self, run_dir: Path, first: int = 0, last: int | None = None) -> None:
        files = sorted((run_dir / "metrics").glob("*.prom"))
        self.files = files[first: last]
        self.hits = 0
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                i = min(replica.hits, len(replica.files) - 1)
                replica.hits += 1
                body = replica.files[i].read_bytes()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scraper gave up (scrape timeout on a loaded machine)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(jobs: dict[str, list[str]], interval: str = "1s", underscore_jobs: tuple[str, ...] = ()) -> str:
    """prometheus.yml with one static job per entry; ``underscore_jobs`` store ``sglang_`` names (the
    rename Prometheus 3 / the router produce, reproduced with metric_relabel_configs)."""
    lines = ["global:", f"  scrape_interval: {interval}", f"  scrape_timeout: {interval}", "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{', '.join(repr(t) for t in targets)}]"]
        if job in underscore_jobs:
            lines += ["    metric_relabel_configs:", "      - source_labels: [__name__]", "        regex: 'sglang:(.*)'",
                      "        target_label: __name__", "        replacement: 'sglang_$1'"]
    return "\n".join(lines) + "\n"


def wait_for_samples(url: str, query: str, want_series: int, min_samples: int, timeout: float = 40.0) -> None:
    """Until ``count_over_time(query[5m])`` reports ``min_samples`` on ``want_series`` series."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        r = httpx.get(url + "/api/v1/query", params={"query": f"count_over_time({query}[5m])"}, timeout=5).json()
        res = r.get("data", {}).get("result", [])
        last = [x["value"][1] for x in res]
        if len(res) >= want_series and all(float(x["value"][1]) >= min_samples for x in res):
            return
        time.sleep(0.5)
    raise AssertionError(f"prometheus never had {min_samples} samples on {want_series} series of {query}: {last}")


# -- a generated 1,000-target fleet, backfilled with promtool ------------------------------------------
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0)  # 0.4.5+ bounds (docs/sglang.md#metrics-requests), cut at 40


@dataclass
class FleetSpec:
    """What the generated fleet looks like, and what a reader must find in it."""

    n: int = 1000
    end: float = 0.0  # last sample time
    minutes: int = 10
    step: int = 30
    hot: frozenset[int] = frozenset({3, 11, 19, 27, 600, 601})
    old_version: frozenset[int] = frozenset({610, 611})  # 0.4.4-0.4.9 label generation in model qwen-7b
    odd_page: int = 5  # page_size 16 while every other llama replica runs 1
    evil: str = ""  # when set, the last target's instance label carries this text (markup-escaping tests)
    # (first index past the group, job) in order: nested fleets in one backfill (bench_fleet: job=~"f1" is the
    # first 1,000, job=~"f1|f3" the first 3,000 …); empty: every target is job="sglang"
    jobs: tuple[tuple[int, str], ...] = ()
    targets: list[dict[str, object]] = field(default_factory=list)

    def model(self, i: int) -> str:
        return "llama-70b" if i < 600 else "qwen-7b"

    def instance(self, i: int) -> str:
        if self.evil and i == self.n - 1:
            return f"{self.evil}:30000"
        return f"10.0.{i // 250}.{i % 250}:30000"

    def job(self, i: int) -> str:
        for upto, name in self.jobs:
            if i < upto:
                return name
        return "sglang"

    def spelling(self, i: int) -> str:
        return "sglang_" if i % 2 else "sglang:"


def _target_values(spec: FleetSpec, i: int, k: int) -> dict[str, float]:
    hot, llama = i in spec.hot, i < 600
    if hot:
        running, queue, usage = 64 - (k % 2), 30 + (k % 3), 0.97
    elif llama:
        running, queue, usage = 20 + (k % 2), 0, 0.30
    else:
        running, queue, usage = (k % 2), 0, 0.02
    pool = 200_000 if llama else 80_000
    return {"num_running_reqs": running, "num_queue_reqs": queue, "token_usage": usage,
            "num_used_tokens": round(usage * pool), "gen_throughput": running * 25.0, "max_total_num_tokens": pool,
            "cache_hit_rate": 0.4}


def write_fleet_openmetrics(path: Path, spec: FleetSpec) -> FleetSpec:
    """Write the fleet as OpenMetrics text (families grouped, series in time order, ``# EOF``)."""
    times = [spec.end - spec.minutes * 60 + j * spec.step for j in range(spec.minutes * 60 // spec.step + 1)]
    spec.targets = []
    base_labels = {}
    for i in range(spec.n):
        common = f'instance="{spec.instance(i)}",job="{spec.job(i)}",model_name="{spec.model(i)}"'
        if i in spec.old_version:
            sched = common + ',engine_type="unified"'
        else:
            sched = common + ',engine_type="unified",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        base_labels[i] = (common, sched)
        rate = 2.0 + (i % 7)  # requests/s, constant: rate() must give it back exactly
        spec.targets.append({"instance": spec.instance(i), "model": spec.model(i), "rate": rate,
                             "running_mean": sum(_target_values(spec, i, k)["num_running_reqs"] for k in range(len(times))) / len(times),
                             "queue_mean": sum(_target_values(spec, i, k)["num_queue_reqs"] for k in range(len(times))) / len(times),
                             "ttft_bucket": 6.0 if i in spec.hot else 0.4})
    with path.open("w") as fh:
        w = fh.write
        gauges = ["num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "gen_throughput", "cache_hit_rate",
                  "max_total_num_tokens", "page_size", "prealloc_full_token_usage"]
        for spelling in ("sglang:", "sglang_"):
            idx = [i for i in range(spec.n) if spec.spelling(i) == spelling]
            for g in gauges:
                w(f"# TYPE {spelling}{g} gauge\n")
                for i in idx:
                    if g in ("max_total_num_tokens", "page_size", "prealloc_full_token_usage") and i in spec.old_version:
                        continue  # not in 0.4.x
                    sched = base_labels[i][1]
                    for k, t in enumerate(times):
                        if g == "page_size":
                            v = 16 if i == spec.odd_page else 1
                        elif g == "prealloc_full_token_usage":
                            v = 0.0
                        else:
                            v = _target_values(spec, i, k)[g]
                        w(f"{spelling}{g}{{{sched}}} {v} {t:.3f}\n")
            for c, per_req in (("num_requests", 1), ("generation_tokens", 100), ("prompt_tokens", 400)):
                w(f"# TYPE {spelling}{c} counter\n")
                for i in idx:
                    r = float(spec.targets[i]["rate"]) * per_req  # type: ignore[arg-type]
                    for t in times:
                        w(f"{spelling}{c}_total{{{base_labels[i][0]}}} {r * (t - times[0]) + 1000:.1f} {t:.3f}\n")
            w(f"# TYPE {spelling}time_to_first_token_seconds histogram\n")
            for i in idx:
                common = base_labels[i][0]
                r = float(spec.targets[i]["rate"])  # type: ignore[arg-type]
                hit = float(spec.targets[i]["ttft_bucket"])  # type: ignore[arg-type]
                for t in times:
                    n = r * (t - times[0])
                    for b in TTFT_BUCKETS:
                        w(f'{spelling}time_to_first_token_seconds_bucket{{{common},le="{b}"}} {n if b >= hit else 0.0:.1f} {t:.3f}\n')
                    w(f'{spelling}time_to_first_token_seconds_bucket{{{common},le="+Inf"}} {n:.1f} {t:.3f}\n')
                    w(f"{spelling}time_to_first_token_seconds_count{{{common}}} {n:.1f} {t:.3f}\n")
                    w(f"{spelling}time_to_first_token_seconds_sum{{{common}}} {n * hit * 0.8:.1f} {t:.3f}\n")
        w("# EOF\n")
    return spec


def backfill(om_path: Path, data_dir: Path) -> float:
    """``promtool tsdb create-blocks-from openmetrics``; returns the seconds it took."""
    _, promtool = need_prometheus()
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    p = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om_path), str(data_dir)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def fleet_prometheus(workdir: Path, n: int = 1000, evil: str = "",
                     jobs: tuple[tuple[int, str], ...] = ()) -> tuple[Prom, FleetSpec]:
    """A real Prometheus serving a backfilled ``n``-target fleet (ends 60 s ago, 10 minutes long)."""
    spec = FleetSpec(n=n, end=float(int(time.time()) - 60), evil=evil, jobs=jobs)
    om = workdir / "fleet.om"
    write_fleet_openmetrics(om, spec)
    t = backfill(om, workdir / "data")
    om.unlink()
    prom = start_prometheus(workdir, scrape_config({}), data_dir=workdir / "data")
    prom.extra["backfill_s"] = t
    return prom, spec
