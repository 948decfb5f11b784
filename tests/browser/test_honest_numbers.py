"""Honest web numbers (issue 27, item 6), in real Chromium against a live ``diagnose serve`` polling a
loopback server that serves REAL SGLang 0.5.23 scrapes (tests/data/sglang-cpu-real):

* the tiles show the judged window (median and max, or the last reading and its age) and say which —
  never a bare instant value beside WARNING; the "judged window" states the data it had (seconds of
  data in a 5-minute window say so), with stamps to the second;
* the charts shade only findings at warning or above that fire now, and the labels naming them never
  overlap (bounding boxes of the label elements), even when findings fire a few seconds apart;
* every rule page leads with what it detects and the fix: the Fix heading is on the first screen.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.rules import REGISTRY
from tests.browser.samples_server import SampleServer
from tests.browser.serve_proc import Serve, free_port, need_binary
from tests.browser.test_dashboard_layout import new_page, until
from tests.helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

MICROS = re.compile(r"\d\d:\d\d:\d\d\.\d")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need_binary("chromium", CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, SampleServer]]:
    """A 5-minute window over a server that has just started being scraped: seconds of data, not 5 min.
    The served run starts as long-queue (a slot cap: queue findings fire) and turns into kv-full-retract
    a few seconds later (the KV findings fire then), so bands start at different moments."""
    work = tmp_path_factory.mktemp("honest")
    with SampleServer(data_dir, "long-queue") as srv:
        serve = Serve(["--url", srv.url, "--interval", "1", "--for", "0", "--window", "5m", "--timeout", "2"], work / "serve.log")
        try:
            serve.wait_for(lambda: serve.get("/target/0/series.json?range=5m").json()["marks"], timeout=40,
                           what="a warning firing on long-queue")
            time.sleep(12)
            srv.set_run("kv-full-retract")
            serve.wait_for(lambda: len(band_starts(serve)) >= 2, timeout=60, what="bands that started at two moments")
            yield serve, srv
        finally:
            serve.close()


def band_starts(serve: Serve) -> list[float]:
    """The start times of the bands now, merged as the chart merges them (within 5 s at the 5m range)."""
    starts = sorted(m["start"] for m in serve.get("/target/0/series.json?range=5m").json()["marks"])
    return [s for i, s in enumerate(starts) if i == 0 or s - starts[i - 1] > 5]


def test_tiles_show_the_window_and_say_which(browser: Any, served: tuple[Serve, SampleServer], artifacts: Path) -> None:
    serve, _srv = served
    for path, root in (("/", 'article.card[data-target="0"]'), ("/target/0", "#top")):
        page, problems = new_page(browser, 1280)
        page.goto(serve.base + path)
        tiles = page.locator(f"{root} dl.nums .tile")
        tiles.first.wait_for(timeout=20_000)
        doc = serve.get("/target/0.json").json()
        by_signal = {h["signal"]: h for h in doc["headline"]}
        assert doc["health"] in ("warning", "critical")
        seen = set()
        for tile in tiles.all():
            sig = tile.get_attribute("data-signal")
            how = tile.locator("dd.how").inner_text().strip()
            seen.add(sig)
            # every tile says what its number is: a median with the max, a last reading with its age, or a config value
            assert how == "median · max" or re.fullmatch(r"last reading(, [\d a-z]+ ago)?", how) or how in ("config", "before the window"), (sig, how)
            if how == "median · max":
                assert tile.locator(".max").inner_text().startswith("max "), sig
                h = by_signal[sig]
                assert h["n"] >= 2 and h["max"] >= h["value"], h  # the median, beside its max
        assert {"running_reqs", "queue_reqs", "token_usage"} <= seen, seen
        # the queue of the served run is never shown as a bare 0 while the server is at WARNING
        queue = by_signal["queue_reqs"]
        assert queue["how"] == "median · max" and queue["max"] > 0, queue
        basis = page.locator(f"{root} .tiles-basis").inner_text()
        assert "judged window" in basis and "5 min" in basis, basis
        if path == "/target/0":
            stamp = page.locator("#top .stamp").inner_text()
            assert not MICROS.search(stamp), stamp  # stamps to the second
            w = doc["window"]
            assert w["length_s"] == pytest.approx(300, abs=2) and 3 <= w["data_s"] < 200, w
            # "5 min, 1 min 5 s of data (…)" — the window and the data it actually had
            assert re.search(r"5 min, (\d+ min )?\d+ s of data \(\d\d:\d\d:\d\d → \d\d:\d\d:\d\d\)", stamp), stamp
            page.screenshot(path=str(artifacts / "honest-target-top.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 700})
        assert problems == [], problems
        page.close()


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def test_bands_only_for_warnings_that_fire_with_labels_that_never_overlap(browser: Any, served: tuple[Serve, SampleServer], artifacts: Path) -> None:
    serve, _srv = served
    serve.wait_for(lambda: len(band_starts(serve)) >= 2, timeout=60, what="bands that started at two moments")
    doc = serve.get("/target/0/series.json?range=5m").json()
    firing = {f["rule"]: f["severity"] for f in serve.get("/target/0.json").json()["findings"] if f["state"] == "firing"}
    assert all(firing.get(m["rule"]) in ("warning", "critical") for m in doc["marks"]), (doc["marks"], firing)
    assert all(m["severity"] in ("warning", "critical") and m["end"] is None for m in doc["marks"]), doc["marks"]
    assert all(m["end"] is not None for m in doc["resolved_marks"])
    info = {f["rule"] for f in serve.get("/target/0.json").json()["findings"] if f["severity"] == "info"}
    assert not info & {m["rule"] for m in doc["marks"]}, info
    for width in (1280, 390):
        page, problems = new_page(browser, width)
        page.goto(serve.base + "/target/0")
        page.locator('#zoom button[data-range="5m"]').click()
        until(page, "document.querySelectorAll('figure[data-chart=\"batch\"] .band-label').length >= 2", 20, "two band labels")
        page.wait_for_timeout(300)
        # one moment of the page (the labels are redrawn with each refresh): every chart's label boxes and its plot
        figs = page.evaluate("""() => [...document.querySelectorAll('figure.chart')].map(f => ({
            id: f.getAttribute('data-chart'),
            plot: f.querySelector('.u-over').getBoundingClientRect().toJSON(),
            labels: [...f.querySelectorAll('.band-label')].map(e => ({text: e.textContent, ...e.getBoundingClientRect().toJSON()}))}))""")
        n_labels = 0
        for fig in figs:
            boxes, plot = fig["labels"], fig["plot"]
            n_labels += len(boxes)
            for i, a in enumerate(boxes):
                assert a["width"] > 0 and a["x"] >= plot["x"] - 1 and a["x"] + a["width"] <= plot["x"] + plot["width"] + 1, (fig["id"], a, plot)
                for b in boxes[i + 1:]:
                    assert not _overlap(a, b), (fig["id"], a, b)
        assert n_labels >= 12, n_labels  # two or more per chart: they fired at different moments
        legend = page.locator("#marks-legend").inner_text()
        assert "warning or above" in legend and not MICROS.search(legend), legend
        page.locator('figure[data-chart="batch"]').scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / f"honest-bands-{width}.png"))
        assert problems == [], problems
        page.close()


@pytest.fixture(scope="module")
def doc_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    dead = f"http://127.0.0.1:{free_port()}"  # the rule pages need no live target
    s = Serve(["--url", dead, "--interval", "5", "--timeout", "1"], tmp_path_factory.mktemp("docs") / "serve.log")
    yield s
    s.close()


@pytest.mark.parametrize(("width", "height"), [(1280, 900), (390, 844)])
def test_rule_page_leads_with_what_it_detects_and_the_fix(browser: Any, doc_serve: Serve, artifacts: Path, width: int, height: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": height})
    worst = (0.0, "")
    for rule in REGISTRY:
        page.goto(f"{doc_serve.base}/rules/{rule.name}")
        heads = page.locator("article.ruledoc section h2").all_inner_texts()
        assert heads[:3] == ["Summary", "Fix", "What it detects"], (rule.name, heads)
        y = page.locator('section[data-section="Fix"] h2').bounding_box()["y"]
        worst = max(worst, (y, rule.name))
        assert y + 30 < height, f"{rule.name}: the Fix heading is at {y:.0f} px, below the first screen ({height} px)"
    page.goto(f"{doc_serve.base}/rules/{worst[1]}")
    page.screenshot(path=str(artifacts / f"rule-page-first-screen-{width}.png"))
    page.close()


def test_the_client_panel_reads_at_390_and_1280(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    """``serve --client-results`` on the real bench_serving run replayed: the panel is there and fits a phone."""
    import json
    import os
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "data" / "client-results" / "sglang-cpu-bench-serving", run)
    mtime = json.loads((run / "client_run.json").read_text())["output_mtime"]
    os.utime(run / "bench_serving.jsonl", (mtime, mtime))
    serve = Serve(["--replay", str(run), "--speed", "30", "--interval", "1", "--client-results", str(run / "bench_serving.jsonl")],
                  tmp_path / "serve.log")
    try:
        serve.wait_for(lambda: (((serve.get("/target/0.json").json().get("client") or {}).get("server") or {}).get("requests_finished") or 0) >= 47,
                       timeout=60, what="the replay past the client's run")
        for width in (1280, 390):
            page, problems = new_page(browser, width)
            page.goto(serve.base + "/target/0")
            panel = page.locator("#client")
            panel.wait_for(timeout=20_000)
            text = panel.inner_text()
            assert "What the client saw" in text and "output tok/s" in text and "--max-running-requests" in text
            assert panel.locator('tr[data-key="requests"]').count() == 1
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"client-panel-{width}.png"))
            assert problems == [], problems
            page.close()
    finally:
        serve.close()
