"""Start-up path of ``diagnose --once --log small.log`` (bench/bench_startup.py times it; here: what it
imports and that it still diagnoses), and the hand-written stand-ins kept off that path checked
against the library they replace."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.capacity.throughput import decode_points, median
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kv-full-retract" / "server.log"
# never needed by a one-engine --once --log pass (HTTP, web, exporter, TOML without --config, fleet maths)
OFF_PATH = ("pandas", "httpx", "fastapi", "uvicorn", "prometheus_client", "jinja2", "tomllib", "statistics", "json",
            "diagnoser.fleet", "diagnoser.sources.http", "diagnoser.web", "diagnoser.engines.sglang.metrics",
            "diagnoser.engines.sglang.logfast", "multiprocessing",  # a small log is read line by line
            "shutil")  # argparse's help width is read without it


def test_once_log_keeps_unneeded_modules_off_the_start_up_path(tmp_path: Path) -> None:
    small = tmp_path / "small.log"
    small.write_bytes(b"".join(EXAMPLE.read_bytes().splitlines(keepends=True)[:200]))  # as bench_startup.py
    code = (
        "import sys, io, contextlib\n"
        "from diagnoser.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = main(['--once', '--log', {str(small)!r}])\n"  # the default text report, as the bench runs it
        f"mods = [m for m in {OFF_PATH!r} if m in sys.modules]\n"
        "import json\n"
        "print(json.dumps({'rc': rc, 'text': out.getvalue(), 'mods': mods}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["mods"] == [], f"imported on the --once --log path: {got['mods']}"
    # and the pass still judges the log: the retracting, full KV pool of this real 0.5.23 run
    assert got["rc"] == 1
    text = got["text"]
    assert "status: PROBLEMS" in text
    assert "top cause: kv_saturation " in text and " kv_retraction (follows from it)" in text, text
    assert "KV token usage peaked at 0.98" in text  # a value read from the log (its line: under --verbose)


def test_median_is_statistics_median_on_real_step_times(data_dir: Path) -> None:
    adapter = get_adapter("sglang")
    runs = sorted((data_dir / "sglang-cpu-real").glob("*/server.log"))
    assert runs, "no cpu-real logs"
    checked = 0
    for log in runs:
        bs, xs = decode_points(collect_logs(adapter, [str(log)]).timelines[0])
        steps = [b / x for b, x in zip(bs, xs, strict=True) if b > 0 and x > 0]
        for vals in (steps, steps[:-1], steps[:1], bs):  # odd and even counts, one value, integers
            if vals:
                assert median(vals) == statistics.median(vals)
                assert median(iter(vals)) == statistics.median(iter(vals))  # generators too
                checked += 1
    assert checked >= 10
    with pytest.raises(ValueError):
        median([])


def test_console_script_pauses_the_garbage_collector_only_while_loading(tmp_path: Path) -> None:
    """As the ``diagnose`` process: the collector is off while modules load, on again (with the start-up
    objects frozen) before the log is read. A caller of ``main(argv)`` gets it back on, and nothing of
    its own frozen."""
    small = tmp_path / "small.log"
    small.write_bytes(b"".join(EXAMPLE.read_bytes().splitlines(keepends=True)[:200]))
    code = (
        "import gc, io, json, sys, contextlib\n"
        "import diagnoser.collect as col\n"
        "seen = []\n"
        "real = col.collect_once\n"
        "def spy(*a, **k):\n"
        "    seen.append(gc.isenabled())\n"
        "    return real(*a, **k)\n"
        "col.collect_once = spy\n"
        "from diagnoser.cli import main\n"
        "loading = []\n"
        "import diagnoser.cli.run as run\n"
        "real_parser = run.build_parser\n"
        "run.build_parser = lambda: (loading.append(gc.isenabled()), real_parser())[1]\n"
        "out = io.StringIO()\n"
        f"sys.argv = ['diagnose', '--once', '--log', {str(small)!r}]\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main()\n"
        "as_script = [loading[0], seen[0], gc.isenabled(), gc.get_freeze_count() > 0]\n"
        "gc.unfreeze()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    main(['--once', '--log', {str(small)!r}])\n"
        "print(json.dumps({'rc': rc, 'as_script': as_script, 'as_call': [loading[1], seen[1], gc.isenabled(), gc.get_freeze_count()]}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["rc"] == 1
    assert got["as_script"] == [False, True, True, True]
    assert got["as_call"] == [False, True, True, 0]


def test_help_width_follows_columns_as_shutil_would() -> None:
    import os
    import shutil

    from diagnoser.cli.run import _terminal_columns

    old = os.environ.get("COLUMNS")
    try:
        for cols in ("57", "133", "0", "junk"):
            os.environ["COLUMNS"] = cols
            assert _terminal_columns() == shutil.get_terminal_size().columns
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def test_the_reader_modules_import_each_other_in_no_circle() -> None:
    """Issue 24: one reader path. The reader modules' imports at run time (module level and inside
    functions; not the annotations-only ``TYPE_CHECKING`` blocks) form no cycle, and no pattern table is
    a lazy wrapper: every pattern is an ``re.Pattern`` compiled once, at import."""
    import ast
    import re

    pkg = ROOT / "diagnoser" / "engines" / "sglang"
    graph: dict[str, set[str]] = {}
    for path in pkg.glob("*.py"):
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)}
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diagnoser.engines.sglang"):
                deps.add(node.module.rsplit(".", 1)[-1] if node.module != "diagnoser.engines.sglang" else "")
                if node.module == "diagnoser.engines.sglang":
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name.rsplit(".", 1)[-1] for a in node.names if a.name.startswith("diagnoser.engines.sglang."))
        graph[path.stem] = {d for d in deps if d and d != path.stem and (pkg / f"{d}.py").exists()}
    reader = {"logs", "logfast", "logscan", "logformats", "logline", "logevents"}
    assert reader <= set(graph)

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in trail:
                    stack.append((nxt, [*trail, nxt]))
        return None

    for mod in sorted(reader):
        assert cycle_from(mod) is None, cycle_from(mod)
    assert "logfast" in graph["logs"] and "logscan" in graph["logfast"]  # the path: line parser → bulk reader → C glue
    assert "logs" not in graph["logfast"] and "logfast" not in graph["logscan"]

    from diagnoser.engines.sglang import logformats

    patterns = [k for k, v in vars(logformats).items() if k.endswith("_RE")]
    assert len(patterns) >= 30
    assert all(isinstance(getattr(logformats, k), re.Pattern) for k in patterns)
