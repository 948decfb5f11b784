"""Start a real ``diagnose serve`` subprocess on a free loopback port and wait until it answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT
from tests.helpers import free_port, need_binary  # noqa: F401  (re-exported for the browser tests)

XSS = "<script>alert(1)</script>"
SECRET = "sk-live-DIAGNOSER-TEST-SECRET-7f3a"


class Serve:
    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        exe = ROOT / ".venv" / "bin" / "diagnose"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "diagnoser"]
        self.log = log
        self.fh = open(log, "wb")
        self.proc = subprocess.Popen([*cmd, "serve", "--port", str(self.port), *args], stdout=self.fh, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"diagnose serve exited with {self.proc.returncode}: {log.read_text()}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"diagnose serve did not answer /healthz within 30 s: {log.read_text()}")

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(self.base + path, timeout=10, **kw)  # type: ignore[arg-type]

    def wait_for(self, cond: object, timeout: float = 40.0, what: str = "") -> object:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = cond()  # type: ignore[operator]
            if last:
                return last
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; serve log: {self.log.read_text()[-2000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.fh.close()
