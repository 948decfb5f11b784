"""Real components for the fleet tests and bench/bench_fleet.py: the Debian ``prometheus`` started on
loopback, tiny replica servers replaying real SGLang scrapes, and a 1,000-target fleet backfilled
into a TSDB with ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import IN_CI

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def need_prometheus() -> tuple[str, str]:
    if not PROMETHEUS or not PROMTOOL:
        if IN_CI:
            pytest.fail("prometheus/promtool not installed; CI must apt-get install prometheus")
        pytest.skip("!!! SKIPPED: Debian prometheus/promtool not installed here (apt-get install prometheus); "
                    "fleet integration tests need the real binary")
    return PROMETHEUS, PROMTOOL  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- prometheus ------------------------------------------------------------------------------------
@dataclass
class Prom:
    url: str
    proc: subprocess.Popen[bytes]
    workdir: Path
    log: Path
    extra: dict[str, object] = field(default_factory=dict)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_prometheus(workdir: Path, config_yaml: str, data_dir: Path | None = None) -> Prom:
    binary, _ = need_prometheus()
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(config_yaml)
    data = data_dir or workdir / "data"
    port = free_port()
    log = workdir / "prometheus.log"
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=2h",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                return Prom(url, proc, workdir, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("prometheus did not become ready in 30 s")


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


@pytest.fixture
def tmp_workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def env_ci() -> bool:
    return IN_CI or os.environ.get("CI", "") != ""
