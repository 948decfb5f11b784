"""Start-up cost of ``diagnose --once --log small.log`` against a bare ``python -c pass`` (same run).

    .venv/bin/python bench/bench_startup.py [--runs 9]

Runs each command several times (alternating, so machine noise hits both alike), prints the medians,
the difference and the ratio, and lists which heavy libraries the command imported (pandas, numpy,
httpx, fastapi, uvicorn, prometheus_client should stay off this path). Exit 0 when the difference is
at most 0.3 s (the issue's target).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.3
HEAVY = ("pandas", "numpy", "httpx", "fastapi", "uvicorn", "prometheus_client", "jinja2")
EXAMPLE = ROOT / "examples" / "kv-full-retract" / "server.log"


def _small_log(tmp: str) -> str:
    """The first 200 lines of the bundled real SGLang 0.5.23 log (startup, prefill, decode, retraction)."""
    path = os.path.join(tmp, "small.log")
    if EXAMPLE.exists():
        lines = EXAMPLE.read_bytes().splitlines(keepends=True)[:200]
    else:
        lines = [
            b"[2026-11-29 09:32:06] max_total_num_tokens=2048, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=64, context_len=2048, available_cpu_mem=21.30 GB\n",
        ] + [
            f"[2026-11-29 09:32:{i % 60:02d}] Decode batch, #running-req: 5, #token: 739, token usage: 0.36, cpu graph: False, gen throughput (token/s): 100.12, #queue-req: 35\n".encode()
            for i in range(199)
        ]
    with open(path, "wb") as fh:
        fh.writelines(lines)
    return path


# as installed: byte-code caching on (the dev/CI environment may set PYTHONDONTWRITEBYTECODE, which makes
# every start recompile every module; a pip-installed diagnose never runs like that)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT, env=ENV)
    return time.perf_counter() - t0


def _heavy_imports(log: str) -> list[str]:
    code = (
        "import sys, io, contextlib\n"
        "from diagnoser.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try: main(['--once', '--log', {log!r}])\n"
        "    except SystemExit: pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT, env=ENV)
    return [m for m in out.stdout.strip().split(",") if m]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    diagnose = str(Path(sys.executable).parent / "diagnose")
    with tempfile.TemporaryDirectory() as tmp:
        log = _small_log(tmp)
        cmd = [diagnose, "--once", "--log", log] if os.path.exists(diagnose) else [sys.executable, "-m", "diagnoser", "--once", "--log", log]
        # the log-reading part alone: engine adapter + log source + timeline, reading small.log
        logpath = [sys.executable, "-c", "import diagnoser.collect as c; from diagnoser.engines.sglang import ADAPTER; "
                   f"c.collect_logs(ADAPTER, [{log!r}])"]
        base, ours, part = [], [], []
        for warm in ([sys.executable, "-c", "pass"], cmd, logpath):  # page cache and byte-code caches
            _run(warm)
        for _ in range(args.runs):
            base.append(_run([sys.executable, "-c", "pass"]))
            ours.append(_run(cmd))
            part.append(_run(logpath))
        heavy = _heavy_imports(log)
    b, o, lp = statistics.median(base), statistics.median(ours), statistics.median(part)
    print(f"python -c pass                      median {b * 1000:7.0f} ms  (baseline, {args.runs} runs)")
    print(f"diagnose --once --log small.log     median {o * 1000:7.0f} ms  ratio {o / b:.1f}x")
    print(f"difference                                 {(o - b) * 1000:7.0f} ms  (target <= {TARGET_S * 1000:.0f} ms)")
    print(f"  of which reading the log (adapter + log source + timeline): {(lp - b) * 1000:.0f} ms beyond the baseline")
    print(f"heavy libraries imported on this path: {', '.join(heavy) or 'none'}")
    ok = (o - b) <= TARGET_S
    print(f"target: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
