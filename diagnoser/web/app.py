"""The ``diagnose serve`` web app: FastAPI + Jinja2 over a :class:`diagnoser.live.LiveMonitor`.

Pages (each has a JSON twin: ``/path.json`` or ``Accept: application/json``):
    /                     overview, one card per target          (/index.json)
    /target/N             charts, findings, suggestions, config   (/target/N.json; chart data /target/N/series.json)
    /rules, /rules/NAME   rule docs from the catalogue            (/rules.json, /rules/NAME.json)
    /docs/sglang          how diagnoser reads SGLang (docs/sglang.md) (/docs/sglang.json)
    /metrics              Prometheus exporter; /healthz liveness

No endpoint takes a URL from the visitor: the targets are fixed at start-up. All assets are served from
``static/``; the Content-Security-Policy forbids anything else (and inline scripts).
"""

from __future__ import annotations

import hmac
import json
import math
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from diagnoser import __version__
from diagnoser.outputs.exporter import CONTENT_TYPE, make_registry, render
from diagnoser.web import docs as docs_page
from diagnoser.web import fleet as fleet_page
from diagnoser.web import views
from diagnoser.web.head import HeadAsGet

HERE = Path(__file__).resolve().parent
CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
TOKEN_COOKIE = "diagnoser_token"


def _json(doc: Any, status: int = 200) -> Response:
    body = json.dumps(doc, default=str, allow_nan=False) if _finite_ok(doc) else json.dumps(_clean(doc), default=str)
    return Response(body, status_code=status, media_type="application/json")


def _finite_ok(doc: Any) -> bool:
    try:
        json.dumps(doc, default=str, allow_nan=False)
        return True
    except ValueError:
        return False


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def wants_json(request: Request, path_param: str = "") -> bool:
    if path_param.endswith(".json"):
        return True
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def create_app(monitor: Any, *, token: str | None = None, job_requests: int | None = None, title: str = "diagnoser") -> FastAPI:
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescape on for .html
    templates.env.globals.update(version=__version__, ranges=list(views.RANGES))
    templates.env.filters.update(markdown=docs_page.html, markdown_inline=docs_page.inline)  # rule docs (web/docs.py)
    registry = make_registry(lambda: monitor.snapshot)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    interval = float(getattr(monitor, "interval", 5.0))

    @app.middleware("http")
    async def security(request: Request, call_next: Any) -> Any:
        if token and request.url.path != "/healthz":
            supplied = ""
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                supplied = auth[7:].strip()
            supplied = supplied or request.cookies.get(TOKEN_COOKIE, "")
            q = request.query_params.get("token")
            if q and hmac.compare_digest(q, token):  # log in once from a browser; the cookie keeps it
                resp: Any = RedirectResponse(request.url.path, status_code=303)
                resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
                return resp
            if not (supplied and hmac.compare_digest(supplied, token)):
                return Response("Unauthorised: pass 'Authorization: Bearer <token>' (the --token given to diagnose serve), or open /?token=<token> once.\n",
                                status_code=401, media_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
        resp = await call_next(request)
        resp.headers.setdefault("Content-Security-Policy", CSP)
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        return resp

    def page(request: Request, name: str, ctx: dict[str, Any], status: int = 200) -> Any:
        ctx = {"interval": interval, **ctx}
        return templates.TemplateResponse(request, name, ctx, status_code=status)

    def not_found(request: Request, what: str, as_json: bool) -> Any:
        msg = f"{what} does not exist. Go back to the overview at /."
        if as_json:
            return _json({"error": msg}, 404)
        return page(request, "error.html", {"message": msg, "title": "Not found"}, 404)

    def _target(tid: str) -> Any:
        raw = tid.removesuffix(".json")
        if not raw.isdigit():
            return None
        i = int(raw)
        snap = monitor.snapshot
        return snap.targets[i] if 0 <= i < len(snap.targets) else None

    @app.get("/healthz")
    def healthz() -> Response:
        snap = monitor.snapshot
        return _json({"status": "ok", "tick": snap.tick, "targets": len(snap.targets)})

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse)
    @app.get("/index.json")
    def overview(request: Request) -> Any:
        doc = views.overview_doc(monitor.snapshot, interval)
        if request.url.path.endswith(".json") or wants_json(request):
            return _json(doc)
        return page(request, "overview.html", {"doc": doc, "title": "Overview"})

    @app.get("/_/cards", response_class=HTMLResponse)
    def cards(request: Request) -> Any:
        return page(request, "_cards.html", {"doc": views.overview_doc(monitor.snapshot, interval)})

    @app.get("/target/{tid}/series.json")
    def series(tid: str, range: str = "1h", points: int = 600) -> Response:  # noqa: A002
        t = _target(tid)
        if t is None:
            return _json({"error": f"target {tid} does not exist."}, 404)
        span = views.RANGES.get(range)
        if span is None:
            return _json({"error": f"range {range!r} is not one of {', '.join(views.RANGES)}."}, 400)
        return _json(views.series_doc(monitor, t, span, max(50, min(points, 2000))))

    @app.get("/_/target/{tid}", response_class=HTMLResponse)
    def target_panels(request: Request, tid: str) -> Any:
        t = _target(tid)
        if t is None:
            return not_found(request, f"Target {tid}", False)
        return page(request, "_target_panels.html", {"doc": views.target_doc(monitor.snapshot, t, monitor, job_requests)})

    @app.get("/target/{tid}", response_class=HTMLResponse)
    def target(request: Request, tid: str) -> Any:
        as_json = wants_json(request, tid)
        t = _target(tid)
        if t is None:
            return not_found(request, f"Target {tid.removesuffix('.json')}", as_json)
        doc = views.target_doc(monitor.snapshot, t, monitor, job_requests)
        if as_json:
            return _json(doc)
        return page(request, "target.html", {"doc": doc, "title": doc["name"]})

    @app.get("/rules", response_class=HTMLResponse)
    @app.get("/rules.json")
    def rules(request: Request) -> Any:
        doc = views.rules_doc()
        if request.url.path.endswith(".json") or wants_json(request):
            return _json(doc)
        return page(request, "rules.html", {"doc": doc, "title": "Rules"})

    @app.get("/rules/{name}", response_class=HTMLResponse)
    def rule(request: Request, name: str) -> Any:
        as_json = wants_json(request, name)
        doc = views.rule_doc(name.removesuffix(".json"))
        if doc is None:
            return not_found(request, f"Rule {name.removesuffix('.json')}", as_json)
        if as_json:
            return _json(doc)
        return page(request, "rule.html", {"doc": doc, "title": doc["name"]})

    app.include_router(fleet_page.router(monitor, page, _json))  # /fleet: sort, filter, paginate (fleet.py)
    app.include_router(docs_page.router(page, _json, not_found))  # /docs/sglang (web/docs.py)
    app.add_middleware(HeadAsGet)  # HEAD answers on every GET route (head.py), behind the same token check
    return app
