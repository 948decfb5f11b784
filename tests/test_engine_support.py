"""The real-engine harness itself (tests/engine/support.py), on a stand-in server made of the standard
library, so its start-up, port retry and shutdown are checked in the fast suite without an engine:

* ``stop()`` ends the whole process group, a worker left behind by a first process that already exited
  included, and waits until it is gone (a vLLM server is three processes: API server, engine core, worker);
* a server whose port was taken between choosing and binding it is started again on another port;
* a server that dies at start-up for another reason is reported with its log, not retried;
* the vLLM harness's CPU split puts the worker on the engine's CPUs and the API server on the front one;
* the load generator sends exactly ``n`` requests at most and counts failures without stopping.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from tests.engine import support, vllm_support

# A server in the shape of the engines': it forks a worker into its own process group (as vLLM's API
# server spawns its engine core), then serves HTTP on the given port; with "orphan" its first process
# exits at SIGTERM while the worker ignores SIGTERM and lives on.
SERVER = r"""
import http.server, os, signal, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
if os.fork() == 0:
    if mode == "orphan":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
if mode == "crash":
    print("a bad flag", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
try:
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
except OSError as e:
    print(e, flush=True)
    sys.exit(1)
print("ready", flush=True)
srv.serve_forever()
"""


@dataclass
class Stand(support.ServerProcess):
    mode: str = "plain"
    name: ClassVar[str] = "stand-in"
    start_timeout: ClassVar[float] = 30.0
    stop_grace: ClassVar[float] = 2.0

    def command(self) -> list[str]:
        return [sys.executable, "-c", SERVER, str(self.port), self.mode]

    def ready(self) -> bool:
        code, _ = support.http_get(self.url + "/health", timeout=1)
        return code == 200


def group_of(srv: Stand) -> int:
    assert srv.proc is not None
    return srv.proc.pid


@pytest.mark.skipif(sys.platform != "linux", reason="the engine recipe is Linux-only")
@pytest.mark.parametrize("mode", ["plain", "orphan"])
def test_stop_ends_the_whole_group(tmp_path: Path, mode: str) -> None:
    srv = Stand(Path(sys.executable), tmp_path, [], tmp_path / "w", mode=mode).start()
    pgid = group_of(srv)
    assert support.group_alive(pgid)
    t0 = time.time()
    srv.stop()
    assert not support.group_alive(pgid)
    assert srv.proc is None and srv not in support._STARTED
    # the orphan outlives SIGTERM: only SIGKILL after the grace ends it
    assert (time.time() - t0 >= Stand.stop_grace) == (mode == "orphan")


@pytest.mark.skipif(sys.platform != "linux", reason="the engine recipe is Linux-only")
def test_taken_port_starts_again_elsewhere(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = Stand(Path(sys.executable), tmp_path, [], tmp_path / "w", port=port)
        with srv:
            assert srv.port != port
            assert support.http_get(srv.url + "/health")[0] == 200


@pytest.mark.skipif(sys.platform != "linux", reason="the engine recipe is Linux-only")
def test_start_up_failure_is_reported_with_the_log(tmp_path: Path) -> None:
    srv = Stand(Path(sys.executable), tmp_path, [], tmp_path / "w", mode="crash")
    port = srv.port
    with pytest.raises(RuntimeError, match=r"exited with 3 during start-up(.|\n)*a bad flag"):
        srv.start()
    assert srv.port == port and srv.proc is None  # not retried: the port was not the cause


@dataclass
class PlacedStand(Stand):
    """The stand-in started as a vLLM server is: on the engine's CPUs, its first process moved to the front."""

    def command(self) -> list[str]:
        return vllm_support.placed(super().command())

    def after_ready(self) -> None:
        assert self.proc is not None
        vllm_support.to_front(self.proc.pid)


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 CPUs")
def test_vllm_cpu_split_places_the_worker_and_the_api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = vllm_support.cpu_split()
    cpus = sorted(os.sched_getaffinity(0))
    assert split == (tuple(cpus[:-1]), (cpus[-1],))
    with PlacedStand(Path(sys.executable), tmp_path, [], tmp_path / "w") as srv:
        assert srv.proc is not None
        api = srv.proc.pid
        workers = [pid for pid in support.group_members(api) if pid != api]
        assert workers, "the stand-in forks its worker before it answers"
        assert all(os.sched_getaffinity(int(t.name)) == set(split[1]) for t in Path(f"/proc/{api}/task").iterdir())
        assert all(os.sched_getaffinity(w) == set(split[0]) for w in workers)
    monkeypatch.setenv("DIAGNOSER_VLLM_CPU_SPLIT", "0")
    assert vllm_support.cpu_split() is None and vllm_support.placed(["x"]) == ["x"]


def test_bounded_load_counts_and_bounds() -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def send(i: int, left: float) -> int:
        assert left > 0
        with lock:
            calls.append(i)
        if i % 4 == 3:
            raise ValueError(f"request {i} refused")
        return 10

    res = support.bounded_load(21, 3, send, timeout=30)
    assert sorted(calls) == list(range(21))
    assert (res.sent, res.ok, res.failed, res.completion_tokens) == (21, 16, 5, 160)
    assert len(res.errors) == 5 and all("refused" in e for e in res.errors)
    stop = threading.Event()
    stop.set()
    assert support.bounded_load(21, 3, send, timeout=30, stop=stop).sent == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the engine recipe is Linux-only")
def test_prune_stale_removes_only_unused_venvs_of_the_same_engine(tmp_path: Path) -> None:
    def venv(name: str, built: bool = True) -> Path:
        d = tmp_path / name
        (d / "venv").mkdir(parents=True)
        if built:
            (d / "venv.ok").write_text('{"built_s": 1}')
        return d

    current, stale, in_use, building = venv("vllm-cur"), venv("vllm-old"), venv("vllm-used"), venv("vllm-half", built=False)
    sglang_old = venv("0123456789abcdef")
    held = support._lock(in_use / "use.lock", exclusive=False)  # another test session uses it
    try:
        assert support.prune_stale(current) == [stale]
        assert not stale.exists() and current.exists() and in_use.exists() and building.exists() and sglang_old.exists()
        # SGLang's venvs are keyed by the bare hash: pruning for one of them leaves vLLM's alone
        sglang_cur = venv("fedcba9876543210")
        assert support.prune_stale(sglang_cur) == [sglang_old]
        assert in_use.exists() and current.exists()
    finally:
        assert held is not None
        held.close()
    assert support.prune_stale(current) == [in_use]  # no longer in use
