"""The dashboard as an SRE meets it, in real Chromium (playwright-core driving Debian's /usr/bin/chromium)
against a live ``diagnose serve`` polling a loopback server that serves REAL SGLang 0.5.23 scrapes
(tests/data/sglang-cpu-real/kv-full-retract: the KV pool is full, requests queue and retract).

Covers issue 19's acceptance: an overview card shows the top suggestion (flag current → proposed and its
effect); the target page leads with the verdict and the top fixes, charts below; a live refresh keeps an
opened ``<details>`` open (and a closed one closed, the scroll position and the chart zoom); no horizontal
scroll at 390 px (and 360 px), laid out at 1280 px; charts with 1-2-5 ticks, hover values, a second axis
for ITL in ms, UTC times and bands where findings fired. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.browser.samples_server import SampleServer
from tests.browser.serve_proc import Serve, need_binary
from tests.helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

PAGES = ["/", "/target/0", "/rules", "/rules/kv_saturation", "/fleet"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need_binary("chromium", CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    work = tmp_path_factory.mktemp("layout")
    with SampleServer(data_dir, "kv-full-retract") as srv:
        serve = Serve(["--url", srv.url, "--interval", "1", "--for", "0", "--window", "8s", "--timeout", "2"], work / "serve.log")
        try:
            serve.wait_for(lambda: (serve.get("/index.json").json()["targets"][0].get("top_fix") or {}).get("flag"),
                           timeout=40, what="a top fix on the target")
            yield serve
        finally:
            serve.close()


def new_page(browser: Any, width: int) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    return page, problems


def until(page: Any, js: str, timeout: float = 20.0, what: str = "") -> Any:
    """Poll ``js`` (an expression) from the test side: the page's CSP (no eval) stays on, so Playwright's
    in-page polling of wait_for_function cannot be used."""
    deadline = time.monotonic() + timeout
    while True:
        got = page.evaluate(f"() => {js}")
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or js}")
        time.sleep(0.1)


def wait_refreshes(page: Any, n: int = 2, timeout: float = 20.0) -> None:
    """Wait until the live script has morphed ``n`` more fragment answers into the page."""
    page.evaluate("() => { window.__refreshed = 0; document.addEventListener('diagnoser:refreshed', () => window.__refreshed++); }")
    until(page, f"window.__refreshed >= {n}", timeout, f"{n} live refreshes")


@pytest.mark.parametrize("width", [1280, 390])
def test_card_shows_the_top_suggestion(browser: Any, served: Serve, artifacts: Path, width: int) -> None:
    page, problems = new_page(browser, width)
    page.goto(served.base + "/")
    fix = page.locator('article.card[data-target="0"] .card-fix')
    fix.wait_for(timeout=20_000)
    flag = fix.locator(".change code").inner_text()
    api = served.get("/index.json").json()["targets"][0]["top_fix"]
    assert flag.startswith("--") and flag == fix.get_attribute("data-flag")
    assert api["flag"] in ("--max-total-tokens", "--mem-fraction-static", "--schedule-conservativeness", "--max-running-requests")
    assert fix.locator(".change strong").inner_text().strip()  # the proposed value
    assert fix.locator(".change .cur").inner_text().strip()  # the current value
    effect = fix.locator(".effect").inner_text()
    assert len(effect) > 20 and "Assumes" not in effect, effect  # one line: the effect, not its assumptions
    assert "Top fix" in fix.text_content() and "kv_" in fix.text_content()  # names the finding it fixes
    # the card leads with the fix: it comes before the numbers and the list of findings
    order = page.evaluate("""() => [...document.querySelector('article.card[data-target="0"]').children].map(e => e.className)""")
    assert order.index("card-fix") < order.index("nums") < order.index("findings"), order
    page.screenshot(path=str(artifacts / f"layout-overview-{width}.png"), full_page=True)
    assert problems == [], problems
    page.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_target_page_leads_with_verdict_and_fixes_charts_below(browser: Any, served: Serve, artifacts: Path, width: int) -> None:
    page, problems = new_page(browser, width)
    page.goto(served.base + "/target/0")
    until(page, "+(document.querySelector('figure[data-chart=\"batch\"]') || {getAttribute: () => 0}).getAttribute('data-points') > 2")
    top = lambda sel: page.locator(sel).first.bounding_box()["y"]  # noqa: E731
    assert top("#top .verdict") < top("#top ol.fixes") < top("#charts") < top("#panels .finding")
    if width == 1280:  # the verdict and the first fix are above the fold
        box = page.locator("#top ol.fixes > li").first.bounding_box()
        assert box["y"] + box["height"] < 900
    verdict = page.locator("#top .verdict").inner_text()
    assert "kv_" in verdict and "finding" in verdict  # the lead finding, and how many more
    fixes = page.locator("#top ol.fixes > li")
    assert fixes.count() >= 1
    first = fixes.first
    assert first.locator("code").inner_text().startswith("--")
    assert first.locator(".chips li").count() >= 1  # its projection, in numbers
    # the card's fix is the page's first fix
    card_flag = served.get("/index.json").json()["targets"][0]["top_fix"]["flag"]
    assert first.get_attribute("data-flag") == card_flag
    # every assumption is stated once per suggestion (the effect no longer repeats them)
    for li in page.locator("#panels ol.suggestions > li").all():
        assumes = li.locator(".assume li").all_inner_texts() or [t.removeprefix("Assumes: ") for t in li.locator(".assume").all_inner_texts()]
        text = li.inner_text()
        for a in assumes:
            assert text.count(a.strip()) == 1, f"assumption repeated: {a!r} in {text!r}"
    page.screenshot(path=str(artifacts / f"layout-target-{width}.png"), full_page=True)
    assert problems == [], problems
    page.close()


def test_refresh_keeps_the_readers_state(browser: Any, served: Serve, artifacts: Path) -> None:
    page, problems = new_page(browser, 1280)
    page.goto(served.base + "/target/0")
    page.wait_for_selector("#panels details#config-other", timeout=20_000)
    # a projection of the replay's lasting bottleneck (other findings come and go as the replay runs)
    stable = '#panels details.proj[id^="proj-kv_saturation"]'
    page.wait_for_selector(stable, timeout=20_000)
    before = page.evaluate("() => [...document.querySelectorAll('#panels details')].map(d => [d.id, d.open])")
    # the reader opens the long config list and one projection, closes one evidence table, scrolls
    page.click("#panels details#config-other > summary")
    proj = page.locator(stable).first
    proj_id = proj.get_attribute("id")
    proj.locator("summary").click()
    ev = page.locator("#panels details#ev-kv_saturation")
    ev_id = ev.get_attribute("id")
    ev.locator("summary").click()
    page.evaluate("() => { document.querySelector('#config-other').__mine = 1; }")  # the same element after a refresh
    # the reader scrolls down to the settings they opened
    page.evaluate("() => { const d = document.querySelector('#config-other'); window.scrollTo(0, d.getBoundingClientRect().top + window.scrollY - 150); }")
    page.wait_for_timeout(300)
    assert page.evaluate("window.scrollY") > 300
    seen = page.evaluate("document.querySelector('#config-other').getBoundingClientRect().top")
    tick = page.locator("#top .verdict").get_attribute("data-tick")
    wait_refreshes(page, 3)
    assert page.locator("#top .verdict").get_attribute("data-tick") != tick  # the fragment did change
    state = dict(page.evaluate("() => [...document.querySelectorAll('#panels details')].map(d => [d.id, d.open])"))
    assert state["config-other"] is True, state
    assert state[proj_id] is True, state
    assert state[ev_id] is False, state  # closed by the reader, although the server renders it open
    opened_by_refresh = [i for i, o in state.items() if o and i not in ("config-other", proj_id) and dict(before).get(i) is False]
    assert opened_by_refresh == [], f"the refresh opened {opened_by_refresh}"
    assert page.evaluate("document.querySelector('#config-other').__mine") == 1  # morphed, not replaced
    # what the reader looks at stays put on screen (the browser's scroll anchoring may move scrollY when
    # text above rewraps; the reader sees no jump)
    assert abs(page.evaluate("document.querySelector('#config-other').getBoundingClientRect().top") - seen) < 5
    page.screenshot(path=str(artifacts / "layout-target-state-kept.png"))
    assert problems == [], problems
    page.close()


def test_chart_zoom_survives_refresh_and_double_click_resets(browser: Any, served: Serve) -> None:
    page, problems = new_page(browser, 1280)
    page.goto(served.base + "/target/0")
    until(page, "document.querySelector('#charts').getAttribute('data-view')")
    page.wait_for_timeout(6000)  # a few seconds of history to zoom into
    over = page.locator('figure[data-chart="gen"] .u-over')
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2, steps=8)
    page.mouse.up()
    until(page, "document.querySelector('#charts').getAttribute('data-zoomed') === 'yes'", 5, "the zoom")
    view = page.locator("#charts").get_attribute("data-view")
    assert page.locator("#unzoom").is_visible()
    drawn = page.locator("#charts").get_attribute("data-drawn")
    until(page, f"document.querySelector('#charts').getAttribute('data-drawn') !== '{drawn}'", 10, "a chart refresh")
    page.wait_for_timeout(300)
    assert page.locator("#charts").get_attribute("data-view") == view  # new data, same zoom
    # every chart shows the same window
    ticks = [json.loads(f.get_attribute("data-ticks"))["0"]["splits"] for f in page.locator("figure.chart").all()]
    assert all(t == ticks[0] for t in ticks), ticks
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    until(page, "document.querySelector('#charts').getAttribute('data-zoomed') === 'no'", 5, "the zoom reset")
    assert not page.locator("#unzoom").is_visible()
    lo, hi = (float(x) for x in page.locator("#charts").get_attribute("data-view").split(","))
    zlo, zhi = (float(x) for x in view.split(","))
    assert hi - lo > zhi - zlo
    assert problems == [], problems
    page.close()


def _is_125(step: float) -> bool:
    m = step / 10 ** math.floor(math.log10(step) + 1e-12)
    return any(abs(m - k) < 1e-6 for k in (1, 2, 5, 10))


def test_charts_ticks_hover_second_axis_utc_and_finding_bands(browser: Any, served: Serve, artifacts: Path) -> None:
    page, problems = new_page(browser, 1280)
    page.goto(served.base + "/target/0")
    until(page, "+(document.querySelector('figure[data-chart=\"latency\"]') || {getAttribute: () => 0}).getAttribute('data-points') > 2")
    until(page, "+document.querySelector('figure[data-chart=\"batch\"]').getAttribute('data-bands') >= 1", 30, "a finding band")
    for fig in page.locator("figure.chart").all():
        ticks = json.loads(fig.get_attribute("data-ticks"))
        y = ticks["1"]
        steps = {round(b - a, 9) for a, b in zip(y["splits"], y["splits"][1:], strict=False)}
        assert len(steps) == 1 and _is_125(steps.pop()), (fig.get_attribute("data-chart"), y)
        assert all(re.fullmatch(r"-?[\d.]+[kM]?", lab) for lab in y["labels"]), y["labels"]
        x = ticks["0"]
        for t, lab in zip(x["splits"], x["labels"], strict=True):  # the clock is UTC, like the evidence
            d = datetime.fromtimestamp(t, UTC)
            assert lab in (d.strftime("%H:%M"), d.strftime("%H:%M:%S")), (lab, d)
    # ITL in ms on its own right-hand axis beside TTFT in seconds
    lat = page.locator('figure[data-chart="latency"]')
    assert lat.get_attribute("data-axes") == "y:s,y2:ms"
    assert "2" in json.loads(lat.get_attribute("data-ticks"))
    # findings fired: a band on the charts and a line naming them
    assert int(page.locator('figure[data-chart="batch"]').get_attribute("data-bands")) >= 1
    marks = page.locator("#marks-legend").inner_text()
    assert "kv_saturation" in marks and "since" in marks and "UTC" in page.locator(".hint").inner_text()
    # hover: the legend reads the series at the cursor, with its UTC time
    legend = page.locator('figure[data-chart="batch"] .u-legend')
    assert "(latest)" in legend.inner_text()
    over = page.locator('figure[data-chart="batch"] .u-over')
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.5)
    page.wait_for_timeout(200)
    text = legend.inner_text()
    assert "(latest)" not in text and re.search(r"\d\d:\d\d:\d\d", text) and re.search(r"running:?\s*\d", text), text
    # the cursor is synced: the latency chart's legend reads the same moment
    assert re.search(r"\d\d:\d\d:\d\d", lat.locator(".u-legend").inner_text())
    page.screenshot(path=str(artifacts / "layout-charts-hover.png"), full_page=False, clip={"x": 0, "y": box["y"] - 60, "width": 1280, "height": 700})
    assert problems == [], problems
    page.close()


@pytest.mark.parametrize("width", [390, 360, 1280])
def test_no_horizontal_scroll(browser: Any, served: Serve, artifacts: Path, width: int) -> None:
    page, problems = new_page(browser, width)
    for path in PAGES:
        page.goto(served.base + path)
        page.wait_for_timeout(1500 if path == "/target/0" else 300)
        if path == "/target/0":
            page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")  # the widest content too
            page.wait_for_timeout(200)
        sw = page.evaluate("document.documentElement.scrollWidth")
        assert sw <= width, f"{path} is {sw} px wide at {width} px"
        wide = page.evaluate(f"""() => [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > {width} + 1
                                   && !e.closest('.fleet-table')).slice(0, 5).map(e => e.tagName + '.' + e.className)""")
        assert wide == [], f"{path}: elements past the right edge at {width} px: {wide}"
    if width == 390:
        page.goto(served.base + "/target/0")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(artifacts / "layout-target-390-first-screen.png"))
    assert problems == [], problems
    page.close()
