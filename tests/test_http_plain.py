"""The stdlib fetch path for live polling (:class:`PlainTarget`) against the httpx path, the reference,
over real loopback servers: the same answers and the same one-sentence errors, case by case."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from diagnoser.sources.http import PlainTarget, fetch, looks_like_html, make_target_client
from tests.helpers import free_port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routes: dict[str, tuple[int, str, bytes, dict[str, str]]] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status, ctype, body, extra = self.routes.get(self.path, (404, "text/plain", b"not found\n", {}))
        if self.path == "/slow":
            time.sleep(1.5)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture()
def server(data_dir: Path):  # type: ignore[no-untyped-def]
    text = (data_dir / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom").read_bytes()
    _Handler.routes = {
        "/metrics": (200, "text/plain; version=0.0.4; charset=utf-8", text, {}),
        "/page": (200, "text/html; charset=utf-8", b"<!doctype html><html><body>login</body></html>", {}),
        "/secret": (401, "text/plain", b"unauthorised\n", {}),
        "/boom": (500, "text/plain", b"internal error\n", {}),
        "/moved": (302, "text/plain", b"", {"Location": "/metrics"}),
        "/slow": (200, "text/plain", b"late\n", {}),
        "/q?x=1": (200, "text/plain", b"query kept\n", {}),
        "/gz": (200, "text/plain", gzip.compress(text), {"Content-Encoding": "gzip"}),
    }
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.handle_error = lambda *a: None  # type: ignore[method-assign]  # a client that cut its socket (the keep-alive test)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", text
    finally:
        srv.shutdown()
        srv.server_close()


def both(url: str, max_bytes: int = 32 * 1024 * 1024, timeout: float = 5.0) -> tuple[Any, Any]:
    plain = PlainTarget(timeout=timeout)
    ref = make_target_client(timeout=timeout)
    try:
        return plain.fetch(url, max_bytes, "metrics"), fetch(ref, url, max_bytes, "metrics")
    finally:
        plain.close()
        ref.close()


@pytest.mark.parametrize("path", ["/metrics", "/page", "/secret", "/boom", "/missing/metrics", "/moved", "/q?x=1", "/gz"])
def test_same_answer_as_httpx(server: tuple[str, bytes], path: str) -> None:
    base, text = server
    a, b = both(base + path)
    assert (a.ok, a.status, a.text, a.error, a.truncated) == (b.ok, b.status, b.text, b.error, b.truncated)
    assert a.content_type.split(";")[0] == b.content_type.split(";")[0]
    if path in ("/metrics", "/moved", "/gz"):  # /gz: gzipped although identity was asked for
        assert a.ok and a.text == text.decode()  # the redirect is followed (by the httpx fallback)
    if path == "/page":
        assert looks_like_html(a) and looks_like_html(b)
    if path == "/missing/metrics":
        assert "--enable-metrics" in a.error


def test_size_cap_cuts_like_httpx(server: tuple[str, bytes]) -> None:
    base, text = server
    a, b = both(base + "/metrics", max_bytes=10_000)
    assert a.truncated and b.truncated and a.ok and b.ok
    assert a.text == b.text == text[:10_000].decode(errors="replace")


def test_refused_port_same_sentence() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    a, b = both(url)
    assert not a.ok and a.error == b.error and "connection refused" in a.error


def test_read_timeout_same_sentence(server: tuple[str, bytes]) -> None:
    base, _ = server
    a, b = both(base + "/slow", timeout=0.3)
    assert not a.ok and a.error == b.error and "did not answer within the timeout" in a.error


def test_unanswered_connect_is_a_timeout_or_refusal_never_a_traceback() -> None:
    """A listening socket whose backlog is full leaves connects hanging (or refused, by kernel): either
    way one sentence, as httpx gives."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    fillers = []
    try:
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(s.getsockname())
            fillers.append(c)
        a = PlainTarget(timeout=0.3).fetch(f"http://127.0.0.1:{s.getsockname()[1]}/metrics")
        assert not a.ok and a.error.endswith(".") and "Traceback" not in a.error
    finally:
        for c in fillers:
            c.close()
        s.close()


def test_keeps_one_connection_and_survives_the_server_closing_it(server: tuple[str, bytes]) -> None:
    base, text = server
    p = PlainTarget(timeout=5.0)
    try:
        first = p.fetch(base + "/metrics")
        (conn, _), = p._conns.values()
        again = p.fetch(base + "/metrics")
        (conn2, _), = p._conns.values()
        assert conn is conn2  # kept alive, reused
        conn2.sock.shutdown(socket.SHUT_RDWR)  # as if the server closed the idle socket
        third = p.fetch(base + "/metrics")
        assert first.ok and again.ok and third.ok and third.text == text.decode()
    finally:
        p.close()


def test_https_and_credentials_go_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    p = PlainTarget(timeout=1.0)
    seen: list[str] = []
    import diagnoser.sources.http as h

    real = h.fetch

    def spy(client: Any, url: str, *a: Any) -> Any:
        if client is p.fallback:
            seen.append(url)
            return h.Fetched(url, False, error="stub")
        return real(client, url, *a)

    monkeypatch.setattr(h, "fetch", spy)
    try:
        p.fetch("https://127.0.0.1:1/metrics")
        p.fetch("http://user:pw@127.0.0.1:1/metrics")
    finally:
        p.close()
    assert seen == ["https://127.0.0.1:1/metrics", "http://user:pw@127.0.0.1:1/metrics"]
