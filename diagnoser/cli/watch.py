"""``diagnose`` without ``--once``: watch mode. Polls the targets and follows the logs, and every interval
redraws a compact terminal view (headline numbers, firing findings, the top suggestion). When stdout is
not a terminal it prints plain lines instead: one status line per target per tick, and a line whenever a
finding fires or resolves. Ctrl-C exits cleanly with a final summary (the full text report).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import IO, Any

from diagnoser.cli import UsageError
from diagnoser.cli.run import api_key_headers, load_thresholds
from diagnoser.model import Severity, iso
from diagnoser.outputs.term import SEV_STYLE, Term, shown, term_for
from diagnoser.outputs.termsafe import term_safe
from diagnoser.outputs.text import SEV_MARK
from diagnoser.redact import redact_text

CLEAR = "\x1b[H\x1b[2J"
HEAD = [("running_reqs", "run", "{:.0f}"), ("queue_reqs", "queue", "{:.0f}"), ("token_usage", "kv", "{:.2f}"),
        ("gen_throughput_tps", "gen tok/s", "{:.0f}"), ("ttft_seconds_p95", "ttft p95", "{:.2f}s")]


def _fmt(f: str, v: Any) -> str:
    try:
        return f.format(float(v))
    except (TypeError, ValueError):
        return "-"


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def status_line(t: Any) -> str:
    if t.is_url and t.up is False:
        return f"{t.name}: DOWN — {t.last_error}"
    cells = [f"{label} {_fmt(f, t.latest[k])}" for k, label, f in HEAD if k in t.latest]
    mrr = t.config.get("max_running_requests")
    if mrr is not None and "running_reqs" in t.latest:
        cells[0] = f"run {_fmt('{:.0f}', t.latest['running_reqs'])}/{mrr.value}"
    return f"{t.name}: " + (" · ".join(cells) if cells else "no data yet")


def screen(snap: Any, started: float, term: Term | None = None) -> str:
    """The redrawn view at the terminal's width (wrapped between words, never cut), in the findings' one
    order (the top cause first); every server-provided string through :func:`term.shown`."""
    t = term or Term()
    out = [t.fit(f"diagnoser watch · {iso(snap.ts)} · tick {snap.tick} · Ctrl-C for the summary"), ""]
    for tg in snap.targets:
        out.extend(t.paint(x, "bold") for x in t.wrap(shown(status_line(tg)), "    ", "▸ "))
        busy = any((_num(tg.latest.get(k)) or 0) > 0 for k in ("running_reqs", "queue_reqs"))
        for f in snap.for_target(tg.name):
            if busy and f.rule == "insufficient_data" and "idle" in f.summary:
                # the rules judged a window before this reading: "idle" beside a queue would contradict it
                out.extend(t.wrap("load arrived after the last rule pass (which saw the server idle): judged at the next one",
                                  "         ", "   [info] "))
                continue
            mark = SEV_MARK.get(f.severity.label, f.severity.label)
            pend = " (pending)" if f.state == "pending" else ""
            lines = t.wrap(shown(f"{f.rule}{pend}: {f.summary}"), "         ", f"   [{mark}] ")
            lines[0] = lines[0].replace(f"[{mark}]", t.paint(f"[{mark}]", SEV_STYLE.get(f.severity.label)), 1)
            out.extend(lines)
            if f.suggestions:
                s = f.suggestions[0]
                cur = "unset" if s.current is None else s.current
                eff = f" — {s.effect}" if s.effect else ""
                out.append(t.fit(shown(f"      → {s.flag} {cur} → {s.proposed}{eff}")))
        out.append("")
    if not snap.findings:
        out.append("No finding.")
    body = redact_text("\n".join(out) + "\n")  # every server string went through shown() (term_safe)
    return body if t.color else term_safe(body)


class PlainPrinter:
    """Plain lines for pipes: a status line per target per tick, and finding transitions."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.firing: set[tuple[str, str]] = set()

    def __call__(self, snap: Any) -> None:
        stamp = iso(snap.ts)
        lines = [f"{stamp} {status_line(t)}" for t in snap.targets]
        now = {(f.target, f.rule): f for f in snap.findings if f.state == "firing"}
        for key, f in now.items():
            if key not in self.firing:
                lines.append(f"{stamp} FIRING {f.severity.label} {f.rule} {f.target}: {f.summary}")
        for key in self.firing - set(now):
            lines.append(f"{stamp} RESOLVED {key[1]} {key[0]}")
        self.firing = set(now)
        self.out.write(term_safe(redact_text("\n".join(lines) + "\n")))
        self.out.flush()


def final_summary(monitor: Any, args: argparse.Namespace, term: Term | None = None) -> tuple[str, str]:
    """The full text report over the whole kept history (as ``--once`` would print it)."""
    from diagnoser.collect import Collection
    from diagnoser.evaluate import evaluate, select_rules
    from diagnoser.outputs.report import build
    from diagnoser.outputs.text import render

    col = Collection()
    for t in monitor.targets:
        with t.lock:
            tl = t.timeline.window(None, None)
        col.timelines.append(tl)
        col.inputs.extend(tl.inputs)
    extras = dict(monitor.extras)
    extras["unreachable"] = {t.name: t.last_error for t in monitor.targets if t.is_url and t.up is False}
    report = evaluate(col.timelines, monitor.adapter, monitor.thresholds, select_rules(args.select, args.ignore), extras)
    doc = build(col, report, Severity.parse(args.fail_on))
    return render(doc, verbose=args.verbose, term=term), str(doc["status"])


def _catch_signals() -> None:
    """Ctrl-C (and SIGTERM) end the watch with the summary, even when started with SIGINT ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)


def main(args: argparse.Namespace, out: IO[str] | None = None, max_ticks: int | None = None) -> int:
    out = out or sys.stdout
    if not args.url and not args.log and not getattr(args, "prometheus", None):
        raise UsageError("nothing to watch: pass --url http://HOST:30000 and/or --log PATH (add --once for a single report)")
    if "-" in args.log:
        raise UsageError("watch mode follows log files; read stdin with --once --log -")
    if args.interval <= 0 or args.timeout <= 0:
        raise UsageError("--interval and --timeout must be above 0 seconds")
    from diagnoser.engines import get_adapter
    from diagnoser.evaluate import select_rules
    from diagnoser.live import LiveMonitor

    window = args.last or max(60.0, args.duration)
    kw: dict[str, Any] = dict(
        interval=args.interval, timeout=args.timeout, window_s=window,
        for_seconds=getattr(args, "for_s", None), thresholds=load_thresholds(args), rules=select_rules(args.select, args.ignore),
        extras={"job_requests": args.job_requests, "client_concurrency": args.client_concurrency,
                "model_config": args.model_config, "avg_tokens_per_request": args.avg_tokens_per_request,
                "ignore_eos": getattr(args, "ignore_eos", None)},
    )
    if getattr(args, "prometheus", None):  # fleet mode: targets from Prometheus (diagnoser/web/fleet.py)
        from diagnoser.web.fleet import fleet_monitor

        kw["window_s"] = args.last or getattr(args, "range", None) or 600.0
        monitor: Any = fleet_monitor(args, get_adapter("sglang"), **kw)
    else:
        monitor = LiveMonitor(get_adapter("auto"), args.url, args.log, headers=api_key_headers(args), **kw)
    _catch_signals()
    tty = out.isatty()
    plain = PlainPrinter(out)
    color = getattr(args, "color", "auto")
    started = time.time()
    ticks = 0
    try:
        while max_ticks is None or ticks < max_ticks:
            t0 = time.monotonic()
            try:
                snap = monitor.tick()
            except Exception as e:  # noqa: BLE001 — a poll that fails (a bug, memory) is said and retried
                ticks += 1
                msg = f"{iso(time.time())} polling failed ({type(e).__name__}: {e}"[:400]
                out.write(term_safe(redact_text(f"{msg}); retrying in {monitor.interval:g} s\n")))
                out.flush()
                time.sleep(monitor.interval)
                continue
            ticks += 1
            if tty:
                out.write(CLEAR + screen(snap, started, term_for(out, color)))  # the width now (a resize)
                out.flush()
            else:
                plain(snap)
            if max_ticks is not None and ticks >= max_ticks:
                break
            time.sleep(max(0.05, monitor.interval - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        out.write("\n")
    finally:
        monitor.close()
    text, status = final_summary(monitor, args, term_for(out, getattr(args, "color", "auto")))
    out.write(("\n" if not tty else "") + f"Summary after {time.time() - started:.0f} s of watching:\n" + text)
    out.flush()
    return 2 if status == "error" else (1 if status == "problems" else 0)
