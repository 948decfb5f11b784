"""Helpers shared by the tests that run real components: a free loopback port, a required binary
(skipped loudly locally, a failure under CI), Debian Chromium's launch settings, a real
Prometheus started on 127.0.0.1 from a fixture, and a log read through each of the reader's paths."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI

CHROMIUM = "/usr/bin/chromium"
# testing-tools.md: the flags that keep Chromium off the (closed) network and working as root
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_binary(name: str, path: str | None = None) -> str:
    """The path of a required binary; a loud skip on a contributor's machine, a failure under CI=true."""
    found = path if path and Path(path).exists() else shutil.which(name)
    if not found:
        msg = f"{name} is not installed here (Debian package; .ci/run installs it)"
        if IN_CI:
            pytest.fail(msg + " — required under CI")
        pytest.skip("SKIPPED LOUDLY: " + msg)
    return str(found)


@dataclass
class Prom:
    """A running Debian ``prometheus`` on loopback."""

    url: str
    proc: subprocess.Popen[bytes]
    workdir: Path
    log: Path
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def logfile(self) -> Path:
        return self.log

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + path, params=params, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {r.status_code} {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/query", query=expr)["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_prometheus(workdir: Path, config_yaml: str | None = None, data_dir: Path | None = None,
                     extra_args: tuple[str, ...] = (), config_path: Path | None = None, retention: str = "2h") -> Prom:
    """Start prometheus with ``config_yaml`` (written to ``workdir``) or an existing ``config_path``
    (kept in place, so relative ``rule_files`` still resolve); wait until ``/-/ready``."""
    binary = need_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    if config_path is None:
        config_path = workdir / "prometheus.yml"
        config_path.write_text(config_yaml or "")
    data = data_dir or workdir / "data"
    port = free_port()
    log = workdir / "prometheus.log"
    proc = subprocess.Popen(
        [binary, f"--config.file={config_path}", f"--storage.tsdb.path={data}", f"--storage.tsdb.retention.time={retention}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra_args],
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
    raise RuntimeError("prometheus did not become ready in 30 s:\n" + log.read_text()[-2000:])


READ_PATHS = ("line", "scan", "regex")  # the line parser, the bulk reader with the C scanner, and without it


def read_log_bytes(data: bytes, path: str, how: str, target: str = "t") -> tuple[Any, Any]:
    """Read a log's bytes through one of :data:`READ_PATHS`; returns (reader, timeline)."""
    import io
    import os

    import diagnoser.engines.sglang.logfast as lf
    from diagnoser.engines.sglang import ADAPTER
    from diagnoser.sources.logs import finish_report, open_log_reader
    from diagnoser.timeline import Timeline

    old = os.environ.get("DIAGNOSER_NO_SCAN")
    os.environ["DIAGNOSER_NO_SCAN"] = "1" if how == "regex" else ""
    lf.SCAN = "unloaded"
    try:
        tl = Timeline(target=target)
        r = open_log_reader(ADAPTER, tl, path)
        if how == "line":
            r.feed_lines(io.BytesIO(data))
        else:
            r.feed_stream(io.BytesIO(data), bulk_min=0, workers=0)
        finish_report(ADAPTER, r)
        return r, tl
    finally:
        if old is None:
            os.environ.pop("DIAGNOSER_NO_SCAN", None)
        else:
            os.environ["DIAGNOSER_NO_SCAN"] = old
        lf.SCAN = "unloaded"
