"""A drip on a kept-alive connection, both ways (issue 26), on real loopback sockets.

* **A target that drips to us.** A raw-socket server answers a connection's first request at once
  (``Connection: keep-alive``) and its second — on the same socket — with headers (or a body) one byte
  every 0.1 s. Every fetch path (the one-shot httpx client, a live poll's per-target httpx client, the
  plain ``http.client`` path) must end the second request at its overall deadline with the one
  sentence, not at the per-read timeout (which a drip never meets). The server counts connections, so
  a client that opened a fresh socket for the second request (and so met the first-request guard)
  fails the test.
* **A client that drips to serve.** Against the real ``diagnose serve``: a client sends a whole request,
  reads the answer, and on the same kept-alive connection sends a second request's head one byte every
  0.25 s. The door closes it at the head deadline (``HEAD_TIMEOUT_S``) counted from the end of the first
  answer, as for a first request; ``/healthz`` answers in under 1 s all along.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from diagnoser.sources.http import PlainTarget, fetch, make_client, make_target_client
from diagnoser.web.door import HEAD_TIMEOUT_S
from tests.helpers import free_port

BODY = b"# TYPE up gauge\nup 1\n"
DRIP_S = 0.1


def _read_head(conn: socket.socket, buf: bytearray) -> bool:
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            return False
        buf += chunk
    del buf[: buf.index(b"\r\n\r\n") + 4]
    return True


class DripOnSecond:
    """Answers a connection's first request at once and kept alive; drips the second (``mode``:
    ``"headers"`` — a status line, then one header byte every DRIP_S; ``"body"`` — whole headers and
    then one body byte every DRIP_S)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests = 0
        self.mode = "headers"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        n = 0
        try:
            while _read_head(conn, buf):
                n += 1
                self.requests += 1
                if n == 1:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: keep-alive\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
                    continue
                if self.mode == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    for _ in range(600):
                        conn.sendall(b"X")
                        time.sleep(DRIP_S)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 100000\r\n\r\n")
                    for _ in range(600):
                        conn.sendall(b"#")
                        time.sleep(DRIP_S)
                return
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture()
def dripper() -> Iterator[DripOnSecond]:
    d = DripOnSecond()
    yield d
    d.close()


TIMEOUT = 1.5


def _clients() -> list[tuple[str, Any]]:
    return [("make_client", make_client(timeout=TIMEOUT)), ("make_target_client", make_target_client(timeout=TIMEOUT)),
            ("PlainTarget", PlainTarget(timeout=TIMEOUT))]


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_a_target_dripping_on_a_kept_alive_connection_is_cut_at_the_deadline(dripper: DripOnSecond, mode: str) -> None:
    dripper.mode = mode
    for name, client in _clients():
        before = dripper.connections
        try:
            first = fetch(client, dripper.url())
            assert first.ok and first.text == BODY.decode(), (name, first.error)
            t0 = time.monotonic()
            second = fetch(client, dripper.url())
            took = time.monotonic() - t0
        finally:
            client.close()
        assert dripper.connections == before + 1, (name, "the second request did not reuse the kept-alive connection")
        assert not second.ok and "did not finish answering within 1.5 s" in second.error, (name, second.error)
        assert TIMEOUT - 0.1 < took < TIMEOUT + 1.0, (name, mode, took)


# -- a client dripping to serve -------------------------------------------------------------------
def _start_serve(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / "serve.log"
    p = subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--url", "http://127.0.0.1:1", "--port", str(port),
                          "--interval", "2", "--timeout", "1"], stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"serve exited: {log.read_text()[-2000:]}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return p, port, log
        except httpx.HTTPError:
            time.sleep(0.2)
    p.kill()
    raise AssertionError("serve did not start in 30 s")


def _answer(f: Any) -> bytes:
    """One whole answer (head and Content-Length body) from a kept-alive connection's reader
    (``socket.makefile("rb")``); returns the head."""
    lines = []
    while True:
        line = f.readline(65537)
        assert line, "serve closed the connection before answering"
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line.rstrip(b"\r\n"))
    head = b"\r\n".join(lines)
    length = next(int(v) for k, _, v in (ln.partition(b": ") for ln in lines) if k.lower() == b"content-length")
    assert len(f.read(length)) == length, "serve closed the connection mid-answer"
    return head


def test_serve_cuts_a_header_drip_on_a_kept_alive_connection_at_the_head_deadline(tmp_path: Path) -> None:
    p, port, log = _start_serve(tmp_path)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = _answer(s.makefile("rb"))  # nothing follows the answer: the raw socket is read next
        answered = time.monotonic()
        assert head.split(b" ")[1] in (b"200", b"503") and b"connection: close" not in head.lower(), head
        second = b"GET /index.json HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-Drip-%d: y\r\n" % i for i in range(200))
        health: list[float] = []
        closed_at = None
        s.settimeout(0.25)
        for i in range(len(second)):
            try:
                s.send(second[i : i + 1])
                if s.recv(4096) == b"":  # noqa: SIM108 - the door closed it (no answer comes before the head is in)
                    closed_at = time.monotonic()
                    break
            except TimeoutError:
                pass  # still open: nothing to read in 0.25 s
            except OSError:
                closed_at = time.monotonic()
                break
            if i % 4 == 0:
                t0 = time.perf_counter()
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                assert r.status_code in (200, 503)
                health.append(time.perf_counter() - t0)
            if time.monotonic() - answered > HEAD_TIMEOUT_S + 5:
                break
        s.close()
        assert closed_at is not None, f"the kept-alive drip was not cut in {HEAD_TIMEOUT_S + 5:g} s"
        waited = closed_at - answered
        assert HEAD_TIMEOUT_S - 0.5 < waited < HEAD_TIMEOUT_S + 1.5, waited
        assert len(health) >= 5 and max(health) < 1.0, health
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    assert "Traceback" not in log.read_text(errors="replace")


def test_serve_answers_pipelined_requests_on_a_kept_alive_connection(tmp_path: Path) -> None:
    """Two whole requests in one send: both answered (the second is not taken for a head still coming)."""
    p, port, _log = _start_serve(tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /index.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            f = s.makefile("rb")
            heads = [_answer(f), _answer(f)]
        assert all(h.split(b" ")[1] in (b"200", b"503") for h in heads), heads
    finally:
        p.terminate()
        p.wait(10)
