"""The /fleet page in a real browser (Debian Chromium + Playwright) against ``diagnose serve
--prometheus`` reading a real Prometheus that holds a backfilled 650-target fleet: sorting, filtering,
paging, fleet findings, and a ``<script>`` instance label that must stay inert text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.serve_proc import XSS, Serve, need_binary
from tests.fleet_fixtures import FleetSpec, Prom, fleet_prometheus, need_prometheus
from tests.helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]

N = 650


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, FleetSpec]]:
    need_prometheus()
    need_binary("chromium", CHROMIUM)
    work = tmp_path_factory.mktemp("fleet-web")
    prom: Prom
    prom, spec = fleet_prometheus(work, N, evil=XSS)
    srv = None
    try:
        srv = Serve(["--prometheus", prom.url, "--interval", "5", "--for", "0", "--window", "10m"], work / "serve.log")
        srv.wait_for(lambda: srv.get("/fleet.json").json()["total"] == N, timeout=90, what=f"{N} fleet targets")
        # fleet rules run every eval interval (live.py): wait for their first pass over all targets
        srv.wait_for(lambda: any(f["rule"] == "config_drift" for f in srv.get("/fleet.json").json()["fleet_findings"]),
                     timeout=90, what="the first fleet-rule pass")
        yield srv, spec
    finally:
        if srv is not None:
            srv.close()
        prom.stop()


def rows(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "table.fleet-table tbody tr[data-target]",
        "trs => trs.map(tr => ({name: tr.querySelector('.col-name a').textContent,"
        " engine: (tr.querySelector('.col-name .engine') || {}).textContent, model: tr.querySelector('.col-model').textContent,"
        " health: tr.querySelector('.col-health').textContent.trim(), queue: tr.querySelector('.col-queue').textContent}))")


def test_fleet_page_sort_filter_paginate(served: tuple[Serve, FleetSpec], artifacts: Path) -> None:
    srv, spec = served
    from playwright.sync_api import sync_playwright

    dialogs: list[str] = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(srv.base + "/fleet")
            assert page.text_content("#fleet-count").strip() == f"{N} of {N} targets · page 1 of {-(-N // 50)}"
            first = rows(page)
            assert len(first) == 50
            hot = {spec.instance(i) for i in spec.hot}
            # default sort: health, worst first: the busy replicas are among the warnings, and no warning
            # comes after an ok row
            order = {"critical": 3, "warning": 2, "down": 1, "starting": 1, "ok": 0}
            ranks = [order[r["health"]] for r in first]
            assert ranks == sorted(ranks, reverse=True)
            warned = {r["name"] for r in first if r["health"] == "warning"}
            # and the page-size drift (config_drift, read from the 0.5.11+ page_size gauge over the whole range)
            assert hot | {spec.instance(spec.odd_page)} <= warned, (warned, srv.get("/fleet.json?health=warning").json()["rows"])
            # fleet findings on top, naming the busy replicas
            fleet_text = page.text_content("ul.fleet-findings")
            assert "replica_imbalance" in fleet_text and spec.instance(3) in fleet_text and "config_drift" in fleet_text
            cap = page.text_content("#fleet-capacity")
            assert cap.startswith(f"KV pool {600 * 200_000 + 48 * 80_000:,} tokens") and "headroom ≈" in cap
            # sort by queue, descending
            page.click("th.col-queue a")
            page.wait_for_url("**sort=queue**")
            by_queue = rows(page)
            assert {r["name"] for r in by_queue[:6]} == hot and float(by_queue[6]["queue"]) == 0
            # paginate
            page.click("nav.pager a[rel=next]")
            page.wait_for_url("**page=2**")
            assert "page 2 of" in page.text_content("#fleet-count") and len(rows(page)) == 50
            assert not ({r["name"] for r in rows(page)} & hot)
            # filter by model, then by health
            page.fill("input[name=q]", "qwen")
            page.select_option("select[name=health]", "warning")
            page.click("form.fleet-filter button")
            page.wait_for_url("**q=qwen**")
            got = rows(page)
            assert {r["name"] for r in got} == {spec.instance(600), spec.instance(601)}
            assert all(r["model"] == "qwen-7b" for r in got)
            page.screenshot(path=str(artifacts / "fleet-filtered.png"), full_page=True)
            # a label carrying markup is shown as text and never runs
            page.goto(srv.base + "/fleet?q=script")
            evil = rows(page)
            assert [r["name"] for r in evil] == [f"{XSS}:30000"]
            assert page.eval_on_selector_all("table.fleet-table script", "s => s.length") == 0
            page.wait_for_timeout(6000)  # one live refresh of the fragment
            assert [r["name"] for r in rows(page)] == [f"{XSS}:30000"]
            assert dialogs == []
            page.goto(srv.base + "/fleet?per=200")
            assert len(rows(page)) == 200
            page.screenshot(path=str(artifacts / "fleet.png"))
        finally:
            b.close()
    doc = srv.get("/fleet.json?sort=name&order=asc&per=25&page=3").json()
    assert doc["page"] == 3 and len(doc["rows"]) == 25 and doc["matched"] == N
    names = [r["name"] for r in doc["rows"]]
    assert names == sorted(names, key=str.casefold)
