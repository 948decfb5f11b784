"""Start-up cost of ``diagnose --once --log small.log`` against a bare ``python -c pass`` (same run).

    .venv/bin/python bench/bench_startup.py [--runs 9] [--instructions]

Runs each command several times (alternating, so machine noise hits both alike), prints the medians
of wall time (the issue's figure) and of the child's CPU time (user + system; less sensitive to other
processes on a shared machine), the difference and the ratio, and lists which heavy libraries the
command imported (pandas, numpy, httpx, fastapi, uvicorn, prometheus_client should stay off this path).
``--instructions`` also counts the instructions each command executes under valgrind (callgrind;
PYTHONHASHSEED=0): a noise-free figure for comparing two versions of the code on a busy machine.
Exit 0 when the wall-time difference is at most 0.3 s (the issue's target).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
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


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``cmd``."""
    c0, t0 = _cpu(), time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT, env=ENV)
    return time.perf_counter() - t0, _cpu() - c0


def _instructions(cmd: list[str]) -> int | None:
    """Instructions ``cmd`` executes (callgrind's total), or None without valgrind."""
    valgrind = shutil.which("valgrind")
    if not valgrind:
        return None
    out = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd], capture_output=True,
                         text=True, check=False, cwd=ROOT, env={**ENV, "PYTHONHASHSEED": "0"})
    m = re.search(r"Collected : (\d+)", out.stderr)
    return int(m.group(1)) if m else None


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
    ap.add_argument("--instructions", action="store_true", help="also count instructions under valgrind (slow, noise-free)")
    args = ap.parse_args()
    diagnose = str(Path(sys.executable).parent / "diagnose")
    with tempfile.TemporaryDirectory() as tmp:
        log = _small_log(tmp)
        cmd = [diagnose, "--once", "--log", log] if os.path.exists(diagnose) else [sys.executable, "-m", "diagnoser", "--once", "--log", log]
        # the log-reading part alone: engine adapter + log source + timeline, reading small.log (after
        # diagnoser.cli, whose import sets what the command's start-up sets: one BLAS thread)
        logpath = [sys.executable, "-c", "import diagnoser.cli; import diagnoser.collect as c; from diagnoser.engines.sglang import ADAPTER; "
                   f"c.collect_logs(ADAPTER, [{log!r}])"]
        bare = [sys.executable, "-c", "pass"]
        base, ours, part = [], [], []
        for warm in (bare, cmd, logpath):  # page cache and byte-code caches
            _run(warm)
        for _ in range(args.runs):
            base.append(_run(bare))
            ours.append(_run(cmd))
            part.append(_run(logpath))
        heavy = _heavy_imports(log)
        counts = [_instructions(c) for c in (bare, cmd)] if args.instructions else []
    b, o, lp = (statistics.median(w for w, _c in runs) for runs in (base, ours, part))
    bc, oc = (statistics.median(c for _w, c in runs) for runs in (base, ours))
    print(f"python -c pass                      median {b * 1000:7.0f} ms  (baseline, {args.runs} runs)")
    print(f"diagnose --once --log small.log     median {o * 1000:7.0f} ms  ratio {o / b:.1f}x")
    print(f"difference                                 {(o - b) * 1000:7.0f} ms  (target <= {TARGET_S * 1000:.0f} ms)")
    print(f"  of which reading the log (adapter + log source + timeline): {(lp - b) * 1000:.0f} ms beyond the baseline")
    print(f"CPU time (user + sys): python -c pass {bc * 1000:.0f} ms, diagnose {oc * 1000:.0f} ms, "
          f"ratio {oc / bc:.1f}x, difference {(oc - bc) * 1000:.0f} ms")
    if counts and None not in counts:
        ib, io_ = counts
        print(f"instructions (callgrind): python -c pass {ib / 1e6:.0f} M, diagnose {io_ / 1e6:.0f} M, "
              f"ratio {io_ / ib:.1f}x, difference {(io_ - ib) / 1e6:.0f} M")
    elif args.instructions:
        print("instructions: valgrind not found (or it failed); skipped")
    print(f"heavy libraries imported on this path: {', '.join(heavy) or 'none'}")
    ok = (o - b) <= TARGET_S
    print(f"target: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
