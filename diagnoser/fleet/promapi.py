"""A small client for the Prometheus HTTP API (``/api/v1/query``, ``query_range``, ``series``, label
values), the one thing fleet mode talks to. Works with Prometheus and the stores that speak its API
(Thanos, Mimir, VictoriaMetrics).

Every failure becomes a :class:`PromError` whose message is one sentence naming the query and the
answer (HTTP status, Prometheus' ``errorType``/``error``), never a traceback. Secrets (bearer token,
basic-auth password, credentials in the URL, custom header values) never appear in a message.

Bounds: each answer is read within a deadline for the whole request (the query's ``timeout`` plus
``DEADLINE_GRACE_S``, and never past the pass's ``pass_deadline``; a socket still trickling then is shut),
and at most ``MAX_ANSWER_BYTES`` of it after decompression (the one bounded read, :func:`diagnoser.sources.http.read_bounded`). An answer whose ``data`` has the wrong shape
for the call (a ``scalar`` where a ``matrix`` was asked for, a list that is not one) is a PromError too.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from diagnoser.jsonout import loads
from diagnoser.redact import redact_text
from diagnoser.sources.http import (
    BodyError,
    DeadlineExceeded,
    is_loopback,
    make_client,
    read_bounded,
    tls_context,
)

MAX_SHOWN_QUERY = 160
# One answer, as sent (after decompression). A 10,000-target pass's largest answer (series discovery)
# is 11.5 MB (bench/bench_fleet.py's fleet); parsed, an answer takes 3.5-8x its size. A fleet pass parses
# its answers in one thread, one at a time (``query_range(raw=True)`` and :meth:`PromAPI.finish`): parsed
# in the worker threads, each thread's malloc arena kept its own peak and RSS grew past 1 GB.
MAX_ANSWER_BYTES = 32 * 2**20


@dataclass(slots=True)
class Raw:
    """An answer read but not parsed yet (:meth:`PromAPI.finish` parses it)."""

    status: int
    body: bytes
    path: str
    shown_q: str
    want: str
DEADLINE_GRACE_S = 5.0  # the store enforces `timeout` itself (and answers 503 timeout); the socket waits this much longer


class PromError(Exception):
    """A query failed; ``str(e)`` is the one-line message for the user."""

    def __init__(self, message: str, *, timeout: bool = False, status: int = 0) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.status = status


class AnswerTooBig(Exception):
    pass


class AnswerTooSlow(Exception):
    pass


def read_capped(chunks: Iterable[bytes], cap: int, deadline: float) -> bytes:
    """The body from ``chunks``, refused past ``cap`` bytes (:class:`AnswerTooBig`) or once
    ``time.monotonic()`` is past ``deadline`` (:class:`AnswerTooSlow`). The one place answer size and
    time are checked while reading (the transport may be replaced, this stays)."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise AnswerTooBig(size)
        if time.monotonic() > deadline:
            raise AnswerTooSlow()
        parts.append(chunk)
    if time.monotonic() > deadline:
        raise AnswerTooSlow()
    return b"".join(parts)


_EXPECT = {"matrix": "a matrix (range query)", "vector": "a vector", "series": "a list of series", "labels": "a list of label values"}


def check_shape(data: Any, want: str) -> list[Any]:
    """``data`` of a successful answer → its list of results, or ValueError naming what came instead.
    ``want``: ``matrix`` / ``vector`` (``query``/``query_range``: ``resultType`` and ``result``), ``series``
    (a list of label sets) or ``labels`` (a list of strings). An instant query asked for a range vector
    answers a matrix: ``vector`` accepts both."""
    if want in ("matrix", "vector"):
        if not isinstance(data, dict):
            raise ValueError(f"{_kind(data)} where {_EXPECT[want]} was expected")
        rt = data.get("resultType")
        ok = ("matrix",) if want == "matrix" else ("vector", "matrix")
        if rt not in ok:
            shown = f"a {rt}" if isinstance(rt, str) and rt.isascii() and rt.isalpha() and len(rt) < 20 else "an unknown result type"
            raise ValueError(f"{shown} where {_EXPECT[want]} was expected")
        res = data.get("result")
        if res is None:
            return []
        if not isinstance(res, list):
            raise ValueError(f"{_kind(res)} as the result where {_EXPECT[want]} was expected")
        return res
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValueError(f"{_kind(data)} where {_EXPECT[want]} was expected")
    return data


def _kind(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(x), "a value")


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


def _loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (:func:`diagnoser.sources.http.is_loopback`)."""
    try:
        host = httpx.URL(url).host or ""
    except (httpx.InvalidURL, ValueError, TypeError):
        return False
    return is_loopback(host)


@dataclass(slots=True)
class PromAPI:
    """One Prometheus-compatible endpoint, one httpx connection pool."""

    url: str
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    client: httpx.Client | None = None
    pass_deadline: float | None = None  # time.monotonic() past which no answer is waited for (the pass's end)
    max_bytes: int = MAX_ANSWER_BYTES
    cut: int = 0  # queries cut (or never sent) at the pass deadline
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
            # the store enforces `timeout` itself (and answers 503 timeout); the socket waits a bit longer.
            # No kept-alive connections: each request opens its own, so its socket can be shut at its deadline.
            transport = httpx.HTTPTransport(verify=tls_context(), limits=httpx.Limits(max_keepalive_connections=0))
            # answers compress 50-70x (label sets repeat), which pays across a network; on this machine's own
            # loopback gzip only costs CPU on both ends (10,000 targets: 0.5 s of Prometheus' CPU a pass)
            enc = {"Accept-Encoding": "identity"} if _loopback(self.url) else {}
            self.client = make_client(timeout=self.timeout + DEADLINE_GRACE_S,
                                      headers={**enc, **self.headers, "Accept": "application/json"}, transport=transport)

    @property
    def shown(self) -> str:
        return redact_text(self.url)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    # -- API calls -------------------------------------------------------------------------------
    def query_range(self, query: str, start: float, end: float, step: float, raw: bool = False) -> Any:
        """The result list; with ``raw`` the answer unparsed (:class:`Raw`, for :meth:`finish`)."""
        form = {"query": query, "start": _t(start), "end": _t(end), "step": _t(step), "timeout": f"{self.timeout:g}s"}
        return self._call("/api/v1/query_range", form, query, want="matrix", raw=raw)

    def query(self, query: str, at: float) -> list[Any]:
        return self._call("/api/v1/query", {"query": query, "time": _t(at), "timeout": f"{self.timeout:g}s"}, query, want="vector")

    def series(self, match: str, start: float, end: float) -> list[Any]:
        return self._call("/api/v1/series", {"match[]": match, "start": _t(start), "end": _t(end)}, match, want="series")

    def label_values(self, label: str) -> list[str]:
        data = self._call(f"/api/v1/label/{label}/values", None, f"label values of {label}", method="GET", want="labels")
        return [v for v in data if isinstance(v, str)]

    def deadline(self) -> float:
        """When the next request must be over: its own time, and never past the pass's."""
        d = time.monotonic() + self.timeout + DEADLINE_GRACE_S
        return d if self.pass_deadline is None else min(d, self.pass_deadline)

    def _send(self, method: str, url: str, form: dict[str, str] | None, deadline: float) -> tuple[int, bytes]:
        """One request read whole within ``deadline`` and ``max_bytes`` through the one bounded read
        (:func:`diagnoser.sources.http.read_bounded`: the body capped after decompression, one encoding at
        most, the socket shut at the deadline, which ends a read a server keeps alive by trickling bytes)."""
        assert self.client is not None
        if deadline - time.monotonic() <= 0:
            raise AnswerTooSlow()
        try:
            resp = read_bounded(self.client, url, max_bytes=self.max_bytes, shown=f"Prometheus at {self.shown}",
                                deadline=deadline, method=method, data=form if method == "POST" else None,
                                params=form if method != "POST" else None)
        except DeadlineExceeded:
            raise AnswerTooSlow() from None
        except httpx.HTTPError:
            if time.monotonic() >= deadline:
                raise AnswerTooSlow() from None
            raise
        if resp.truncated:
            raise AnswerTooBig()
        return resp.status, resp.body

    def _call(self, path: str, form: dict[str, str] | None, what: str, method: str = "POST", want: str = "",
              raw: bool = False) -> Any:
        shown_q = shorten(what)
        t0 = time.perf_counter()
        deadline = self.deadline()
        allowed = max(0.0, deadline - time.monotonic())
        by_pass = self.pass_deadline is not None and deadline >= self.pass_deadline
        try:
            status, body = self._send(method, self.url + path, form, deadline)
        except AnswerTooSlow:
            if by_pass:  # the pass's time ran out, not this query's own
                self.cut += 1
                raise PromError(f"Prometheus at {self.shown} had not answered {path} for `{shown_q}` when the pass's time ran out "
                                f"(the earlier queries took it); raise --timeout or narrow --range/--selector.", timeout=True) from None
            raise PromError(f"Prometheus at {self.shown} did not finish answering {path} for `{shown_q}` within {allowed:.1f} s "
                            f"(overloaded, hung or sending very slowly); raise --timeout or narrow --range/--selector.",
                            timeout=True) from None
        except BodyError as e:  # an encoding refused (gzip, gzip), a redirect to another origin
            raise PromError(f"{e} (answering {path} `{shown_q}`)") from None
        except AnswerTooBig:
            raise PromError(f"Prometheus at {self.shown} answered {path} for `{shown_q}` with more than {self.max_bytes / 2**20:g} MiB, "
                            f"after decompression, the most one answer may hold; narrow --selector or --range, or raise --step.") from None
        except httpx.TimeoutException:
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
        self.bytes_read += len(body)
        answer = Raw(status, body, path, shown_q, want)
        del body
        return answer if raw else self.finish(answer)

    def finish(self, answer: Raw) -> Any:
        """Parse an answer read with ``raw=True`` (PromError for an error answer or a wrong shape). The
        answer's bytes are let go before the parse: the parse holds the decoded text and what it builds
        (3.5-8x the answer), not the bytes as well (tests/test_fleet_hostile.py's peak)."""
        return self._parse(answer, answer.path, answer.shown_q, answer.want)

    def _parse(self, answer: Raw, path: str, shown_q: str, want: str) -> Any:
        status = answer.status
        head, html = answer.body[:200], _HTML_START.match(answer.body) is not None  # (for an error's sentence)
        text = answer.body.decode("utf-8", "replace")
        answer.body = b""  # the only reference (Raw is the caller's, emptied): the bytes are freed here
        try:
            doc = loads(text)  # lone surrogates replaced
        except (ValueError, RecursionError):
            doc = None
        del text
        if status >= 400 or not isinstance(doc, dict) or doc.get("status") != "success":
            raise PromError(self._explain(status, doc, head, html, path, shown_q), status=status,
                            timeout=isinstance(doc, dict) and doc.get("errorType") == "timeout")
        warnings = doc.get("warnings")
        for w in warnings if isinstance(warnings, list) else []:
            msg = f"Prometheus warned on `{shown_q}`: {redact_text(_line(w))}"
            if msg not in self.warnings and len(self.warnings) < MAX_WARNINGS:
                self.warnings.append(msg)
        try:
            return check_shape(doc.get("data"), want) if want else doc.get("data")
        except ValueError as e:
            raise PromError(f"Prometheus at {self.shown} answered {path} `{shown_q}` with {e}; "
                            f"is --prometheus a Prometheus-compatible API?") from None

    def _explain(self, status: int, doc: Any, body: bytes, html: bool, path: str, shown_q: str) -> str:
        """The sentence for an error answer (``body``: its first 200 bytes; ``html``: it begins with ``<``)."""
        if isinstance(doc, dict) and doc.get("error"):
            answer = f"{_line(doc.get('errorType', 'error'), 40)}: {_line(doc['error'])}"
        elif html:
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


MAX_WARNINGS = 20
_HTML_START = re.compile(rb"\s*<")  # bytes.lstrip() would copy the whole answer


def _line(x: Any, limit: int = 300) -> str:
    """A server-provided value as one short line (any type; whitespace collapsed, cut at ``limit``)."""
    t = " ".join(str(x).split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def _t(v: float) -> str:
    return f"{v:.3f}"
