"""The ``diagnose serve`` web app: FastAPI + Jinja2 over a :class:`diagnoser.live.LiveMonitor`.

Pages (each has a JSON twin: ``/path.json`` or ``Accept: application/json``):
    /                     overview, one card per target          (/index.json)
    /target/N             charts, findings, suggestions, config   (/target/N.json; chart data /target/N/series.json)
    /rules, /rules/NAME   rule docs from the catalogue            (/rules.json, /rules/NAME.json)
    /docs/sglang          how diagnoser reads SGLang (docs/sglang.md) (/docs/sglang.json)
    /metrics              Prometheus exporter; /healthz liveness (503 when polling has stopped or fails)

No endpoint takes a URL from the visitor: the targets are fixed at start-up. All assets are served from
``static/`` (read once at start-up); the Content-Security-Policy forbids anything else (and inline
scripts).

Every answer goes out through one door: documents are redacted (:func:`diagnoser.redact.redact_strings`) and
written as strict JSON (:mod:`diagnoser.jsonout`: ``null`` for a non-finite number), pages are rendered by
Jinja2 with autoescape from the same redacted documents. The pages of the project's own documentation
(the rule docs, /docs/…) hold no server data and are rendered as written.

Under load (many viewers refreshing the same pages every interval) each answer is built once per
snapshot: the first request for a page after the monitor publishes a snapshot renders it, concurrent and
later requests for it get the same bytes until the next snapshot (``_Answers``). Requests are handled on
the event loop (no thread hop), and the token check and security headers are a plain ASGI wrapper.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import mimetypes
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.requests import cookie_parser

from diagnoser import __version__
from diagnoser.jsonout import dumps
from diagnoser.outputs.exporter import CONTENT_TYPE, make_registry, render
from diagnoser.redact import redact_strings
from diagnoser.web import docs as docs_page
from diagnoser.web import fleet as fleet_page
from diagnoser.web import views
from diagnoser.web.head import HeadAsGet

HERE = Path(__file__).resolve().parent
CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
TOKEN_COOKIE = "diagnoser_token"
MAX_ID_DIGITS = 9  # /target/N: more digits than any list of targets has (int() of 5,000 digits raises)
MAX_ANSWERS = 512  # answers kept per snapshot (the keys come from URLs: bounded)
_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer")]
_UNAUTHORISED = ("Unauthorised: pass 'Authorization: Bearer <token>' (the --token given to diagnose serve), "
                 "or open /?token=<token> once.\n")


def _json_bytes(doc: Any) -> bytes:
    return dumps(redact_strings(doc)).encode("utf-8")


def _json(doc: Any, status: int = 200) -> Response:
    """A JSON answer: redacted, strict (``null`` for NaN/±Inf)."""
    return Response(_json_bytes(doc), status_code=status, media_type="application/json")


def _own_json(doc: Any, status: int = 200) -> Response:
    """A JSON answer of the project's own documentation: strict, not redacted (it quotes ``--api-key KEY``)."""
    return Response(dumps(doc).encode("utf-8"), status_code=status, media_type="application/json")


OWN_PAGES = frozenset({"rules.html", "rule.html", "doc.html"})  # the project's documentation: no server data


def wants_json(request: Request, path_param: str = "") -> bool:
    if path_param.endswith(".json"):
        return True
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def target_index(tid: str) -> int | None:
    """``"3"`` or ``"3.json"`` → 3; None for anything else (``²``, 5,000 digits, ``-1``, ``1e3``)."""
    raw = tid.removesuffix(".json")
    if not raw or len(raw) > MAX_ID_DIGITS or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def local_path(path: str) -> str:
    """A path of this server for a redirect: ``//other.host/x`` (or ``/\\other.host``), which a browser
    reads as another site, becomes ``/other.host/x``; anything not starting with ``/`` becomes ``/``."""
    if not path.startswith("/"):
        return "/"
    return "/" + path.lstrip("/\\")


class _Guard:
    """The bearer token (header, cookie, or ``?token=`` once to set the cookie) and the security headers,
    as a plain ASGI wrapper. The token is compared as bytes in constant time, so a header or query value
    in any charset is just a wrong token."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None

    def __getattr__(self, name: str) -> Any:  # the FastAPI app's own attributes (routes, state …)
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.token is not None and scope["path"] != "/healthz":
            answer = self._check(scope)
            if answer is not None:
                await answer(scope, receive, self._with_headers(send))
                return
        await self.app(scope, receive, self._with_headers(send))

    def _check(self, scope: dict[str, Any]) -> Response | None:
        assert self.token is not None
        headers = dict(scope.get("headers") or [])
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        q = query.get("token", [""])[0]
        if q and hmac.compare_digest(q.encode("utf-8", "surrogateescape"), self.token):
            resp = RedirectResponse(local_path(scope["path"]), status_code=303)  # log in once from a browser; the cookie keeps it
            resp.set_cookie(TOKEN_COOKIE, self.token.decode("utf-8"), httponly=True, samesite="strict")
            return resp
        supplied = b""
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            supplied = auth[7:].strip()
        if not supplied and b"cookie" in headers:
            supplied = cookie_parser(headers[b"cookie"].decode("latin-1")).get(TOKEN_COOKIE, "").encode("latin-1", "replace")
        if supplied and hmac.compare_digest(supplied, self.token):
            return None
        return Response(_UNAUTHORISED, status_code=401, media_type="text/plain", headers={"WWW-Authenticate": "Bearer"})

    @staticmethod
    def _with_headers(send: Any) -> Callable[[dict[str, Any]], Any]:
        async def wrapped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *((k, v) for k, v in _HEADERS if k not in have)]
            await send(message)

        return wrapped


Build = Callable[[Any], tuple[bytes, int, str]]  # snapshot → (body, status, media type)


class _Answers:
    """Rendered answers of the current snapshot. Each key is built once per snapshot (concurrent requests
    for it wait for that one build) and kept until the monitor publishes the next one. The keys asked for
    under one snapshot are rebuilt for the next as soon as it is published (:meth:`prebuild`, run by the
    monitor after its tick), so viewers that refresh every interval find their answer ready."""

    def __init__(self, problem: Callable[[], str]) -> None:
        self.problem = problem  # the monitor's health sentence: part of every answer (the banner)
        self.gen: tuple[Any, str, dict[Any, tuple[bytes, int, str]]] = (None, "", {})
        self.recipes: dict[Any, Build] = {}  # key → how to build it, for the keys asked under the last snapshot
        self.asked: set[Any] = set()
        self.locks: dict[Any, asyncio.Lock] = {}
        self.builds = 0

    def _current(self, snap: Any) -> dict[Any, tuple[bytes, int, str]]:
        problem = self.problem()
        g_snap, g_problem, items = self.gen
        if g_snap is not snap or g_problem != problem:
            items = {}
            self.gen = (snap, problem, items)
            self.locks = {}
        return items

    def _build(self, build: Build, snap: Any) -> tuple[bytes, int, str]:
        self.builds += 1
        return build(snap)

    async def get(self, snap: Any, key: Any, build: Build) -> tuple[bytes, int, str]:
        items = self._current(snap)
        if len(self.recipes) < MAX_ANSWERS or key in self.recipes:
            self.recipes[key] = build
            self.asked.add(key)
        hit = items.get(key)
        if hit is not None:
            return hit
        if len(self.locks) >= MAX_ANSWERS:  # an odd flood of distinct keys: answer without keeping
            return self._build(build, snap)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = items.get(key)
            if hit is None:
                hit = self._build(build, snap)
                items[key] = hit
        return hit

    def prebuild(self, snap: Any) -> None:
        """Build, for a snapshot just published, the answers asked for under the previous one (run in the
        monitor's thread; a request that comes first builds its answer itself)."""
        asked, self.asked = self.asked, set()
        items = self._current(snap)
        for key in asked:
            build = self.recipes.get(key)
            if build is None or key in items:
                continue
            try:
                items[key] = self._build(build, snap)
            except Exception:  # noqa: S112 — the request path builds it again and shows the error there
                continue
            if self.gen[2] is not items:  # a newer snapshot came meanwhile
                return
        for key in set(self.recipes) - asked - self.asked:  # not asked for a whole snapshot: forget it
            self.recipes.pop(key, None)


class _Assets:
    """Every file under static/ (subdirectories too), read once at start-up and answered from memory with
    an ETag (mounted at /static, as StaticFiles was; HEAD is answered as GET by :class:`HeadAsGet`)."""

    def __init__(self, root: Path) -> None:
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                ctype = mimetypes.guess_type(p.name)[0] or "application/octet-stream"
                if ctype.startswith("text/") or ctype == "application/javascript":
                    ctype += "; charset=utf-8"
                self.files[p.relative_to(root).as_posix()] = (data, ctype, '"' + hashlib.sha256(data).hexdigest()[:20] + '"')

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        name = path[len(root):] if root and path.startswith(root) else path.removeprefix("/static")
        hit = self.files.get(name.lstrip("/"))
        if hit is None or scope.get("method") not in ("GET", "HEAD"):
            resp = Response("Not Found\n", status_code=404 if hit is None else 405, media_type="text/plain")
        else:
            data, ctype, etag = hit
            headers = {"ETag": etag, "Cache-Control": "no-cache"}  # revalidated: a new version is picked up at once
            inm = dict(scope.get("headers") or []).get(b"if-none-match", b"").decode("latin-1")
            if inm == etag:
                resp = Response(status_code=304, headers=headers)
            else:
                resp = Response(b"" if scope.get("method") == "HEAD" else data, media_type=ctype,
                                headers={**headers, "Content-Length": str(len(data))})
        await resp(scope, receive, send)


def create_app(monitor: Any, *, token: str | None = None, job_requests: int | None = None, title: str = "diagnoser") -> Any:
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True)
    env.globals.update(version=__version__, ranges=list(views.RANGES))
    env.filters.update(markdown=docs_page.html, markdown_inline=docs_page.inline)  # rule docs (web/docs.py)
    registry = make_registry(lambda: monitor.snapshot)
    interval = float(getattr(monitor, "interval", 5.0))

    def health() -> tuple[bool, str]:
        h = getattr(monitor, "health", None)
        return h() if callable(h) else (True, "")

    answers = _Answers(lambda: health()[1])
    listeners = getattr(monitor, "listeners", None)
    if isinstance(listeners, list):
        listeners.append(answers.prebuild)

    def render_page(name: str, ctx: dict[str, Any]) -> bytes:
        ok, problem = health()
        ctx = {"interval": interval, "monitor_problem": problem, **ctx}
        if "doc" in ctx and name not in OWN_PAGES:
            ctx["doc"] = redact_strings(ctx["doc"])
        return env.get_template(name).render(ctx).encode("utf-8")

    def page(request: Request, name: str, ctx: dict[str, Any], status: int = 200) -> Any:
        return HTMLResponse(render_page(name, ctx), status_code=status)

    def with_monitor(doc: dict[str, Any]) -> dict[str, Any]:
        ok, problem = health()
        return {**doc, "monitor": {"healthy": ok, "problem": problem or None}}

    def not_found(request: Any, what: str, as_json: bool) -> Response:
        msg = f"{what} does not exist. Go back to the overview at /."
        if as_json:
            return _json({"error": msg}, 404)
        return HTMLResponse(render_page("error.html", {"message": msg, "title": "Not found"}), status_code=404)

    async def cached(key: Any, build: Build) -> Response:
        try:
            body, status, media = await answers.get(monitor.snapshot, key, build)
        except LookupError:  # the target is not in the snapshot being built
            return not_found(None, "That target", isinstance(key, tuple) and key[0] in ("series", "target.json"))
        return Response(body, status_code=status, media_type=media)

    def html(name: str, ctx: Callable[[Any], dict[str, Any]]) -> Build:
        return lambda snap: (render_page(name, ctx(snap)), 200, "text/html; charset=utf-8")

    def js(doc: Callable[[Any], Any]) -> Build:
        return lambda snap: (_json_bytes(doc(snap)), 200, "application/json")

    def own_js(doc: Callable[[Any], Any]) -> Build:  # the project's documentation: as written
        return lambda snap: (dumps(doc(snap)).encode("utf-8"), 200, "application/json")

    def view(snap: Any, i: int) -> Any:
        """Target ``i`` of a snapshot (a later snapshot may have fewer: then the error page)."""
        if not 0 <= i < len(snap.targets):
            raise LookupError(f"target {i} is gone")
        return snap.targets[i]

    def _target(tid: str) -> Any:
        i = target_index(tid)
        if i is None:
            return None
        snap = monitor.snapshot
        return snap.targets[i] if 0 <= i < len(snap.targets) else None

    @app.get("/healthz")
    async def healthz() -> Response:
        snap = monitor.snapshot
        ok, problem = health()
        doc: dict[str, Any] = {"status": "ok" if ok else "failing", "tick": snap.tick, "targets": len(snap.targets)}
        if not ok:
            doc["problem"] = problem
        return _json(doc, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return await cached("metrics", lambda snap: (render(registry), 200, CONTENT_TYPE))

    @app.get("/", response_class=HTMLResponse)
    @app.get("/index.json")
    async def overview(request: Request) -> Any:
        def doc(snap: Any) -> dict[str, Any]:
            return with_monitor(views.overview_doc(snap, interval))

        if request.url.path.endswith(".json") or wants_json(request):
            return await cached("index.json", js(doc))
        return await cached("index", html("overview.html", lambda snap: {"doc": doc(snap), "title": "Overview"}))

    @app.get("/_/cards", response_class=HTMLResponse)
    async def cards() -> Any:
        return await cached("cards", html("_cards.html", lambda snap: {"doc": views.overview_doc(snap, interval)}))

    @app.get("/target/{tid}/series.json")
    async def series(tid: str, range: str = "1h", points: int = 600) -> Response:  # noqa: A002
        t = _target(tid)
        if t is None:
            return _json({"error": f"target {tid[:40]} does not exist."}, 404)
        span = views.RANGES.get(range)
        if span is None:
            return _json({"error": f"range {range[:40]!r} is not one of {', '.join(views.RANGES)}."}, 400)
        n, i = max(50, min(points, 2000)), t.index
        return await cached(("series", i, range, n), js(lambda snap: views.series_doc(monitor, view(snap, i), span, n, snap)))

    @app.get("/_/target/{tid}", response_class=HTMLResponse)
    async def target_panels(tid: str) -> Any:
        t = _target(tid)
        if t is None:
            return not_found(None, f"Target {tid[:40]}", False)
        i = t.index
        return await cached(("panels", i), html("_target_panels.html",
                                                lambda snap: {"doc": views.target_doc(snap, view(snap, i), monitor, job_requests)}))

    @app.get("/target/{tid}", response_class=HTMLResponse)
    async def target(request: Request, tid: str) -> Any:
        as_json = wants_json(request, tid)
        t = _target(tid)
        if t is None:
            return not_found(request, f"Target {tid.removesuffix('.json')[:40]}", as_json)
        i = t.index

        def doc(snap: Any) -> dict[str, Any]:
            return with_monitor(views.target_doc(snap, view(snap, i), monitor, job_requests))

        if as_json:
            return await cached(("target.json", i), js(doc))

        def ctx(snap: Any) -> dict[str, Any]:
            d = doc(snap)
            return {"doc": d, "title": d["name"]}

        return await cached(("target", i), html("target.html", ctx))

    @app.get("/rules", response_class=HTMLResponse)
    @app.get("/rules.json")
    async def rules(request: Request) -> Any:
        if request.url.path.endswith(".json") or wants_json(request):
            return await cached("rules.json", own_js(lambda snap: views.rules_doc()))
        return await cached("rules", html("rules.html", lambda snap: {"doc": views.rules_doc(), "title": "Rules"}))

    @app.get("/rules/{name}", response_class=HTMLResponse)
    async def rule(request: Request, name: str) -> Any:
        as_json = wants_json(request, name)
        doc = views.rule_doc(name.removesuffix(".json"))
        if doc is None:
            return not_found(request, f"Rule {name.removesuffix('.json')[:60]}", as_json)
        if as_json:
            return await cached(("rule.json", doc["name"]), own_js(lambda snap: doc))
        return await cached(("rule", doc["name"]), html("rule.html", lambda snap: {"doc": doc, "title": doc["name"]}))

    app.include_router(fleet_page.router(monitor, page, _json))  # /fleet: sort, filter, paginate (fleet.py)
    app.include_router(docs_page.router(page, _own_json, not_found))  # /docs/sglang (web/docs.py)
    app.mount("/static", _Assets(HERE / "static"), name="static")
    app.add_middleware(HeadAsGet)  # HEAD answers on every GET route (head.py), behind the same token check
    guard = _Guard(app, token)
    guard.fastapi, guard.answers = app, answers  # type: ignore[attr-defined]
    return guard


__all__ = ["TOKEN_COOKIE", "create_app", "local_path", "target_index", "wants_json"]
