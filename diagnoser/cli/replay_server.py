"""``diagnose replay-server FILE|DIR``: serve a recording as a live SGLang or vLLM server.

    diagnose replay-server run.dgb --port 30000 [--host 127.0.0.1] [--speed S] [--loop]
                                   [--log-out PATH|-] [--keep-log-times] [--target NAME]

``/metrics`` answers with the recorded scrape whose (scaled) time has come — the exposition text
exactly as recorded; ``/server_info``, ``/get_server_info``, ``/get_server_args``, ``/model_info``,
``/get_model_info``, ``/v1/loads``, and vLLM's ``/version`` and ``/v1/models`` with the recorded
payloads (redacted at recording; a path the recording lacks answers 404, as the engine that lacks it
would); ``/health`` with 200. The recording starts when the server starts; ``--speed 10`` plays ten recorded seconds per
wall second; ``--loop`` starts over after the end (otherwise the last scrape stays served).
``--log-out`` writes the recorded log lines as their time comes, with the leading timestamp moved to
the wall-clock time of the replay (so a tool reading the file sees a live log; vLLM's yearless
``MM-DD HH:MM:SS`` head stamp too); ``--keep-log-times``
writes them verbatim. Binds 127.0.0.1 unless ``--host`` says otherwise; ``--port 0`` picks a free port
(printed on stderr). SIGTERM/SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

from diagnoser.bundle import BundleError, decode_line
from diagnoser.cli import UsageError
from diagnoser.jsonout import dumps
from diagnoser.outputs.termsafe import term_safe
from diagnoser.redact import redact
from diagnoser.replay import ReplayFeed, ReplaySource, load_source

METRICS_CTYPE = "text/plain; version=0.0.4; charset=utf-8"
SERVER_INFO_ALIASES = ("/server_info", "/get_server_info", "/get_server_args")
MODEL_INFO_ALIASES = ("/model_info", "/get_model_info")
ENGINE_PATHS = ("/v1/loads", "/version", "/v1/models")  # SGLang's loads; vLLM's version and model list
_STAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?")


class ReplayState:
    """What the server should answer at a given wall time."""

    def __init__(self, source: ReplaySource, speed: float = 1.0, loop: bool = False, target: str | None = None,
                 started: float | None = None) -> None:
        self.source = source
        names = source.targets or sorted({str(r.get("target")) for r in source.records if r.get("kind") == "scrape"})
        if target is not None and target not in names and names:
            raise UsageError(f"{source.path} has no target {target!r}; it has: {', '.join(names)}")
        self.target = target or (names[0] if names else None)
        self.feed = ReplayFeed(source, speed=speed, loop=loop)
        self.feed.start(started)
        self.scrapes = [r for r in source.records if r.get("kind") == "scrape" and r.get("target") == self.target]
        self.scrape_rel = [float(r["t"]) - self.feed.t0 for r in self.scrapes]
        self.config: dict[str, Any] = {}
        for r in source.records:
            if r.get("kind") == "config" and (r.get("target") == self.target or self.target is None):
                self.config[str(r.get("path"))] = r.get("data")
        self.requests = 0

    def scrape_at(self, now: float | None = None) -> dict[str, Any] | None:
        if not self.scrapes:
            return None
        _, pos = self.feed.position(now)
        i = bisect.bisect_right(self.scrape_rel, pos) - 1
        return self.scrapes[max(i, 0)]

    def payload(self, path: str) -> Any:
        for group in (SERVER_INFO_ALIASES, MODEL_INFO_ALIASES):
            if path in group:
                for p in (path, *group):
                    if p in self.config:
                        return self.config[p]
                return None
        return self.config.get(path)


def make_handler(state: ReplayState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "diagnoser-replay"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            state.requests += 1
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path == "/metrics":
                rec = state.scrape_at()
                if rec is None:
                    self._send(404, b"Not Found: this recording has no /metrics scrapes (like SGLang without --enable-metrics)\n", "text/plain")
                elif rec.get("error"):
                    self._send(503, f"recorded scrape failed: {rec['error']}\n".encode(), "text/plain")
                else:
                    ctype = str(rec.get("content_type") or METRICS_CTYPE)
                    self._send(int(rec.get("status") or 200), str(rec.get("text") or "").encode("utf-8"), ctype)
            elif path in ("/health", "/health_generate"):
                self._send(200, b"", "text/plain")
            elif path in (*SERVER_INFO_ALIASES, *MODEL_INFO_ALIASES, *ENGINE_PATHS):
                data = state.payload(path)
                if data is None:
                    self._send(404, json.dumps({"detail": "Not Found"}).encode(), "application/json")
                else:
                    self._send(200, dumps(redact(data)).encode("utf-8"), "application/json")
            else:
                self._send(404, json.dumps({"detail": "Not Found"}).encode(), "application/json")

    return Handler


class LogWriter(threading.Thread):
    """Writes the recording's log lines as their time comes (a separate feed on the same clock)."""

    def __init__(self, state: ReplayState, out: IO[bytes], keep_times: bool = False, tick: float = 0.05) -> None:
        super().__init__(daemon=True, name="replay-log")
        self.state = state
        self.feed = ReplayFeed(state.source, speed=state.feed.speed, loop=state.feed.loop)
        self.feed.start(state.feed.started)
        self.out = out
        self.keep_times = keep_times
        self.tick = tick
        self.stop_evt = threading.Event()
        self.lines = 0

    def _retime(self, line: bytes, rec: dict[str, Any]) -> bytes:
        if self.keep_times:
            return line
        text = line.decode("utf-8", errors="surrogateescape")
        m = _STAMP_RE.search(text, 0, 120)
        if not m:
            return self._retime_yearless(text, rec)
        from diagnoser.replay import line_time

        own = line_time(m.group(0))
        if own is None:
            return line
        offset = int(rec.get("pass") or 0) * self.feed.period  # later passes of --loop
        started = self.state.feed.started or time.time()
        wall = started + (own + offset - self.feed.t0) / self.feed.speed
        stamp = datetime.fromtimestamp(wall, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        if "." in m.group(0)[10:] or "," in m.group(0)[10:]:
            sep = "." if "." in m.group(0)[10:] else ","
            frac = len(m.group(0).split(sep)[-1])
            stamp += sep + f"{wall % 1:.{frac}f}"[2:]
        stamp = stamp[:10] + m.group(0)[10] + stamp[11:]
        return (text[: m.start()] + stamp + text[m.end():]).encode("utf-8", errors="surrogateescape")

    def _retime_yearless(self, text: str, rec: dict[str, Any]) -> bytes:
        """vLLM's head stamp (``INFO 12-02 15:03:43``): moved to the replay's wall time, still without a year."""
        from diagnoser.replay.source import _YEARLESS_RE, yearless_time

        m = _YEARLESS_RE.search(text, 0, 160)
        own = yearless_time(text, self.feed.t0) if m else None
        if m is None or own is None:
            return text.encode("utf-8", errors="surrogateescape")
        offset = int(rec.get("pass") or 0) * self.feed.period
        started = self.state.feed.started or time.time()
        wall = started + (own + offset - self.feed.t0) / self.feed.speed
        stamp = datetime.fromtimestamp(wall, tz=UTC).strftime("%m-%d %H:%M:%S")
        start, end = m.start(1), m.end(5)
        return (text[:start] + stamp + text[end:]).encode("utf-8", errors="surrogateescape")

    def drain(self, now: float | None = None) -> int:
        n = 0
        for rec in self.feed.due(now):
            if rec.get("kind") != "log":
                continue
            if self.state.target is not None and rec.get("target") not in (self.state.target, None) and self.state.source.targets:
                continue
            for item in rec.get("lines") or []:
                self.out.write(self._retime(decode_line(item), rec) + b"\n")
                n += 1
        if n:
            self.out.flush()
            self.lines += n
        return n

    def run(self) -> None:
        while not self.stop_evt.wait(self.tick):
            try:
                self.drain()
            except (OSError, ValueError):  # reader went away (closed pipe): stop writing
                return
            if self.feed.finished:
                return


class ReplayServer:
    """The HTTP server plus the optional log writer; ``start()`` runs both in threads."""

    def __init__(self, source: ReplaySource, host: str = "127.0.0.1", port: int = 30000, speed: float = 1.0,
                 loop: bool = False, log_out: IO[bytes] | None = None, keep_log_times: bool = False,
                 target: str | None = None) -> None:
        self.state = ReplayState(source, speed, loop, target)
        self.httpd = ThreadingHTTPServer((host, port), make_handler(self.state))
        self.httpd.daemon_threads = True
        self.log = LogWriter(self.state, log_out, keep_log_times) if log_out is not None else None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ReplayServer:
        self.state.feed.start()
        if self.log is not None:
            self.log.feed.start(self.state.feed.started)
            self.log.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.log is not None:
            self.log.stop_evt.set()
            self.log.join(timeout=2)
            try:
                self.log.out.flush()
            except (OSError, ValueError):
                pass


def build_parser() -> argparse.ArgumentParser:
    from diagnoser.cli.run import _Parser

    p = _Parser(prog="diagnose replay-server", description="Serve a recorded bundle (or run directory) as a live SGLang or vLLM server.")
    p.add_argument("path", help="bundle file from 'diagnose record', or a run directory (server.log, metrics/*.prom)")
    p.add_argument("--port", type=int, default=30000, help="port (default 30000; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--speed", type=float, default=1.0, help="recorded seconds per wall second (default 1)")
    p.add_argument("--loop", action="store_true", help="start over after the end of the recording")
    p.add_argument("--log-out", help="write the recorded log lines here as they occur (- for stdout)")
    p.add_argument("--keep-log-times", action="store_true", help="write log lines verbatim (default: stamps moved to now)")
    p.add_argument("--target", help="which recorded target to serve (bundles of several servers)")
    p.add_argument("--insecure", action="store_true",
                   help="allow binding a non-loopback --host (the recording's state, redacted, is then open to that network)")
    return p


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.speed <= 0:
        raise UsageError("--speed must be greater than 0")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port number (0-65535)")
    from diagnoser.sources.http import is_loopback

    if not is_loopback(args.host) and not args.insecure:
        raise UsageError(f"refusing to bind --host {args.host} (not loopback): anyone who can reach it would read the recording. "
                         "Pass --insecure if only you can reach that network (a container's own network, say)")
    try:
        source = load_source(args.path)
    except BundleError as e:
        raise UsageError(str(e)) from None
    out: IO[bytes] | None = None
    if args.log_out == "-":
        out = sys.stdout.buffer
    elif args.log_out:
        try:
            out = open(args.log_out, "ab")
        except OSError as e:
            raise UsageError(f"cannot write the log to {args.log_out} ({e.strerror}); pick a writable path") from None
    try:
        srv = ReplayServer(source, args.host, args.port, args.speed, args.loop, out, args.keep_log_times, args.target)
    except OSError as e:
        if getattr(e, "errno", None) == 98 or "in use" in str(e).lower():
            raise UsageError(f"port {args.port} on {args.host} is already in use; pick another with --port (0 = any free port)") from None
        raise UsageError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); check --host and --port") from None
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    srv.start()
    n = len(srv.state.scrapes)
    t0, t1 = source.span()
    # the first line always ends with the URL (scripts and tests read it)
    print(f"replay-server: serving {source.path} ({n} scrape(s) over {t1 - t0:.0f} s of recording, speed {args.speed:g}"
          f"{', looping' if args.loop else ''}) at {srv.url}", file=sys.stderr, flush=True)
    if source.problems:
        print(term_safe(f"replay-server: {source.summary}"), file=sys.stderr, flush=True)
    if len(source.targets) > 1:
        print(term_safe(f"replay-server: the recording has {len(source.targets)} servers; serving {srv.state.target} "
                        f"(pick another with --target: {', '.join(source.targets)})"), file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        srv.stop()
        if out is not None and out is not sys.stdout.buffer:
            out.close()
    print(f"replay-server: stopped after {srv.state.requests} request(s).", file=sys.stderr)
    return 0
