"""End to end: the compose Prometheus config, adapted to loopback ports, in a real Prometheus that scrapes
`diagnose replay-server` (playing the bundled real KV-saturation run, deploy/demo/) and `diagnose serve`.

Two Prometheus servers run side by side: one stores the `sglang:` spelling, the other the `sglang_` one
(forced by a metric_relabel_configs rename, the way Prometheus 3 / prometheus_client's escaping=underscores
would store it). Every panel expr of both dashboards must return data in both, and the KV-saturation
alerts must fire. Adaptations to the compose stack, all for speed: scrape every 1 s, evaluate every 1 s,
alert `for` shortened to 5 s, and `diagnose serve --interval 1 --for 4s`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from diagnoser.outputs import promgen
from tests.conftest import IN_CI, ROOT
from tests.stack_support import DASHBOARD_FILES, Prometheus, dashboard_exprs, free_port, need_bin, substitute

pytestmark = pytest.mark.prometheus

RECORDING = ROOT / "deploy" / "demo" / "kv-full-retract.dgb"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
SPELLINGS = {"colon": ("sglang_(.+)", "sglang:$1"), "underscore": ("sglang:(.+)", "sglang_$1")}
WARMUP_S = 120.0


def need_cli(sub: str) -> None:
    r = subprocess.run([sys.executable, "-m", "diagnoser", sub, "--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        msg = f"`diagnose {sub}` is not available yet ({(r.stderr or r.stdout).strip().splitlines()[-1:]}): the e2e stack test cannot run"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip("SKIPPED LOUDLY: " + msg)


def wait_http(url: str, proc: subprocess.Popen[str], what: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not answering {url} after {timeout} s")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def adapted_config(workdir: Path, sglang: str, diagnoser: str, spelling: str) -> Path:
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    cfg["global"].update({"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"})
    cfg["rule_files"] = [str(workdir / "rules" / "*.yml")]
    regex, replacement = SPELLINGS[spelling]
    for job in cfg["scrape_configs"]:
        job.update({"scrape_interval": "1s", "scrape_timeout": "1s"})
        if job["job_name"] == "sglang":
            job["static_configs"] = [{"targets": [sglang]}]
            job["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": regex, "target_label": "__name__", "replacement": replacement}]
        elif job["job_name"] == "diagnoser":
            job["static_configs"] = [{"targets": [diagnoser]}]
    (workdir / "rules").mkdir(parents=True)
    for rel, text in promgen.rendered_files(for_override="5s").items():
        if rel.startswith("rules/") and rel.count("/") == 1:
            (workdir / rel).write_text(text)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_bin("prometheus")
    need_cli("replay-server")
    need_cli("serve")
    work = tmp_path_factory.mktemp("stack")
    procs: list[subprocess.Popen[str]] = []
    proms: dict[str, Prometheus] = {}
    try:
        rport, sport = free_port(), free_port()
        live_log = work / "sglang.log"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "replay-server", str(RECORDING), "--port", str(rport), "--loop", "--log-out", str(live_log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        wait_http(f"http://127.0.0.1:{rport}/metrics", procs[-1], "diagnose replay-server")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "serve", "--url", f"http://127.0.0.1:{rport}", "--log", str(live_log),
             "--port", str(sport), "--interval", "1", "--for", "4s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        wait_http(f"http://127.0.0.1:{sport}/metrics", procs[-1], "diagnose serve")
        for spelling in SPELLINGS:
            d = work / spelling
            d.mkdir()
            proms[spelling] = Prometheus(adapted_config(d, f"127.0.0.1:{rport}", f"127.0.0.1:{sport}", spelling), d)
        # warm-up: both jobs up, a finding exported and scraped, and rate windows holding several samples
        deadline = time.time() + WARMUP_S
        for p in proms.values():
            while time.time() < deadline:
                ups = {r["metric"]["job"]: r["value"][1] for r in p.query("up")}
                if ups == {"sglang": "1", "diagnoser": "1"} and p.query("diagnoser_finding_active") and p.query(
                        'count_over_time({__name__=~"sglang[:_]num_running_reqs"}[1m]) >= 10'):
                    break
                time.sleep(1)
            else:
                pytest.fail(f"stack not warm after {WARMUP_S} s: up={p.query('up')}; log:\n{p.logfile.read_text()[-2000:]}")
        yield {"prom": proms, "sglang": f"127.0.0.1:{rport}", "serve": f"127.0.0.1:{sport}", "work": work}
    finally:
        for p in proms.values():
            p.stop()
        for proc in reversed(procs):
            stop(proc)


def test_each_spelling_is_stored_as_forced(stack: dict[str, Any]) -> None:
    colon, underscore = stack["prom"]["colon"], stack["prom"]["underscore"]
    assert colon.query("sglang:num_running_reqs") and not colon.query("sglang_num_running_reqs")
    assert underscore.query("sglang_num_running_reqs") and not underscore.query("sglang:num_running_reqs")
    # the recording's pool size, read back through Prometheus in both spellings
    for p in (colon, underscore):
        (r,) = p.query('max({__name__=~"sglang[:_]max_total_num_tokens"})')
        assert float(r["value"][1]) == 2048.0


PANEL_EXPRS = [
    (spelling, path.stem, label, expr)
    for spelling in SPELLINGS
    for path in DASHBOARD_FILES
    if path.stem != "vllm-overview"  # read against a vLLM target in tests/test_stack_vllm.py
    for label, expr in dashboard_exprs(json.loads(path.read_text()))
    if label.startswith("panel ")
]


@pytest.mark.parametrize(("spelling", "dashboard", "label", "expr"), PANEL_EXPRS,
                         ids=[f"{s}-{d}-{lbl[6:]}" for s, d, lbl, _ in PANEL_EXPRS])
def test_every_panel_expr_returns_data(stack: dict[str, Any], spelling: str, dashboard: str, label: str, expr: str) -> None:
    prom: Prometheus = stack["prom"][spelling]
    q = substitute(expr)
    deadline = time.time() + 60
    result: list[dict[str, Any]] = []
    while time.time() < deadline:
        result = prom.query(q)
        if result:
            break
        time.sleep(2)
    assert result, f"{dashboard} {label} returned nothing in the {spelling} Prometheus: {q}"


def _firing(prom: Prometheus, name: str, timeout: float) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alerts = [a for a in prom.api("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]
        if alerts:
            return alerts
        time.sleep(1)
    return []


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_kv_saturation_alerts_fire(stack: dict[str, Any], spelling: str) -> None:
    prom: Prometheus = stack["prom"][spelling]
    raw = _firing(prom, "SGLangKVPoolFullWithQueue", 90)
    assert raw, f"SGLangKVPoolFullWithQueue never fired ({spelling}); alerts: {prom.api('/api/v1/alerts')}"
    a = raw[0]
    assert a["labels"]["instance"] == stack["sglang"] and a["labels"]["model_name"] == "tiny-llama"
    assert "peaked at 9" in a["annotations"]["description"], a["annotations"]["description"]  # 92-96 % in the recording
    found = _firing(prom, "DiagnoserKVSaturation", 90)
    assert found, f"DiagnoserKVSaturation never fired ({spelling}); findings: {prom.query('diagnoser_finding_active')}"
    ann = found[0]["annotations"]
    assert found[0]["labels"]["target"] == f"http://{stack['sglang']}"
    assert "token_usage=" in ann["description"] and "queue_reqs=" in ann["description"], ann["description"]
    assert ann["runbook_url"].endswith("/rules/kv_saturation")
    retract = _firing(prom, "SGLangRetractionsRising", 90)
    assert retract and float(retract[0]["value"]) > 0


def test_artifacts(stack: dict[str, Any]) -> None:
    """Keep what Prometheus saw for a look after the run (test-artifacts/stack-e2e/)."""
    out = ROOT / "test-artifacts" / "stack-e2e"
    out.mkdir(parents=True, exist_ok=True)
    for spelling, p in stack["prom"].items():
        (out / f"alerts-{spelling}.json").write_text(json.dumps(p.api("/api/v1/alerts"), indent=1))
        shutil.copy(p.logfile, out / f"prometheus-{spelling}.log")
    assert any(out.iterdir())


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_template_variables_find_values(stack: dict[str, Any], spelling: str) -> None:
    """Grafana fills the instance/model/target variables from these selectors: they must find the replayed server."""
    prom: Prometheus = stack["prom"][spelling]
    found: dict[str, set[str]] = {}
    for path in DASHBOARD_FILES:
        if path.stem == "vllm-overview":
            continue  # its variables find the vLLM target in tests/test_stack_vllm.py
        for v in json.loads(path.read_text())["templating"]["list"]:
            if v["type"] != "query":
                continue
            label = v["query"]["query"].rsplit(",", 1)[1].strip(" )")
            selector = dashboard_exprs({"templating": {"list": [v]}})[0][1]
            found[v["name"]] = {r["metric"].get(label, "") for r in prom.query(substitute(selector))}
    assert found["instance"] == {stack["sglang"]}
    assert found["model"] == {"tiny-llama"}
    assert found["dp_rank"] == {""}  # a single-rank server has no dp_rank label; "All" (.*) still matches
    assert found["target"] == {f"http://{stack['sglang']}"}


def test_every_runbook_url_resolves_on_diagnose_serve(stack: dict[str, Any]) -> None:
    """Each alert's runbook_url points at a page `diagnose serve` really has (compose publishes it on :8000)."""
    urls = set()
    for name in ("diagnoser-alerts.yml", "sglang-alerts.yml"):
        for group in yaml.safe_load((ROOT / "rules" / name).read_text())["groups"]:
            urls |= {r["annotations"]["runbook_url"] for r in group["rules"]}
    assert len(urls) >= 10
    for url in sorted(urls):
        assert url.startswith(promgen.RUNBOOK_BASE.rsplit("/rules/", 1)[0])
        local = url.replace("http://localhost:8000", f"http://{stack['serve']}")
        r = httpx.get(local, timeout=10)
        assert r.status_code == 200, f"{url} -> {r.status_code}"
        name = url.rstrip("/").rsplit("/", 1)[1]
        assert name == "rules" or name in r.text
