"""``diagnose compare BEFORE AFTER``: did the change work? (diagnoser/outputs/compare.py says what it reads)

    diagnose compare before.dgb after.dgb [--format text|json] [--last 10m] [--target NAME] [--fail-on warning]

BEFORE and AFTER are bundles (``diagnose record``) or run directories, one server each (``--target``
picks one of several). Each is diagnosed as ``diagnose --once --replay`` would, with the same options.
The verdict judges the change that was made: the suggestions of BEFORE that AFTER applied (their
findings, their predicted numbers), else the findings; other movements are listed beside it.

Exit codes: 0 when AFTER has no finding at or above ``--fail-on`` that BEFORE did not have; 1 when it
does (the change made something worse); 2 on a usage error or an unreadable recording.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diagnoser.cli import UsageError
from diagnoser.cli.run import _Parser, parse_duration

FORWARDED = ("--last", "--fail-on", "--client-concurrency", "--model-config", "--avg-tokens-per-request", "--job-requests")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="diagnose compare", description="Compare two recordings of one server: before and after a change.")
    p.add_argument("before", help="bundle (.dgb) or run directory recorded before the change")
    p.add_argument("after", help="bundle (.dgb) or run directory recorded after it")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--target", default=None, help="the target to compare when a recording holds several")
    p.add_argument("--last", type=parse_duration, default=None, help="judge only the last part of each recording, e.g. 5m")
    p.add_argument("--fail-on", default="warning", choices=("info", "warning", "critical"), help="lowest severity of a new finding that exits 1")
    p.add_argument("--client-concurrency", type=int, default=None)
    p.add_argument("--model-config", default=None)
    p.add_argument("--avg-tokens-per-request", type=float, default=None)
    p.add_argument("--job-requests", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="the client sets ignore_eos (as for diagnose --once)")
    return p


def _side(path: str, args: argparse.Namespace, adapter: Any) -> Any:
    from diagnoser.cli.run import analyse, gather
    from diagnoser.cli.run import build_parser as run_parser
    from diagnoser.outputs.compare import Side

    argv = ["--once", "--replay", path]
    for opt in FORWARDED:
        v = getattr(args, opt[2:].replace("-", "_"))
        if v is not None:
            argv += [opt, str(v)]
    if args.ignore_eos:
        argv.append("--ignore-eos")
    rargs = run_parser().parse_args(argv)
    col = gather(rargs, adapter)
    if not col.timelines:
        raise UsageError(f"{path}: nothing usable was read; check it is a bundle from 'diagnose record' or a run directory")
    if args.target is not None:
        col.timelines = [tl for tl in col.timelines if tl.target == args.target]
        if not col.timelines:
            raise UsageError(f"{path} has no target {args.target!r}")
    elif len(col.timelines) > 1:
        names = ", ".join(tl.target for tl in col.timelines)
        raise UsageError(f"{path} holds several targets ({names}); pick one with --target")
    report, doc = analyse(rargs, col, adapter)
    if doc["status"] == "error":
        raise UsageError(f"{path}: nothing usable was read ({(doc.get('errors') or [{}])[0].get('error', 'no signal')})")
    return Side(path, col.timelines[0], report, doc)


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from diagnoser.engines import get_adapter
    from diagnoser.model import Severity
    from diagnoser.outputs import compare as C

    adapter = get_adapter("auto")
    before, after = _side(args.before, args, adapter), _side(args.after, args, adapter)
    doc = C.compare(before, after)
    if args.format == "json":
        import json

        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        from diagnoser.outputs.termsafe import term_safe

        sys.stdout.write(term_safe(C.render(doc)))
    floor = Severity.parse(args.fail_on)
    return 1 if any(Severity.parse(x["severity"]) >= floor for x in doc["findings"]["new"]) else 0
