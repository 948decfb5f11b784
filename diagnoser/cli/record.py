"""``diagnose record``: save what a server shows (raw scrapes, log lines, server info) to a bundle.

    diagnose record --url http://127.0.0.1:30000 [--log server.log] --duration 10m -o run.dgb
                    [--interval 2] [--max-size 50M] [--report text|json]

Every ``--interval`` seconds each URL's ``/metrics`` is fetched and stored as received (secrets
redacted); each ``--log`` is followed like ``tail -F`` (from its start, so the startup lines are kept)
and every new line is stored with its arrival time; server/model info and ``/v1/loads`` are stored at
the start. The bundle is written block by block, so it is valid at every moment: Ctrl-C (or SIGTERM)
ends the recording and leaves a complete bundle, ``--max-size`` stops it before the file passes the
cap, and a write error (disk full) stops it with what was written kept valid.

The same samples are ingested live exactly as ``diagnose --once`` would; ``--report text|json`` prints
that live diagnosis at the end (``diagnose --once --replay FILE`` reproduces it from the bundle).

Exit codes: 0 recorded (also after Ctrl-C or reaching --max-size); 1 stopped by a write error (the
bundle holds what came before it); 2 usage error or nothing could be recorded.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import signal
import sys
import threading
import time
from typing import Any

from diagnoser.bundle import BundleFull, BundleWriter, encode_line, manifest, redact_fast
from diagnoser.cli import UsageError
from diagnoser.cli.run import API_KEY_HELP, _Parser, api_key_headers, parse_duration
from diagnoser.collect import Collection, finalize
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.jsonout import dumps
from diagnoser.model import InputReport, iso
from diagnoser.outputs.termsafe import term_safe
from diagnoser.redact import redact_text
from diagnoser.replay.source import record_engines
from diagnoser.sources.http import DEFAULT_MAX_BYTES, display_url, fetch, make_client
from diagnoser.sources.logs import LogFollower, LogReader, finish_report, open_log_reader
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.sources.serverinfo import fetch_config
from diagnoser.timeline import Timeline

SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def parse_size(text: str) -> int:
    t = str(text).strip().lower()
    num = t.rstrip("kmgb")
    unit = t[len(num):]
    try:
        n = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or 500K, 50M, 2G") from None
    if unit not in SIZE_UNITS or n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or 500K, 50M, 2G")
    return int(n * SIZE_UNITS[unit])


def redact_line(raw: bytes) -> bytes:
    try:
        return redact_fast(raw.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return redact_fast(raw.decode("latin-1")).encode("latin-1")


class _TeeReader:
    """Stands in for the LogReader a LogFollower feeds: redacts and keeps each line for the bundle.
    The real reader (the parser a live run uses) gets the lines in :meth:`flush_to_reader`, after the
    scrapes, because ``diagnose --once --url … --log …`` reads its log after sampling."""

    def __init__(self, reader: LogReader) -> None:
        self.reader = reader
        self.pending: list[bytes] = []
        self.kept: list[bytes] = []
        self.first_line = 1

    @property
    def report(self) -> InputReport:
        return self.reader.report

    def feed_bytes(self, raw: bytes) -> None:
        raw = redact_line(raw)
        self.pending.append(raw)
        self.kept.append(raw)

    def flush_to_reader(self) -> None:
        self.reader.feed_stream(io.BytesIO(b"\n".join(self.kept) + b"\n"))  # as read_log reads a file
        self.kept = []

    def take(self) -> tuple[int, list[bytes]]:
        lines, first = self.pending, self.first_line
        self.pending = []
        self.first_line += len(lines)
        return first, lines


class Recorder:
    """One recording: live ingestion (as ``--once``) plus the bundle writer."""

    def __init__(self, adapter: Any, urls: list[str], logs: list[str], writer: BundleWriter, client: Any,
                 interval: float = 2.0, duration: float = 600.0, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.adapter = adapter
        self.writer = writer
        self.client = client
        self.interval = interval
        self.duration = duration
        self.max_bytes = max_bytes
        self.targets = [MetricsTarget(u, adapter) for u in urls]
        self.tls = {t.url: Timeline(target=t.report.source) for t in self.targets}
        self.ranges = {t.url: VersionRange() for t in self.targets}
        self.config_reports: dict[str, InputReport] = {}
        self.raw_config: dict[str, dict[str, Any]] = {}
        # logs: with one URL they belong to it, else each log is a target of its own (as --once)
        self.logs: list[tuple[str, str, Timeline, _TeeReader, LogFollower]] = []
        for path in logs:
            if len(self.targets) == 1:
                tl = self.tls[self.targets[0].url]
            else:
                tl = Timeline(target=path)
            tee = _TeeReader(open_log_reader(adapter, tl, path))
            self.logs.append((path, tl.target, tl, tee, LogFollower(tee, path, from_start=True)))  # type: ignore[arg-type]
        self.scrapes = 0
        self.lines = 0
        self.started = time.time()
        self.stopped_reason = "duration"

    # -- recording -------------------------------------------------------------------------------
    def begin(self) -> None:
        recs: list[dict[str, Any]] = []
        version = None
        for t in self.targets:
            rep, raw = fetch_config(self.client, t.url, self.adapter, self.tls[t.url], self.ranges[t.url])
            self.config_reports[t.url] = rep
            self.raw_config[t.report.source] = raw
            for path, data in raw.items():
                recs.append({"kind": "config", "t": time.time(), "target": t.report.source, "path": path, "data": data})
                if isinstance(data, dict) and isinstance(data.get("version"), str):
                    version = version or data["version"]
        engines = record_engines(recs)  # what the config endpoints said (vLLM's /version, /v1/models)
        vllm = "vllm" in engines.values()
        man = manifest(
            targets=[{"name": t.report.source, "url": t.report.source,
                      **({"engine": engines[t.report.source]} if t.report.source in engines else {})} for t in self.targets],
            logs=[{"source": redact_text(p), "target": target} for p, target, *_ in self.logs],
            start=self.started, interval=self.interval, planned_duration=self.duration,
            sglang_version=None if vllm else version, **({"engine_version": version} if vllm and version else {}),
        )
        self.writer.write_member([man])  # alone: whatever happens next, the bundle has its manifest
        self.writer.write_member(recs)

    def tick(self) -> None:
        recs: list[dict[str, Any]] = []
        done: list[tuple[MetricsTarget, float, Any]] = []
        for t in self.targets:
            ts = time.time()
            t0 = time.perf_counter()
            f = fetch(self.client, t.metrics_url, self.max_bytes, "metrics")
            t.last_duration_s = time.perf_counter() - t0
            if not f.ok:
                recs.append({"kind": "scrape", "t": ts, "target": t.report.source, "error": f.error, "status": f.status})
                done.append((t, ts, f))
                continue
            f.text = redact_fast(f.text)
            recs.append({"kind": "scrape", "t": ts, "target": t.report.source, "text": f.text, "status": f.status,
                         "content_type": f.content_type, "duration_s": round(t.last_duration_s, 6),
                         **({"truncated": True} if f.truncated else {})})
            done.append((t, ts, f))
        recs.extend(self.poll_logs())
        self.writer.write_member(recs)
        # only what is on disk counts, and only that goes into the live diagnosis (so --report and
        # a replay of the bundle always agree, even after --max-size or a write error)
        self._count(recs)
        for t, ts, f in done:
            if not f.ok:
                t._fail(f.error)
                continue
            if f.truncated:
                t._note(f"The exposition from {display_url(t.metrics_url)} exceeded {self.max_bytes} bytes and was cut; the complete lines before the cut were used.")  # as MetricsTarget.scrape
            t.ingest_text(f.text, ts, self.tls[t.url], f)

    def _count(self, recs: list[dict[str, Any]]) -> None:
        self.scrapes += sum(1 for r in recs if r.get("kind") == "scrape" and "text" in r)
        self.lines += sum(len(r.get("lines") or []) for r in recs if r.get("kind") == "log")

    def poll_logs(self) -> list[dict[str, Any]]:
        recs = []
        for path, target, _tl, tee, follower in self.logs:
            follower.poll()
            first, lines = tee.take()
            if lines:
                recs.append({"kind": "log", "t": time.time(), "target": target, "source": redact_text(path),
                             "first_line": first, "lines": [encode_line(x) for x in lines]})
        return recs

    def end(self, reason: str) -> None:
        self.stopped_reason = reason
        recs = self.poll_logs() if reason not in ("write-error",) else []
        now = time.time()
        end = {"kind": "end", "t": now, "reason": reason, "window": {"start": self.started, "end": now},
               "counts": {"scrapes": self.scrapes, "log_lines": self.lines},
               "sglang_version": self.version_text(),
               "engines": {t.report.source: self.tls[t.url].engine for t in self.targets}}
        end["counts"] = {"scrapes": self.scrapes, "log_lines": self.lines + sum(len(r.get("lines") or []) for r in recs)}
        try:
            self.writer.write_member([*recs, end], final=True)
            self._count(recs)
        except BundleFull:
            end["counts"]["log_lines"] = self.lines
            self.writer.write_member([end], final=True)

    def close_logs(self) -> None:
        for *_, follower in self.logs:
            follower.close()

    # -- the live diagnosis (what --once would have built from the same samples) -------------------
    def collection(self) -> Collection:
        """Finalise the live timelines (once, at the end) into the Collection ``--once`` would build."""
        col = Collection()
        for t in self.targets:
            rep = self.config_reports.get(t.url)
            tl = self.tls[t.url]
            col.raw_config[t.report.source] = self.raw_config.get(t.report.source, {})
            if rep is not None and rep.scrapes:
                tl.inputs.append(rep)
                col.inputs.append(rep)
        for t in self.targets:
            tl = self.tls[t.url]
            tl.inputs.insert(0, t.report)
            col.inputs.insert(0, t.report)
            self.ranges[t.url].merge(t.state.version)
            wq = getattr(self.adapter, "window_quantiles", None)
            if wq is not None and t.report.scrapes:
                tl.meta["window_quantiles"] = wq(t.state)  # histogram quantiles over the whole window, as --once
            if t.report.scrapes == 0:
                col.unreachable[tl.target] = t.last_error
                tl.meta["unreachable"] = t.last_error
                tl.meta["engine_exposition"] = t.is_engine
        own = {tl.target for tl in self.tls.values()}
        for _path, _target, tl, tee, _f in self.logs:
            tee.flush_to_reader()
            finish_report(self.adapter, tee.reader)
            tl.inputs.append(tee.report)
            col.inputs.append(tee.report)
            if len(self.targets) == 1:
                self.ranges[self.targets[0].url].merge(tee.reader.parser.version)
            else:
                p = tee.reader.parser
                tl.untimed = bool(p.untimed_lines) and not p.saw_date and p.untimed_lines >= tee.report.lines_recognized
                finalize(tl, p.version)
                col.versions[tl.target] = p.version
                col.timelines.append(tl)
        for t in self.targets:
            tl = self.tls[t.url]
            finalize(tl, self.ranges[t.url])
            col.versions[tl.target] = self.ranges[t.url]
            col.timelines.append(tl)
        col.timelines.sort(key=lambda tl: tl.target not in own)
        return col

    def version_text(self) -> str | None:
        """The detected SGLang version so far, for the end record (timelines are not finalised)."""
        from diagnoser.engines.sglang.versions import parse_version

        for t in self.targets:
            vr = VersionRange()
            vr.merge(self.ranges[t.url])
            vr.merge(t.state.version)
            v = self.tls[t.url].cfg("version")
            pv = parse_version(str(v)) if v else None
            if pv:
                vr.set_exact(pv, "server info")
            if vr.text():
                return vr.text()
        for *_, tee, _f in self.logs:
            if tee.reader.parser.version.text():
                return str(tee.reader.parser.version.text())
        return None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="diagnose record", description="Record raw scrapes, log lines and server info into a bundle.")
    p.add_argument("--from", dest="from_path", metavar="PATH", help="convert a run directory (or re-write a damaged bundle) instead of recording live")
    p.add_argument("--every", type=int, default=1, help="with --from: keep every Nth scrape (default 1 = all)")
    p.add_argument("--name", help="with --from: target name to store instead of the local path")
    p.add_argument("--note", help="with --from: a note stored in the manifest (e.g. where the data came from)")
    p.add_argument("--url", action="append", default=[], help="SGLang server base URL (repeatable)")
    p.add_argument("--log", action="append", default=[], help="server log file to follow (repeatable)")
    p.add_argument("--duration", type=parse_duration, default=600.0, help="how long to record, e.g. 90s, 10m (default 10m)")
    p.add_argument("--interval", type=parse_duration, default=2.0, help="seconds between scrapes (default 2)")
    p.add_argument("-o", "--output", required=True, help="bundle file to write (conventionally .dgb)")
    p.add_argument("--max-size", type=parse_size, default=parse_size("50M"), help="stop before the bundle passes this size (default 50M)")
    p.add_argument("--timeout", type=float, default=5.0, help="time each request may take, in seconds (default 5)")
    p.add_argument("--api-key", default=None, help=API_KEY_HELP)
    p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    p.add_argument("--report", choices=("text", "json"), help="print the diagnosis of the recorded window at the end")
    p.add_argument("--fail-on", default="warning", choices=("info", "warning", "critical"), help=argparse.SUPPRESS)
    return p


def _progress(rec: Recorder, tty: bool, last: list[float], final: bool = False) -> None:
    el = time.time() - rec.started
    msg = (f"recording {_mmss(el)}/{_mmss(rec.duration)} · {rec.scrapes} scrape(s) · {rec.lines} log line(s) · "
           f"{rec.writer.size / 1e6:.2f} MB")
    if tty:
        print(("\r" + msg + " " * 4) if not final else ("\r" + " " * (len(msg) + 4) + "\r"), end="", file=sys.stderr, flush=True)
    elif not final and (el - last[0] >= 10 or last[0] < 0):
        last[0] = el
        print(msg, file=sys.stderr, flush=True)


def _mmss(s: float) -> str:
    s = int(s)
    return f"{s // 60:02d}:{s % 60:02d}"


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.from_path:
        return _convert(args)
    if not args.url and not args.log:
        raise UsageError("nothing to record: pass --url http://HOST:30000 and/or --log PATH")
    if "-" in args.log:
        raise UsageError("record follows log files; --log - (stdin) is not supported, pass the file's path")
    if args.interval <= 0 or args.duration < 0:
        raise UsageError("--interval must be > 0 and --duration >= 0")
    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} already exists; pass --force to overwrite it or choose another -o")
    for lp in args.log:
        if not os.path.isfile(lp):
            raise UsageError(f"log file {lp} does not exist (or is not a file); check the path")
    if args.max_size < 4096:
        raise UsageError("--max-size must be at least 4K")
    if args.timeout <= 0:
        raise UsageError("--timeout must be above 0 seconds")
    headers = api_key_headers(args)  # checked before the output file is created
    try:
        writer = BundleWriter(args.output, max_bytes=args.max_size)
    except OSError as e:
        raise UsageError(f"cannot create {args.output} ({e.strerror}); pick a writable path") from None
    from diagnoser.engines import get_adapter

    adapter = get_adapter("auto")
    client = make_client(timeout=args.timeout, headers=headers)
    rec = Recorder(adapter, args.url, args.log, writer, client, args.interval, args.duration)
    tty = sys.stderr.isatty()
    last = [-1.0]

    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C: stop at once (the block being written may be lost)
            raise KeyboardInterrupt
        stop.set()  # finish the block being written, then end cleanly

    old_int = signal.signal(signal.SIGINT, _stop)
    old_term = signal.signal(signal.SIGTERM, _stop)
    code = 0
    note = ""
    try:
        try:
            rec.begin()
            n = max(1, int(round(args.duration / args.interval)) + 1) if args.duration > 0 else 1
            for i in range(n):
                if stop.is_set():
                    break
                t0 = time.monotonic()
                rec.tick()
                _progress(rec, tty, last)
                if i < n - 1:
                    stop.wait(max(0.0, args.interval - (time.monotonic() - t0)))
            rec.end("interrupted" if stop.is_set() else "duration")
            if stop.is_set():
                note = "stopped by Ctrl-C/SIGTERM; the bundle is complete up to that moment"
        except KeyboardInterrupt:
            rec.end("interrupted")
            note = "stopped by Ctrl-C/SIGTERM; the bundle is complete up to that moment"
        except BundleFull:
            rec.end("max-size")
            note = f"reached --max-size ({args.max_size} bytes); recording stopped and the bundle is complete up to there"
    except OSError as e:
        code = 1
        what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"writing failed ({e.strerror or e})"
        if e.errno == errno.EFBIG:
            what = "the file-size limit was reached"
        try:
            rec.end("write-error")
            kept = "the end record was written"
        except (OSError, BundleFull):
            kept = "there was no room for the end record"
        note = (f"{what} while writing {args.output}: recording stopped after {rec.scrapes} scrape(s); the {rec.writer.size} "
                f"bytes written are a valid bundle ({kept}). Free space and record again for the rest.")
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        rec.close_logs()
        writer.close()
        client.close()
        _progress(rec, tty, last, final=True)
    summary = (f"recorded {rec.scrapes} scrape(s) and {rec.lines} log line(s) over {_mmss(time.time() - rec.started)} "
               f"into {args.output} ({writer.size} bytes)")
    print(term_safe(f"diagnose record: {summary}" + (f"; {note}" if note else ".")), file=sys.stderr)
    if rec.scrapes == 0 and rec.lines == 0 and code == 0:
        errs = [m for t in rec.targets for m in t.report.messages]
        print(term_safe(f"diagnose record: nothing was recorded{(': ' + errs[0]) if errs else ''}"), file=sys.stderr)
        code = 2
    if args.report:
        code = max(code, _report(args, rec, adapter))
    return code


def _convert(args: argparse.Namespace) -> int:
    from diagnoser.bundle import BundleError
    from diagnoser.replay import load_source, write_source

    if args.url or args.log:
        raise UsageError("--from converts an existing recording; it cannot be combined with --url or --log")
    if args.every < 1:
        raise UsageError("--every must be 1 or more")
    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} already exists; pass --force to overwrite it or choose another -o")
    try:
        src = load_source(args.from_path)
    except BundleError as e:
        raise UsageError(str(e)) from None
    if src.problems:
        print(term_safe(f"diagnose record: {src.summary}"), file=sys.stderr)
    try:
        counts = write_source(src, args.output, every=args.every, name=args.name, note=args.note, max_bytes=args.max_size)
    except BundleFull:
        print(f"diagnose record: {args.output} would pass --max-size {args.max_size} bytes; raise it or thin with --every N.", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"diagnose record: writing {args.output} failed ({e.strerror or e}); the bundle holds what came before.", file=sys.stderr)
        return 1
    print(f"diagnose record: wrote {args.output}: {counts['scrapes']} scrape(s) ({counts['dropped_scrapes']} thinned out), "
          f"{counts['log_lines']} log line(s), {counts['bytes']} bytes.", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace, rec: Recorder, adapter: Any) -> int:
    from diagnoser.cli.run import analyse
    from diagnoser.cli.run import build_parser as run_parser

    ns = run_parser().parse_args(["--once", "--fail-on", args.fail_on])  # every analysis option at its default
    col = rec.collection()
    _report_obj, doc = analyse(ns, col, adapter)
    if args.report == "json":
        sys.stdout.write(dumps(doc, indent=2) + "\n")
    else:
        from diagnoser.outputs.term import term_for
        from diagnoser.outputs.text import render

        sys.stdout.write(render(doc, term=term_for(sys.stdout)))
    return 0


__all__ = ["Recorder", "main", "parse_size", "iso"]
