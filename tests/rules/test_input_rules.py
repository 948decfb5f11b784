"""Input-health rules: source_unreachable, metrics_disabled, insufficient_data.

The URL paths run the real CLI against real sockets on 127.0.0.1: a closed port, and a real HTTP server
(stdlib ``http.server``) that has no ``/metrics`` route, as SGLang without ``--enable-metrics``.
"""

from __future__ import annotations

import io
import json
import socket
import threading
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.model import InputReport, Severity
from diagnoser.rules.in01_source_unreachable import SourceUnreachable
from diagnoser.rules.in02_metrics_disabled import MetricsDisabled
from diagnoser.rules.in03_insufficient_data import InsufficientData
from tests.rules.helpers import run, window


def _json_run(argv: list[str]) -> dict[str, Any]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(argv)
    return json.loads(buf.getvalue())


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _NoMetrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        body = b'{"detail":"Not Found"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture()
def no_metrics_server() -> Any:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NoMetrics)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_unreachable_target_gets_a_finding_through_the_cli() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    doc = _json_run(["--once", "--url", url, "--duration", "0", "--timeout", "2", "--format", "json"])
    rules = {f["rule"]: f for f in doc["findings"]}
    assert set(rules) == {"source_unreachable"}, rules
    f = rules["source_unreachable"]
    assert f["severity"] == "critical" and f["target"] == url and "connection refused" in f["summary"].lower()


def test_metrics_404_is_metrics_disabled_not_unreachable(no_metrics_server: str) -> None:
    doc = _json_run(["--once", "--url", no_metrics_server, "--duration", "0", "--timeout", "2", "--format", "json"])
    rules = {f["rule"]: f for f in doc["findings"]}
    assert "metrics_disabled" in rules and "source_unreachable" not in rules, rules
    f = rules["metrics_disabled"]
    assert f["severity"] == "warning" and "404" in f["summary"]
    assert f["suggestions"][0]["flag"] == "--enable-metrics" and f["suggestions"][0]["proposed"] is True


def test_source_unreachable_reads_extras_and_meta() -> None:
    tl = window()
    assert run(SourceUnreachable, tl) is None
    f = run(SourceUnreachable, tl, extras={"unreachable": {"t": "Could not connect to x (connection refused)."}})
    assert f is not None and f.severity == Severity.CRITICAL
    tl.meta["unreachable"] = "x answered 404: the server has no /metrics. Start SGLang with --enable-metrics."
    assert run(SourceUnreachable, tl) is None
    assert run(MetricsDisabled, tl) is not None


def test_metrics_disabled_from_server_args_is_info() -> None:
    f = run(MetricsDisabled, window(config={"enable_metrics": False}))
    assert f is not None and f.severity == Severity.INFO
    assert run(MetricsDisabled, window(config={"enable_metrics": True})) is None


def test_insufficient_data_boundary() -> None:
    assert run(InsufficientData, window(running_reqs=[1, 2, 3])) is None
    f = run(InsufficientData, window(running_reqs=[1, 2]))
    assert f is not None and f.severity == Severity.INFO and "Only 2 reading(s)" in f.summary
    tl = window()
    tl.inputs.append(InputReport(kind="log", source="x.log", lines_read=2, lines_recognized=2))
    f = run(InsufficientData, tl)
    # a note, never a verdict: no reading at all is still info (the findings stand on startup lines)
    assert f is not None and f.severity == Severity.INFO and "2 of 2 log lines" in f.summary and "No load reading" in f.summary
    assert run(InsufficientData, tl, extras={"unreachable": {"t": "refused"}}) is None


def test_insufficient_data_calls_an_idle_server_healthy_idle() -> None:
    f = run(InsufficientData, window(running_reqs=[0] * 20, queue_reqs=[0] * 20, token_usage=[0.0] * 20))
    assert f is not None and f.severity == Severity.INFO and "Healthy-idle" in f.summary
    assert run(InsufficientData, window(running_reqs=[0] * 19 + [1], queue_reqs=[0] * 20)) is None  # it ran something
    # requests waiting in a PD bootstrap queue are not idle
    f = run(InsufficientData, window(running_reqs=[0] * 5, queue_reqs=[0] * 5, pd_bootstrap_reqs=[40] * 5))
    assert f is None
