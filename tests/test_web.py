"""The web app in-process (Starlette TestClient) over a LiveMonitor polling REAL SGLang scrapes served on
loopback: JSON twins, escaping, redaction, the bearer token, 404s, no visitor-chosen URL."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from diagnoser.engines import get_adapter
from diagnoser.live import LiveMonitor
from diagnoser.web import create_app
from tests.browser.samples_server import SampleServer
from tests.browser.serve_proc import SECRET, XSS, free_port


@pytest.fixture(scope="module")
def monitor(data_dir: Path) -> Any:
    dead = f"http://127.0.0.1:{free_port()}"
    with SampleServer(data_dir, "kv-full-retract", model_name=XSS, api_key=SECRET) as srv:
        m = LiveMonitor(get_adapter("sglang"), [srv.url, dead], [], interval=0.1, timeout=1, for_seconds=0, window_s=30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            snap = m.tick()
            if any(f.rule == "kv_saturation" for f in snap.firing(srv.url)) and snap.targets[0].config and snap.targets[1].up is False:
                break
            time.sleep(0.1)
        m.srv_url = srv.url  # type: ignore[attr-defined]
        m.dead_url = dead  # type: ignore[attr-defined]
        yield m
        m.close()


@pytest.fixture()
def client(monitor: Any) -> TestClient:
    return TestClient(create_app(monitor, job_requests=500))


def test_every_page_has_a_json_twin(client: TestClient, monitor: Any) -> None:
    for html_path, json_path in (("/", "/index.json"), ("/target/0", "/target/0.json"), ("/rules", "/rules.json"),
                                 ("/rules/kv_saturation", "/rules/kv_saturation.json")):
        page = client.get(html_path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        twin = client.get(json_path)
        assert twin.status_code == 200 and twin.headers["content-type"] == "application/json"
        by_accept = client.get(html_path, headers={"Accept": "application/json"})
        assert by_accept.json() == twin.json() or html_path in ("/", "/target/0")  # live pages move between calls
        assert set(by_accept.json()) == set(twin.json())
    ov = client.get("/index.json").json()
    assert [t["name"] for t in ov["targets"]] == [monitor.srv_url, monitor.dead_url]
    live, dead = ov["targets"]
    assert live["health"] in ("warning", "critical") and live["version"] == "0.5.23"
    heads = {h["signal"]: h["value"] for h in live["headline"]}
    assert heads["max_running_requests"] == 64 and heads["running_reqs"] >= 1
    assert dead["health"] == "down" and [f["rule"] for f in dead["findings"]] == ["source_unreachable"]


def test_target_page_has_findings_evidence_config_sources_and_eta(client: TestClient) -> None:
    doc = client.get("/target/0.json").json()
    kv = next(f for f in doc["findings"] if f["rule"] == "kv_saturation")
    assert kv["evidence"] and all(e["source"] for e in kv["evidence"] if e["signal"] == "token_usage")
    assert doc["config"]["max_total_tokens"]["value"] == 2048
    assert doc["config"]["max_total_tokens"]["source"]
    assert doc["eta"]["job_requests"] == 500 and doc["eta"]["completed"] is not None
    assert [c["id"] for c in doc["charts"]] == ["batch", "usage", "gen", "prefill", "retract", "latency"]
    html = client.get("/target/0").text
    assert "kv_saturation" in html and "Job ETA" in html and "Configuration" in html
    # each finding says what it stands on, as in the text report
    n = kv["basis"]["readings"]
    assert n >= 1 and f"confidence, {kv['basis_text']}" in html and kv["basis_text"].startswith(f"on {n} reading")


def test_series_json_is_downsampled_and_bounded(client: TestClient) -> None:
    d = client.get("/target/0/series.json?range=1h&points=50").json()
    assert d["range_s"] == 3600 and d["lines"]["batch"]["value"] == 64
    assert len(d["series"]["running_reqs"]["t"]) >= 3
    assert all(len(s["t"]) <= 50 for s in d["series"].values())
    assert client.get("/target/0/series.json?range=7y").status_code == 400
    assert client.get("/target/7/series.json").status_code == 404


def test_server_strings_are_escaped_and_secrets_redacted(client: TestClient) -> None:
    pages = ["/", "/index.json", "/target/0", "/target/0.json", "/_/cards", "/_/target/0", "/target/0/series.json", "/metrics"]
    for p in pages:
        body = client.get(p).text
        assert SECRET not in body, p
        if not p.endswith(".json") and p != "/metrics":
            assert XSS not in body, f"{p} has the raw <script> payload"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/").text
    assert json.loads(client.get("/index.json").text)["targets"][0]["model_name"] == XSS  # JSON carries it as data
    assert "script-src 'self'" in client.get("/").headers["content-security-policy"]


def test_no_endpoint_takes_a_target_url_from_the_visitor(client: TestClient, monitor: Any) -> None:
    before = [t.name for t in monitor.targets]
    for p in ("/?url=http://169.254.169.254/", "/target/0?url=http://example.com", "/index.json?target=http://x"):
        assert client.get(p).status_code == 200
    assert client.post("/", json={"url": "http://example.com"}).status_code == 405
    assert [t.name for t in monitor.targets] == before


def test_unknown_pages_answer_404_in_one_sentence(client: TestClient) -> None:
    r = client.get("/target/99")
    assert r.status_code == 404 and "does not exist" in r.text
    assert client.get("/target/99.json").json() == {"error": "Target 99 does not exist. Go back to the overview at /."}
    assert client.get("/rules/nope.json").status_code == 404
    assert client.get("/target/../../etc/passwd").status_code == 404


def test_bearer_token(monitor: Any) -> None:
    c = TestClient(create_app(monitor, token="s3cret-token"))
    assert c.get("/healthz").status_code == 200  # liveness stays open
    for p in ("/", "/index.json", "/metrics", "/target/0"):
        r = c.get(p)
        assert r.status_code == 401 and "Bearer" in r.text, p
    assert c.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/index.json", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    r = c.get("/?token=s3cret-token", follow_redirects=False)
    assert r.status_code == 303 and "diagnoser_token" in r.headers["set-cookie"]
    assert c.get("/").status_code == 200  # the cookie keeps the browser logged in


def test_healthz_and_rules_docs(client: TestClient) -> None:
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["targets"] == 2 and h["tick"] >= 1
    rules = client.get("/rules.json").json()["rules"]
    assert any(r["name"] == "kv_saturation" and r["code"] == "KV01" for r in rules)
    doc = client.get("/rules/kv_saturation.json").json()
    assert "What it detects" in doc["sections"] and "usage_high" in doc["thresholds"]
    assert client.get("/static/chart.js").status_code == 200


def test_serve_cli_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main

    assert main(["serve"]) == 2
    assert "nothing to watch" in capsys.readouterr().err
    assert main(["serve", "--replay", "/nonexistent/bundle.dgb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diagnose: cannot replay /nonexistent/bundle.dgb") and "Traceback" not in err
    assert main(["serve", "--url", "http://127.0.0.1:1", "--interval", "0"]) == 2


def test_binding_off_loopback_warns_and_loopback_is_default() -> None:
    from diagnoser.cli.serve import build_parser, is_loopback

    assert build_parser().parse_args([]).host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")


def test_serve_says_so_when_the_port_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from diagnoser.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--url", "http://127.0.0.1:1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "pick another --port" in err
