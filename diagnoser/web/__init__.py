"""The web dashboard for ``diagnose serve`` (FastAPI + Jinja2; assets under ``static/``)."""

from __future__ import annotations

from typing import Any


def create_app(monitor: Any, **kw: Any) -> Any:
    from diagnoser.web.app import create_app as _create

    return _create(monitor, **kw)


__all__ = ["create_app"]
