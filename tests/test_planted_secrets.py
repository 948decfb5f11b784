"""Secrets planted where users put them, in every shape a security probe found leaking, must reach no
output at all: the terminal report, the JSON report, watch mode, every dashboard page and JSON twin and
fragment, the /metrics exporter, a recorded bundle and its report, the replay-server's answers and log,
a replay of the bundle, and the error messages of bad command lines.

The server is a loopback stand-in serving a REAL SGLang 0.5.23 run (tests/data/sglang-cpu-real/
kv-full-retract: its scrapes, server info and log) with secrets planted in it, and it answers only
requests that carry the planted ``--api-key`` (401 otherwise), so every command is also proven to send
the key. Every surface is checked for content too (a surface that showed nothing would prove nothing).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.serve_proc import Serve
from tests.conftest import ROOT
from tests.helpers import free_port

RUN = "kv-full-retract"
KEY = "sk-planted-cli-key-11"  # the server's --api-key: diagnoser must send it and never show it
SECRETS = {
    "server-info api_key": "sk-planted-apikey-01",
    "admin_api_key": "adm-planted-02",
    "unquoted bearer in a config string": "tok-planted-bearer-03",
    "redis URL with an empty user": "pw-planted-redis-04",
    "user:pw@host without a scheme": "pw-planted-noscheme-05",
    "--url http://:pw@host": "pw-planted-url-06",
    "password holding @ (its tail)": "ss-planted-07",
    "JSON in a string in JSON": "pw-planted-deep-08",
    "server_args log line": "sk-planted-log-09",
    "launch_command --api-key": "sk-planted-launch-10",
    "--api-key given to diagnose": KEY,
    "credentials in a metric label": "pw-planted-label-12",
    "nested hf_token": "hf_planted13",
    "camelCase clientSecret": "cs-planted-14",
    "Basic auth header": "dXNlcjpwbGFudGVkMTU=",
    "pass key in a JSON flag value": "pp-planted-pass-16",
    "passphrase key in a JSON flag value": "pp-planted-phrase-17",
    "Azure SAS sig=": "sas-planted-sig-18",
    "quoted multi-word --admin-api-key (its tail)": "planted-multi-19",
    "URL password holding / (its tail)": "planted-slash-20",
}
EXE = ROOT / ".venv" / "bin" / "diagnose"
CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "diagnoser"]


def server_info(data_dir: Path) -> dict[str, Any]:
    info = json.loads((data_dir / "sglang-cpu-real" / RUN / "get_server_info.json").read_text())
    info["api_key"] = SECRETS["server-info api_key"]
    info["admin_api_key"] = SECRETS["admin_api_key"]
    info["otlp_traces_headers"] = f"Authorization: Bearer {SECRETS['unquoted bearer in a config string']}"
    inner = json.dumps({"backend": {"password": SECRETS["JSON in a string in JSON"]}, "hosts": ["cache-1"]})
    info["hicache_storage_backend_extra_config"] = json.dumps({
        "url": f"redis://:{SECRETS['redis URL with an empty user']}@cache:6379/0",
        "mirror": f"cache-admin:{SECRETS['user:pw@host without a scheme']}@mirror:6379",
        "primary": f"redis://admin:p@{SECRETS['password holding @ (its tail)']}@primary:6379",
        "nested": inner, "clientSecret": SECRETS["camelCase clientSecret"],
        "headers": f"Authorization: Basic {SECRETS['Basic auth header']}",
        "pass": SECRETS["pass key in a JSON flag value"], "passphrase": SECRETS["passphrase key in a JSON flag value"],
        "blob": f"https://acct.blob.core.windows.net/kv?sv=2022-11-02&sig={SECRETS['Azure SAS sig=']}&se=2026-12-01",
        "backup": f"redis://admin:pw/{SECRETS['URL password holding / (its tail)']}@backup:6379/0",
    })
    info["launch_command"] = (info.get("launch_command", "python -m sglang.launch_server") + f" --api-key {SECRETS['launch_command --api-key']}"
                              f" --admin-api-key 'adm {SECRETS['quoted multi-word --admin-api-key (its tail)']}'")
    info["internal_states"][0]["hf_token"] = SECRETS["nested hf_token"]
    return info


class PlantedServer:
    """The real run's scrapes (in a loop), server info and model info, with the secrets planted; answers
    401 to any request without ``Authorization: Bearer KEY``."""

    def __init__(self, data_dir: Path) -> None:
        run = data_dir / "sglang-cpu-real" / RUN
        self.scrapes = [p.read_text() for p in sorted((run / "metrics").glob("*.prom"))[1:-2]]
        label = f'model_name="http://loader:{SECRETS["credentials in a metric label"]}@hub/tiny-llama"'
        self.scrapes = [re.sub(r'model_name="[^"]*"', lambda m: label, s) for s in self.scrapes]
        self.info = json.dumps(server_info(data_dir)).encode()
        self.model = (run / "get_model_info.json").read_bytes()
        self.pos = 0
        self.unauthorised = 0
        self.authorised = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    owner.unauthorised += 1
                    self._send(401, b'{"error": "Unauthorized"}', "application/json")
                    return
                owner.authorised += 1
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = owner.scrapes[owner.pos % len(owner.scrapes)].encode()
                    owner.pos += 1
                    self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/get_server_info":
                    self._send(200, owner.info, "application/json")
                elif path == "/get_model_info":
                    self._send(200, owner.model, "application/json")
                else:
                    self._send(404, b"", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url_with_password(self) -> str:  # as a user may paste it (httpx then sends Basic auth: this server says 401)
        return f"http://:{SECRETS['--url http://:pw@host']}@127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def planted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    srv = PlantedServer(data_dir)
    tmp = tmp_path_factory.mktemp("planted")
    log = tmp / "server.log"
    real = (data_dir / "sglang-cpu-real" / RUN / "server.log").read_text()
    line = (f"[2026-11-29 09:31:57] server_args=ServerArgs(model_path='models/tiny-llama', api_key='{SECRETS['server_args log line']}', "
            f"hf_token='{SECRETS['nested hf_token']}', port=30000)\n")
    log.write_text(line + real)
    yield srv, log, tmp
    srv.close()


def leaks(text: str) -> list[str]:
    return [name for name, s in SECRETS.items() if s in text]


def run(args: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_API_KEY", "DIAGNOSER_TOKEN")}
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False, **kw)


def test_no_secret_reaches_any_surface(planted: Any) -> None:
    srv, log, tmp = planted
    found: dict[str, list[str]] = {}
    content: dict[str, str] = {}

    def check(surface: str, text: str, must: str = "") -> None:
        content[surface] = text
        if leaks(text):
            found[surface] = leaks(text)
        assert not must or must in text, f"{surface} shows nothing to check: {must!r} not in {text[:300]!r}"

    # --once: the text report and the JSON report
    r = run(["--once", "--url", srv.url, "--log", str(log), "--duration", "2", "--interval", "1", "--api-key", KEY, "-v"])
    check("--once text", r.stdout + r.stderr, "kv_saturation")
    r = run(["--once", "--url", srv.url, "--log", str(log), "--duration", "2", "--interval", "1", "--api-key", KEY, "--format", "json"])
    doc = json.loads(r.stdout)
    check("--once --format json", r.stdout + r.stderr, "hicache_storage_backend_extra_config")
    assert any(f["rule"] == "kv_saturation" for f in doc["findings"])
    # watch mode (plain lines, then the summary at SIGTERM), with the key from the environment
    env = {k: v for k, v in os.environ.items() if k != "DIAGNOSER_TOKEN"} | {"SGLANG_API_KEY": KEY}
    p = subprocess.Popen([*CMD, "--url", srv.url, "--log", str(log), "--interval", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    time.sleep(6)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    check("watch", out, "Summary after")
    # record a bundle (key from a file), its live report, then the bundle's bytes
    keyfile = tmp / "key"
    keyfile.write_text(KEY + "\n")
    bundle = tmp / "run.dgb"
    r = run(["record", "--url", srv.url, "--log", str(log), "--duration", "3", "--interval", "1", "-o", str(bundle),
             "--api-key", f"@{keyfile}", "--report", "json", "--force"])
    assert r.returncode == 0, r.stderr
    check("record --report json + stderr", r.stdout + r.stderr, "kv_saturation")
    check("bundle bytes (zcat)", gzip.decompress(bundle.read_bytes()).decode("utf-8", "replace"), '"kind":"scrape"')
    # replay of the bundle
    r = run(["--once", "--replay", str(bundle), "--format", "json"])
    check("--once --replay json", r.stdout + r.stderr, "kv_saturation")
    r = run(["--once", "--replay", str(bundle), "-v"])
    check("--once --replay text", r.stdout + r.stderr, "kv_saturation")
    # the replay-server's answers and the log it writes
    port = free_port()
    replay_log = tmp / "replayed.log"
    rs = subprocess.Popen([*CMD, "replay-server", str(bundle), "--port", str(port), "--speed", "50", "--log-out", str(replay_log)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(base + "/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        for path in ("/metrics", "/get_server_info", "/server_info", "/get_model_info", "/model_info", "/v1/loads"):
            check(f"replay-server {path}", httpx.get(base + path, timeout=5).text)
        assert "hicache_storage_backend_extra_config" in content["replay-server /get_server_info"]
        assert "sglang:num_running_reqs" in content["replay-server /metrics"]
        time.sleep(1.0)
    finally:
        rs.send_signal(signal.SIGTERM)
        rs_out, rs_err = rs.communicate(timeout=30)
    check("replay-server stderr + log-out", rs_err + replay_log.read_text(errors="replace"), "Decode batch")
    # the dashboard: every page, twin and fragment, the exporter, healthz (key from the flag)
    srv_log = tmp / "serve.log"
    s = Serve(["--url", srv.url, "--log", str(log), "--interval", "1", "--for", "0", "--api-key", KEY], srv_log)
    try:
        s.wait_for(lambda: s.get("/index.json").json()["targets"][0]["findings"], what="a finding on the dashboard")
        for path in ("/", "/index.json", "/_/cards", "/target/0", "/target/0.json", "/_/target/0", "/target/0/series.json?range=1h",
                     "/target/0/series.json?range=24h", "/rules", "/rules.json", "/rules/kv_saturation", "/rules/kv_saturation.json",
                     "/fleet", "/fleet.json", "/_/fleet", "/metrics", "/healthz", "/target/9", "/target/9.json"):
            check(f"serve {path}", s.get(path).text)
        check("serve /target/0 as JSON by Accept", s.get("/target/0", headers={"Accept": "application/json"}).text, "config")
        assert "hicache_storage_backend_extra_config" in content["serve /target/0.json"]
        assert "diagnoser_scrape_up" in content["serve /metrics"]
    finally:
        s.close()
    check("serve's own output", srv_log.read_text(errors="replace"), "diagnose serve:")
    # usage errors and error messages that quote what was typed
    for args in (["plan", "--api-key", KEY], ["serve", "--api-kee", KEY, "--token", KEY], ["serve", "--api-kee", KEY, "--url", "http://h"], ["--once", "--api-key=" + KEY, "--bogus"],
                 ["--once", "--url", f"http://:{SECRETS['--url http://:pw@host']}@127.0.0.1:{free_port()}", "--duration", "0"],
                 ["--once", "--url", f"http://u:{SECRETS['--url http://:pw@host']}@[::1", "--duration", "0"],
                 ["record", "--url", srv.url, "--api-key", KEY]):
        r = run(args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        check(f"error: {' '.join(args)[:60]}", r.stdout + r.stderr, "diagnose")
    assert srv.authorised > 0 and srv.unauthorised == 0, "a command talked to the server without the --api-key"
    # a URL holding a password, to a server that refuses it: the 401 sentence names the target redacted
    r = run(["--once", "--url", srv.url_with_password, "--duration", "0", "--api-key", KEY])
    assert r.returncode == 2 and "401" in r.stderr
    check("--once against a refusing server", r.stdout + r.stderr, "http://***@127.0.0.1")
    assert len(content) >= 40
    assert found == {}, f"secrets leaked: {found}"
