"""Every surface against one live SGLang 0.5.23 engine under KV pressure, at the same time:

* ``diagnose serve`` polls it and a real Chromium sees the finding appear on the page;
* a real Prometheus scrapes it: the stored names come out as ``sglang_…`` (the colon-to-underscore trap
  of prometheus_client's content negotiation), and ``diagnose --once --prometheus`` still diagnoses it;
* ``diagnose record`` of the live run, then ``--once --replay`` of the bundle: the same findings.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.serve_proc import Serve, need_binary
from tests.conftest import ARTIFACTS
from tests.engine import support
from tests.engine.conftest import diagnose_bin
from tests.helpers import CHROMIUM, CHROMIUM_ARGS
from tests.stack_support import Prometheus

pytestmark = pytest.mark.engine

KV_RULES = {"kv_saturation", "kv_retraction", "queue_buildup"}


@pytest.fixture(scope="module")
def loaded_engine(engine_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("surfaces")
    eng = support.Engine(engine_python, tiny_model, ["--max-total-tokens", "2048", "--max-running-requests", "64"], work / "engine")
    eng.start()
    stop = threading.Event()
    load = threading.Thread(target=support.run_load, args=(eng.url, 2000, 40, 256), kwargs={"ignore_eos": False, "timeout": 400, "stop": stop}, daemon=True)
    load.start()
    try:
        yield eng, work
    finally:
        stop.set()
        eng.stop()


def test_surfaces_against_a_live_engine(loaded_engine: Any) -> None:
    eng, work = loaded_engine
    need_binary("prometheus")
    need_binary("chromium", CHROMIUM)
    cfg = work / "prometheus.yml"
    host = eng.url.split("//", 1)[1]
    cfg.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sglang\n    static_configs:\n      - targets: ['{host}']\n")
    prom = Prometheus(cfg, work)
    bundle = work / "live.dgb"
    rec = subprocess.Popen([diagnose_bin(), "record", "--url", eng.url, "--log", str(eng.log_path), "--duration", "24s",
                            "--interval", "2", "-o", str(bundle), "--report", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    serve = Serve(["--url", eng.url, "--log", str(eng.log_path), "--interval", "2", "--for", "0"], work / "serve.log")
    try:
        # 1. the web page shows the bottleneck as it happens
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.goto(serve.base + "/")
            sel = ", ".join(f'article.card li[data-rule="{r}"]' for r in sorted(KV_RULES))
            page.wait_for_selector(sel, timeout=90_000)
            # the card leads with what to change: a flag, current → proposed, and its effect
            fix = page.locator("article.card .card-fix").first
            fix.wait_for(timeout=60_000)
            assert fix.locator(".change code").inner_text().startswith("--") and fix.locator(".effect").inner_text().strip()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "engine-live-overview.png"), full_page=True)
            assert "tiny-llama" in page.content() or eng.url.split("//")[1] in page.content()
            # the target page: the verdict and the top fixes, then charts drawn from the engine's numbers
            page.goto(serve.base + "/target/0")
            page.wait_for_selector("#top ol.fixes > li code", timeout=30_000)
            page.wait_for_selector('figure[data-chart="batch"][data-points]', timeout=30_000)
            assert int(page.locator('figure[data-chart="batch"]').get_attribute("data-points") or 0) > 2
            page.screenshot(path=str(ARTIFACTS / "engine-live-target.png"), full_page=True)
            browser.close()

        # 2. Prometheus stored the underscore spelling; the colon one is empty (the trap)
        deadline = time.time() + 60
        while time.time() < deadline and not prom.query('sglang_num_running_reqs{job="sglang"}'):
            time.sleep(1)
        assert prom.query('sglang_num_running_reqs{job="sglang"}'), "Prometheus stored no sglang_ series"
        assert not prom.query('{__name__="sglang:num_running_reqs"}'), "expected the colon spelling to be absent"
        time.sleep(5)
        p = subprocess.run([diagnose_bin(), "--once", "--prometheus", prom.url, "--selector", '{job="sglang"}', "--range", "60s",
                            "--step", "2s", "--rate-window", "10s", "--format", "json"], capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 1), p.stderr
        doc = json.loads(p.stdout)
        assert len(doc["signals"]) == 1, doc["signals"].keys()
        sig = next(iter(doc["signals"].values()))
        assert sig["running_reqs"]["max"] >= 1 and sig["queue_reqs"]["max"] >= 1 and sig["token_usage"]["n"] > 0, sig
        assert KV_RULES & {f["rule"] for f in doc["findings"]}, doc["findings"]

        # 3. record → replay gives the findings the live run reported
        out, err = rec.communicate(timeout=120)
        assert rec.returncode in (0, 1), err
        live = json.loads(out)
        r = subprocess.run([diagnose_bin(), "--once", "--replay", str(bundle), "--format", "json"], capture_output=True, text=True, timeout=120)
        replayed = json.loads(r.stdout)
        assert live["findings"], "the recorded window must show the KV bottleneck"
        assert [(f["rule"], f["summary"]) for f in replayed["findings"]] == [(f["rule"], f["summary"]) for f in live["findings"]]
    finally:
        if rec.poll() is None:
            rec.kill()
        serve.close()
        prom.stop()
