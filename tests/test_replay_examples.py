"""Every bundled example replays through the real CLI and names its bottleneck; each is small, listed
in examples/README.md with its source, and rebuilds byte-identically from that source."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.bundle import read_bundle
from diagnoser.cli import main as cli_main
from tests.conftest import ROOT

EX = ROOT / "examples"
SEVERITY = {"info": 1, "warning": 2, "critical": 3}
# example → the rule(s) naming its bottleneck
EXPECTED = {
    "kv-full-retract.dgb": {"kv_saturation", "kv_retraction"},
    "client-bound.dgb": {"client_bound"},
    "prefill-capped.dgb": {"prefill_stall"},
    "eagle3-low-accept.dgb": {"low_spec_acceptance"},
    "seed-kimi-k25.dgb": {"kv_saturation"},
}


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EX.glob("*.dgb")) == sorted(EXPECTED)
    readme = (EX / "README.md").read_text()
    for name in EXPECTED:
        assert f"`{name}`" in readme, f"{name} needs a README line naming its source"
    assert "synthetic" in readme.split("`seed-kimi-k25.dgb`")[1].split("\n")[0].lower()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_replays_and_names_its_bottleneck(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = EX / name
    assert path.stat().st_size <= 1024 * 1024
    res = read_bundle(str(path))
    assert res.complete, res.summary()
    assert res.manifest is not None and res.manifest.get("note"), "the manifest names the source"
    code = cli_main(["--once", "--replay", str(path), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] != "error" and code in (0, 1)
    rules = {f["rule"]: SEVERITY[f["severity"]] for f in doc["findings"]}
    assert EXPECTED[name] <= set(rules), f"{name}: found {sorted(rules)}"
    top = max(rules.values())
    assert max(rules[r] for r in EXPECTED[name]) == top, f"{name}: a stronger finding than the bottleneck: {rules}"
    for f in doc["findings"]:
        if f["rule"] in EXPECTED[name]:
            assert any(e["source"] for e in f["evidence"]), "evidence must point at the recorded data"


def test_examples_rebuild_byte_identically(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    (work / "examples").mkdir(parents=True)
    (work / "tests" / "cases").mkdir(parents=True)
    (work / "deploy" / "demo").mkdir(parents=True)
    (work / "diagnoser" / "examples").mkdir(parents=True)
    os.symlink(ROOT / "tests" / "cases" / "seed-kimi-k25", work / "tests" / "cases" / "seed-kimi-k25")
    os.symlink(ROOT / "tests" / "data", work / "tests" / "data")
    (work / "examples" / "build.sh").write_text((EX / "build.sh").read_text())
    wrapper = tmp_path / "diagnose"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m diagnoser "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, DIAGNOSE=str(wrapper), PYTHONPATH=str(ROOT))
    r = subprocess.run(["sh", str(work / "examples" / "build.sh")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in EXPECTED:
        assert filecmp.cmp(work / "examples" / name, EX / name, shallow=False), (
            f"examples/{name} is stale: run examples/build.sh and commit it")
    # the compose demo and `diagnose demo` (shipped in the wheel) play the same recording
    for demo in ("deploy/demo/kv-full-retract.dgb", "diagnoser/examples/kv-full-retract.dgb"):
        assert filecmp.cmp(work / demo, ROOT / demo, shallow=False), f"{demo} is stale: run examples/build.sh and commit it"
