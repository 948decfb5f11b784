"""A small client for the Prometheus HTTP API (``/api/v1/query``, ``query_range``, ``series``, label
values), the one thing fleet mode talks to. Works with Prometheus and the stores that speak its API
(Thanos, Mimir, VictoriaMetrics).

Every failure becomes a :class:`PromError` whose message is one sentence naming the query and the
answer (HTTP status, Prometheus' ``errorType``/``error``), never a traceback. Secrets (bearer token,
basic-auth password, credentials in the URL, custom header values) never appear in a message.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from diagnoser.jsonout import loads
from diagnoser.redact import redact_text
from diagnoser.sources.http import BodyError, DeadlineExceeded, make_client, read_bounded

MAX_SHOWN_QUERY = 160
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # one API answer, after decompression (sources/http.py: read_bounded)


class PromError(Exception):
    """A query failed; ``str(e)`` is the one-line message for the user."""

    def __init__(self, message: str, *, timeout: bool = False, status: int = 0) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.status = status


def shorten(query: str, limit: int = MAX_SHOWN_QUERY) -> str:
    q = " ".join(query.split())
    return q if len(q) <= limit else q[: limit - 1] + "…"


def auth_headers(bearer_token: str | None = None, basic_auth: str | None = None, headers: list[str] | None = None) -> dict[str, str]:
    """Request headers from the CLI options. ``@PATH`` reads a token or ``user:password`` from a file.

    Raises ValueError (one sentence) on a malformed option."""
    out: dict[str, str] = {}
    for h in headers or []:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header {name.strip() or h!r} must look like 'Name: value', e.g. 'X-Scope-OrgID: team-a'")
        out[name.strip()] = value.strip()
    if bearer_token:
        out["Authorization"] = "Bearer " + _maybe_file(bearer_token, "--bearer-token")
    if basic_auth:
        cred = _maybe_file(basic_auth, "--basic-auth")
        if ":" not in cred:
            raise ValueError("--basic-auth must look like USER:PASSWORD (or @FILE holding that)")
        out["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    return out


def _maybe_file(value: str, opt: str) -> str:
    if not value.startswith("@"):
        return value.strip()
    try:
        with open(value[1:], encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as e:
        raise ValueError(f"{opt} file {value[1:]} cannot be read ({e.strerror}); check the path") from None


@dataclass(slots=True)
class PromAPI:
    """One Prometheus-compatible endpoint, one httpx connection pool."""

    url: str
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    client: httpx.Client | None = None
    calls: int = 0
    seconds: float = 0.0
    bytes_read: int = 0
    warnings: list[str] = field(default_factory=list)
    max_bytes: int = MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        u = self.url.strip().rstrip("/")
        if "://" not in u:
            u = "http://" + u
        for suffix in ("/api/v1", "/graph"):
            if u.endswith(suffix):
                u = u[: -len(suffix)]
        self.url = u
        if self.client is None:
            # the store enforces `timeout` itself (and answers 503 timeout); the socket waits a bit longer
            self.client = make_client(timeout=self.timeout + 5.0, headers={**self.headers, "Accept": "application/json"})

    @property
    def shown(self) -> str:
        return redact_text(self.url)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    # -- API calls -------------------------------------------------------------------------------
    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        form = {"query": query, "start": _t(start), "end": _t(end), "step": _t(step), "timeout": f"{self.timeout:g}s"}
        data = self._call("/api/v1/query_range", form, query)
        return list(data.get("result") or [])

    def query(self, query: str, at: float) -> list[dict[str, Any]]:
        data = self._call("/api/v1/query", {"query": query, "time": _t(at), "timeout": f"{self.timeout:g}s"}, query)
        return list(data.get("result") or [])

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data = self._call("/api/v1/series", {"match[]": match, "start": _t(start), "end": _t(end)}, match)
        return list(data or [])  # type: ignore[arg-type]

    def label_values(self, label: str) -> list[str]:
        data = self._call(f"/api/v1/label/{label}/values", None, f"label values of {label}", method="GET")
        return [str(v) for v in (data or [])]  # type: ignore[union-attr]

    def _call(self, path: str, form: dict[str, str] | None, what: str, method: str = "POST") -> Any:
        assert self.client is not None
        shown_q = shorten(what)
        t0 = time.perf_counter()
        try:  # the one bounded read: body capped after decompression, the whole request within the deadline
            resp = read_bounded(self.client, self.url + path, max_bytes=self.max_bytes, shown=f"Prometheus at {self.shown}",
                                deadline=time.monotonic() + self.timeout + 5.0, method=method,
                                data=form if method == "POST" else None, params=form if method != "POST" else None)
        except BodyError as e:
            raise PromError(f"{e} (answering {path} `{shown_q}`)") from None
        except (httpx.TimeoutException, DeadlineExceeded):
            raise PromError(f"Prometheus at {self.shown} did not answer {path} for `{shown_q}` within {self.timeout:g} s; "
                            f"raise --timeout or narrow --range/--selector.", timeout=True) from None
        except httpx.ConnectError as e:
            reason = "connection refused" if "refused" in str(e).lower() else "cannot connect"
            raise PromError(f"Prometheus at {self.shown} is unreachable ({reason}) for {path} `{shown_q}`; "
                            f"check the --prometheus URL and that the server is up.") from None
        except httpx.UnsupportedProtocol:
            raise PromError(f"--prometheus {self.shown} is not an http(s) URL; pass something like http://127.0.0.1:9090.") from None
        except httpx.HTTPError as e:
            raise PromError(f"Prometheus at {self.shown} failed on {path} `{shown_q}` ({type(e).__name__}); check the URL.") from None
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
        body = resp.body
        self.bytes_read += len(body)
        if resp.truncated:
            raise PromError(f"Prometheus at {self.shown} answered {path} `{shown_q}` with more than {self.max_bytes // (1024 * 1024)} MiB "
                            "(after decompression), which diagnoser does not hold; narrow --range/--selector or raise --step.")
        try:
            doc = loads(body)  # invalid UTF-8 and lone surrogates replaced
        except (ValueError, RecursionError):
            doc = None
        if resp.status >= 400 or not isinstance(doc, dict) or doc.get("status") != "success":
            raise PromError(self._explain(resp.status, doc, body, path, shown_q), status=resp.status,
                            timeout=isinstance(doc, dict) and doc.get("errorType") == "timeout")
        for w in doc.get("warnings") or []:
            msg = f"Prometheus warned on `{shown_q}`: {w}"
            if msg not in self.warnings:
                self.warnings.append(msg)
        return doc.get("data")

    def _explain(self, status: int, doc: Any, body: bytes, path: str, shown_q: str) -> str:
        if isinstance(doc, dict) and doc.get("error"):
            answer = f"{doc.get('errorType', 'error')}: {doc['error']}"
        elif body.lstrip()[:1] == b"<":
            answer = "an HTML page, not the Prometheus API (is --prometheus the server's base URL?)"
        else:
            answer = " ".join(body[:200].decode("utf-8", "replace").split()) or "an empty body"
        answer = redact_text(answer)
        if status in (401, 403):
            hint = "pass --bearer-token, --basic-auth or --header with the right credentials"
        elif status == 404:
            hint = "check that --prometheus points at the Prometheus base URL (no /api/v1 path, or the right prefix)"
        elif status == 400:
            hint = "check --selector"
        elif status in (422, 503) or (isinstance(doc, dict) and doc.get("errorType") == "timeout"):
            hint = "the store is overloaded or the query too large; narrow --range/--selector or raise --step"
        else:
            hint = "check the store's logs"
        code = f"HTTP {status}" if status else "an invalid answer"
        return f"Prometheus at {self.shown} answered {code} to {path} `{shown_q}`: {answer}; {hint}."


def _t(v: float) -> str:
    return f"{v:.3f}"
