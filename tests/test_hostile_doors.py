"""Every terminal door with the same hostile strings, from a hostile bundle and a hostile Prometheus:
0 raw ESC (and no raw C1 control, bidi override or undecodable byte) in anything diagnoser prints, no
traceback, and a deeply nested or lone-surrogate bundle is read, not fatal.

The bundle is the real example recording (examples/kv-full-retract.dgb, a real SGLang 0.5.23 run on
CPU) rewritten byte for byte with hostile target names, log source, model path, a note, a config nested
450 deep (which json parses and redaction used to recurse on) and one nested 5,000 deep (which json
refuses: an unreadable record, counted). It is written as raw gzip members, not through BundleWriter,
so that nothing diagnoser writes has cleaned it first.
"""

from __future__ import annotations

import gzip
import json
import os
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

from diagnoser.bundle import read_bundle
from diagnoser.outputs.termsafe import term_safe
from tests.conftest import ROOT
from tests.helpers import free_port

# OSC 52 clipboard write, screen clear, title change, right-to-left override, 8-bit CSI, a lone surrogate
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]0;pwned\x07\u202eevil\x9b31m\r\ud800"
RAW = (b"\x1b", "\u202e".encode(), "\x9b".encode(), b"\r")  # \x9b as UTF-8 (C2 9B); \r only as a raw control
EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"


def nested(depth: int) -> str:
    return '{"a": ' * depth + '"deep"' + "}" * depth


def hostile_bundle(path: Path) -> None:
    res = read_bundle(str(EXAMPLE))
    name = "kv" + HOSTILE
    man = dict(res.manifest or {})
    man["targets"] = [{"name": name, "url": name}]
    man["logs"] = [{"source": "server.log" + HOSTILE, "target": name}]
    lines = [json.dumps(man)]
    for rec in res.records:
        rec = dict(rec)
        rec["target"] = name
        if rec["kind"] == "log":
            rec["source"] = "server.log" + HOSTILE
        if rec["kind"] == "config" and isinstance(rec.get("data"), dict):
            rec["data"] = {**rec["data"], "model_path": "models/tiny" + HOSTILE, "served_model_name": HOSTILE}
        lines.append(json.dumps(rec))
    t = res.records[0]["t"]
    lines.append(json.dumps({"v": 1, "kind": "note", "t": t, "text": "note" + HOSTILE}))
    cfg = '{"v": 1, "kind": "config", "t": %s, "target": %s, "path": "/get_server_info", "data": {"extra": %s}}'
    lines.append(cfg % (t, json.dumps(name), nested(450)))
    lines.append(cfg % (t, json.dumps(name), nested(5000)))
    lines.append(json.dumps(res.end or {"v": 1, "kind": "end", "t": t + 60, "reason": "duration"}))
    body = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(body[:len(body) // 2]) + gzip.compress(body[len(body) // 2:]))  # two members


def check(p: subprocess.CompletedProcess[bytes], *ok_codes: int) -> str:
    both = p.stdout + p.stderr
    for raw in RAW:
        assert raw not in both, (raw, both[max(0, both.find(raw) - 200): both.find(raw) + 50])
    text = both.decode("utf-8")  # strict: what diagnoser printed is valid UTF-8
    assert "Traceback" not in text and "RecursionError" not in text, text[-3000:]
    assert p.returncode in (ok_codes or (0, 1)), (p.returncode, text[-2000:])
    return text


def diagnose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "diagnoser", *args], capture_output=True, cwd=ROOT, timeout=timeout, env=env, check=False)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("hostile") / "hostile.dgb"
    hostile_bundle(p)
    return p


def test_term_safe_escapes_every_control() -> None:
    out = term_safe("a\tb\n" + HOSTILE)
    assert out.startswith("a\tb\n") and "\\x1b]52;c;" in out and "\\u202e" in out and "\\x9b" in out and "\\ud800" in out
    assert all(raw.decode() not in out for raw in RAW)
    out.encode("utf-8")  # encodable
    assert term_safe("plain text · é") == "plain text · é"


def test_once_replay_text_and_json(bundle: Path) -> None:
    text = check(diagnose("--once", "--replay", str(bundle)))
    assert "\\x1b]52;c;" in text  # shown, escaped: the reader sees it was there
    assert "unreadable record" in text  # the 5,000-deep one
    doc = json.loads(check(diagnose("--once", "--replay", str(bundle), "--format", "json")))
    assert doc["inputs"] and doc["signals"]  # the real run in it was judged


def test_record_from_compare_and_replay_server(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.dgb"
    check(diagnose("record", "--from", str(bundle), "-o", str(out)), 0)
    assert read_bundle(str(out)).records  # written: and redacted/cleaned on the way (no surrogate survives)
    check(diagnose("compare", str(bundle), str(out)), 0, 1)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "replay-server", str(bundle), "--port", str(port), "--speed", "100"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        info = httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=5)
        assert info.status_code in (200, 404)
        check(diagnose("--once", "--url", f"http://127.0.0.1:{port}", "--duration", "2", "--interval", "1"))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            o, e = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            o, e = proc.communicate()
    check(subprocess.CompletedProcess(proc.args, 0, o, e))


class HostileProm:
    """A Prometheus API whose series labels, warnings and errors carry the hostile strings."""

    def __init__(self) -> None:
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                if path.endswith("/series"):
                    doc: dict[str, Any] = {"status": "success", "warnings": ["warn" + HOSTILE], "data": [
                        {"__name__": "sglang:num_running_reqs", "job": "sglang" + HOSTILE, "instance": "10.0.0.1:30000" + HOSTILE}]}
                elif "/label/" in path:
                    doc = {"status": "success", "data": ["sglang" + HOSTILE]}
                else:
                    doc = {"status": "error", "errorType": "bad_data" + HOSTILE, "error": "boom" + HOSTILE, "warnings": ["w" + HOSTILE]}
                body = json.dumps(doc).encode()
                self.send_response(200 if doc["status"] == "success" else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._answer()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture(scope="module")
def prom() -> Any:
    p = HostileProm()
    yield p
    p.close()


def test_once_prometheus(prom: HostileProm) -> None:
    text = check(diagnose("--once", "--prometheus", prom.url, "--timeout", "5"), 0, 1, 2)
    assert "\\x1b" in text  # the hostile strings were shown (escaped), not skipped


def test_watch_prometheus_plain_lines_and_summary(prom: HostileProm) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "--prometheus", prom.url, "--interval", "1", "--timeout", "3"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    try:
        o, e = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        o, e = proc.communicate()
    text = check(subprocess.CompletedProcess(proc.args, 0, o, e))
    assert text.strip()


def test_usage_error_line_is_neutral() -> None:
    p = diagnose("--once", "--url", "http://h" + HOSTILE.replace("\ud800", ""), "--duration", "0")
    check(p, 2)


def test_serve_replay_pages_answer_for_the_hostile_bundle(bundle: Path) -> None:
    """A lone surrogate in a served model name made /, /_/cards and /fleet answer 500 for every target;
    the hostile bundle's pages now answer, with the strings escaped."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--replay", str(bundle), "--port", str(port),
                             "--speed", "50", "--interval", "1"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        time.sleep(3)  # a few polls of the replay
        for path in ("/", "/index.json", "/_/cards", "/target/0", "/target/0.json", "/target/0/series.json?range=1h", "/metrics"):
            r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    assert "Traceback" not in err, err[-3000:]


def test_numbers_at_the_edge_of_float_print_no_numpy_warning(tmp_path: Path) -> None:
    """Gauges and counters at ±1.7e308 (finite, so read) overflow in sums and rates: the arithmetic gives inf or
    NaN, which the rules read as no number, and the terminal gets the report, not NumPy's warning lines."""
    names = ["num_running_reqs", "num_queue_reqs", "token_usage", "generation_tokens_total", "prompt_tokens_total", "num_requests_total"]
    files = []
    for i, v in enumerate(("1.7e308", "-1.7e308", "1.7e308")):
        f = tmp_path / f"m{i}.prom"
        f.write_text("".join(f"# TYPE sglang:{n} {'counter' if n.endswith('_total') else 'gauge'}\nsglang:{n}{{model_name=\"m\"}} {v}\n"
                             for n in names))
        files += ["--metrics-file", str(f)]
    p = diagnose("--once", *files)
    check(p)
    assert p.stderr == b"" and b"diagnoser" in p.stdout, p.stderr.decode(errors="replace")[-2000:]
