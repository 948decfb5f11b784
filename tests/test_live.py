"""LiveMonitor: concurrent polling with per-target timeouts, bounded history, hysteresis, log following,
replay, and watch mode's output — on real SGLang scrapes served over loopback."""

from __future__ import annotations

import argparse
import io
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from diagnoser.engines import get_adapter
from diagnoser.live import LiveMonitor, ReplayMonitor, downsample, trim
from diagnoser.timeline import Timeline
from tests.browser.samples_server import SampleServer

ADAPTER = get_adapter("sglang")


class _Slow:
    """A loopback server that answers /metrics only after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                stop.wait(delay)
                try:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"x 1\n")
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_slow_target_never_stalls_the_others(data_dir: Path) -> None:
    slow = _Slow(delay=20.0)
    with SampleServer(data_dir, "long-queue") as fast:
        m = LiveMonitor(ADAPTER, [slow.url, fast.url], [], interval=0.2, timeout=3.0, for_seconds=0, window_s=30)
        try:
            t0 = time.monotonic()
            ticks = 0
            durations = []
            while time.monotonic() - t0 < 20:
                t1 = time.monotonic()
                snap = m.tick()
                durations.append(time.monotonic() - t1)
                ticks += 1
                by = {t.name: t for t in snap.targets}
                if by[slow.url].up is False:
                    break
            # the slow target needs 6 s per scrape (config + metrics, 3 s timeout each); meanwhile
            # the fast one was scraped on every tick and no tick waited for the slow one
            assert ticks >= 4 and by[fast.url].scrapes == ticks
            assert max(durations[1:]) < 2.5, durations  # (after the warm-up tick) none waited out the 3 s timeout
            running = m.targets[1].timeline.get("running_reqs")
            assert running is not None and max(running.values) == 4.0  # long-queue: capped at 4 running
            assert max(m.targets[1].timeline.get("queue_reqs").values) >= 30  # type: ignore[union-attr]
            assert by[slow.url].up is False and "did not answer within the timeout" in by[slow.url].last_error
            assert any(f.rule == "source_unreachable" and f.target == slow.url for f in snap.findings)
        finally:
            m.close()
            slow.close()


def test_finding_fires_then_resolves_with_hysteresis(data_dir: Path) -> None:
    with SampleServer(data_dir, "kv-full-retract") as srv:
        m = LiveMonitor(ADAPTER, [srv.url], [], interval=0.1, timeout=2, for_seconds=0.5, window_s=1.5)
        try:
            states = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                snap = m.tick()
                states.append({f.rule: f.state for f in snap.findings}.get("kv_saturation"))
                if states[-1] == "firing":
                    break
                time.sleep(0.1)
            assert "pending" in states, states  # held for --for before firing
            assert states[-1] == "firing", states
            assert states.index("pending") < states.index("firing")
            firing = snap.firing(srv.url)[0] if snap.firing(srv.url) else None
            assert firing is not None and firing.evidence and firing.evidence[0].source.startswith("scrape@")
            srv.set_run("client-bound-low-occupancy")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 30:
                snap = m.tick()
                time.sleep(0.1)
                if not any(f.rule == "kv_saturation" for f in snap.findings):
                    break
            assert not any(f.rule == "kv_saturation" for f in snap.findings)
            assert any(f.rule == "kv_saturation" and f.state == "resolved" for _, f in snap.resolved)
        finally:
            m.close()


def test_history_is_trimmed_by_age_and_size() -> None:
    tl = Timeline(target="t")
    for i in range(1000):
        tl.add("running_reqs", 1000.0 + i, float(i), f"s{i}")
        tl.add("queue_reqs", 1000.0 + i, 1.0, f"s{i}")
    dropped = trim(tl, oldest=1500.0, max_points=10_000, max_events=10)
    assert dropped == 1000 and tl.get("running_reqs").ts[0] == 1500.0  # type: ignore[union-attr]
    trim(tl, oldest=0.0, max_points=100, max_events=10)
    s = tl.get("running_reqs")
    assert s is not None and len(s) == 100 and s.values[-1] == 999.0 and len(s.sources) == 100
    trim(tl, oldest=5000.0, max_points=100, max_events=10)
    assert tl.series == {}


def test_monitor_memory_stays_bounded_over_many_ticks(data_dir: Path) -> None:
    with SampleServer(data_dir, "long-queue") as srv:
        m = LiveMonitor(ADAPTER, [srv.url], [], interval=1, timeout=2, for_seconds=0, max_points=5, window_s=60)
        try:
            base = time.time()
            for i in range(12):
                m.tick(now=base + i)
            tl = m.targets[0].timeline
            assert max(len(s) for s in tl.series.values()) <= 5
            assert m.snapshot.targets[0].scrapes == 12
        finally:
            m.close()


def test_log_is_followed_as_it_grows(tmp_path: Path, data_dir: Path) -> None:
    src = (data_dir / "sglang-cpu-real" / "long-queue" / "server.log").read_bytes().splitlines(keepends=True)
    decode = [ln for ln in src if b"Decode batch" in ln]
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(decode[:5]))
    m = LiveMonitor(ADAPTER, [], [str(log)], interval=1, for_seconds=0)
    try:
        m.tick()
        n0 = len(m.targets[0].timeline.get("running_reqs") or [])
        with log.open("ab") as fh:
            fh.write(b"".join(decode[5:25]))
        snap = m.tick()
        n1 = len(m.targets[0].timeline.get("running_reqs") or [])
        assert (n0, n1) == (5, 25)
        assert snap.targets[0].latest["running_reqs"] == 4.0 and snap.targets[0].latest["queue_reqs"] == 36.0
    finally:
        m.close()


def test_replay_monitor_plays_a_real_run_on_its_own_clock(data_dir: Path) -> None:
    from diagnoser.replay import ReplayFeed

    run = data_dir / "sglang-cpu-real" / "kv-full-retract"
    feed = ReplayFeed(str(run), speed=1000, loop=False)
    m = ReplayMonitor(feed, ADAPTER, for_seconds=0, window_s=30, interval=1)
    try:
        m.tick()
        time.sleep(0.1)
        snap = m.tick()
        assert snap.targets and snap.targets[0].scrapes == len(list((run / "metrics").glob("*.prom")))
        assert abs(snap.ts - feed.records[-1]["t"]) < 120  # the recording's clock, not today's
    finally:
        m.close()


def test_downsample_keeps_extremes_and_bounds_points() -> None:
    ts = [float(i) for i in range(10_000)]
    vals = [float(i % 100) for i in range(10_000)]
    vals[5000] = 1e6
    d = downsample(ts, vals, 500)
    assert len(d["t"]) <= 500 and max(v for v in d["max"] if v is not None) == 1e6
    assert min(v for v in d["min"] if v is not None) == 0.0
    small = downsample([1.0, 2.0], [float("nan"), 3.0], 500)
    assert small == {"t": [1.0, 2.0], "v": [None, 3.0]}


def _watch_args(**kw: Any) -> argparse.Namespace:
    from diagnoser.cli.run import build_parser

    ns = build_parser().parse_args([])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_watch_plain_lines_when_piped_and_summary_at_the_end(data_dir: Path) -> None:
    from diagnoser.cli import watch

    with SampleServer(data_dir, "kv-full-retract") as srv:
        out = io.StringIO()
        rc = watch.main(_watch_args(url=[srv.url], interval=0.1, for_s=0.0, last=2.0), out=out, max_ticks=8)
    text = out.getvalue()
    assert "\x1b[" not in text  # no terminal control codes into a pipe
    lines = text.splitlines()
    assert any(f"{srv.url}: run " in ln and "queue " in ln for ln in lines)
    assert any(" FIRING " in ln and "kv_saturation" in ln for ln in lines)
    assert "Summary after" in text and "kv_saturation" in text.split("Summary after", 1)[1]
    assert rc == 1


def test_watch_screen_has_headline_finding_and_top_suggestion(data_dir: Path) -> None:
    from diagnoser.cli.watch import screen

    with SampleServer(data_dir, "kv-full-retract") as srv:
        m = LiveMonitor(ADAPTER, [srv.url], [], interval=0.1, for_seconds=0, window_s=10)
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15:
                snap = m.tick()
                if any(f.rule == "kv_saturation" for f in snap.firing()):
                    break
                time.sleep(0.1)
        finally:
            m.close()
    text = screen(snap, time.time())
    assert "run " in text and "kv " in text
    assert "[WARN] kv_saturation" in text or "[CRIT] kv_saturation" in text
    sugg = [f for f in snap.firing() if f.suggestions]
    if sugg:
        assert f"→ {sugg[0].suggestions[0].flag}" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_old_history_is_thinned_and_loses_source_text_incrementally() -> None:
    from diagnoser.live import compact

    tl = Timeline(target="t")
    cut = -1e18
    for i in range(2000):  # 5 s points, compacted tick by tick like the monitor does
        tl.add("running_reqs", 5.0 * i, float(i), f"scrape@{i} sglang:num_running_reqs")
        now = 5.0 * i
        compact(tl, cut, now - 3600, 30.0, now - 300, cut)
        cut = now - 3600
    s = tl.get("running_reqs")
    assert s is not None
    old = [t for t in s.ts if t < 5.0 * 1999 - 3600]
    recent = [t for t in s.ts if t >= 5.0 * 1999 - 3600]
    assert len(recent) == 721  # full resolution for the last hour (both ends)
    assert all(b - a >= 30.0 for a, b in zip(old, old[1:], strict=False))
    assert abs(len(old) - (5.0 * 1999 - 3600) / 30.0) <= 2
    assert all(src == "" for t, src in zip(s.ts, s.sources, strict=True) if t < 5.0 * 1999 - 300)
    assert s.sources[-1] == "scrape@1999 sglang:num_running_reqs"


def test_serve_replay_plays_a_recorded_run(data_dir: Path, tmp_path: Path) -> None:
    from tests.browser.serve_proc import Serve

    run = data_dir / "sglang-cpu-real" / "kv-full-retract"
    serve = Serve(["--replay", str(run), "--speed", "10", "--loop", "--interval", "0.5", "--for", "0"], tmp_path / "serve.log")
    try:
        def kv_firing() -> object:
            doc = serve.get("/index.json").json()
            return doc if any(f["rule"] == "kv_saturation" and f["state"] == "firing" for f in doc["targets"][0]["findings"]) else None

        doc = serve.wait_for(kv_firing, timeout=40, what="kv_saturation from the replayed run")
        t = doc["targets"][0]  # type: ignore[index]
        assert t["name"] == str(run) and t["version"] == "0.5.23" and t["health"] in ("warning", "critical")
        assert re.search(r'^diagnoser_finding_active\{[^}]*rule="kv_saturation"', serve.get("/metrics").text, re.M)  # labels sorted: engine first
    finally:
        serve.close()


def test_each_target_polls_through_its_own_client(data_dir: Path) -> None:
    """A connection per target (http.client for plain http; httpcore would scan a whole shared pool per
    request); a client passed in serves all targets."""
    import httpx

    from diagnoser.sources.http import PlainTarget

    with SampleServer(data_dir, "long-queue") as a, SampleServer(data_dir, "kv-full-retract") as b:
        m = LiveMonitor(ADAPTER, [a.url, b.url], [], interval=1.0, for_seconds=0)
        try:
            clients = [t.client for t in m.targets]
            assert all(isinstance(c, PlainTarget) for c in clients) and clients[0] is not clients[1]
            assert all(c.headers["Accept-Encoding"] == "identity" for c in clients)
            for _ in range(2):
                m.tick()
            assert [t.up for t in m.targets] == [True, True] and a.requests >= 2 and b.requests >= 2
            assert all(t.timeline.get("running_reqs") is not None for t in m.targets)
            assert all(len(c._conns) == 1 for c in clients)  # one kept-alive connection each
        finally:
            m.close()
        assert all(c.fallback.is_closed and not c._conns for c in clients)
        shared = httpx.Client()
        m2 = LiveMonitor(ADAPTER, [a.url, b.url], [], interval=1.0, client=shared)
        try:
            assert [t.client for t in m2.targets] == [None, None]
            m2.tick()
            assert [t.up for t in m2.targets] == [True, True]
        finally:
            m2.close()
            shared.close()
