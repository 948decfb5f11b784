"""``diagnose --once --url`` end to end: the real command (a subprocess of the installed ``diagnose``)
against a real loopback HTTP server (threaded http.server on 127.0.0.1) that serves the real SGLang
0.5.23 exposition, a real cpu-real scrape sequence and server info, or one kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DATA
from tests.helpers import free_port

COLLECTOR = DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom"
RUN = DATA / "sglang-cpu-real" / "kv-full-retract"
KEYS = {"schema_version", "status", "engine", "version", "inputs", "window", "config", "signals", "findings", "errors", "top", "checked"}
STAT_KEYS = {"last", "mean", "min", "max", "p50", "p95", "n"}

Route = Callable[[int], tuple[int, str, bytes]]  # request number → (status, content type, body)


def _diagnose() -> list[str]:
    exe = Path(sys.executable).parent / "diagnose"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "diagnoser"]


@contextmanager
def serve(routes: dict[str, Any]) -> Iterator[str]:
    counts: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            route = routes.get(path)
            key = routes.get("__api_key__")
            if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
                route = static(b'{"error":"Unauthorized"}', "application/json", 401)
            if route is None:
                status, ctype, body = 404, "application/json", b'{"detail":"Not Found"}'
            else:
                n = counts.get(path, 0)
                counts[path] = n + 1
                status, ctype, body = route(n)
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (the timeout test)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def static(body: bytes, ctype: str = "text/plain; version=0.0.4; charset=utf-8", status: int = 200) -> Route:
    return lambda n: (status, ctype, body)


def sequence(bodies: list[bytes]) -> Route:
    return lambda n: (200, "text/plain; version=0.0.4; charset=utf-8", bodies[min(n, len(bodies) - 1)])


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_diagnose(), "--once", *args], capture_output=True, text=True, timeout=timeout)



@pytest.fixture(autouse=True)
def _shared(data_dir: Path) -> None:
    return None


def test_real_0_5_23_exposition_over_loopback() -> None:
    with serve({"/metrics": static(COLLECTOR.read_bytes())}) as url:
        p = run("--url", url, "--duration", "1", "--interval", "0.5", "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    assert "Traceback" not in p.stderr
    doc = json.loads(p.stdout)
    assert set(doc) == KEYS
    assert doc["status"] in ("ok", "problems") and doc["engine"] == "sglang"
    assert doc["version"] == ">=0.5.23"  # from the names and labels alone: no server-info endpoint here
    [inp] = [i for i in doc["inputs"] if i["kind"] == "metrics"]
    assert inp["source"] == url and inp["scrapes"] == 3 and inp["errors"] == 0 and inp["lines_recognized"] > 0
    sig = doc["signals"][url]
    assert all(set(v) >= STAT_KEYS for v in sig.values())
    assert sig["running_reqs"]["last"] == 44 and sig["running_reqs"]["n"] == 3
    assert sig["queue_reqs"]["last"] == 37
    assert sig["token_usage"]["max"] == 1.0
    assert sig["used_tokens"]["last"] == 20000
    assert sig["gen_throughput_tps"]["mean"] == pytest.approx(1060.0044818231188)
    assert sig["request_rate"]["last"] == 0  # a static exposition: counters do not move
    cfg = doc["config"][url]
    assert cfg["max_total_tokens"]["value"] == 20000 and "sglang:max_total_num_tokens" in cfg["max_total_tokens"]["source"]
    assert cfg["context_len"]["value"] == 2048
    assert doc["window"]["start"].endswith("Z") and doc["window"]["end"] >= doc["window"]["start"]


def test_cpu_real_sequence_with_server_info_over_loopback() -> None:
    files = sorted((RUN / "metrics").glob("metrics_*.prom"))
    bodies = [p.read_bytes() for p in files[1:12]]
    routes = {
        "/metrics": sequence(bodies),
        "/get_server_info": static((RUN / "get_server_info.json").read_bytes(), "application/json"),
        "/get_model_info": static((RUN / "get_model_info.json").read_bytes(), "application/json"),
    }
    with serve(routes) as url:
        p = run("--url", url, "--duration", "4", "--interval", "0.4", "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["version"] == "0.5.23"  # server info says so exactly
    kinds = {i["kind"]: i for i in doc["inputs"]}
    assert kinds["metrics"]["scrapes"] == 11 and kinds["server_info"]["scrapes"] >= 2
    sig = doc["signals"][url]
    # served scrapes 2..12 of the run: running 5–7, queue up to 35, usage up to 0.96
    assert sig["running_reqs"]["min"] == 5 and sig["running_reqs"]["max"] == 7
    assert sig["queue_reqs"]["max"] == 35
    assert sig["token_usage"]["max"] == pytest.approx(0.96)
    assert sig["retracted_reqs"]["n"] >= 10 and sig["retractions_total"]["last"] >= 4
    assert sig["ttft_seconds_p95"]["n"] >= 5 and 0 < sig["ttft_seconds_p95"]["window"] < 30
    assert sig["request_rate"]["mean"] > 0 and sig["prompt_tps"]["mean"] > 0
    assert 0 < sig["cache_hit_rate"]["mean"] < 0.2
    cfg = doc["config"][url]
    assert cfg["max_running_requests"] == {"value": 64, "source": "get_server_info internal_states[0].effective_max_running_requests_per_dp"}
    assert cfg["chunked_prefill_size"]["value"] == 4096
    assert cfg["mem_fraction_static"]["value"] == 0.716
    assert cfg["cuda_graph_max_bs"]["value"] == 32
    assert cfg["version"]["value"] == "0.5.23"
    assert cfg["model.served_model_name"]["value"] == "tiny-llama"


def test_text_output_is_80_columns_with_headline_first() -> None:
    with serve({"/metrics": static(COLLECTOR.read_bytes())}) as url:
        p = run("--url", url, "--duration", "0")
    assert p.returncode in (0, 1), p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    assert lines[0].startswith("diagnoser") and ">=0.5.23" in lines[0]
    head = "\n".join(lines[:6])
    assert "running 44" in head and "queued 37" in head and "KV usage 1.00" in head


BAD: dict[str, tuple[dict[str, Route], str]] = {
    "404": ({}, "--enable-metrics"),
    "404-server-info-only": ({"/get_server_info": static((RUN / "get_server_info.json").read_bytes(), "application/json")},
                             "--enable-metrics"),
    "html": ({"/metrics": static(b"<!doctype html><html><body>Sign in</body></html>", "text/html")}, "HTML page"),
    "not-sglang": ({"/metrics": static(b"# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3.5\n")}, "none are SGLang's"),
    "binary-junk": ({"/metrics": static(bytes(range(256)) * 64, "application/octet-stream")}, "no parseable Prometheus metrics"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_one_sentence(case: str) -> None:
    routes, needle = BAD[case]
    with serve(routes) as url:
        p = run("--url", url, "--duration", "0")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr + p.stdout
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("diagnose: ") and needle in err[0], p.stderr


def test_refused_connection_exits_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    p = run("--url", url, "--duration", "0")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "connection refused" in p.stderr and "Check that SGLang is running" in p.stderr
    pj = run("--url", url, "--duration", "0", "--format", "json")
    doc = json.loads(pj.stdout)
    assert pj.returncode == 2 and doc["status"] == "error"
    assert any("connection refused" in e["error"] for e in doc["errors"])


def test_usable_data_from_one_target_is_not_exit_2() -> None:
    cut = COLLECTOR.read_bytes()
    cut = cut[: cut.index(b"sglang:num_queue_reqs{") + 25]  # cut off mid-line
    dead = f"http://127.0.0.1:{free_port()}"
    with serve({"/metrics": static(cut)}) as url:
        p = run("--url", url, "--url", dead, "--duration", "0", "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["signals"][url]["running_reqs"]["last"] == 44
    assert "queue_reqs" not in doc["signals"][url]
    msgs = [m for i in doc["inputs"] for m in i.get("messages", [])]
    assert any("cut off mid-line" in m for m in msgs)
    assert any("connection refused" in e["error"] for e in doc["errors"])


def test_usage_error_exits_2() -> None:
    p = subprocess.run([*_diagnose(), "--once"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nothing to read" in p.stderr and "Traceback" not in p.stderr
    p = run("--url", "http://127.0.0.1:9", "--interval", "0")
    assert p.returncode == 2 and "--interval" in p.stderr and "Traceback" not in p.stderr
    p = run("--url", "http://127.0.0.1:9", "--duration", "ten")
    assert p.returncode == 2 and "not a duration" in p.stderr and "Traceback" not in p.stderr


def test_timeout_exits_2_with_the_cause() -> None:
    import time

    def slow(n: int) -> tuple[int, str, bytes]:
        time.sleep(2.0)
        return 200, "text/plain", COLLECTOR.read_bytes()

    with serve({"/metrics": slow, "/server_info": slow}) as url:
        p = run("--url", url, "--duration", "0", "--timeout", "0.5")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "did not answer within the timeout" in p.stderr and "--timeout" in p.stderr


def test_url_and_log_together() -> None:
    files = sorted((RUN / "metrics").glob("metrics_*.prom"))
    with serve({"/metrics": sequence([p.read_bytes() for p in files[1:6]])}) as url:
        p = run("--url", url, "--log", str(RUN / "server.log"), "--duration", "1", "--interval", "0.25",
                "--format", "json")
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert list(doc["signals"]) == [url]  # one target: the log belongs to the scraped server
    kinds = [i["kind"] for i in doc["inputs"]]
    assert kinds.count("metrics") == 1 and kinds.count("log") == 1
    log_in = next(i for i in doc["inputs"] if i["kind"] == "log")
    assert log_in["lines_read"] > 100 and log_in["lines_recognized"] > 50
    assert doc["version"].endswith("0.5.23")  # no server info served: a range from names, labels, log lines
    assert doc["signals"][url]["running_reqs"]["n"] > 5  # scrapes and decode lines in one series


def test_api_key_protected_server(tmp_path: Path) -> None:
    key = "sk-e2e-0123456789"
    routes = {"/metrics": static(COLLECTOR.read_bytes()), "__api_key__": key,
              "/get_server_info": static((RUN / "get_server_info.json").read_bytes(), "application/json")}
    with serve(routes) as url:
        p = run("--url", url, "--duration", "0")
        assert p.returncode == 2 and "401" in p.stderr and "--api-key" in p.stderr and "Traceback" not in p.stderr
        keyfile = tmp_path / "key"
        keyfile.write_text(key + "\n")
        ok = run("--url", url, "--duration", "0", "--api-key", f"@{keyfile}", "--format", "json")
    assert ok.returncode in (0, 1), ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["signals"][url]["running_reqs"]["last"] == 44 and doc["version"] == "0.5.23"
    assert key not in ok.stdout + ok.stderr
