"""serve's front door under hostile clients, against the real ``diagnose serve`` in a subprocess.

* A slowloris of 1,100 connections (each sends a request head one header at a time, and reconnects at
  once when closed) under an open-file limit of 1,024 (``setrlimit`` in the child): ``/healthz`` keeps
  answering in under 1 s, and the log holds no traceback.
* The Host check: a foreign Host is refused (421), the loopback names and ``--allow-host`` are answered.
* The login redirect goes to a local path only (``//other.host/`` is not another site).
"""

from __future__ import annotations

import os
import random
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diagnoser.web.app import local_path
from diagnoser.web.door import Door, HostCheck, host_of
from tests.helpers import free_port

SLOW_CONNECTIONS = 1100
FILE_LIMIT = 1024


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def _start(tmp_path: Path, *args: str, limit: bool = False) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    p = subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--url", "http://127.0.0.1:1", "--port", str(port),
                          "--interval", "2", "--timeout", "1", *args],
                         stdout=subprocess.DEVNULL, stderr=log.open("wb"), preexec_fn=_limit_files if limit else None)
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


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


@pytest.fixture()
def enough_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SLOW_CONNECTIONS + 200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the test process needs {need} open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need) if hard == resource.RLIM_INFINITY else max(soft, min(hard, need * 2)), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Slowloris:
    """``n`` connections that each send ``GET / HTTP/1.1`` and then one header line every ``drip`` seconds,
    never the blank line that ends the head; a closed one is reopened at the next drip, as slowloris tools
    do (seeded drip order)."""

    def __init__(self, port: int, n: int, drip: float = 1.0, seed: int = 26) -> None:
        self.port, self.n, self.drip = port, n, drip
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.opened = self.reopened = self.failed = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, sel: selectors.BaseSelector) -> None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex(("127.0.0.1", self.port))
            sel.register(s, selectors.EVENT_READ, time.monotonic() + self.rng.uniform(0, self.drip))
        except OSError:
            s.close()
            self.failed += 1
            return
        self.opened += 1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            self._open(sel)
        sent: dict[int, int] = {}
        closed = 0
        next_tick = time.monotonic() + self.drip
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_tick:  # the drip tick: reopen what the server closed
                for _ in range(closed):
                    self._open(sel)
                closed, next_tick = 0, now + self.drip
            for key, _ev in sel.select(timeout=0.05):  # readable: the server closed it (or answered): reopen
                sock = key.fileobj
                try:
                    data = sock.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
                    self.reopened += 1
                    closed += 1
            for key in list(sel.get_map().values()):
                if key.data > now:
                    continue
                sock = key.fileobj
                n = sent.get(key.fd, 0)
                line = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" if n == 0 else b"X-Slow-%d: x\r\n" % n
                try:
                    sock.send(line)  # type: ignore[union-attr]
                except OSError:
                    pass
                sent[key.fd] = n + 1
                sel.modify(sock, selectors.EVENT_READ, now + self.drip)
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()

    def __enter__(self) -> Slowloris:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _healthz_once(port: int) -> float:
    t0 = time.perf_counter()
    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=httpx.Timeout(1.0))
    assert r.status_code in (200, 503) and r.json()["status"] in ("ok", "failing"), r.text
    return time.perf_counter() - t0


def test_healthz_answers_in_under_a_second_through_a_slowloris_of_1100_connections_at_1024_files(tmp_path: Path, enough_files: None) -> None:
    p, port, log = _start(tmp_path, limit=True)
    try:
        with open(f"/proc/{p.pid}/limits") as fh:
            assert any(line.startswith("Max open files") and f"{FILE_LIMIT}" in line for line in fh)
        with Slowloris(port, SLOW_CONNECTIONS) as attack:
            deadline = time.monotonic() + 3
            while attack.opened < SLOW_CONNECTIONS and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.0)  # every connection has sent some of its head
            times = []
            end = time.monotonic() + 14  # past the 10 s head deadline: connections are also closed by time
            while time.monotonic() < end:
                try:
                    times.append(_healthz_once(port))
                except httpx.HTTPError as e:
                    raise AssertionError(f"/healthz did not answer within 1 s after {len(times)} answers: {type(e).__name__}; "
                                         f"slowloris opened {attack.opened}, reopened {attack.reopened}") from None
                time.sleep(0.25)
            fds = len(os.listdir(f"/proc/{p.pid}/fd"))
        assert attack.opened >= SLOW_CONNECTIONS and attack.reopened > 0  # the cap and the deadlines closed some
        assert len(times) >= 30 and max(times) < 1.0, (len(times), max(times))
        assert fds < FILE_LIMIT, fds
        assert p.poll() is None  # still serving
        assert _healthz_once(port) < 1.0
    finally:
        _stop(p)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert text.count("Too many open files") <= 1, text[-3000:]  # at most the one line a minute
    assert len(text) < 20_000, len(text)


def test_a_foreign_host_is_refused_and_allowed_names_are_answered(tmp_path: Path) -> None:
    p, port, _log = _start(tmp_path, "--allow-host", "dash.example")
    try:
        base = f"http://127.0.0.1:{port}"
        for host, want in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200), ("[::1]", 200), ("dash.example", 200),
                           ("evil.example", 421), (f"evil.example:{port}", 421), ("127.0.0.1.evil.example", 421), ("", 421)):
            for path in ("/", "/healthz", "/index.json", "/metrics"):
                r = httpx.get(base + path, headers={"Host": host}, timeout=5)
                ok = r.status_code if want == 421 else (200 if r.status_code in (200, 503) else r.status_code)
                assert ok == want, (host, path, r.status_code, r.text[:200])
        r = httpx.get(base + "/index.json", headers={"Host": "evil.example"}, timeout=5)
        assert "targets" not in r.text and "127.0.0.1:1" not in r.text
    finally:
        _stop(p)


def test_the_host_check_by_bound_address() -> None:
    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover - not called
        pass

    loop = HostCheck(app, "127.0.0.1")
    assert loop.allowed(b"127.0.0.1:8000") and loop.allowed(b"LOCALHOST") and loop.allowed(b"[::1]:8000")
    assert not loop.allowed(b"10.0.0.5:8000") and not loop.allowed(b"attacker.example") and not loop.allowed(None)
    wild = HostCheck(app, "0.0.0.0", ["diagnoser"])
    assert wild.allowed(b"10.0.0.5:8000") and wild.allowed(b"diagnoser:8000") and not wild.allowed(b"rebind.example")
    assert HostCheck(app, "10.0.0.5").allowed(b"10.0.0.5:8000")
    assert HostCheck(app, "127.0.0.1", ["*"]).allowed(b"anything")
    assert host_of(b"Example.COM.:80") == "example.com" and host_of(b"[::1]:8000") == "::1"


def test_the_login_redirect_stays_on_this_server(tmp_path: Path) -> None:
    for path, want in (("//other.host/", "/other.host/"), ("/\\other.host", "/other.host"), ("///x", "/x"),
                       ("/target/1", "/target/1"), ("/", "/"), ("x", "/")):
        assert local_path(path) == want
    p, port, _log = _start(tmp_path, "--token", "s3cret-token")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # a raw path: httpx would normalise it
            s.sendall(b"GET //other.host/?token=s3cret-token HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].split()[1] == "303", lines
        location = next(v for k, _, v in (ln.partition(": ") for ln in lines) if k.lower() == "location")
        assert location == "/other.host/", location
    finally:
        _stop(p)


def test_the_door_evicts_the_oldest_waiting_connection_and_refuses_when_all_are_busy() -> None:
    class Conn:
        closed = False

        def close_now(self) -> None:
            self.closed = True
            door.forget(self)

    door = Door(2)
    a, b, c = Conn(), Conn(), Conn()
    assert door.admit(a) and door.admit(b)
    door.waiting.pop(b)  # b's head is in: busy
    assert door.admit(c) and a.closed and not b.closed and door.evicted == 1
    door.waiting.pop(c)
    d = Conn()
    assert not door.admit(d) and door.refused == 1 and not b.closed and not c.closed
