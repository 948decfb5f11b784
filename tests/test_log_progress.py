"""The progress line of a long log read (diagnoser/cli/progress.py, drawn on the run's status line): on a
terminal's stderr it shows lines, MB, MB/s and the time left and is erased before the report; into a
pipe nothing is printed. Run as a user runs it: ``diagnose --once --log`` as a subprocess, its stderr a
real pseudo-terminal (``pty``) or a pipe, on a generated log big enough for the bulk reader."""

from __future__ import annotations

import importlib.util
import io
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli.progress import LogProgress, line_text, log_progress
from tests.conftest import ROOT


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("bench_log_backfill", ROOT / "bench" / "bench_log_backfill.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("progress") / "server.log"
    _generator().generate(path, 20.0, seed=3)  # three chunks of the bulk reader
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["DIAGNOSER_PROGRESS_DELAY"] = "0"  # draw from the first chunk (the log reads in well under a second)
    env["TERM"] = "xterm"  # a terminal with cursor control (TERM=dumb turns the line off)
    env.pop("DIAGNOSER_LOG_WORKERS", None)
    return env


def _run_with_tty_stderr(args: list[str]) -> tuple[int, bytes, bytes]:
    """Run with stderr on a pseudo-terminal (stdout a pipe); returns (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=_env())
    os.close(slave)
    seen = bytearray()
    out = bytearray()
    assert proc.stdout is not None
    fds = [master, proc.stdout.fileno()]
    while fds:
        ready, _, _ = select.select(fds, [], [], 60)
        assert ready, "diagnose produced nothing for 60 s"
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the terminal's other end closed (Linux gives EIO)
                chunk = b""
            if not chunk:
                fds.remove(fd)
            elif fd == master:
                seen += chunk
            else:
                out += chunk
    os.close(master)
    return proc.wait(timeout=60), bytes(out), bytes(seen)


def test_progress_on_a_terminal_and_none_into_a_pipe(big_log: Path) -> None:
    args = [sys.executable, "-m", "diagnoser", "--once", "--log", str(big_log)]
    code, out, tty = _run_with_tty_stderr(args)
    assert code in (0, 1), tty.decode(errors="replace")
    text = tty.decode()
    frames = [f.removesuffix("\x1b[K") for f in text.split("\r") if f.strip()]  # each redraw erases the rest of the line
    frames = [f for f in frames if f]
    assert frames, f"no progress line on the terminal: {text!r}"
    line = re.compile(r"^reading server\.log: [\d,.]+( M)? lines · [\d,]+ of [\d,]+ MB · [\d,]+ MB/s · [\d,]+ s left$")
    assert all(line.match(f) for f in frames), frames
    assert text.endswith("\r\x1b[K"), "the line is erased before the report"
    # every frame redraws over the one before: no newline reaches the terminal from the progress line
    assert "\n" not in text

    piped = subprocess.run(args, capture_output=True, env=_env(), timeout=120)
    assert piped.returncode == code
    assert piped.stderr == b"", piped.stderr  # nothing but the report's own errors would go there
    assert piped.stdout == out  # the report itself is the same either way


def test_line_text_without_a_size_has_no_time_left() -> None:
    class R:
        class report:
            source = "-"
        bytes_read = 50_000_000
        size = None
        line_no = 2_500_000

    assert line_text(R(), 2.0) == "reading stdin: 2.50 M lines · 50 MB · 25 MB/s"
    R.size = 100_000_000
    R.report.source = "/var/log/sglang/server.log"
    assert line_text(R(), 2.0) == "reading server.log: 2.50 M lines · 50 of 100 MB · 25 MB/s · 2 s left"


def test_progress_waits_for_a_long_read() -> None:
    class R:
        class report:
            source = "x.log"
        bytes_read = 1
        size = 10
        line_no = 1
        started = 0.0

    class Line:
        enabled = True

        def __init__(self) -> None:
            self.drawn: list[str] = []
            self.cleared = 0

        def update(self, text: str) -> None:
            self.drawn.append(text)

        def clear(self) -> None:
            self.cleared += 1

    now = [0.0]
    line = Line()
    p = LogProgress(line, clock=lambda: now[0])
    p.delay = 0.5
    r = R()
    p(r)
    now[0] = 0.3
    p(r)
    assert line.drawn == []  # a short read shows nothing
    now[0] = 0.6
    p(r)
    assert line.drawn == ["reading x.log: 1 lines · 0 of 0 MB · 0 MB/s · 5 s left"]
    p.clear()
    assert line.cleared == 1
    assert log_progress(stream=io.StringIO()) is None  # not a terminal
    assert log_progress(Line()) is not None  # the run's status line, shared with the sampling progress


def test_the_line_fits_a_narrow_terminal(big_log: Path) -> None:
    """On a 40-column terminal the line is cut to 39 characters, so that "\\r" redraws it in place."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "--once", "--log", str(big_log)], stdout=subprocess.DEVNULL,
                            stderr=slave, stdin=subprocess.DEVNULL, env=_env())
    os.close(slave)
    seen = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    proc.wait(timeout=60)
    frames = [f.removesuffix("\x1b[K") for f in seen.decode().split("\r")]
    frames = [f for f in frames if f.strip()]
    assert frames and all(len(f) <= 39 for f in frames), frames
    assert frames[0].startswith("reading server.log: ")


def test_no_progress_on_a_dumb_terminal(big_log: Path) -> None:
    env = _env()
    env["TERM"] = "dumb"
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "diagnoser", "--once", "--log", str(big_log)], stdout=subprocess.DEVNULL,
                            stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    seen = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    proc.wait(timeout=60)
    assert b"reading" not in seen
