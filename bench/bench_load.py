"""The dashboard under load: 50 viewers on 8 targets, request latency (target: p99 < 200 ms).

Three processes, as in production: 8 loopback SGLang stand-ins serving REAL 0.5.23 scrapes
(tests/data/sglang-cpu-real, as in bench_serve.py); the server — ``diagnose serve``'s own monitor and web
app, run with serve's uvicorn settings, polling the 8 targets every ``--interval`` — with ``--history``
seconds of history already kept (simulated from the signal points of real scrapes, ending now: what a
dashboard shows after it has run that long; 0 = freshly started); and the viewers, one asyncio process
that behaves like the pages' scripts:

* a target viewer (4 of 5) opens ``/target/N`` with its assets, ``/target/N.json`` and the chart data
  ``/target/N/series.json?range=1h``, then every interval re-fetches the fragment ``/_/target/N`` and the
  chart data (static/app.js, static/chart.js);
* an overview viewer (1 of 5) opens ``/`` with its assets, then re-fetches ``/_/cards`` every interval.

All viewers open their page within ``--spread`` seconds (default 1: a wall of screens after a deploy),
so their refreshes come in bursts. Reported: latency percentiles per request kind and overall, for the
viewer cycle run alone and then under load; the ratio p99 (load) / p99 (alone); with ``--compare DIR``
the same load first against the diagnoser of another checkout (e.g. the previous release) in the same
run, and the ratio of the two p99s; and the server's CPU share during the load (which, unlike the
latencies, hardly moves with the machine's load). Exits 1 if the overall p99 under load is 200 ms or more.

Run: ``.venv/bin/python bench/bench_load.py [--viewers 50] [--targets 8] [--seconds 60] [--interval 5]
[--history 3600] [--compare DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_P99_S = 0.200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_server(port: int, urls: list[str], interval: float, history: float) -> None:
    """The server process: serve's monitor (its defaults) with ``history`` seconds already kept, then
    polling live, and serve's web app under uvicorn as ``diagnose serve`` runs it."""
    code = os.environ.get("BENCH_LOAD_CODE")  # another checkout's diagnoser, to compare in one run
    if code:
        sys.path.insert(0, code)
    import uvicorn

    from bench.bench_serve import recorded_points
    from diagnoser.engines import get_adapter
    from diagnoser.live import LiveMonitor
    from diagnoser.model import iso
    from diagnoser.web import create_app

    monitor = LiveMonitor(get_adapter("sglang"), urls, [], interval=interval, timeout=5.0, window_s=300.0)
    if history > 0:
        scrapes = recorded_points()
        now = time.time()
        steps = int(history / interval)
        for k in range(steps):
            ts = now - history + interval * k
            stamp = iso(ts)
            for j, t in enumerate(monitor.targets):
                for signal, rank, value, metric in scrapes[(k + 7 * j) % len(scrapes)]:
                    t.timeline.add(signal, ts, value, f"scrape@{stamp} {metric}", rank)
            if k % 12 == 11:
                monitor.tick(now=ts, scrape=False)
    monitor.tick(scrape=False)
    monitor.start()
    app = create_app(monitor)
    prof = os.environ.get("BENCH_LOAD_PROFILE")  # a file: cProfile of the request path (the event loop)
    if prof:
        import cProfile
        import signal

        pr = cProfile.Profile()

        def _dump(*_: object) -> None:
            pr.disable()
            pr.dump_stats(prof)
            os._exit(0)

        signal.signal(signal.SIGTERM, _dump)
        pr.enable()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class Conn:
    """One kept-alive HTTP/1.1 connection, as a browser holds: a minimal client (status line, headers,
    Content-Length body) so that the viewers' own CPU does not inflate the latencies they measure."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> int:
        for attempt in (0, 1):
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                assert self.reader is not None
                self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAccept: */*\r\n\r\n".encode())
                head = await self.reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if length:
                    await self.reader.readexactly(length)
                return status
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                if self.writer is not None:
                    self.writer.close()
                self.reader = self.writer = None
                if attempt:
                    return 0
        return 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def viewer(host: str, port: int, kind: str, tid: int, start: float, end: float, interval: float,
                 out: list[tuple[str, float, int]]) -> None:
    conns = [Conn(host, port) for _ in range(4 if kind == "target" else 3)]

    async def get(conn: Conn, label: str, path: str) -> None:
        t0 = time.perf_counter()
        status = await conn.get(path)
        out.append((label, time.perf_counter() - t0, status))

    await asyncio.sleep(max(0.0, start - time.monotonic()))
    a, b, c, *d = conns
    if kind == "overview":
        await get(a, "page", "/")
        await asyncio.gather(get(a, "static", "/static/style.css"), get(b, "static", "/static/app.js"))
    else:
        await get(a, "page", f"/target/{tid}")
        await asyncio.gather(get(a, "static", "/static/style.css"), get(b, "static", "/static/app.js"),
                             get(c, "static", "/static/chart.js"))
        await get(a, "json", f"/target/{tid}.json")
        await get(a, "series", f"/target/{tid}/series.json?range=1h")
    nxt = time.monotonic() + interval
    while nxt < end:
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        if kind == "overview":
            await get(a, "fragment", "/_/cards")
        else:
            await asyncio.gather(get(a, "fragment", f"/_/target/{tid}"), get(b, "series", f"/target/{tid}/series.json?range=1h"))
        nxt += interval
    for conn in conns:
        conn.close()


async def load(host: str, port: int, viewers: int, targets: int, seconds: float, interval: float, spread: float,
               seed: int) -> list[tuple[str, float, int]]:
    rnd = random.Random(seed)
    out: list[tuple[str, float, int]] = []
    now = time.monotonic()
    end = now + seconds
    tasks = []
    for v in range(viewers):
        kind = "overview" if v % 5 == 4 else "target"
        tasks.append(viewer(host, port, kind, v % targets, now + rnd.uniform(0, spread), end, interval, out))
    await asyncio.gather(*tasks)
    return out


def proc_cpu(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def table(rows: list[tuple[str, float, int]], title: str) -> float:
    print(f"  {title}")
    kinds = sorted({k for k, _, _ in rows})
    for k in [*kinds, "all"]:
        xs = [d for kk, d, _ in rows if k in ("all", kk)]
        bad = sum(1 for kk, _, st in rows if k in ("all", kk) and st != 200)
        codes = sorted({st for kk, _, st in rows if k in ("all", kk) and st != 200})
        print(f"    {k:9} {len(xs):6d} requests   p50 {pct(xs, 0.5) * 1e3:7.1f} ms   p95 {pct(xs, 0.95) * 1e3:7.1f} ms"
              f"   p99 {pct(xs, 0.99) * 1e3:7.1f} ms   max {max(xs, default=0) * 1e3:7.1f} ms"
              + (f"   {bad} not 200 (status {', '.join(map(str, codes))}; 0 = no answer)" if bad else ""))
    return pct([d for _, d, _ in rows], 0.99)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--viewers", type=int, default=50)
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--history", type=float, default=3600.0)
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--compare", default="", metavar="DIR",
                    help="first run the same load against the diagnoser of another checkout (its root): the baseline")
    ap.add_argument("--_server", action="store_true", dest="server")
    ap.add_argument("--_port", type=int, default=0, dest="port")
    ap.add_argument("--_urls", default="", dest="urls")
    a = ap.parse_args()
    if a.server:
        run_server(a.port, a.urls.split(","), a.interval, a.history)
        return 0

    port_file = f"/tmp/bench_load_urls.{os.getpid()}"
    helper = subprocess.Popen([sys.executable, str(ROOT / "bench" / "bench_serve.py"), "--_serve-targets", str(a.targets),
                               "--_port-file", port_file])
    try:
        for _ in range(300):
            if Path(port_file).exists() and Path(port_file).read_text().count("\n") == a.targets - 1:
                break
            time.sleep(0.1)
        urls = Path(port_file).read_text().split()
        print(f"diagnose serve's app: {a.targets} targets of real SGLang scrapes, polled every {a.interval:g} s, "
              f"{a.history:.0f} s of history; {a.viewers} viewers ({a.viewers - a.viewers // 5} on target pages, "
              f"{a.viewers // 5} on the overview) opened within {a.spread:g} s, for {a.seconds:.0f} s")
        results = {}
        for name, code in ([("baseline: " + a.compare, a.compare)] if a.compare else []) + [("this checkout", "")]:
            results[name] = run_one(name, code, urls, a)
            if results[name] is None:
                return 2
        mine = results["this checkout"]
        assert mine is not None
        alone, p99 = mine
        ok = p99 < TARGET_P99_S
        print(f"  p99 under load {p99 * 1e3:.1f} ms (target < {TARGET_P99_S * 1e3:.0f} ms: {'OK' if ok else 'OVER'}); "
              f"ratio to the same viewers' p99 alone {p99 / alone:.2f}")
        if a.compare:
            other = results["baseline: " + a.compare]
            assert other is not None
            print(f"  ratio to the baseline checkout's p99 under the same load, same run: {p99 / other[1]:.2f} "
                  f"({p99 * 1e3:.1f} / {other[1] * 1e3:.1f} ms)")
        return 0 if ok else 1
    finally:
        helper.terminate()
        try:
            helper.wait(10)
        except subprocess.TimeoutExpired:
            helper.kill()
        Path(port_file).unlink(missing_ok=True)


def run_one(name: str, code: str, urls: list[str], a: argparse.Namespace) -> tuple[float, float] | None:
    """One server (this checkout, or ``code``'s diagnoser): the viewers alone, then the load; p99s."""
    import httpx

    port = free_port()
    env = {**os.environ, **({"BENCH_LOAD_CODE": code} if code else {})}
    server = subprocess.Popen([sys.executable, __file__, "--_server", "--_port", str(port), "--_urls", ",".join(urls),
                               "--interval", str(a.interval), "--history", str(a.history)], env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json().get("tick", 0) >= 3:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        else:
            print(f"the server ({name}) did not come up")
            return None
        print(f" {name} (load avg {os.getloadavg()[0]:.1f})")
        alone = asyncio.run(load("127.0.0.1", port, 2, a.targets, 4 * a.interval, a.interval, 0.0, a.seed))
        base_p99 = table(alone, "one target viewer and one overview viewer alone")
        c0, w0 = proc_cpu(server.pid), time.monotonic()
        rows = asyncio.run(load("127.0.0.1", port, a.viewers, a.targets, a.seconds, a.interval, a.spread, a.seed))
        cpu = (proc_cpu(server.pid) - c0) / (time.monotonic() - w0)
        p99 = table(rows, f"{a.viewers} viewers")
        print(f"    server CPU under the load: {cpu:.1%} of one core (polling, rules and every answer)")
        return base_p99, p99
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
