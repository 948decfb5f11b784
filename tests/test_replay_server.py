"""``diagnose replay-server``: a recording served as a live SGLang over real HTTP on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from diagnoser.cli.replay_server import ReplayServer, ReplayState
from diagnoser.replay import line_time, load_source
from tests.conftest import ROOT
from tests.helpers import free_port

EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"


def test_endpoints_serve_the_recording_byte_for_byte() -> None:
    src = load_source(str(EXAMPLE))
    srv = ReplayServer(src, port=0, speed=1.0).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=5) as c:
            r = c.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            first = next(x for x in src.records if x["kind"] == "scrape")
            assert r.text == first["text"]  # before the first scrape's time: the first scrape
            info = next(x["data"] for x in src.records if x["kind"] == "config" and x["path"] == "/get_server_info")
            for path in ("/server_info", "/get_server_info", "/get_server_args"):
                assert c.get(path).json() == info
            model = next(x["data"] for x in src.records if x["kind"] == "config" and x["path"] == "/get_model_info")
            assert c.get("/model_info").json() == model == c.get("/get_model_info").json()
            assert c.get("/health").status_code == 200
            assert c.get("/v1/loads").status_code == 404  # not in this recording
            assert c.get("/nope").status_code == 404
    finally:
        srv.stop()


def test_scrapes_advance_with_scaled_time_and_loop() -> None:
    src = load_source(str(EXAMPLE))
    st = ReplayState(src, speed=10.0, loop=True, started=1000.0)
    scr = [r for r in src.records if r["kind"] == "scrape"]
    rel = [r["t"] - st.feed.t0 for r in scr]
    # at wall 1000 + rel/10 each scrape becomes current
    for i in (0, 5, len(scr) - 1):
        assert st.scrape_at(1000.0 + rel[i] / 10 + 1e-6) is scr[i]
    assert st.scrape_at(1000.0 + rel[3] / 10 - 1e-3) is scr[2]
    # one period later it starts over
    assert st.scrape_at(1000.0 + (st.feed.period + rel[1]) / 10 + 1e-6) is scr[1]
    still = ReplayState(src, speed=10.0, loop=False, started=1000.0)
    assert still.scrape_at(1e9) is scr[-1]  # without --loop the last scrape stays


def test_log_out_writes_lines_as_they_occur_with_retimed_stamps(tmp_path: Path) -> None:
    src = load_source(str(EXAMPLE))
    out = tmp_path / "live.log"
    fh = open(out, "ab")
    t_start = time.time()
    srv = ReplayServer(src, port=0, speed=200.0, log_out=fh).start()
    try:
        deadline = time.time() + 10
        want = sum(len(r["lines"]) for r in src.records if r["kind"] == "log")
        while time.time() < deadline and out.read_bytes().count(b"\n") < want:
            time.sleep(0.05)
    finally:
        srv.stop()
        fh.close()
    lines = out.read_bytes().decode(errors="replace").split("\n")[:-1]
    assert len(lines) == want == 596
    stamps = [line_time(ln) for ln in lines if line_time(ln) is not None]
    assert stamps and min(stamps) >= int(t_start) - 1 and max(stamps) <= time.time() + 1  # moved to now
    assert any("KV cache pool is full. Retract requests." in ln for ln in lines)


def test_keep_log_times_writes_the_recorded_lines_verbatim(tmp_path: Path) -> None:
    src = load_source(str(EXAMPLE))
    out = tmp_path / "v.log"
    fh = open(out, "ab")
    recorded = [x for r in src.records if r["kind"] == "log" for x in r["lines"]]
    srv = ReplayServer(src, port=0, speed=500.0, log_out=fh, keep_log_times=True).start()
    try:
        deadline = time.time() + 10
        while time.time() < deadline and out.read_bytes().count(b"\n") < len(recorded):
            time.sleep(0.05)
    finally:
        srv.stop()
        fh.close()
    assert out.read_bytes().decode().split("\n")[:-1] == recorded




def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "diagnoser", "replay-server", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "serving" in line, line
    return p, line.rsplit(" at ", 1)[1].strip()


def test_sigterm_stops_it_cleanly_and_the_default_bind_is_loopback(tmp_path: Path) -> None:
    p, url = _start(str(EXAMPLE), "--port", "0", "--speed", "5")
    try:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "/metrics", timeout=5).status_code == 200
    finally:
        p.terminate()
        _, err = p.communicate(timeout=10)
    assert p.returncode == 0 and "stopped after" in err and "Traceback" not in err


def test_port_in_use_and_bad_inputs_are_one_sentence(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        r = subprocess.run([sys.executable, "-m", "diagnoser", "replay-server", str(EXAMPLE), "--port", str(port)],
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 2 and "already in use" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "diagnoser", "replay-server", str(tmp_path / "none.dgb")],
                       capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_a_run_directory_is_served_too(data_dir: Path) -> None:
    run = data_dir / "sglang-cpu-real" / "client-bound-low-occupancy"
    srv = ReplayServer(load_source(str(run)), port=0, speed=1.0).start()
    try:
        r = httpx.get(srv.url + "/metrics", timeout=5)
        first = sorted((run / "metrics").glob("*.prom"))[0].read_text()
        assert r.text == first
        assert json.loads(httpx.get(srv.url + "/get_server_info", timeout=5).text)["max_total_tokens"] == 65536
    finally:
        srv.stop()


def test_log_only_recording_has_no_metrics_like_sglang_without_enable_metrics() -> None:
    srv = ReplayServer(load_source(str(ROOT / "examples" / "eagle3-low-accept.dgb")), port=0).start()
    try:
        r = httpx.get(srv.url + "/metrics", timeout=5)
        assert r.status_code == 404
    finally:
        srv.stop()


@pytest.mark.parametrize("speed", ["0", "-1"])
def test_speed_must_be_positive(speed: str) -> None:
    r = subprocess.run([sys.executable, "-m", "diagnoser", "replay-server", str(EXAMPLE), "--speed", speed],
                       capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 2 and "--speed" in r.stderr
