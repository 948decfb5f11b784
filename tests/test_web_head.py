"""HEAD answers on every GET route as GET does, without the body (RFC 9110 §9.3.2): ``HEAD /healthz`` is 200,
not 405. The app runs over a replay of a real recording (examples/kv-full-retract.dgb, built from the
SGLang 0.5.23 CPU run in tests/data/sglang-cpu-real/kv-full-retract)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Route

from diagnoser.engines import get_adapter
from diagnoser.live import ReplayMonitor
from diagnoser.replay import ReplayFeed
from diagnoser.web import create_app
from tests.conftest import ROOT

PARAMS = {"tid": "0", "name": "kv_saturation"}


@pytest.fixture(scope="module")
def monitor() -> Iterator[Any]:
    feed = ReplayFeed(str(ROOT / "examples" / "kv-full-retract.dgb"), speed=1000, loop=False)
    m = ReplayMonitor(feed, get_adapter("sglang"), interval=0.1, for_seconds=0, window_s=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not m.tick().firing():
        time.sleep(0.05)
    yield m
    m.close()


def get_paths(app: Any) -> list[str]:
    out = []
    for r in app.routes:
        if isinstance(r, Route) and "GET" in (r.methods or ()):
            path = r.path
            for k, v in PARAMS.items():
                path = path.replace("{" + k + "}", v)
            assert "{" not in path, f"no test value for a parameter of {r.path}"
            out.append(path)
    return out


def test_head_answers_like_get_on_every_get_route(monitor: Any) -> None:
    app = create_app(monitor)
    c = TestClient(app)
    paths = get_paths(app) + ["/fleet", "/static/style.css", "/target/0.json", "/rules/kv_saturation.json"]
    assert {"/healthz", "/", "/target/0", "/metrics", "/rules"} <= set(paths)
    for p in paths:
        g, h = c.get(p), c.head(p)
        assert h.status_code == g.status_code, (p, h.status_code, g.status_code)
        assert g.status_code in (200, 303), p
        assert h.content == b"", f"HEAD {p} sent a body"
        assert h.headers.get("content-type") == g.headers.get("content-type"), p
        assert h.headers.get("content-security-policy") == g.headers.get("content-security-policy"), p
    assert c.head("/healthz").status_code == 200
    assert c.head("/target/99").status_code == 404  # a missing page stays missing
    assert c.request("DELETE", "/healthz").status_code == 405  # only HEAD is added, no other method


def test_head_goes_through_the_token_check(monitor: Any) -> None:
    c = TestClient(create_app(monitor, token="s3cret-token"))
    assert c.head("/healthz").status_code == 200  # liveness stays open, as for GET
    r = c.head("/index.json")
    assert r.status_code == 401 and r.content == b""
    assert c.head("/index.json", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
