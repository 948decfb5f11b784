"""Every JSON diagnoser writes parses with a strict parser: NaN and ±Infinity become null (README, "JSON
report"), numpy numbers become plain numbers. Checked on the report (--format json), plan --format json,
the web twins, bundle records and the replay-server's payloads."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from diagnoser.jsonout import clean, dumps
from tests.conftest import DATA, ROOT

RUN = DATA / "sglang-cpu-real" / "kv-full-retract"


def strict(text: str) -> Any:
    def refuse(c: str) -> Any:
        raise AssertionError(f"non-strict JSON constant {c!r}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_null_and_numpy_numbers_plain() -> None:
    doc = {"nan": math.nan, "inf": [math.inf, -math.inf, 1.5], "np": np.float64("nan"), "f32": np.float32(2.5),
           "i64": np.int64(7), "arr": np.array([1.0, np.inf]), "nested": {"t": (math.nan,)}, "s": {3, 1}}
    out = strict(dumps(doc))
    assert out == {"nan": None, "inf": [None, None, 1.5], "np": None, "f32": 2.5, "i64": 7, "arr": [1.0, None],
                   "nested": {"t": [None]}, "s": [1, 3]}
    assert clean([math.nan, {"a": math.inf}]) == [None, {"a": None}]
    assert dumps({"a": 1}) == json.dumps({"a": 1})  # nothing to replace: the plain encoder's output


def test_the_json_report_is_strict_when_the_data_holds_non_finite_numbers(tmp_path: Path) -> None:
    """A replay whose scrapes hold NaN and +Inf gauges: on the way in those are dropped (counted), and
    whatever non-finite number a computation makes on the way out is null."""
    mdir = tmp_path / "metrics"
    mdir.mkdir()
    for p in sorted((RUN / "metrics").glob("*.prom"))[2:10]:
        text = p.read_text().replace("sglang:gen_throughput{", "sglang:gen_throughput_x{")
        text += 'sglang:gen_throughput{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"} NaN\n'
        text += 'sglang:token_usage{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"} +Inf\n'
        (mdir / p.name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", "--replay", str(tmp_path), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert "Traceback" not in r.stderr
    doc = strict(r.stdout)
    assert doc["signals"]  # a real report, not an empty one


def test_plan_json_is_strict() -> None:
    cfg = next((ROOT / "tests" / "capacity_configs").glob("*.json"))
    r = subprocess.run([sys.executable, "-m", "diagnoser", "plan", "--model-config", str(cfg), "--tp", "1", "--gpu-mem-gb", "80",
                        "--format", "json"], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr
    if r.stdout.strip():
        strict(r.stdout)


def test_bundle_records_and_replay_server_payloads_are_strict(tmp_path: Path) -> None:
    from diagnoser.bundle import BundleWriter
    from diagnoser.cli.replay_server import ReplayServer
    from diagnoser.replay import load_source

    path = tmp_path / "b.dgb"
    w = BundleWriter(str(path), fsync=False)
    w.write_member([{"kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": [{"name": "t", "url": "t"}], "logs": [],
                     "interval_s": math.nan}])
    info = json.loads((RUN / "get_server_info.json").read_text())
    info["weird"] = [math.nan, math.inf]
    w.write_member([{"kind": "config", "t": 1_795_944_700.0, "target": "t", "path": "/get_server_info", "data": info},
                    {"kind": "scrape", "t": 1_795_944_701.0, "target": "t", "text": (RUN / "metrics_final.prom").read_text(),
                     "status": 200, "duration_s": math.inf}])
    w.close()
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        strict(line)
    import httpx

    srv = ReplayServer(load_source(str(path)), port=0).start()
    try:
        body = httpx.get(srv.url + "/get_server_info", timeout=5).text
        assert strict(body)["weird"] == [None, None]
    finally:
        srv.stop()
