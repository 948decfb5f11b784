"""diagnose serve's robustness: a polling thread that dies or fails makes /healthz fail and every page
say so; each answer is built once per snapshot however many viewers ask (and rebuilt for them when the
next snapshot comes); a down target's signals leave the exporter; binding a non-loopback address needs
a token (or --insecure); every command that talks to a server takes --api-key. The monitor polls REAL
SGLang scrapes served on loopback."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from diagnoser.engines import get_adapter
from diagnoser.live import LiveMonitor
from diagnoser.web import create_app
from tests.browser.samples_server import SampleServer
from tests.conftest import ROOT
from tests.helpers import free_port


@pytest.fixture()
def live(data_dir: Path) -> Any:
    with SampleServer(data_dir, "kv-full-retract") as srv:
        m = LiveMonitor(get_adapter("sglang"), [srv.url], [], interval=0.2, timeout=1.0, for_seconds=0, window_s=30)
        m.tick()
        yield m
        m.stop()


def _wait(cond: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_failing_tick_fails_healthz_and_the_pages_say_so_until_it_recovers(live: LiveMonitor) -> None:
    c = TestClient(create_app(live))
    live.start()
    assert c.get("/healthz").status_code == 200
    real_tick = live.tick

    def broken(*a: Any, **k: Any) -> Any:
        raise MemoryError("out of memory in the rule pass")

    live.tick = broken  # type: ignore[method-assign]
    r = _wait(lambda: (lambda r: r if r.status_code == 503 else None)(c.get("/healthz")))
    assert r.json()["status"] == "failing" and "MemoryError" in r.json()["problem"]
    for path in ("/", "/_/cards", "/target/0", "/_/target/0"):
        assert "Polling failed" in c.get(path).text, path
    assert "Polling failed" in c.get("/target/0.json").json()["monitor"]["problem"]
    live.tick = real_tick  # type: ignore[method-assign]
    _wait(lambda: c.get("/healthz").status_code == 200)
    assert "Polling failed" not in c.get("/_/cards").text
    assert c.get("/index.json").json()["monitor"] == {"healthy": True, "problem": None}


def test_a_polling_thread_that_dies_fails_healthz(live: LiveMonitor) -> None:
    c = TestClient(create_app(live))

    def fatal(*a: Any, **k: Any) -> Any:
        raise SystemExit("killed")  # not an Exception: the loop cannot catch it, the thread ends

    live.tick = fatal  # type: ignore[method-assign]
    live.start()
    r = _wait(lambda: (lambda r: r if r.status_code == 503 else None)(c.get("/healthz")))
    assert "polling thread stopped" in r.json()["problem"]
    assert "polling thread stopped" in c.get("/").text and "polling thread stopped" in c.get("/_/target/0").text


def test_a_poll_that_never_completes_fails_healthz(live: LiveMonitor) -> None:
    import threading

    c = TestClient(create_app(live))
    release = threading.Event()
    inside = threading.Event()

    def hung(*a: Any, **k: Any) -> None:
        inside.set()
        release.wait(30)

    live.tick = hung  # type: ignore[method-assign]
    live.start()
    try:
        assert inside.wait(10)
        assert c.get("/healthz").status_code == 200  # a tick in progress is not yet a problem
        live.last_tick_at = time.monotonic() - 3600  # … one that has not completed for an hour is
        r = c.get("/healthz")
        assert r.status_code == 503 and "No poll has completed" in r.json()["problem"]
    finally:
        release.set()


def test_answers_are_built_once_per_snapshot_and_rebuilt_before_viewers_ask(live: LiveMonitor) -> None:
    app = create_app(live)
    answers = app.answers  # type: ignore[attr-defined]

    async def burst(paths: list[str]) -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            rs = await asyncio.gather(*(client.get(p) for p in paths))
        return [r.status_code for r in rs]

    paths = ["/_/target/0", "/target/0/series.json?range=1h", "/_/cards", "/target/0.json"]
    before = answers.builds
    assert asyncio.run(burst(paths * 50)) == [200] * 200  # 50 viewers at once on one snapshot
    assert answers.builds - before == len(paths)  # each answer built once, not 50 times
    live.tick()  # a new snapshot: the answers asked for are rebuilt at once, before anyone asks
    after_tick = answers.builds
    assert after_tick - before == 2 * len(paths)
    assert asyncio.run(burst(paths * 10)) == [200] * 40
    assert answers.builds == after_tick  # served from what the tick prepared


def test_a_down_target_leaves_only_its_scrape_series_in_the_exporter(data_dir: Path) -> None:
    from diagnoser.outputs.exporter import make_registry, render

    srv = SampleServer(data_dir, "kv-full-retract").start()
    m = LiveMonitor(get_adapter("sglang"), [srv.url], [], interval=0.2, timeout=0.5, for_seconds=0, window_s=30)
    try:
        _wait(lambda: m.tick().targets[0].up and m.snapshot.targets[0].latest.get("running_reqs") is not None)
        text = render(make_registry(lambda: m.snapshot)).decode()
        assert "diagnoser_signal{" in text and "diagnoser_pool_capacity_tokens{" in text
        srv.close()
        m.targets[0].client.close()  # its kept-alive connection too: the server is gone
        _wait(lambda: m.tick().targets[0].up is False)
        text = render(make_registry(lambda: m.snapshot)).decode()
        assert "diagnoser_signal{" not in text and "diagnoser_pool_capacity_tokens{" not in text
        up = [ln for ln in text.splitlines() if ln.startswith("diagnoser_scrape_up{")]
        assert len(up) == 1 and up[0].endswith(" 0.0")
        assert any(ln.startswith("diagnoser_scrape_errors_total{") for ln in text.splitlines())
        assert re.search(r'^diagnoser_finding_active\{[^}]*rule="source_unreachable"', text, re.M)  # labels sorted: engine first
    finally:
        m.close()


def _serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "diagnoser", "serve", "--url", "http://127.0.0.1:1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_binding_a_non_loopback_address_needs_a_token_or_insecure() -> None:
    port = free_port()
    p = _serve("--host", "0.0.0.0", "--port", str(port))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "refusing to bind --host 0.0.0.0" in err and "--token" in err and "--insecure" in err
    for extra in (["--insecure"], ["--token", "t0k"]):
        port = free_port()
        p = _serve("--host", "0.0.0.0", "--port", str(port), *extra)
        try:
            _wait(lambda port=port: _healthz(port), timeout=40)
        finally:
            p.terminate()
            out, err = p.communicate(timeout=30)
        assert "warning: binding 0.0.0.0" in err and "t0k" not in err


def _healthz(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("cmd", [["--once"], ["serve"], ["record"], []], ids=["once", "serve", "record", "watch"])
def test_every_command_that_talks_to_a_server_takes_api_key(cmd: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The flag exists on each (the planted-secret test proves each sends it); a key no header can carry
    is one sentence, without the key in it (and record writes no file)."""
    from diagnoser.cli import main

    if cmd == ["record"]:
        cmd = ["record", "-o", str(tmp_path / "never-written.dgb")]
    rc = main([*cmd, "--url", "http://127.0.0.1:1", "--api-key", "two words-s3cr3t", "--duration", "0"]
              if cmd != ["serve"] else [*cmd, "--url", "http://127.0.0.1:1", "--api-key", "two words-s3cr3t"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot carry" in err and "s3cr3t" not in err
    assert not (tmp_path / "never-written.dgb").exists()


def test_watch_says_a_failed_poll_and_goes_on(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from diagnoser.cli import watch
    from diagnoser.cli.run import build_parser

    real = LiveMonitor.tick
    calls = {"n": 0}

    def flaky(self: LiveMonitor, *a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("the first poll ran out of memory")
        return real(self, *a, **k)

    monkeypatch.setattr(LiveMonitor, "tick", flaky)
    with SampleServer(data_dir, "kv-full-retract") as srv:
        out = io.StringIO()
        rc = watch.main(build_parser().parse_args(["--url", srv.url, "--interval", "0.2"]), out=out, max_ticks=3)
    text = out.getvalue()
    assert "polling failed (MemoryError: the first poll ran out of memory); retrying" in text
    assert f"{srv.url}: run" in text and "Summary after" in text and rc in (0, 1)


def test_replay_server_binds_a_non_loopback_address_only_with_insecure() -> None:
    """The replay-server plays a recording as a live SGLang: open to a network only when asked."""
    rec = str(ROOT / "examples" / "kv-full-retract.dgb")
    p = subprocess.run([sys.executable, "-m", "diagnoser", "replay-server", rec, "--host", "0.0.0.0", "--port", str(free_port())],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "refusing to bind --host 0.0.0.0" in p.stderr and "--insecure" in p.stderr
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "diagnoser", "replay-server", rec, "--host", "0.0.0.0", "--port", str(port), "--insecure"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(up, timeout=40)
    finally:
        srv.terminate()
        srv.communicate(timeout=30)
