"""The dashboard in a real browser (Debian Chromium driven by Playwright) against a live ``diagnose serve``
polling a loopback server that serves REAL SGLang 0.5.23 scrapes (sglang-cpu-real runs).

Covers: overview and target pages render and the charts draw; a finding appears (KV-full scrapes) and
later resolves (client-bound scrapes) without reloading the page; a ``<script>`` model name stays inert;
a planted api_key never reaches the page; a dead target shows ``source_unreachable`` while the live one
keeps updating; screenshots are saved to test-artifacts/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.samples_server import SampleServer
from tests.browser.serve_proc import SECRET, XSS, Serve, free_port, need_binary
from tests.helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser



@pytest.fixture(scope="module")
def browser() -> Any:
    need_binary("chromium", CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_dashboard_live_finding_xss_and_down_target(browser: Any, data_dir: Path, artifacts: Path, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with SampleServer(data_dir, "kv-full-retract", model_name=XSS, api_key=SECRET) as srv:
        serve = Serve(["--url", srv.url, "--url", dead, "--interval", "1", "--for", "0", "--window", "6s", "--timeout", "2"],
                      tmp_path / "serve.log")
        try:
            # bypass_csp: prove the escaping alone keeps the payload inert (the CSP is a second wall)
            page = browser.new_page(viewport={"width": 1360, "height": 1000}, bypass_csp=True)
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            external: list[str] = []
            page.on("request", lambda r: external.append(r.url) if not r.url.startswith(serve.base) and not r.url.startswith("data:") else None)

            # overview: both cards, the dead one with source_unreachable, the live one with numbers
            page.goto(serve.base + "/")
            page.wait_for_selector('article.card[data-target="1"] li[data-rule="source_unreachable"]', timeout=20_000)
            page.wait_for_selector('article.card[data-target="0"] li[data-rule="kv_saturation"]', timeout=30_000)
            live_card = page.locator('article.card[data-target="0"]')
            assert "running" in live_card.inner_text() and "KV usage" in live_card.inner_text()
            assert page.locator('article.card[data-target="1"] .badge').inner_text().lower() == "down"
            # the XSS payload is shown as text, never run
            assert XSS in live_card.locator(".model").inner_text()
            scripts = page.evaluate("[...document.querySelectorAll('script')].map(s => s.getAttribute('src'))")
            assert scripts == ["/static/vendor/idiomorph.min.js", "/static/app.js"], scripts  # only the app's own files
            page.screenshot(path=str(artifacts / "dashboard-overview.png"), full_page=True)

            # target page: charts draw real points; findings with evidence below
            page.goto(serve.base + "/target/0")
            page.wait_for_function("document.querySelector('figure[data-chart=\"batch\"]') && +document.querySelector('figure[data-chart=\"batch\"]').getAttribute('data-points') > 2", timeout=20_000)
            for chart in ("batch", "usage", "gen"):
                pts = int(page.locator(f'figure[data-chart="{chart}"]').get_attribute("data-points") or 0)
                assert pts > 2, f"chart {chart} drew {pts} points"
            # the canvas really has ink on it (not blank)
            inked = page.evaluate("""() => { const c = document.querySelector('figure[data-chart="usage"] canvas');
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
                for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }""")
            assert inked > 500
            page.wait_for_selector('#panels article.finding[data-rule="kv_saturation"]', timeout=20_000)
            assert page.locator('#panels article.finding[data-rule="kv_saturation"] table.evidence tr').count() >= 2
            page.click('#zoom button[data-range="5m"]')
            page.wait_for_timeout(1500)
            page.screenshot(path=str(artifacts / "dashboard-target-firing.png"), full_page=True)

            # the served data changes to a client-bound run: the finding resolves without a reload
            srv.set_run("client-bound-low-occupancy")
            page.wait_for_selector('#panels article.finding[data-rule="kv_saturation"]', state="detached", timeout=45_000)
            page.wait_for_selector("#panels ul.resolved li", timeout=10_000)
            assert "kv_saturation" in page.locator("#panels ul.resolved").inner_text()
            page.screenshot(path=str(artifacts / "dashboard-target-resolved.png"), full_page=True)

            # rule docs page
            page.goto(serve.base + "/rules/kv_saturation")
            assert "What it detects" in page.content()

            # nothing fired, nothing leaked, nothing fetched from outside
            html = page.content() + serve.get("/").text + serve.get("/target/0").text + serve.get("/target/0.json").text
            assert SECRET not in html
            assert dialogs == [], f"the XSS payload ran: {dialogs}"
            assert errors == [], f"JavaScript errors: {errors}"
            assert external == [], f"the page fetched outside the app: {external}"
            page.close()
        finally:
            serve.close()
