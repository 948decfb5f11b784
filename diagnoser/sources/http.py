"""HTTP access to engine endpoints: httpx clients with timeouts, a response-size cap, and one clear
sentence (cause + next step) for every way a fetch can fail.

One-shot commands share one client (:func:`make_client`). A live poll of many targets gives each target
its own small client (:func:`make_target_client`): httpcore scans every connection of a pool on each
request (polling each idle socket), so one pool for 100 targets cost ~3.5 ms of CPU per fetch, against
~1.2 ms for a per-target pool. All clients share one TLS context (httpx otherwise loads the CA bundle
again for every client, ~0.1 s each).

For plain-http targets a live poll goes one step further (:class:`PlainTarget`): the standard library's
``http.client`` on one kept-alive connection costs ~0.35 ms of CPU per scrape against ~1.2 ms through
httpx (bench/bench_serve.py), and the serve budget is 5 ms per scrape in all. Everything else — https,
credentials in the URL, redirects — still goes through the target's httpx client, which stays the
reference: tests compare both paths on the same server, answer for answer and error for error.

Every fetch has a deadline for the whole request (``--timeout`` by default: connect, headers and body
together), not only for each read: a server that trickles its answer at 2 bytes/s is cut off at the
deadline with one sentence, like one that does not answer. A watchdog thread (:class:`Reaper`) shuts
the socket at the deadline, which also ends a trickle of the headers: on the plain-http path the
connection's own, through httpx the socket the request goes out on (httpcore's ``trace`` extension:
the one opened for it, or the kept-alive connection the pool assigned it, :class:`_StreamWatch`).

Every body is read through :class:`BoundedBody` (:func:`read_bounded` for httpx, the same class on the
plain path): capped after decompression with a running total, one layer of gzip/deflate at most, and a
redirect followed only to the same scheme, host and port (:data:`MAX_REDIRECTS` at most). A cap that
trips is one sentence (``Fetched.cause``) and the scrape counts it as an error.
"""

from __future__ import annotations

import heapq
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from diagnoser import __version__
from diagnoser.redact import redact_text

DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


def base_url(url: str) -> str:
    """``http://h:30000/metrics`` → ``http://h:30000``; adds ``http://`` when the scheme is missing, and
    SGLang's default port 30000 when neither scheme nor port is given (``localhost`` → ``http://localhost:30000``)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
        host = urlsplit(url).netloc.rsplit("@", 1)[-1]
        if host and (host.endswith("]") or ":" not in host):
            url = url.replace(host, host + ":30000", 1)
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in ("/metrics", "/server_info", "/get_server_info"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def url_problem(url: str) -> str | None:
    """One sentence when ``--url`` cannot be a server address (checked before any request)."""
    shown = redact_text(url.strip()) or "''"
    try:
        b = base_url(url)
        parts = urlsplit(b)
        parts.port  # noqa: B018  (raises on a bad port)
        httpx.URL(b)
    except (ValueError, httpx.InvalidURL) as e:
        return f"--url {shown} is not a valid URL ({e}); pass something like http://127.0.0.1:30000"
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in parts.netloc:
        return f"--url {shown} is not an http(s) server address; pass something like http://127.0.0.1:30000"
    return None


def display_url(url: str) -> str:
    return redact_text(url)


@dataclass(slots=True)
class Fetched:
    url: str
    ok: bool
    status: int = 0
    text: str = ""
    content_type: str = ""
    error: str = ""  # one sentence: cause and next step
    elapsed_s: float = 0.0
    truncated: bool = False
    cause: str = ""  # the sentence for a cap that tripped (the body was cut there)


_TLS: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback:
    ``localhost``, 127.0.0.0/8, ``::1``."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_context() -> ssl.SSLContext:
    """The TLS context every client shares (httpx's default verification: certifi, or SSL_CERT_FILE/DIR)."""
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            _TLS = httpx.create_ssl_context()
        return _TLS


def _headers(headers: dict[str, str] | None) -> dict[str, str]:
    # only the encodings the bounded reader decodes (httpx would offer br/zstd when their modules are there)
    h = {"User-Agent": f"diagnoser/{__version__}", "Accept": "text/plain;version=0.0.4;q=1, */*;q=0.1",
         "Accept-Encoding": "gzip, deflate"}
    if headers:
        h.update(headers)
    return h


def make_client(timeout: float = DEFAULT_TIMEOUT, headers: dict[str, str] | None = None, transport: Any = None) -> httpx.Client:
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        headers=_headers(headers),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        transport=transport,
        follow_redirects=False,  # fetch() follows same-origin redirects itself (same scheme, host and port)
        verify=tls_context(),
    )


# A kept-alive connection idle this long is closed by us before the server's own idle timeout (uvicorn,
# which serves SGLang, closes after 5 s), so a poll never races the server's close on a reused socket.
TARGET_KEEPALIVE_S = 4.0


def make_target_client(timeout: float = DEFAULT_TIMEOUT, headers: dict[str, str] | None = None, transport: Any = None) -> httpx.Client:
    """A client for polling one target: a pool of its own, and ``Accept-Encoding: identity``. SGLang's
    /metrics (prometheus_client) gzips when asked, which costs the server ~1–3 ms of CPU per 80 KB scrape
    and us ~0.5 ms to inflate; an exposition is ~10 KB/s per target at a 5 s interval, so we take it plain."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        headers=_headers({"Accept-Encoding": "identity", **(headers or {})}),
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=2, keepalive_expiry=TARGET_KEEPALIVE_S),
        transport=transport,
        follow_redirects=False,  # fetch() follows same-origin redirects itself (same scheme, host and port)
        verify=tls_context(),
    )


def _connect_timeout(shown: str) -> str:
    return f"Connecting to {shown} timed out. Check the host and port, and that no firewall drops the traffic."


def _read_timeout(shown: str) -> str:
    return f"{shown} did not answer within the timeout. The server may be overloaded or hung; raise --timeout or check it."


def _cannot_connect(shown: str, refused: bool) -> str:
    reason = "connection refused" if refused else "cannot connect"
    return f"Could not connect to {shown} ({reason}). Check that SGLang is running and that host and port are right."


def _failed(shown: str, e: BaseException) -> str:
    return f"Fetching {shown} failed ({type(e).__name__}). Check the URL and the server."


def too_slow(shown: str, total: float) -> str:
    """The sentence for a request that ran out of its time (``total``: the seconds it had, to 0.1 s)."""
    return (f"{shown} did not finish answering within {round(total, 1):g} s (the whole request: it is overloaded, hung, "
            "or sending very slowly). Check the server, or raise --timeout.")


class Reaper:
    """One daemon thread that runs callbacks at deadlines (to shut a socket whose request ran out of
    time); :meth:`arm` returns a handle that :meth:`disarm` cancels. A handle's ``[3]`` is True once its
    callback ran. Cheap to arm: a heap push, no thread per request."""

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._cv = threading.Condition()
        self._n = 0
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, cb: Callable[[], None]) -> list[Any]:
        with self._cv:
            self._n += 1
            entry = [deadline, self._n, cb, False]
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="diagnoser-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:
                self._cv.notify()
            return entry

    def disarm(self, entry: list[Any]) -> bool:
        """Cancel; True when the callback had already run (the deadline passed)."""
        with self._cv:
            entry[2] = None
            return bool(entry[3])

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    if not self._cv.wait(60.0) and not self._heap:
                        self._thread = None
                        return
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                entry = heapq.heappop(self._heap)
                cb, entry[2], entry[3] = entry[2], None, True
                try:
                    cb()
                except Exception:  # noqa: S110 — shutting a socket that is already closed
                    pass


REAPER = Reaper()
DEADLINE_GRACE_S = 0.25


def _shut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread; it sees EOF or an error
        except OSError:
            pass


def client_timeout(client: Any) -> float:
    """The per-request total a client stands for: ``PlainTarget.timeout``, an httpx client's read timeout."""
    t = getattr(client, "timeout", None)
    if isinstance(t, int | float):
        return float(t)
    read = getattr(t, "read", None)
    return float(read) if isinstance(read, int | float) and read > 0 else DEFAULT_TIMEOUT


class PlainTarget:
    """Scrapes one target over plain http with ``http.client`` and one kept-alive connection per host.

    Same answers and the same one-sentence errors as :func:`fetch` through httpx (tested side by side);
    https, credentials in the URL and redirects are handed to ``fallback``, the target's httpx client.
    A connection idle longer than :data:`TARGET_KEEPALIVE_S` is reopened, and a kept-alive socket the
    server closed meanwhile is retried once on a fresh one. One fetch at a time (a lock): a live target
    is scraped by one worker at a time anyway."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, headers: dict[str, str] | None = None) -> None:
        self.timeout = float(timeout)
        self.headers = _headers({"Accept-Encoding": "identity", **(headers or {})})
        self.fallback = make_target_client(timeout=timeout, headers=headers)
        self._conns: dict[tuple[str, int], tuple[http.client.HTTPConnection, float]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for conn, _ in self._conns.values():
                conn.close()
            self._conns.clear()
        self.fallback.close()

    def fetch(self, url: str, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "", deadline: float | None = None) -> Fetched:
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.username or parts.password or not parts.hostname:
            return fetch(self.fallback, url, max_bytes, what, deadline)
        try:
            port = parts.port or 80
        except ValueError:
            return fetch(self.fallback, url, max_bytes, what, deadline)
        with self._lock:
            out = self._get(url, parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), max_bytes, what, deadline)
        return fetch(self.fallback, url, max_bytes, what, deadline) if out is None else out

    def _get(self, url: str, host: str, port: int, path: str, max_bytes: int, what: str, deadline: float) -> Fetched | None:
        shown = display_url(url)
        key = (host, port)
        t0 = time.perf_counter()
        total = max(0.0, deadline - time.monotonic())
        for attempt in (0, 1):
            left = deadline - time.monotonic()
            if left <= 0:
                return Fetched(url, False, error=too_slow(shown, total))
            conn, used_at = self._conns.pop(key, (None, 0.0))
            if conn is not None and t0 - used_at > TARGET_KEEPALIVE_S:
                conn.close()
                conn = None
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=min(self.timeout, left))
                try:
                    conn.connect()
                except TimeoutError:
                    conn.close()
                    return Fetched(url, False, error=_connect_timeout(shown))
                except ConnectionRefusedError:
                    conn.close()
                    return Fetched(url, False, error=_cannot_connect(shown, True))
                except OSError:
                    conn.close()
                    return Fetched(url, False, error=_cannot_connect(shown, False))
            # ends a trickle of headers or body; a little after the deadline, so that a server that sends
            # nothing at all meets the read timeout first (the same sentence as through httpx)
            watch = REAPER.arm(deadline + DEADLINE_GRACE_S, lambda c=conn: _shut(c))
            try:
                conn.request("GET", path, headers=self.headers)
                resp = conn.getresponse()
                reader: BoundedBody | None = None
                if not (300 <= resp.status < 400 and resp.getheader("location")):
                    reader = BoundedBody(shown, resp.getheader("content-encoding") or "", max_bytes)
                    while not resp.isclosed() and reader.feed(resp.read(READ_CHUNK)):
                        pass
            except BodyError as e:
                conn.close()
                REAPER.disarm(watch)
                return Fetched(url, False, error=str(e))
            except TimeoutError:
                conn.close()
                REAPER.disarm(watch)
                return Fetched(url, False, error=_read_timeout(shown))
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if REAPER.disarm(watch):
                    return Fetched(url, False, error=too_slow(shown, total))
                if reused and attempt == 0:
                    continue  # the server closed the kept-alive socket meanwhile: once more on a new one
                return Fetched(url, False, error=_failed(shown, e))
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                if REAPER.disarm(watch):
                    return Fetched(url, False, error=too_slow(shown, total))
                return Fetched(url, False, error=_failed(shown, e))
            if REAPER.disarm(watch):  # the socket was shut mid-body: what arrived is not the whole answer
                conn.close()
                return Fetched(url, False, error=too_slow(shown, total))
            if 300 <= resp.status < 400 and resp.getheader("location"):
                conn.close()
                return None  # a redirect: httpx follows it
            if reader is None:
                conn.close()
                return None  # not reached: a redirect is handled above
            truncated = reader.truncated
            if truncated or resp.will_close or not resp.isclosed():
                conn.close()
            else:
                self._conns[key] = (conn, time.perf_counter())
            ctype = resp.getheader("content-type", "") or ""
            out = _finish(url, resp.status, reader.body(), ctype, time.perf_counter() - t0, truncated, what)
            out.cause = reader.cause()
            return out
        return None  # not reached: the second attempt returns


MAX_REDIRECTS = 5
READ_CHUNK = 64 * 1024
# header bounds (the HTTP libraries' own): http.client reads at most 100 header lines of 64 KiB each,
# httpcore (httpx) at most 100 KiB of status line and headers; the deadline bounds the time they take
MAX_HEADER_LINES = http.client._MAXHEADERS  # type: ignore[attr-defined]
MAX_HEADER_LINE = http.client._MAXLINE  # type: ignore[attr-defined]


class BodyError(Exception):
    """A body that cannot be read as sent (an encoding refused or broken): ``str(e)`` is the sentence."""


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80)


def _origin_text(url: httpx.URL) -> str:
    o = _origin(url)
    return f"{o[0]}://{o[1]}:{o[2]}"


class BoundedBody:
    """Reads a body chunk by chunk into at most ``max_bytes`` bytes *after* decoding it: one layer of
    ``gzip`` or ``deflate`` is inflated incrementally with a running total (a 16 KB answer that inflates to
    10 GiB costs ``max_bytes``, not 10 GiB); nested encodings (``gzip, gzip``) and unknown ones are refused
    with one sentence. ``truncated`` says the cap was met; the rest of the body is not read."""

    __slots__ = ("shown", "max_bytes", "chunks", "size", "truncated", "enc", "_d", "_raw_deflate")

    def __init__(self, shown: str, content_encoding: str, max_bytes: int) -> None:
        self.shown = shown
        self.max_bytes = max_bytes
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        encs = [e.strip().lower() for e in (content_encoding or "").split(",")]
        encs = [e for e in encs if e and e != "identity"]
        if len(encs) > 1:
            raise BodyError(f"{shown} sent a body with nested encodings ({', '.join(encs)[:60]}); diagnoser decodes one "
                            "layer of gzip or deflate at most. Check the server or a proxy in between.")
        self.enc = encs[0] if encs else ""
        self._raw_deflate = False
        if self.enc in ("gzip", "x-gzip"):
            self._d: Any = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip (or a zlib stream labelled gzip)
        elif self.enc == "deflate":
            self._d = zlib.decompressobj(zlib.MAX_WBITS)
        elif self.enc:
            raise BodyError(f"{shown} sent a body in the {self.enc[:30]} encoding, which diagnoser does not decode (it asks "
                            "for gzip, deflate or none). Check the server or a proxy in between.")
        else:
            self._d = None

    def feed(self, data: bytes) -> bool:
        """Take one raw chunk; False once the cap is met (stop reading)."""
        if self.truncated or not data:
            return not self.truncated
        if self._d is not None:
            data = self._inflate(data)
        room = self.max_bytes - self.size
        if len(data) > room:
            self.chunks.append(data[:room])
            self.size = self.max_bytes
            self.truncated = True
            return False
        self.chunks.append(data)
        self.size += len(data)
        return True

    def _inflate(self, data: bytes) -> bytes:
        room = self.max_bytes - self.size
        out: list[bytes] = []
        n = 0
        buf = data
        while True:
            try:
                piece = self._d.decompress(buf, room + 1 - n)  # max_length >= 1 (0 would mean no limit)
            except zlib.error:
                if self.enc == "deflate" and not self._raw_deflate and self.size == 0 and n == 0:
                    self._raw_deflate = True  # a raw deflate stream without the zlib header (some servers)
                    self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise BodyError(f"{self.shown} sent a {self.enc} body that does not decompress. Check the server or a proxy in between.") from None
            out.append(piece)
            n += len(piece)
            if n > room or not self._d.unconsumed_tail:
                return b"".join(out)
            buf = self._d.unconsumed_tail

    def body(self) -> bytes:
        return b"".join(self.chunks)

    def cause(self) -> str:
        """The sentence for a cap that tripped (empty when none did)."""
        if not self.truncated:
            return ""
        after = f" after {self.enc} decompression" if self.enc else ""
        return (f"The answer from {self.shown} was over the {_size_text(self.max_bytes)} cap{after} and was cut there; "
                "the complete lines before the cut were used.")


def _size_text(n: int) -> str:
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n:,} bytes"


class _StreamWatch:
    """Finds the socket a request goes out on, so that the deadline can shut it: a server trickling its
    headers (or body) is then cut at the deadline as on the plain-http path, where the per-read timeout
    never trips. Two ways, both httpcore's ``trace`` extension: a fresh connection reports the socket it
    opened (``connection.connect_tcp.complete``); a request on a kept-alive connection opened earlier is
    looked up, when its head goes out (``http11.send_request_headers.started``, which carries the
    request), among the connection pool's queued requests, each with the connection assigned to it."""

    __slots__ = ("stream", "pool")

    def __init__(self, pool: Any = None) -> None:
        self.stream: Any = None
        self.pool = pool

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self.stream = info.get("return_value")
        elif name == "http11.send_request_headers.started" and self.stream is None and self.pool is not None:
            self.stream = _pooled_stream(self.pool, info.get("request"))

    def shut(self) -> None:
        st = self.stream
        sock = st.get_extra_info("socket") if st is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _pool_of(client: httpx.Client, url: httpx.URL) -> Any:
    """The httpcore connection pool behind ``client`` for ``url`` (None for another transport: a test's
    MockTransport, which has no socket)."""
    try:
        transport = client._transport_for_url(url)  # the mount (proxy) for this URL, or the default
    except Exception:  # noqa: BLE001 — a private helper that changed: no pool, the read timeout bounds the request
        return None
    return getattr(transport, "_pool", None)


def _pooled_stream(pool: Any, request: Any) -> Any:
    """The network stream of the connection the pool assigned to ``request`` (httpcore 1.x:
    ``ConnectionPool._requests`` of ``PoolRequest(request, connection)``; ``HTTPConnection._connection``
    is the HTTP/1.1 connection, whose ``_network_stream`` is the socket's stream)."""
    if request is None:
        return None
    try:
        for pr in list(getattr(pool, "_requests", ())):
            if pr.request is request:
                inner = getattr(pr.connection, "_connection", None)
                return getattr(inner, "_network_stream", None)
    except Exception:  # noqa: BLE001 — httpcore's internals changed: no stream, the read timeout bounds the request
        return None
    return None


class DeadlineExceeded(Exception):
    """The whole request ran out of its time (the socket was shut, or the body came too slowly)."""


class RedirectRefused(BodyError):
    """A redirect to another origin, or too many: ``str(e)`` is the sentence."""


@dataclass(slots=True)
class RawAnswer:
    """What :func:`read_bounded` read: the final answer's status, headers and (decoded, capped) body."""

    status: int
    headers: Any
    body: bytes
    truncated: bool = False
    cause: str = ""


def read_bounded(client: httpx.Client, url: str, *, max_bytes: int, deadline: float, shown: str,
                 method: str = "GET", data: dict[str, str] | None = None, params: dict[str, str] | None = None) -> RawAnswer:
    """The one bounded HTTP read through httpx: at most ``max_bytes`` of body after decoding
    (:class:`BoundedBody`), the whole request (headers included, :class:`_StreamWatch`) within
    ``deadline`` (``time.monotonic()``), at most :data:`MAX_REDIRECTS` redirects of a GET and only to the
    same scheme, host and port. Raises httpx's errors as they are, :class:`BodyError` (and
    :class:`RedirectRefused`) with a sentence, and :class:`DeadlineExceeded`."""
    start = httpx.URL(url)
    current = start
    for _hop in range(MAX_REDIRECTS + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded
        watch = _StreamWatch(_pool_of(client, current))
        guard = REAPER.arm(deadline + DEADLINE_GRACE_S, watch.shut)
        location = ""
        reader: BoundedBody | None = None
        try:
            with client.stream(method, current, data=data, params=params, timeout=httpx.Timeout(min(left, client_timeout(client))),
                               extensions={"trace": watch.trace}) as resp:
                status, headers = resp.status_code, resp.headers
                if method == "GET" and 300 <= status < 400 and headers.get("location"):
                    location = headers["location"]
                else:
                    reader = BoundedBody(shown, headers.get("content-encoding", ""), max_bytes)
                    # a response built whole (a test's MockTransport) has its bytes already
                    raw = (resp._content,) if hasattr(resp, "_content") else resp.iter_raw(READ_CHUNK)
                    for chunk in raw:
                        if time.monotonic() > deadline:
                            raise DeadlineExceeded
                        if not reader.feed(chunk):
                            break
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError):
            if REAPER.disarm(guard):
                raise DeadlineExceeded from None
            raise
        except BaseException:
            REAPER.disarm(guard)
            raise
        if REAPER.disarm(guard):  # shut at the deadline: what arrived is not the whole answer
            raise DeadlineExceeded
        if reader is not None:
            return RawAnswer(status, headers, reader.body(), reader.truncated, reader.cause())
        try:
            nxt = current.join(location)
        except (httpx.InvalidURL, ValueError, TypeError):
            raise RedirectRefused(f"{shown} answered a redirect to an invalid address. Check the URL and the server.") from None
        if nxt.scheme not in ("http", "https") or _origin(nxt) != _origin(start):
            raise RedirectRefused(f"{shown} redirected to another address ({display_url(_origin_text(nxt))}); diagnoser follows "
                                  "a redirect only on the same scheme, host and port. Point the URL at the server that answers.")
        current = nxt
    raise RedirectRefused(f"{shown} redirected more than {MAX_REDIRECTS} times. Check the URL and the server.")


def fetch(client: Any, url: str, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "", deadline: float | None = None) -> Fetched:
    """GET ``url`` within ``deadline`` (``time.monotonic()``; default: now + the client's timeout) through
    :func:`read_bounded`; any failure is one sentence in ``Fetched.error``."""
    if isinstance(client, PlainTarget):
        return client.fetch(url, max_bytes, what, deadline)
    if deadline is None:
        deadline = time.monotonic() + client_timeout(client)
    shown = display_url(url)
    total = max(0.0, deadline - time.monotonic())
    if total <= 0:
        return Fetched(url, False, error=too_slow(shown, 0))
    t0 = time.perf_counter()
    try:
        a = read_bounded(client, url, max_bytes=max_bytes, deadline=deadline, shown=shown)
    except DeadlineExceeded:
        return Fetched(url, False, error=too_slow(shown, total))
    except BodyError as e:
        return Fetched(url, False, error=str(e))
    except httpx.ConnectTimeout:
        return Fetched(url, False, error=_connect_timeout(shown))
    except httpx.TimeoutException:
        return Fetched(url, False, error=_read_timeout(shown))
    except httpx.ConnectError as e:
        return Fetched(url, False, error=_cannot_connect(shown, "refused" in str(e).lower()))
    except httpx.UnsupportedProtocol:
        return Fetched(url, False, error=f"{shown} is not an http(s) URL. Pass something like http://127.0.0.1:30000.")
    except httpx.HTTPError as e:
        return Fetched(url, False, error=_failed(shown, e))
    except (httpx.InvalidURL, ValueError, TypeError):
        return Fetched(url, False, error=f"{shown} is not a valid URL. Pass something like http://127.0.0.1:30000.")
    f = _finish(url, a.status, a.body, a.headers.get("content-type", ""), time.perf_counter() - t0, a.truncated, what)
    f.cause = a.cause
    return f


def _finish(url: str, status: int, body: bytes, ctype: str, elapsed: float, truncated: bool, what: str) -> Fetched:
    """A response read whole (or cut at the cap) as a :class:`Fetched`, with the sentence for an error status."""
    shown = display_url(url)
    text = body.decode("utf-8", errors="replace")
    if status >= 400:
        if status == 404 and url.endswith("/metrics"):
            msg = (f"{shown} answered 404: the server has no /metrics. Start SGLang with --enable-metrics "
                   "(in gRPC mode /metrics is on the HTTP sidecar, --port + 1).")
        elif status in (401, 403):
            msg = (f"{shown} answered {status} (not authorised). Give diagnoser the server's API key with --api-key, its @FILE "
                   "form or $SGLANG_API_KEY; or scrape from an allowed host.")
        else:
            msg = f"{shown} answered HTTP {status}{(' for ' + what) if what else ''}. Check the URL and the server's state."
        return Fetched(url, False, status=status, text=text, content_type=ctype, error=msg, elapsed_s=elapsed)
    return Fetched(url, True, status=status, text=text, content_type=ctype, elapsed_s=elapsed, truncated=truncated)


def looks_like_html(f: Fetched) -> bool:
    head = f.text[:512].lstrip().lower()
    return "text/html" in f.content_type or head.startswith("<!doctype html") or head.startswith("<html")
