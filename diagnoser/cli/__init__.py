"""``diagnose``: the command line. Subcommands live in their own modules and are imported lazily so
that ``diagnose --once --log`` starts fast. :data:`COMMANDS` is the list ``diagnose --help`` prints.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import warnings

# diagnoser does no linear algebra: one BLAS thread instead of one per core, which OpenBLAS would start
# at numpy's import (about 0.1 s of CPU at every start on 2 cores). A value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SUBCOMMANDS = {
    "rules": "diagnoser.cli.rules_cmd",
    "explain": "diagnoser.cli.rules_cmd",
    "serve": "diagnoser.cli.serve",
    "record": "diagnoser.cli.record",
    "replay-server": "diagnoser.cli.replay_server",
    "plan": "diagnoser.cli.plan",
    "compare": "diagnoser.cli.compare",
    "history": "diagnoser.cli.history",
    "completion": "diagnoser.cli.help",
    "demo": "diagnoser.cli.help",
    "help": "diagnoser.cli.help",
    "catalogue": "diagnoser.cli.catalogue_cmd",
}
# every command with one line: ``diagnose --help`` lists them (diagnoser/cli/help.py)
COMMANDS = {
    "URL": "diagnose a server now: 'diagnose http://HOST:30000' is 'diagnose --url http://HOST:30000'",
    "--once": "sample --url/--log/--metrics-file/--replay inputs for --duration, report once and exit",
    "--url": "without --once, watch mode: poll the servers, follow the logs and redraw every --interval",
    "demo": "diagnose the bundled recording of a real SGLang run (no server needed)",
    "rules": "list the rule catalogue",
    "explain": "print one rule's doc: diagnose explain kv_saturation",
    "serve": "web dashboard and /metrics exporter for one or more servers",
    "record": "record a server's scrapes, log and config into a bundle (.dgb)",
    "replay-server": "serve a bundle as a live SGLang or vLLM server",
    "plan": "offline capacity planner: pool, concurrency and throughput from a model config (SGLang; vLLM with --engine vllm)",
    "compare": "judge a change: two recordings (before, after) side by side",
    "history": "verdicts of earlier 'diagnose --once --save' runs: history list, history show ID",
    "catalogue": "SGLang's releases as diagnoser reads them: coverage per release, flags at a release",
    "completion": "print a shell completion script: diagnose completion bash|zsh|fish",
    "help": "this list, or one command's options: diagnose help CMD",
}


class UsageError(Exception):
    """A user error: printed as one sentence, exit code 2."""


_gc_paused = False
_gc_freeze = False


def _pause_gc(freeze: bool) -> None:
    """Start-up allocates a few hundred thousand objects that live as long as the process (numpy, our
    modules, their classes and functions); the cyclic collector would walk them again and again while
    they load and during the work. It stays off until :func:`resume_gc`, which (for the ``diagnose``
    process itself, not a caller of :func:`main`) first freezes them out of its reach: about 2.5 % of
    a ``diagnose --once --log`` start (bench/bench_startup.py --instructions)."""
    global _gc_paused, _gc_freeze
    if gc.isenabled():
        gc.disable()
        _gc_paused, _gc_freeze = True, freeze


def resume_gc() -> None:
    """Turn the collector back on once a command's modules are loaded, before its real work."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        if _gc_freeze:
            gc.freeze()
        gc.enable()


# NumPy's floating-point warnings (a hostile 1.7e308 summed, a 0/0 rate): the arithmetic already gives inf or
# NaN, which every rule reads as "no number"; printed, they would be lines of a source file on the terminal
FP_WARNINGS = r"(overflow|invalid value|divide by zero|underflow) encountered"


def main(argv: list[str] | None = None) -> int:
    _pause_gc(freeze=argv is None)  # the console script: nothing of a caller's to freeze
    if argv is None:  # (the console script: a caller of main() keeps its own warning filters)
        warnings.filterwarnings("ignore", message=FP_WARNINGS, category=RuntimeWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("-h", "--help"):
            from diagnoser.cli.help import main_help

            print(main_help(), end="")
            return 0
        if argv and argv[0] in SUBCOMMANDS:
            mod = importlib.import_module(SUBCOMMANDS[argv[0]])
            resume_gc()
            return int(mod.main(argv[0], argv[1:]))
        from diagnoser.cli import run

        return int(run.main(argv))
    except UsageError as e:
        # a usage error may quote what was typed (--api-key KEY, a URL): it goes out redacted
        from diagnoser.outputs.termsafe import term_safe
        from diagnoser.redact import redact_text

        print(term_safe(f"diagnose: {redact_text(str(e))}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    finally:
        resume_gc()
