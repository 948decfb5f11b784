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
            "diagnoser.engines.sglang.logfast", "multiprocessing")  # a small log is read line by line


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
    assert "] kv_saturation " in text and "] kv_retraction " in text, text
    assert "token_usage = 0.98" in text  # a value read from the log, cited with its line


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
