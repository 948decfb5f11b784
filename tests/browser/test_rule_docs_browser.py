"""The rendered docs in a real browser (Debian Chromium driven by Playwright) against a real ``diagnose
serve``: every rule page shows its doc as headings, lists, code and links (not a ``<pre>`` of the
docstring), a reference link leads to its section of /docs/sglang, and hostile Markdown stays inert text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnoser.outputs import docmd
from diagnoser.rules import REGISTRY
from diagnoser.rules.base import DOC_HEADINGS
from tests.browser.serve_proc import Serve, free_port, need_binary
from tests.helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

HOSTILE = """Text <script>alert('inline')</script> and <img src=x onerror="alert('img')">.

- [a javascript: link](javascript:alert('js')) and [quoted](https://example.com/"onmouseover="alert('q'))
- `<script>alert('code')</script>` **<b onclick="alert('bold')">b</b>**

| <svg onload="alert('svg')"> | x |
|---|---|
| <iframe src="javascript:alert('frame')"></iframe> | y |
"""


@pytest.fixture(scope="module")
def browser() -> Any:
    need_binary("chromium", CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Any:
    dead = f"http://127.0.0.1:{free_port()}"  # the doc pages need no live target
    s = Serve(["--url", dead, "--interval", "5", "--timeout", "1"], tmp_path_factory.mktemp("serve") / "serve.log")
    yield s
    s.close()


def test_every_rule_page_renders_its_doc(browser: Any, serve: Any, artifacts: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for rule in REGISTRY:
        page.goto(f"{serve.base}/rules/{rule.name}")
        heads = page.locator("article.ruledoc section h2").all_inner_texts()
        lead = ["Summary", "Fix", "What it detects"]  # the page leads with the fix (test_honest_numbers.py)
        assert heads[: 1 + len(DOC_HEADINGS)] == lead + [h for h in DOC_HEADINGS if h not in lead], (rule.name, heads)
        assert page.locator("pre.doctext").count() == 0
        text = page.locator("article.ruledoc").inner_text()
        for markup in ("``", "](", "**", ":attr:", "<a id"):
            assert markup not in text, (rule.name, markup)
        refs = page.locator('section[data-section="References"]')
        assert refs.locator("ul > li").count() >= 1
        internal = refs.locator('a[href^="/docs/sglang#"]')
        assert internal.count() >= 1, rule.name
        assert page.locator("article.ruledoc code").count() >= 1
        # code spans are styled as code (the stylesheet of the doc pages is loaded)
        font = page.locator("article.ruledoc code").first.evaluate("e => getComputedStyle(e).fontFamily")
        assert "mono" in font.lower(), font
    page.goto(f"{serve.base}/rules/kv_saturation")
    page.screenshot(path=str(artifacts / "rule-doc-kv_saturation.png"), full_page=True)

    # a reference link opens its section of the SGLang notes, which exists and is scrolled to
    link = page.locator('section[data-section="References"] a[href="/docs/sglang#decode-line"]').first
    link.click()
    page.wait_for_url(f"{serve.base}/docs/sglang#decode-line")
    target = page.locator("#decode-line")
    assert target.count() == 1 and target.evaluate("e => e.tagName") == "H3"
    assert "Decode batch" in target.inner_text()
    top = target.evaluate("e => e.getBoundingClientRect().top")
    assert 0 <= top < 200, top  # the browser scrolled to it
    assert page.locator("article.docpage table").count() >= 10 and page.locator("article.docpage pre code").count() >= 2
    assert page.locator("article.docpage h2").count() >= 12
    page.screenshot(path=str(artifacts / "docs-sglang.png"))
    # the catalogue renders the summaries' code spans
    page.goto(f"{serve.base}/rules")
    assert page.locator("table.rules td.md code").count() >= 1 and "`" not in page.locator("table.rules").inner_text()
    assert errors == [], errors
    page.close()


def test_hostile_markdown_renders_as_inert_text(browser: Any, serve: Any) -> None:
    """The renderer's HTML in a real browser: nothing from the source runs, every tag shows as text."""
    page = browser.new_page(bypass_csp=True)  # the escaping alone must keep it inert (the CSP is a second wall)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{serve.base}/rules")  # same origin and stylesheet as the served pages
    page.evaluate("html => { document.querySelector('main').innerHTML = html; }", docmd.to_html(HOSTILE))
    page.wait_for_timeout(300)
    main = page.locator("main")
    for tag in ("script", "img", "svg", "iframe", "b[onclick]"):
        assert main.locator(tag).count() == 0, tag
    text = main.inner_text()
    assert "<script>alert('inline')</script>" in text and "<iframe" in text and "<svg" in text
    hrefs = main.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert all(h.startswith("https://") for h in hrefs), hrefs
    for a in main.locator("a").all():
        assert a.get_attribute("onmouseover") is None
    main.locator("a").first.hover()
    page.wait_for_timeout(200)
    assert dialogs == [], dialogs
    page.close()
