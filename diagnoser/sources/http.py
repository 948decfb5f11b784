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
deadline with one sentence, like one that does not answer. On the plain-http path a watchdog thread
(:class:`Reaper`) shuts the socket at the deadline, which also ends a trickle of the headers; through
httpx each read gets the time left and the body is checked between chunks (a trickle of the headers
alone is then bounded by the caller: ``--once`` abandons the request, watch/serve mark the target down).
"""

from __future__ import annotations

import heapq
import http.client
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


_TLS: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The TLS context every client shares (httpx's default verification: certifi, or SSL_CERT_FILE/DIR)."""
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            _TLS = httpx.create_ssl_context()
        return _TLS


def _headers(headers: dict[str, str] | None) -> dict[str, str]:
    h = {"User-Agent": f"diagnoser/{__version__}", "Accept": "text/plain;version=0.0.4;q=1, */*;q=0.1"}
    if headers:
        h.update(headers)
    return h


def make_client(timeout: float = DEFAULT_TIMEOUT, headers: dict[str, str] | None = None, transport: Any = None) -> httpx.Client:
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        headers=_headers(headers),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        transport=transport,
        follow_redirects=True,
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
        follow_redirects=True,
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
                body = resp.read(max_bytes + 1)
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
            enc = (resp.getheader("content-encoding") or "").strip().lower()
            if enc in ("gzip", "deflate"):  # asked for identity, but a server may compress anyway
                try:
                    body = zlib.decompressobj(zlib.MAX_WBITS | 32).decompress(body, max_bytes + 1)
                except zlib.error:
                    conn.close()
                    return Fetched(url, False, error=f"{shown} sent a {enc} body that does not decompress. Check the server or a proxy in between.")
            truncated = len(body) > max_bytes
            if truncated or resp.will_close:
                conn.close()
            else:
                self._conns[key] = (conn, time.perf_counter())
            ctype = resp.getheader("content-type", "") or ""
            return _finish(url, resp.status, body[:max_bytes] if truncated else body, ctype, time.perf_counter() - t0, truncated, what)
        return None  # not reached: the second attempt returns


def fetch(client: Any, url: str, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "", deadline: float | None = None) -> Fetched:
    """GET ``url`` within ``deadline`` (``time.monotonic()``; default: now + the client's timeout), at
    most ``max_bytes`` of body; any failure is one sentence in ``Fetched.error``."""
    if isinstance(client, PlainTarget):
        return client.fetch(url, max_bytes, what, deadline)
    if deadline is None:
        deadline = time.monotonic() + client_timeout(client)
    shown = display_url(url)
    total = max(0.0, deadline - time.monotonic())
    if total <= 0:
        return Fetched(url, False, error=too_slow(shown, 0))
    try:
        with client.stream("GET", url, timeout=httpx.Timeout(min(total, client_timeout(client)))) as resp:
            chunks: list[bytes] = []
            size = 0
            truncated = False
            for chunk in resp.iter_bytes():
                if time.monotonic() > deadline:
                    return Fetched(url, False, error=too_slow(shown, total))
                size += len(chunk)
                if size > max_bytes:
                    chunks.append(chunk[: max(0, max_bytes - (size - len(chunk)))])
                    truncated = True
                    break
                chunks.append(chunk)
            body = b"".join(chunks)
            elapsed = resp.elapsed.total_seconds() if hasattr(resp, "_elapsed") else 0.0
            ctype = resp.headers.get("content-type", "")
            status = resp.status_code
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
    return _finish(url, status, body, ctype, elapsed, truncated, what)


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
