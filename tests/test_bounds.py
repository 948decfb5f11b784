"""Memory stays bounded whatever an input holds: a followed log that never writes a newline (or a 5 GB
sparse file), a bundle member that inflates to 1.5 GiB, run-directory files that are symlinks to
/dev/zero or to a 5 GB file, and a 200 MB garbage /metrics body. Each case is built from real data
with one hostile part; subprocess cases run under an address-space limit, so a reader that holds what
it should not fails (MemoryError) instead of taking the machine's memory."""

from __future__ import annotations

import gzip
import json
import resource
import struct
import subprocess
import sys
import threading
import tracemalloc
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.logs import MAX_LINE, LogFollower, open_log_reader
from diagnoser.timeline import Timeline
from tests.conftest import DATA, ROOT

RUN = DATA / "sglang-cpu-real" / "kv-full-retract"
LIMIT_AS = 1536 * 1024 * 1024  # address space for a subprocess: diagnoser needs well under 1 GiB of it


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


def diagnose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnoser", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, check=False, preexec_fn=_limited)


def real_lines() -> list[bytes]:
    return [ln for ln in (RUN / "server.log").read_bytes().splitlines(keepends=True) if b"Decode batch" in ln][:20]


def _follower(path: Path) -> tuple[Timeline, Any, LogFollower]:
    tl = Timeline(target="t")
    reader = open_log_reader(ADAPTER, tl, str(path))
    return tl, reader, LogFollower(reader, str(path))


def test_a_followed_line_that_never_ends_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    tl, reader, f = _follower(path)
    lines = real_lines()
    with open(path, "ab") as fh:
        fh.write(lines[0])
    tracemalloc.start()
    try:
        for _ in range(12):  # 36 MB without a newline, as a broken writer or a binary file would grow
            with open(path, "ab") as fh:
                fh.write(b"x" * (3 << 20))
            f.poll()
            assert len(f.partial) < MAX_LINE
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"following held {peak / 2**20:.0f} MiB"
    with open(path, "ab") as fh:
        fh.write(b"\n" + b"".join(lines[1:]))
    f.poll()
    f.close()
    assert len(tl.get("running_reqs")) == len(lines)  # the real lines on both sides of the junk were read
    assert reader.report.errors == 1 and f.overlong == 1 and reader.report.lines_read == len(lines) + 1


def test_following_a_5_gb_sparse_file_holds_little(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    with open(path, "wb") as fh:
        fh.truncate(5 * 1024**3)  # zeros, no newline: what a preallocated or corrupt file looks like
    tl, reader, f = _follower(path)
    tracemalloc.start()
    try:
        for _ in range(3):
            f.poll()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        f.close()
    assert peak < 8 << 20, f"following held {peak / 2**20:.0f} MiB"
    assert f.skipping and len(f.partial) < MAX_LINE and f.pos >= 3 * (64 << 20)  # it keeps reading, and keeps nothing


def _bomb(path: Path, gib: float = 1.5) -> None:
    """A valid bundle manifest, then one gzip member that inflates to ``gib`` GiB of zeros (1.5 MB on disk)."""
    chunk = 64 << 20
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = co.compress(b"\0" * chunk) + co.flush(zlib.Z_FULL_FLUSH)
    n = int(gib * 1024**3) // chunk
    crc = 0
    zero = b"\0" * chunk
    for _ in range(n):
        crc = zlib.crc32(zero, crc)
    man = {"v": 1, "kind": "manifest", "format": "diagnoser-bundle", "format_version": 1, "targets": [], "logs": []}
    with open(path, "wb") as f:
        f.write(gzip.compress((json.dumps(man) + "\n").encode()))
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + block * n + co.flush(zlib.Z_FINISH) + struct.pack("<II", crc, (n * chunk) & 0xFFFFFFFF))
        scrape = {"v": 1, "kind": "scrape", "t": 1_795_944_700.0, "target": "http://10.0.0.1:30000",
                  "text": sorted((RUN / "metrics").glob("*.prom"))[5].read_text(), "status": 200}
        f.write(gzip.compress((json.dumps(scrape) + "\n").encode()))


def test_a_bundle_member_that_inflates_to_1_5_gib_is_skipped(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.dgb"
    _bomb(bomb)
    assert bomb.stat().st_size < 4 << 20
    r = diagnose("--once", "--replay", str(bomb))
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-500:]
    assert r.returncode in (0, 1) and "inflate past 64 MiB" in r.stdout + r.stderr
    assert "running" in r.stdout  # the intact member after the bomb was replayed


def test_run_directory_files_that_are_devices_or_huge_are_refused_with_a_reason(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    real = sorted((RUN / "metrics").glob("*.prom"))
    for p in real[3:6]:
        (run / "metrics" / p.name).write_bytes(p.read_bytes())
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as fh:
        fh.truncate(5 * 1024**3)
    (run / "metrics" / "metrics_1795944800.prom").symlink_to("/dev/zero")
    (run / "metrics" / "metrics_1795944801.prom").symlink_to(huge)
    (run / "get_server_info.json").symlink_to("/dev/zero")
    (run / "server.log").symlink_to("/dev/zero")
    r = diagnose("--once", "--replay", str(run), timeout=60)
    out = r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-500:]
    assert r.returncode in (0, 1), out[-800:]
    assert "not a regular file" in out and "more than a scrape can be" in out
    assert "running" in r.stdout  # the three real scrapes were used


def test_a_log_larger_than_a_replay_holds_is_cut_at_a_line_and_said(tmp_path: Path) -> None:
    from diagnoser.replay import load_source, source

    run = tmp_path / "run"
    run.mkdir()
    text = (RUN / "server.log").read_bytes()
    (run / "server.log").write_bytes(text * 3)
    old = source.MAX_LOG_FILE
    source.MAX_LOG_FILE = len(text) + 10  # the bound, scaled down (the real one is 512 MiB)
    try:
        src = load_source(str(run))
    finally:
        source.MAX_LOG_FILE = old
    lines = sum(len(r["lines"]) for r in src.records if r["kind"] == "log")
    assert lines == text.count(b"\n") and any("were replayed" in p for p in src.problems)


class GarbageServer:
    """Answers /metrics with 200 MB of metric-looking garbage (prometheus_client would read it as some
    other service's metrics), generated as it is sent."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/metrics":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                piece = b"".join(b"garbage_metric_%d{x=\"y\"} %d\n" % (i, i) for i in range(20000))
                n = 200 * 1024 * 1024 // len(piece)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(piece) * n))
                self.end_headers()
                try:
                    for _ in range(n):
                        self.wfile.write(piece)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def garbage() -> Any:
    s = GarbageServer()
    yield s
    s.close()


def test_a_200_mb_garbage_body_is_too_big_not_metrics_disabled(garbage: GarbageServer) -> None:
    r = diagnose("--once", "--url", garbage.url, "--duration", "0", "--format", "json", timeout=90)
    assert "Traceback" not in r.stderr, r.stderr[-500:]
    doc = json.loads(r.stdout)
    rules = [f["rule"] for f in doc["findings"]]
    assert "metrics_disabled" not in rules and "source_unreachable" in rules
    msg = " ".join(m for i in doc["inputs"] for m in i.get("messages", []))
    assert "more than 32 MiB" in msg and "not an SGLang exposition" in msg
