"""`diagnose demo` from an installed package: a wheel built from this tree ships the example recording
and the JSON Schema, and, installed into a fresh directory (outside the clone), `diagnose demo` diagnoses
the recording from there (pip builds the wheel with its ordinary build isolation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", str(tmp / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    if build.returncode != 0:
        pytest.fail(f"pip wheel failed: {build.stderr[-2000:]}")
    wheel = next((tmp / "dist").glob("diagnoser-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "diagnoser/examples/kv-full-retract.dgb" in names and "diagnoser/schema/report.schema.json" in names
    site = tmp / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-2000:]
    return site


def _run(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)  # the installed copy first (its dependencies come from this interpreter)
    return subprocess.run([sys.executable, "-c", "import sys, diagnoser.cli as c; print(c.__file__, file=sys.stderr); sys.exit(c.main())", *argv],
                          capture_output=True, text=True, timeout=120, env=env, cwd=site.parent)


def test_demo_runs_from_the_installed_package(installed: Path) -> None:
    out = _run(installed, "demo")
    assert out.stderr.splitlines()[0].startswith(str(installed)), out.stderr  # not the clone's copy
    assert out.returncode == 1, out.stderr  # the example has problems
    assert "top cause: kv_saturation" in out.stdout and "Fix first: --max-total-tokens 2048 → 16384" in " ".join(out.stdout.split())
    doc = json.loads(_run(installed, "demo", "--format", "json").stdout)
    assert doc["findings"][0]["rule"] == "kv_saturation" and doc["schema_version"]
