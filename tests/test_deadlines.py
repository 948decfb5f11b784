"""Bounded time whatever a server does: a server that trickles its /metrics answer at a few bytes a
second (headers or body) is cut off at the request's deadline, ``--once --duration 4`` ends in seconds
instead of minutes, and watch/serve show such a target down (not its stale numbers as healthy). The
trickling server is a real socket server on loopback that first serves REAL SGLang scrapes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.http import PlainTarget, fetch, make_client
from tests.conftest import DATA, ROOT

SCRAPES = [p.read_bytes() for p in sorted((DATA / "sglang-cpu-real" / "kv-full-retract" / "metrics").glob("*.prom"))[2:8]]


class Trickler:
    """``mode``: "headers" trickles the whole answer, "body" sends the headers at once and trickles the
    body, "good-then-headers" serves ``good`` real scrapes first, then trickles. 2 bytes every 0.5 s."""

    def __init__(self, mode: str, good: int = 0) -> None:
        self.mode, self.good, self.n = mode, good, 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(c,), daemon=True).start()

    def _handle(self, c: socket.socket) -> None:
        try:
            while not self.stop.is_set():
                req = b""
                while b"\r\n\r\n" not in req:
                    chunk = c.recv(65536)
                    if not chunk:
                        return
                    req += chunk
                path = req.split(b" ", 2)[1]
                if path != b"/metrics":
                    c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                self.n += 1
                body = SCRAPES[self.n % len(SCRAPES)]
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n" % len(body)
                if self.n <= self.good:
                    c.sendall(head + body)
                    continue
                data = head + body
                if self.mode == "body":
                    c.sendall(head)
                    data = body
                for i in range(0, len(data), 2):
                    if self.stop.is_set():
                        return
                    c.sendall(data[i:i + 2])
                    time.sleep(0.5)
        except OSError:
            pass
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture(params=["headers", "body"])
def trickler(request: pytest.FixtureRequest) -> Any:
    t = Trickler(request.param)
    yield t
    t.close()


def test_a_fetch_is_cut_off_at_its_deadline(trickler: Trickler) -> None:
    clients: list[Any] = [PlainTarget(timeout=1.5)]
    if trickler.mode == "body":  # through httpx the body is checked between chunks; headers: see --once below
        clients.append(make_client(timeout=1.5))
    for c in clients:
        t0 = time.monotonic()
        f = fetch(c, trickler.url + "/metrics")
        took = time.monotonic() - t0
        assert not f.ok and "did not finish answering within 1.5 s" in f.error, f.error
        assert took < 3.0, f"{type(c).__name__} took {took:.1f} s"
        c.close()


def test_once_ends_in_seconds_against_a_trickling_server(trickler: Trickler) -> None:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", "--url", trickler.url, "--duration", "4", "--timeout", "2"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    took = time.monotonic() - t0
    assert took < 25, f"--once --duration 4 --timeout 2 took {took:.0f} s"
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "did not finish answering within 2 s" in r.stderr


def test_a_trickling_target_among_good_ones_does_not_hold_the_others(data_dir: Path) -> None:
    from diagnoser.collect import collect_once
    from tests.browser.samples_server import SampleServer

    slow = Trickler("headers")
    try:
        with SampleServer(data_dir, "kv-full-retract") as good:
            t0 = time.monotonic()
            col = collect_once(ADAPTER, [good.url, slow.url], [], duration=3, interval=1, timeout=1.5)
            took = time.monotonic() - t0
    finally:
        slow.close()
    assert took < 14, took
    ok, bad = col.timelines
    assert len(ok.get("running_reqs")) >= 3  # scraped every round while the other trickled
    assert "did not finish answering" in col.unreachable[bad.target]


def test_watch_and_serve_show_a_target_that_starts_trickling_as_down() -> None:
    from diagnoser.live import LiveMonitor
    from diagnoser.outputs.exporter import make_registry, render
    from diagnoser.web.views import overview_doc

    srv = Trickler("headers", good=3)
    m = LiveMonitor(ADAPTER, [srv.url], [], interval=0.5, timeout=1.0, for_seconds=0)
    try:
        seen_up = False
        deadline = time.monotonic() + 30
        view = None
        while time.monotonic() < deadline:
            snap = m.tick()
            view = snap.targets[0]
            seen_up = seen_up or view.up is True
            if seen_up and view.up is False:
                break
            time.sleep(0.3)
        assert seen_up, "the target never answered its good scrapes"
        assert view is not None and view.up is False and "did not finish answering" in view.last_error
        card = overview_doc(m.snapshot, 0.5)["targets"][0]
        assert card["health"] == "down" and any(f["rule"] == "source_unreachable" for f in card["findings"])
        text = render(make_registry(lambda: m.snapshot)).decode()
        assert re.search(r'^diagnoser_scrape_up\{[^}]*target="[^}]*\} 0\.0$', text, re.M)  # labels sorted: engine first
        assert "diagnoser_signal{" not in text  # its last numbers are not exported as current
    finally:
        m.close()
        srv.close()
