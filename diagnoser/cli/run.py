"""``diagnose [--once]``: sample the targets for a window, evaluate the rules, report.

Exit codes: 0 = nothing at or above ``--fail-on`` (default warning); 1 = a finding at or above it;
2 = a usage error, or no usable data was read.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from diagnoser import __version__
from diagnoser.cli import UsageError, resume_gc

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# default poll interval of the continuous modes (watch, serve): SGLang spends ~27 ms of CPU rendering
# /metrics (bench/bench_observer.py), so 10 s keeps our polling near 0.3 % of its time (target < 0.5 %)
WATCH_INTERVAL_S = 10.0
API_KEY_HELP = "the SGLang server's --api-key for --url targets, or @FILE holding it (default $SGLANG_API_KEY)"


def parse_duration(text: str) -> float:
    t = str(text).strip().lower()
    try:
        if t and t[-1] in DURATION_UNITS:
            return float(t[:-1]) * DURATION_UNITS[t[-1]]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use seconds or 30s, 10m, 2h") from None


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (with zlib, bz2 and lzma it costs
    about 2 ms of every start, and argparse imports it for the width of each help formatter)."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _unrecognised(message: str) -> str:
    """argparse's "unrecognized arguments: …" with only the flags shown: what follows a mistyped flag
    (``--api-kee KEY``) may be a secret, and no pattern can know it."""
    head = "unrecognized arguments: "
    if not message.startswith(head):
        return message
    words = message[len(head):].split()
    flags = [w.split("=", 1)[0] for w in words if w.startswith("-")]
    hidden = len(words) - len(flags) + sum(1 for w in words if w.startswith("-") and "=" in w)
    shown = " ".join(flags)
    more = f"{hidden} value(s), not shown" if hidden else ""
    return "unrecognized arguments: " + (f"{shown} (and {more})" if shown and more else shown or more)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one sentence, exit 2, no usage dump
        raise UsageError(f"{_unrecognised(message)}. See 'diagnose --help'.")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # what argparse does with width=None, minus its shutil import (it also subtracts 2)
        return self.formatter_class(prog=self.prog, width=_terminal_columns() - 2)


class _RunParser(_Parser):
    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        if ns.interval is None:  # a short burst for --once; continuous polling stays under 0.5 % of the server
            ns.interval = 2.0 if (ns.once or ns.replay) else WATCH_INTERVAL_S
        return ns


def build_parser() -> argparse.ArgumentParser:
    p = _RunParser(prog="diagnose", description="Why is my SGLang server slow, and what should I change?")
    p.add_argument("--version", action="version", version=f"diagnose {__version__}")
    p.add_argument("--once", action="store_true", help="sample for --duration, report once and exit")
    p.add_argument("--url", action="append", default=[], help="SGLang server base URL (repeatable), e.g. http://127.0.0.1:30000")
    p.add_argument("--log", action="append", default=[], help="server log file, or - for stdin (repeatable)")
    p.add_argument("--metrics-file", action="append", default=[], metavar="PATH",
                   help="a saved /metrics exposition (repeatable: successive scrapes of one server), or - for stdin")
    p.add_argument("--replay", help="replay a recorded bundle instead of live inputs")
    p.add_argument("--prometheus", help="read targets from a Prometheus server (fleet mode)")
    p.add_argument("--selector", default="", help="PromQL label selector for --prometheus, e.g. '{job=\"sglang\"}'")
    p.add_argument("--range", type=parse_duration, default=None, help="look-back read from --prometheus (default 10m)")
    p.add_argument("--step", type=parse_duration, default=None, help="query resolution for --prometheus (default range/20, at least 15s)")
    p.add_argument("--rate-window", type=parse_duration, default=None, help="rate()/quantile window for --prometheus (default max(1m, 2 steps))")
    p.add_argument("--end", default=None, help="end of the --prometheus range: epoch seconds or ISO time (default now)")
    p.add_argument("--bearer-token", default=None, help="bearer token for --prometheus, or @FILE holding it")
    p.add_argument("--basic-auth", default=None, help="USER:PASSWORD for --prometheus, or @FILE holding it")
    p.add_argument("--header", action="append", default=[], help="extra 'Name: value' header for --prometheus (repeatable)")
    p.add_argument("--duration", type=parse_duration, default=10.0, help="sampling window for --once with --url (default 10s)")
    p.add_argument("--interval", type=parse_duration, default=None,
                   help="seconds between scrapes (default 2 with --once, 10 in watch mode: each /metrics render "
                   "costs SGLang about 27 ms of CPU, see bench/bench_observer.py)")
    p.add_argument("--last", type=parse_duration, default=None, help="only judge the last part of the input, e.g. 10m (without it, a log is judged on its newest 4 M points)")
    p.add_argument("--api-key", default=None, help=API_KEY_HELP)
    p.add_argument("--timeout", type=float, default=5.0, help="time each request may take in seconds, connect to last byte (default 5)")
    p.add_argument("target", nargs="?", default=None, metavar="URL", help="a server URL: 'diagnose URL' is 'diagnose --url URL'")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="text (the terminal report), json (schema: diagnoser/schema/report.schema.json) or markdown (a card to paste)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour on a terminal (auto: a TTY without NO_COLOR)")
    p.add_argument("--fail-on", default="warning", choices=("info", "warning", "critical"), help="lowest severity that exits 1")
    p.add_argument("--config", help="TOML file with rule thresholds ([rules.NAME] tables)")
    p.add_argument("--set", action="append", default=[], metavar="RULE.KEY=VALUE", help="override a rule threshold")
    p.add_argument("--select", action="append", default=[], help="only run these rules (name or code)")
    p.add_argument("--ignore", action="append", default=[], help="skip these rules (name or code)")
    p.add_argument("--job-requests", type=int, default=None, help="total requests in the batch job, for the ETA")
    p.add_argument("--client-concurrency", type=int, default=None, help="requests the client keeps in flight, if known")
    p.add_argument("--model-config", help="the model's Hugging Face config.json, for the capacity model")
    p.add_argument("--avg-tokens-per-request", type=float, default=None, help="prompt + output tokens per request")
    p.add_argument("--host-mem-gb", type=float, default=None, help="host RAM in GiB, to check that a HiCache size fits")
    p.add_argument("--ignore-eos", action="store_true", default=None,
                   help="the client sets ignore_eos (fixed-length outputs): SGLang then reserves each request's whole max_new_tokens")
    p.add_argument("--client-results", default=None, metavar="FILE",
                   help="a load tool's result file (SGLang bench_serving JSONL, vLLM bench serve, GenAI-Perf, AIPerf, "
                        "GuideLLM JSON): set what the client saw beside the server's numbers over the same window")
    p.add_argument("--verbose", "-v", action="store_true", help="the evidence with its sources, the assumptions and every rule checked")
    p.add_argument("--save", action="store_true", help="--once: keep this run's verdict in the local history ('diagnose history list')")
    p.add_argument("--history-db", default=None, metavar="PATH", help="the history file --save writes (default: see 'diagnose history --help')")
    p.add_argument("--for", dest="for_s", type=parse_duration, default=None, help="watch mode: how long a condition must hold before its finding fires (default: each rule's own)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.target is not None:  # diagnose URL: the same as --url URL
        if not args.target.startswith(("http://", "https://")):
            raise UsageError("a word on its own is neither a command nor a URL: 'diagnose --help' lists the commands; a server is http://HOST:PORT")
        args.url.append(args.target)
    if not args.once and not args.replay:
        from diagnoser.cli import watch

        resume_gc()
        return int(watch.main(args))
    return run_once(args)


def load_thresholds(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from diagnoser.thresholds import load_thresholds as _load

    try:
        return _load(args.config, args.set)
    except ValueError as e:
        raise UsageError(str(e)) from None


def looks_like_exposition(path: str) -> bool:
    """A file whose first lines are a Prometheus exposition of SGLang (``# TYPE sglang…`` / ``sglang:…``)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return False
    lines = [ln.strip() for ln in head if ln.strip()][:40]
    expo = sum(1 for ln in lines if ln.startswith(("# HELP sglang", "# TYPE sglang", "sglang:", "sglang_")))
    return len(lines) >= 1 and expo >= max(1, len(lines) // 2)


def gather(args: argparse.Namespace, adapter: Any) -> Any:
    """Collect the inputs the arguments name into a Collection."""
    if args.replay:
        from diagnoser.replay import BundleError, collect_replay

        try:
            return collect_replay(args.replay, adapter)
        except BundleError as e:
            raise UsageError(str(e)) from None
    if args.prometheus:
        from diagnoser.fleet import collect_prometheus

        return collect_prometheus(args, adapter)
    if args.log and not args.url and not args.metrics_file:
        # a saved /metrics dump passed as --log (people do): read it as the exposition it is
        dumps = [p for p in args.log if p != "-" and looks_like_exposition(p)]
        if dumps:
            args.metrics_file = dumps
            args.log = [p for p in args.log if p not in dumps]
            args.exposition_as_log = dumps
    if args.metrics_file:
        if args.url:
            raise UsageError("--metrics-file reads saved expositions: use it without --url (or drop it and scrape the server)")
        if "-" in args.metrics_file and "-" in args.log:
            raise UsageError("stdin can feed --metrics-file - or --log -, not both")
        from diagnoser.collect import collect_files

        options = _log_options(args, None)
        try:
            col = collect_files(adapter, args.metrics_file, args.log, options=options)
        finally:
            if options.progress is not None:
                options.progress.clear()
        for path in getattr(args, "exposition_as_log", None) or []:
            for rep in col.inputs:
                if rep.kind == "metrics":
                    rep.messages.append(f"{path} is a /metrics exposition, read as one scrape (--metrics-file says so explicitly).")
                    break
        return col
    if not args.url and not args.log:
        raise UsageError("nothing to read: pass --url http://HOST:30000 and/or --log PATH (or --log - for stdin), or --metrics-file FILE")
    if args.url:
        from diagnoser.sources.http import url_problem

        for u in args.url:
            problem = url_problem(u)
            if problem:
                raise UsageError(problem)
    if args.interval <= 0 or args.duration < 0 or args.timeout <= 0:
        raise UsageError("--interval and --timeout must be more than 0 seconds and --duration at least 0, e.g. --duration 10s --interval 2s")
    from diagnoser.collect import collect_once

    line: Any = None
    progress: Any = None
    client = _client(args) if args.url else None  # checks --api-key before any request
    if args.url and args.duration > 0:  # sampling takes --duration: say how far it is (on a terminal only)
        from diagnoser.cli.statusline import StatusLine, sampling_progress

        line = StatusLine()
        progress = sampling_progress(line) if line.enabled else None
    options = _log_options(args, line)
    reading = options.progress
    try:
        return collect_once(adapter, args.url, args.log, duration=args.duration, interval=args.interval, progress=progress,
                            client=client, timeout=args.timeout, log_options=options)
    finally:
        if line is not None:
            line.clear()
        if reading is not None:
            reading.clear()


def _log_options(args: argparse.Namespace, line: Any) -> Any:
    """How the logs are read: kept to the window judged while they are read (``--last``, else their
    newest MAX_POINTS points), with a progress line on the terminal's status line ``line`` (or its own)."""
    from diagnoser.collect import LogOptions
    from diagnoser.timeline.window import MAX_POINTS

    reading = None
    if args.log:  # a long log read: lines, MB/s and the time left (a terminal only)
        from diagnoser.cli.progress import log_progress

        reading = log_progress(line)
    return LogOptions(max_points=None if args.last else MAX_POINTS, last_s=args.last or None, progress=reading)


def api_key_headers(args: argparse.Namespace) -> dict[str, str] | None:
    """``--api-key`` (or ``@FILE``, or $SGLANG_API_KEY) as the bearer header every command sends to every
    --url endpoint; None without a key. The key itself is never printed."""
    key = getattr(args, "api_key", None) or os.environ.get("SGLANG_API_KEY") or None
    if not key:
        return None
    from diagnoser.fleet.promapi import auth_headers

    try:
        headers = auth_headers(bearer_token=key)
    except ValueError as e:
        raise UsageError(str(e).replace("--bearer-token", "--api-key")) from None
    value = headers["Authorization"]
    if value == "Bearer " or not all(33 <= ord(c) < 127 for c in value[7:]):
        raise UsageError("the key given with --api-key, or $SGLANG_API_KEY, is empty or holds spaces or characters an HTTP header "
                         "cannot carry; pass the key exactly as the server was started with it")
    return headers


def _client(args: argparse.Namespace) -> Any:
    """The one httpx pool for every --url target; ``--api-key`` (or $SGLANG_API_KEY) as a bearer token."""
    from diagnoser.sources.http import make_client

    return make_client(timeout=args.timeout, headers=api_key_headers(args))


def analyse(args: argparse.Namespace, col: Any, adapter: Any) -> tuple[Any, dict[str, Any]]:
    from diagnoser.evaluate import evaluate, select_rules
    from diagnoser.model import Severity

    thresholds = load_thresholds(args)
    if args.last:
        for i, tl in enumerate(col.timelines):
            start, end = tl.span()
            if end is not None and not tl.untimed:
                col.timelines[i] = tl.window(end - args.last, end)
                col.timelines[i].meta.pop("window_quantiles", None)  # they cover the whole sampling window
    extras = {
        "job_requests": args.job_requests,
        "client_concurrency": args.client_concurrency,
        "model_config": args.model_config,
        "avg_tokens_per_request": args.avg_tokens_per_request,
        "host_mem_gb": getattr(args, "host_mem_gb", None),
        "ignore_eos": getattr(args, "ignore_eos", None),
        "unreachable": getattr(col, "unreachable", {}),
    }
    from diagnoser.outputs.report import build, prepare

    prepared = []  # the report's parts that do not wait for the findings, built while workers judge targets
    report = evaluate(col.timelines, adapter, thresholds, select_rules(args.select, args.ignore), extras,
                      meanwhile=lambda: prepared.append(prepare(col)))
    try:
        from diagnoser.advice import enrich

        enrich(report, col.timelines, extras)
    except ImportError:
        pass
    doc = build(col, report, Severity.parse(args.fail_on), prepared=prepared[0] if prepared else None)
    if getattr(args, "client_results", None):
        doc["client"] = client_section(args.client_results, col.timelines)
    return report, doc


def client_section(path: str, timelines: list[Any]) -> dict[str, Any]:
    """What the client saw (``--client-results``) beside the first target's numbers over the same window."""
    from diagnoser.redact import redact_strings
    from diagnoser.sources.client_results import read_client_results
    from diagnoser.timeline.client import reconcile

    run = read_client_results(path)
    tls = [tl for tl in timelines if tl.series] or timelines
    if not tls:
        return redact_strings({"tool": run.tool, "source": path, "rows": [], "gaps": [], "client": run.to_dict(),
                               "notes": [*run.notes, "No server input to set it beside."]})
    out = reconcile(run, tls[0])
    if len(tls) > 1:
        out["notes"].append(f"Set beside the first target ({tls[0].target}); the file is one client's run.")
    return redact_strings(out)


def run_once(args: argparse.Namespace) -> int:
    # everything a report needs, loaded before the garbage collector comes back on (start-up time)
    import diagnoser.advice  # noqa: F401
    import diagnoser.collect  # noqa: F401
    import diagnoser.evaluate  # noqa: F401
    import diagnoser.outputs.report  # noqa: F401
    from diagnoser.engines import get_adapter

    adapter = get_adapter("auto")
    resume_gc()
    if args.client_results:  # a bad file is one sentence before any sampling starts
        from diagnoser.sources.client_results import ClientResultsError, read_client_results

        try:
            read_client_results(args.client_results)
        except ClientResultsError as e:
            print(f"diagnose: {e}", file=sys.stderr)
            return 2
    col = gather(args, adapter)
    report, doc = analyse(args, col, adapter)
    if args.save:
        from pathlib import Path

        from diagnoser.cli.history import HistoryError, save
        from diagnoser.outputs.termsafe import term_safe

        try:
            run_id = save(doc, Path(args.history_db) if args.history_db else None)
            if args.format == "text":
                print(term_safe(f"diagnose: saved as run {run_id} ('diagnose history show {run_id}')"), file=sys.stderr)
        except HistoryError as e:
            print(term_safe(f"diagnose: {e}"), file=sys.stderr)
    if args.format == "json":
        from diagnoser.jsonout import dumps  # imported here: the text report (the default) does not need it

        sys.stdout.write(dumps(doc, indent=2) + "\n")
    elif args.format == "markdown":
        from diagnoser.outputs.markdown import render_markdown

        sys.stdout.write(render_markdown(doc))
    else:
        from diagnoser.outputs.term import term_for
        from diagnoser.outputs.text import render

        sys.stdout.write(render(doc, verbose=args.verbose, term=term_for(sys.stdout, args.color)))
    if doc["status"] == "error":
        if args.format == "text":
            msgs = [e["error"] for e in doc.get("errors", []) if e.get("source") == "input"]
            msgs += [m for i in doc["inputs"] for m in i.get("messages", [])]
            hint = msgs[0] if msgs else "No usable data was read from the inputs given."
            from diagnoser.outputs.termsafe import term_safe

            print(term_safe(f"diagnose: {hint}"), file=sys.stderr)
        return 2
    return 1 if doc["status"] == "problems" else 0

