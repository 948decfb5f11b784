"""A hostile target, rebuilt from the adversarial pass of issue 26: each attack is served by a real
loopback HTTP server (the real SGLang 0.5.23 exposition from tests/data with one hostile part) and read
by a real ``diagnose --once --url`` in a subprocess, whose peak memory is read with
``resource.getrusage(RUSAGE_CHILDREN)`` in a wrapper process that runs nothing else.

Each case asserts: no traceback, peak RSS under the bound (1 GB, or tighter where the cap makes the
answer small), an end within the deadline, and the one sentence that names the cause (so a run that
silently read the attack fails too). Seeded and bounded: every body is built from fixed data.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DATA, ROOT

REAL = (DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom").read_bytes()
GB = 1024 * 1024 * 1024
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t0 = time.monotonic()\n"
    "p = subprocess.run([sys.executable, '-m', 'diagnoser', *sys.argv[1:]], capture_output=True, text=True)\n"
    "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr, 's': time.monotonic() - t0,\n"
    "                  'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))\n"
)


def zeros_gzip(mib: int) -> bytes:
    """One gzip member of ``mib`` MiB of NUL bytes (level 1: quick to build, ~1 MB per 256 MiB)."""
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    z = bytes(1 << 20)
    return b"".join([*(c.compress(z) for _ in range(mib)), c.flush()])


def many_series(n: int) -> bytes:
    """The real exposition plus ``n`` extra ``dp_rank`` series of a real SGLang gauge (as the attack sent)."""
    rows = (f'sglang:num_running_reqs{{dp_rank="{i}",engine_type="unified",model_name="tiny-llama",pp_rank="0",tp_rank="0"}} 1.0\n'
            for i in range(n))
    return REAL + "".join(rows).encode()


def huge_label(n: int) -> bytes:
    line = f'sglang:num_running_reqs{{engine_type="unified",model_name="{"x" * n}",tp_rank="0"}} 5.0\n'.encode()
    return REAL + line


class Hostile:
    """The attacks, one path each; ``other`` is a second server on another port (a redirect's target)."""

    def __init__(self) -> None:
        bomb = zeros_gzip(256)
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {
            "/bomb/metrics": (200, {"Content-Encoding": "gzip"}, bomb),
            "/nested/metrics": (200, {"Content-Encoding": "gzip, gzip"}, gzip.compress(bomb)),
            "/hop/metrics": (302, {"Location": "/nested/metrics"}, b""),
            "/hopbomb/metrics": (302, {"Location": "/bomb/metrics"}, b""),  # a same-origin redirect to the bomb: followed
            "/series/metrics": (200, {}, many_series(300_000)),
            "/label/metrics": (200, {}, huge_label(20 * 1024 * 1024)),
        }
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.srv.daemon_threads = True
        self.other = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.other.daemon_threads = True
        self.routes["/away/metrics"] = (302, {"Location": f"http://127.0.0.1:{self.other.server_address[1]}/real/metrics"}, b"")
        self.routes["/real/metrics"] = (200, {}, REAL)
        info = json.loads((DATA / "sglang-cpu-real" / "kv-full-retract" / "get_server_info.json").read_text())
        info["served_model_name"] = "tiny\ud800"
        deep = json.dumps(info)[:-1] + ', "extra": ' + '{"a": ' * 450 + '"deep"' + "}" * 450 + "}"
        self.routes["/deep/metrics"] = (200, {}, REAL)
        for path in ("/deep/server_info", "/deep/get_server_info"):
            self.routes[path] = (200, {"Content-Type": "application/json"}, deep.encode())
        for s in (self.srv, self.other):
            s.handle_error = lambda *a: None  # type: ignore[method-assign]  # a client that stopped reading at its cap
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/drip/"):  # the status line, then the headers one byte every 0.2 s
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        self.wfile.flush()
                        for _ in range(600):
                            self.wfile.write(b"X")
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        pass
                    return
                status, headers, body = owner.routes.get(self.path, (404, {}, b"not found\n"))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the client stopped reading at its cap
                    pass

            def do_POST(self) -> None:  # noqa: N802  (the Prometheus API's queries)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

        return H

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.srv.server_address[1]}/{name}"

    def close(self) -> None:
        for s in (self.srv, self.other):
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def hostile() -> Any:
    h = Hostile()
    yield h
    h.close()


def attack(*args: str, timeout: float = 120) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    both = out["out"] + out["err"]
    assert "Traceback" not in both and "MemoryError" not in both, both[-2000:]
    return out


def once(url: str, *extra: str) -> dict[str, Any]:
    return attack("--once", "--url", url, "--duration", "0", "--timeout", "5", *extra)


def test_gzip_bomb_is_cut_at_the_cap_after_decompression(hostile: Hostile) -> None:
    r = once(hostile.url("bomb"))
    assert "more than 32 MiB after decompression" in " ".join(r["out"].split()), r["out"]
    assert r["rss"] < 400 * 1024 * 1024  # 256 MiB inflated, held at most 32 MiB of it
    assert r["rc"] == 2 and " 0 errors" not in r["out"]  # the error count tells the truth


def test_nested_encodings_behind_a_redirect_are_refused(hostile: Hostile) -> None:
    r = once(hostile.url("hop"), "--format", "json")
    doc = json.loads(r["out"])
    metrics = [i for i in doc["inputs"] if i["kind"] == "metrics"][0]
    assert metrics["errors"] >= 1 and any("nested encodings (gzip, gzip)" in m for m in metrics["messages"]), metrics
    assert r["rss"] < 400 * 1024 * 1024


def test_a_redirect_to_another_port_is_not_followed(hostile: Hostile) -> None:
    r = once(hostile.url("away"), "--format", "json")
    metrics = [i for i in json.loads(r["out"])["inputs"] if i["kind"] == "metrics"][0]
    assert any(f"redirected to another address (http://127.0.0.1:{hostile.other.server_address[1]})" in m for m in metrics["messages"])
    assert metrics["lines_recognized"] == 0 and metrics["errors"] == 1  # the other port's data is not the target's


def test_a_20_mb_label_value_is_dropped_and_the_rest_used(hostile: Hostile) -> None:
    r = once(hostile.url("label"), "--format", "json")
    doc = json.loads(r["out"])
    metrics = [i for i in doc["inputs"] if i["kind"] == "metrics"][0]
    assert any("longer than 16 KiB" in m for m in metrics["messages"]) and metrics["errors"] >= 1
    assert metrics["lines_recognized"] > 0  # the real exposition around it was read
    assert r["rss"] < GB
    assert r["s"] < 30


def test_300k_series_are_capped_in_time_and_memory(hostile: Hostile) -> None:
    r = once(hostile.url("series"), "--format", "json")
    doc = json.loads(r["out"])
    metrics = [i for i in doc["inputs"] if i["kind"] == "metrics"][0]
    said = " ".join(metrics["messages"])
    assert "more than 50,000 SGLang samples" in said and "DP/PP ranks" in said, said
    assert r["rss"] < GB
    assert r["s"] < 30  # 1 scrape; was 68 s for 32 MiB of series


def test_a_header_drip_ends_at_the_deadline(hostile: Hostile) -> None:
    r = attack("--once", "--url", hostile.url("drip"), "--duration", "0", "--timeout", "2")
    assert "did not" in r["out"] + r["err"]
    assert r["s"] < 12, r["s"]  # 2 x timeout + duration + timeout, and start-up


def test_fetch_refuses_cross_origin_and_caps_in_process(hostile: Hostile) -> None:
    """The same bounded read, called directly (both paths: httpx and the live poll's http.client)."""
    from diagnoser.sources.http import PlainTarget, fetch, make_client

    c, p = make_client(timeout=5), PlainTarget(timeout=5)
    try:
        for f in (fetch(c, hostile.url("bomb/metrics")), p.fetch(hostile.url("bomb/metrics"))):
            assert f.ok and f.truncated and len(f.text) == 32 * 1024 * 1024 and "after gzip decompression" in f.cause
        for f in (fetch(c, hostile.url("nested/metrics")), p.fetch(hostile.url("nested/metrics"))):
            assert not f.ok and "nested encodings" in f.error
        for f in (fetch(c, hostile.url("away/metrics")), p.fetch(hostile.url("away/metrics"))):
            assert not f.ok and "redirected to another address" in f.error
        for f in (fetch(c, hostile.url("hop/metrics")), p.fetch(hostile.url("hop/metrics"))):  # same origin: followed
            assert not f.ok and "nested encodings" in f.error
        t0 = time.monotonic()
        f = fetch(make_client(timeout=1.5), hostile.url("drip/metrics"))
        assert not f.ok and time.monotonic() - t0 < 3.0, f.error
    finally:
        c.close()
        p.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc for the server's memory")
def test_serve_memory_stays_flat_under_a_target_sending_the_maximum(hostile: Hostile) -> None:
    """``serve`` polling every second a target that sends 300k series and one that sends a 20 MB label
    value: its memory after 10 polls and after 25 stays within 1 GB and does not keep growing."""
    import httpx

    from tests.helpers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--url", hostile.url("series"), "--url", hostile.url("label"),
                             "--port", str(port), "--interval", "1", "--timeout", "5"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        samples, slow = [], []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 25:
            time.sleep(2.5)
            t = time.monotonic()
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            slow.append(time.monotonic() - t)
            samples.append(_rss(proc.pid))
        early, late = max(samples[:4]), max(samples[-4:])
        print("serve RSS MiB", [s // 2**20 for s in samples], "healthz s", [round(x, 3) for x in slow])
        assert max(samples) < GB, samples
        assert late < early + 100 * 1024 * 1024, samples  # flat: not growing poll after poll
        assert max(slow) < 1.0, slow
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err, err[-2000:]


def test_serve_behind_a_redirect_to_a_gzip_bomb_stays_bounded_and_says_the_cut(hostile: Hostile) -> None:
    """``serve`` polling every second a target whose /metrics redirects (same origin: followed) to 16 KB of
    gzip that inflates to 256 MiB (the attack climbed to 3.7 GB every 12 s with /healthz ok): memory stays
    under 1 GB and flat, /healthz answers, and the target is down with the cut said in one sentence."""
    import httpx

    from tests.helpers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--url", hostile.url("hopbomb"), "--port", str(port),
                             "--interval", "1", "--timeout", "5"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        samples, slow = [], []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 16:
            time.sleep(2.0)
            t = time.monotonic()
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            slow.append(time.monotonic() - t)
            samples.append(_rss(proc.pid))
        page = httpx.get(f"http://127.0.0.1:{port}/target/0", headers={"Accept": "application/json"}, timeout=5).text
        print("serve RSS MiB", [s // 2**20 for s in samples], "healthz s", [round(x, 3) for x in slow])
        assert max(samples) < GB, samples
        assert max(samples[-3:]) < max(samples[:3]) + 100 * 1024 * 1024, samples  # flat
        # (each poll inflates and checks 32 MiB, ~0.15 s of CPU a second: on a loaded machine /healthz
        # waits for CPU, so its bound here is the request's own timeout, not the slowloris test's 1 s)
        assert max(slow) < 5.0, slow
        assert "sent more than 32 MiB after decompression" in page and '"health": "down"' in page, page[:2000]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err, err[-2000:]


def test_prometheus_api_answers_are_bounded(hostile: Hostile) -> None:
    """The Prometheus API client reads through the same bounded read: a gzip bomb is one sentence (it
    was a MemoryError traceback), a nested encoding is refused, a header drip ends at its deadline."""
    from diagnoser.fleet.promapi import PromAPI, PromError

    base = f"http://127.0.0.1:{hostile.srv.server_address[1]}"
    hostile.routes["/bomb/api/v1/query"] = (200, {"Content-Encoding": "gzip", "Content-Type": "application/json"}, zeros_gzip(64))
    hostile.routes["/nested/api/v1/query"] = (200, {"Content-Encoding": "gzip, gzip"}, gzip.compress(zeros_gzip(8)))
    api = PromAPI(base + "/bomb", max_bytes=1024 * 1024)
    with pytest.raises(PromError) as e:
        api.query("up", 0)
    assert "more than 1 MiB, after decompression" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PromError) as e:
        PromAPI(base + "/nested").query("up", 0)
    assert "nested encodings" in str(e.value)
    t0 = time.monotonic()
    with pytest.raises(PromError) as e:
        PromAPI(base + "/drip", timeout=0.5).query("up", 0)
    assert e.value.timeout and time.monotonic() - t0 < 8  # the whole request: timeout + 5 s of socket grace


def test_a_server_info_nested_450_deep_with_a_lone_surrogate_is_read(hostile: Hostile) -> None:
    """Redaction hit the recursion limit on it (and serve then showed the healthy target down for good)."""
    r = once(hostile.url("deep"), "--format", "json")
    doc = json.loads(r["out"])
    info = [i for i in doc["inputs"] if i["kind"] == "server_info"][0]
    assert info["scrapes"] >= 1 and info["errors"] == 0, info
    assert r["rc"] in (0, 1) and "\\ud800" not in r["out"]


def test_drop_long_lines_equals_the_plain_split() -> None:
    """The window test that skips the split is exact: the same result as splitting every text (seeded)."""
    import random

    from diagnoser.sources.metrics import drop_long_lines

    def reference(t: str, limit: int) -> tuple[str, int]:
        lines = t.split("\n")
        kept = [ln for ln in lines if len(ln) <= limit]
        return ("\n".join(kept), len(lines) - len(kept)) if len(kept) != len(lines) else (t, 0)

    r = random.Random(26)
    for _ in range(3000):
        limit = r.randint(1, 64)
        t = "\n".join("x" * r.choice([0, 1, 5, limit - 1, limit, limit + 1, 2 * limit, r.randint(0, 200)]) for _ in range(r.randint(0, 30)))
        assert drop_long_lines(t, limit) == reference(t, limit), (limit, t)
    assert drop_long_lines(REAL.decode()) == (REAL.decode(), 0)
