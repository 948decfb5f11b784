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
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import zlib
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

    def fetch(self, url: str, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "") -> Fetched:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.username or parts.password or not parts.hostname:
            return fetch(self.fallback, url, max_bytes, what)
        try:
            port = parts.port or 80
        except ValueError:
            return fetch(self.fallback, url, max_bytes, what)
        with self._lock:
            out = self._get(url, parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), max_bytes, what)
        return fetch(self.fallback, url, max_bytes, what) if out is None else out

    def _get(self, url: str, host: str, port: int, path: str, max_bytes: int, what: str) -> Fetched | None:
        shown = display_url(url)
        key = (host, port)
        t0 = time.perf_counter()
        for attempt in (0, 1):
            conn, used_at = self._conns.pop(key, (None, 0.0))
            if conn is not None and t0 - used_at > TARGET_KEEPALIVE_S:
                conn.close()
                conn = None
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
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
            try:
                conn.request("GET", path, headers=self.headers)
                resp = conn.getresponse()
                body = resp.read(max_bytes + 1)
            except TimeoutError:
                conn.close()
                return Fetched(url, False, error=_read_timeout(shown))
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused and attempt == 0:
                    continue  # the server closed the kept-alive socket meanwhile: once more on a new one
                return Fetched(url, False, error=_failed(shown, e))
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                return Fetched(url, False, error=_failed(shown, e))
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


def fetch(client: Any, url: str, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "") -> Fetched:
    if isinstance(client, PlainTarget):
        return client.fetch(url, max_bytes, what)
    shown = display_url(url)
    try:
        with client.stream("GET", url) as resp:
            chunks: list[bytes] = []
            size = 0
            truncated = False
            for chunk in resp.iter_bytes():
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
            msg = f"{shown} answered {status} (not authorised). Pass the server's key with --api-key KEY (or @FILE), or scrape from an allowed host."
        else:
            msg = f"{shown} answered HTTP {status}{(' for ' + what) if what else ''}. Check the URL and the server's state."
        return Fetched(url, False, status=status, text=text, content_type=ctype, error=msg, elapsed_s=elapsed)
    return Fetched(url, True, status=status, text=text, content_type=ctype, elapsed_s=elapsed, truncated=truncated)


def looks_like_html(f: Fetched) -> bool:
    head = f.text[:512].lstrip().lower()
    return "text/html" in f.content_type or head.startswith("<!doctype html") or head.startswith("<html")
