"""Rendered docs in ``diagnose serve``: the rule pages' Markdown (Jinja filters ``markdown`` and
``markdown_inline``) and the project's SGLang notes at ``/docs/sglang`` (``docs/sglang.md``; JSON twin
``/docs/sglang.json``), which the rule docs link to.

Only the pages named in :data:`PAGES` are served, from the package (a wheel carries a copy, see setup.py)
or from the checkout beside it; no path comes from the visitor. Every character of a doc is escaped by
:mod:`diagnoser.outputs.docmd`; links to other schemes than http(s) are never made.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from diagnoser.outputs import docmd

HERE = Path(__file__).resolve().parent
PAGES = {"sglang": "sglang.md"}
# where a page is looked for: the copy inside the package (wheels), then the checkout's docs/
SEARCH = (HERE / "docs", HERE.parent.parent / "docs")


def web_link(target: str) -> str | None:
    """A doc's link target as the web app serves it: ``docs/sglang.md#decode-line`` → ``/docs/sglang#decode-line``, rules.md →
    /rules; repository paths with no page here are not linked (shown as text)."""
    if target.startswith(("https://", "http://", "#")):
        return target
    path, _, frag = target.partition("#")
    path = path.removeprefix("docs/")
    frag = f"#{frag}" if frag else ""
    for name, file in PAGES.items():
        if path == file:
            return f"/docs/{name}{frag}"
    if path == "rules.md":
        return f"/rules{frag}" if not frag else f"/rules/{frag[1:]}"
    return None


def html(text: str, heading_offset: int = 0) -> Markup:
    return Markup(docmd.to_html(text, web_link, heading_offset))  # noqa: S704 (docmd escapes every character)


def inline(text: str) -> Markup:
    return Markup(docmd.inline_html(text, web_link))  # noqa: S704 (docmd escapes every character)


def page_path(name: str) -> Path | None:
    file = PAGES.get(name)
    if file is None:
        return None
    return next((base / file for base in SEARCH if (base / file).is_file()), None)


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    blocks = docmd.parse(text)
    title = next((docmd.inline_text(b.text) for b in blocks if b.kind == "heading"), path.stem)
    toc = [{"id": b.anchor or docmd.slug(b.text), "title": docmd.inline_text(b.text), "level": b.level}
           for b in blocks if b.kind == "heading" and b.level == 2]
    return {"title": title, "markdown": text, "anchors": docmd.anchors(text), "toc": toc, "html": docmd.to_html(text, web_link)}


def doc_page(name: str) -> dict[str, Any] | None:
    path = page_path(name)
    if path is None:
        return None
    return _load(path, path.stat().st_mtime)


def router(page: Any, as_json: Any, not_found: Any) -> APIRouter:
    r = APIRouter()

    @r.get("/docs/{name}", response_class=HTMLResponse)
    def docs(request: Request, name: str) -> Any:
        want_json = name.endswith(".json") or "application/json" in request.headers.get("accept", "") and "text/html" not in request.headers.get("accept", "")
        key = name.removesuffix(".json")
        doc = doc_page(key)
        if doc is None and key in PAGES:
            msg = (f"The doc page {key!r} is not installed with this copy of diagnoser; read docs/{PAGES[key]} in the "
                   "project's repository, or reinstall from a checkout (pip install .).")
            return as_json({"error": msg}, 404) if want_json else page(request, "error.html", {"message": msg, "title": "Not found"}, 404)
        if doc is None:
            return not_found(request, f"The doc page {key!r}", want_json)
        if want_json:
            return as_json({k: doc[k] for k in ("title", "markdown", "anchors", "toc")})
        return page(request, "doc.html", {"doc": {**doc, "html": Markup(doc["html"])}, "title": doc["title"]})  # noqa: S704

    return r
