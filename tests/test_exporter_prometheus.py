"""A real Prometheus (Debian package, 127.0.0.1, free port) scraping a live ``diagnose serve``'s /metrics,
while serve polls a loopback server playing REAL SGLang scrapes: the finding gauge becomes queryable,
and clears after the served data changes and the finding resolves. promtool accepts the exposition."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.browser.samples_server import SampleServer
from tests.browser.serve_proc import SECRET, Serve
from tests.helpers import need_binary, start_prometheus

pytestmark = pytest.mark.prometheus


def _query(base: str, q: str) -> list[dict]:
    r = httpx.get(base + "/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_prometheus_scrapes_finding_gauge_until_resolved(data_dir: Path, tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    with SampleServer(data_dir, "kv-full-retract", api_key=SECRET) as srv:
        serve = Serve(["--url", srv.url, "--interval", "1", "--for", "0", "--window", "6s"], tmp_path / "serve.log")
        p = start_prometheus(tmp_path / "prom", "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                             f"scrape_configs:\n  - job_name: diagnoser\n    static_configs:\n      - targets: ['127.0.0.1:{serve.port}']\n")
        base = p.url
        try:
            # promtool lints serve's exposition (names with underscores only, counters with _total …)
            def exposition_with_finding() -> str | None:
                t = serve.get("/metrics").text
                return t if "diagnoser_finding_active{" in t else None

            text = serve.wait_for(exposition_with_finding, what="a finding in /metrics")
            chk = subprocess.run([promtool, "check", "metrics"], input=str(text), capture_output=True, text=True)
            assert chk.returncode == 0, chk.stdout + chk.stderr
            assert SECRET not in str(text)

            active = 'diagnoser_finding_active{rule="kv_saturation"}'
            res = serve.wait_for(lambda: _query(base, active), timeout=40, what="kv_saturation in Prometheus")
            assert res[0]["metric"]["severity"] in ("warning", "critical")
            assert res[0]["metric"]["target"] == srv.url
            assert res[0]["value"][1] == "1"
            up = _query(base, "diagnoser_scrape_up")
            assert up and up[0]["value"][1] == "1"
            assert _query(base, 'diagnoser_signal{signal="running_reqs"} > 0')
            assert float(_query(base, "diagnoser_pool_capacity_tokens")[0]["value"][1]) == 2048.0

            srv.set_run("client-bound-low-occupancy")
            serve.wait_for(lambda: _query(base, active) == [], timeout=45, what="kv_saturation to clear in Prometheus")
            # the dashboard agrees: no firing kv_saturation any more
            doc = serve.get("/index.json").json()
            assert not any(f["rule"] == "kv_saturation" for f in doc["targets"][0]["findings"])
        finally:
            p.stop()
            serve.close()
            time.sleep(0.1)
