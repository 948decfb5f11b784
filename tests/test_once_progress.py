"""``diagnose --once --url … --duration`` shows a progress line on a terminal's stderr while it samples, and
nothing when stderr is piped. The real command runs in a pseudo-terminal against a loopback server that
serves REAL SGLang 0.5.23 scrapes (tests/data/sglang-cpu-real/kv-full-retract)."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from diagnoser.cli.statusline import StatusLine, sampling_text
from tests.browser.samples_server import SampleServer
from tests.conftest import ROOT


def _cmd() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "diagnose"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "diagnoser"]


def _run_on_pty(args: list[str], cols: int = 120, timeout: float = 60) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (``cols`` wide), stdout on a pipe: (exit code, stdout, terminal bytes)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm"
    proc = subprocess.Popen([*_cmd(), *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read().decode() if proc.stdout else ""
        code = proc.wait(10)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, out, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def server(data_dir: Path) -> SampleServer:
    with SampleServer(data_dir, "kv-full-retract") as srv:
        yield srv


def test_sampling_shows_progress_on_a_terminal(server: SampleServer) -> None:
    code, out, tty = _run_on_pty(["--once", "--url", server.url, "--duration", "3s", "--interval", "1s"])
    assert code == 1, out + tty  # kv-full-retract has findings
    assert out.startswith("diagnoser · sglang 0.5.23") and "kv_saturation" in out  # the report is intact on stdout
    frames = [f for f in tty.split("\r") if f.strip("\x1b[K")]
    assert frames and all(f.startswith("sampling 1 target ") for f in frames), frames
    scrapes = {m for f in frames for m in re.findall(r"scrape (\d)/4", f)}
    assert scrapes >= {"1", "2", "3", "4"}, frames  # it moves with every scrape
    assert any("s left" in f for f in frames) and any(re.search(r"\d s of 3 s", f) for f in frames)
    assert all(len(f.replace("\x1b[K", "")) < 120 for f in frames)  # one line: it is rewritten in place
    assert tty.endswith("\r\x1b[K"), repr(tty[-40:])  # erased before the report


def test_sampling_prints_no_progress_when_piped(server: SampleServer) -> None:
    r = subprocess.run([*_cmd(), "--once", "--url", server.url, "--duration", "2s", "--interval", "1s"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1 and "kv_saturation" in r.stdout
    assert "sampling" not in r.stderr and "\r" not in r.stderr and "\x1b" not in r.stderr, r.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_rewrites_one_line_and_stays_silent_off_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "80")  # a StringIO has no terminal: the width falls back to $COLUMNS
    s = _Tty()
    line = StatusLine(s, min_interval=0)
    line.update("a" * 500)  # longer than any terminal: cut to one line
    line.update("second")
    line.clear()
    frames = s.getvalue().split("\r")
    assert frames[1].endswith("…\x1b[K") and len(frames[1].removesuffix("\x1b[K")) < 80 and frames[2] == "second\x1b[K" and frames[3] == "\x1b[K"
    piped = io.StringIO()
    quiet = StatusLine(piped)
    quiet.update("x")
    quiet.clear()
    assert not quiet.enabled and piped.getvalue() == ""
    monkeypatch.setenv("TERM", "dumb")
    assert not StatusLine(_Tty()).enabled


def test_sampling_text() -> None:
    t = sampling_text({"scrapes": 4, "of": 7, "elapsed_s": 6.2, "duration_s": 12, "targets": 2, "failing": 1})
    assert t == "sampling 2 targets ▕██████      ▏ 6 s of 12 s · scrape 4/7 · 6 s left · 1 not answering"
    end = sampling_text({"scrapes": 7, "of": 7, "elapsed_s": 12.4, "duration_s": 12, "targets": 1, "failing": 0})
    assert end.endswith("12 s of 12 s · scrape 7/7 · judging") and "▕████████████▏" in end
    assert sampling_text({"scrapes": 3, "of": 4, "elapsed_s": 3.1, "duration_s": 3, "targets": 1}).endswith("scrape 3/4 · 0 s left")
    long = sampling_text({"scrapes": 1, "of": 31, "elapsed_s": 75, "duration_s": 300, "targets": 1, "failing": 1})
    assert "1m15s of 5m00s" in long and "3m45s left" in long and long.endswith("· not answering")
