"""The rule pass for one engine's window against the cost of reading that window (issue 3 target: the
rule pass ≤ 2 ms).

For each real CPU-engine run (tests/data/sglang-cpu-real: ~20-30 /metrics scrapes taken every 2 s plus
the full server log), the window is read once the way ``diagnose --once --replay`` reads it (every
scrape through :meth:`MetricsTarget.ingest_text`, the log through the adapter's parser), then the whole
catalogue runs over it with :func:`diagnoser.evaluate.evaluate`. Reading writes the timeline's numpy
columns (points that arrived out of time order are sorted by ``finalize``, inside the timed read), so
the rule pass reads arrays and converts nothing; each read round builds a new timeline. Both are timed in the same run (median
of several rounds) and printed side by side with their ratio.

Run: ``.venv/bin/python bench/bench_rules.py [--instructions]`` (exits 1 if a rule pass is above 2 ms).

CPU time on a shared machine is noisy (other processes slow the caches and the SMT sibling), so
``--instructions`` also counts the instructions of one rule pass per window under valgrind (callgrind,
split at ``os.getppid()`` markers between the windows; the reading is outside the counted parts): a
noise-free figure to compare two versions of the rules with.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnoser.collect import finalize  # noqa: E402
from diagnoser.engines.sglang import ADAPTER  # noqa: E402
from diagnoser.engines.sglang.versions import VersionRange  # noqa: E402
from diagnoser.evaluate import evaluate  # noqa: E402
from diagnoser.sources.logs import read_log  # noqa: E402
from diagnoser.sources.metrics import MetricsTarget  # noqa: E402
from diagnoser.timeline import Timeline  # noqa: E402
from tests.conftest import DATA  # noqa: E402

TARGET_MS = 2.0
ROUNDS = 7


def read_window(run: str, scrapes: list[tuple[float, str]]) -> Timeline:
    tl = Timeline(target=os.path.basename(run))
    vr = VersionRange()
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    for ts, text in scrapes:
        mt.ingest_text(text, ts, tl)
    vr.merge(mt.state.version)
    reader = read_log(ADAPTER, tl, os.path.join(run, "server.log"))
    tl.inputs.extend([mt.report, reader.report])
    vr.merge(reader.parser.version)
    finalize(tl, vr)
    return tl


def cpu_ms(fn, reps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(best, median) CPU milliseconds per call over ROUNDS rounds: process time, so other processes on
    the shared 2-core machine inflate it less than wall time; the best round is the least disturbed."""
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        rounds.append((time.process_time() - t0) / reps * 1000)
    return min(rounds), statistics.median(rounds)


def _scrapes(run: str) -> list[tuple[float, str]]:
    files = sorted(glob.glob(os.path.join(run, "metrics", "*.prom")))
    return [(float(re.search(r"_(\d+\.\d+)\.prom$", f).group(1)), Path(f).read_text()) for f in files]  # type: ignore[union-attr]


def marked_passes(runs: list[str], reps: int) -> None:
    """Under callgrind: each window's ``reps`` rule passes between two ``os.getppid()`` markers."""
    tls = [read_window(r, _scrapes(r)) for r in runs]
    for tl in tls:
        evaluate([tl], ADAPTER)  # warm: imports and first-call caches of Python itself
    for tl in tls:
        os.getppid()
        for _ in range(reps):
            evaluate([tl], ADAPTER)
    os.getppid()


def instructions(reps: int = 5) -> list[float] | None:
    """Instructions of one rule pass per window (callgrind), or None without valgrind."""
    valgrind = shutil.which("valgrind")
    if not valgrind:
        return None
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        r = subprocess.run([valgrind, "--tool=callgrind", "--dump-before=os_getppid", f"--callgrind-out-file={out}",
                            sys.executable, __file__, "--marked-passes", str(reps)], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        totals = []
        for part in sorted(glob.glob(out + ".*"), key=lambda f: int(f.rsplit(".", 1)[1])):
            with open(part) as fh:
                totals.append(next(int(line.split()[1]) for line in fh if line.startswith(("totals:", "summary:"))))
    # part k holds what ran before the k-th marker: part 1 is the start-up and the reading, then one per
    # window (what runs after the last marker goes to the unnumbered file)
    return [t / reps for t in totals[1:]] if len(totals) > 1 else None


def main() -> int:
    runs = sorted(glob.glob(str(DATA / "sglang-cpu-real" / "*")))
    if not runs:
        print(f"no recorded CPU-engine runs under {DATA}/sglang-cpu-real (a fresh clone has them)")
        return 2
    if sys.argv[1:2] == ["--marked-passes"]:
        marked_passes(runs, int(sys.argv[2]))
        return 0
    print("CPU ms per call, best of 7 rounds (median in brackets)")
    print(f"{'run':28} {'scrapes':>7} {'log lines':>9} {'points':>7} {'read ms':>16} {'rules ms':>14} {'rules/read':>10} {'findings':>8}")
    worst = 0.0
    for run in runs:
        scrapes = _scrapes(run)
        lines = sum(1 for _ in open(os.path.join(run, "server.log"), "rb"))
        tl = read_window(run, scrapes)
        points = sum(len(s) for s in tl.series.values())
        read_ms, read_med = cpu_ms(lambda r=run, s=scrapes: read_window(r, s), 1)
        rules_ms, rules_med = cpu_ms(lambda t=tl: evaluate([t], ADAPTER), 20)
        n = len(evaluate([tl], ADAPTER).findings)
        worst = max(worst, rules_ms)
        print(f"{os.path.basename(run):28} {len(scrapes):>7} {lines:>9} {points:>7} {read_ms:>7.1f} ({read_med:>6.1f}) {rules_ms:>5.2f} ({rules_med:>5.2f}) {rules_ms / read_ms:>10.4f} {n:>8}")
    if "--instructions" in sys.argv[1:]:
        counts = instructions()
        if counts is None or len(counts) != len(runs):
            print("instructions: valgrind not found (or it failed); skipped")
        else:
            print("instructions per rule pass (callgrind): " + ", ".join(f"{os.path.basename(r)} {c / 1e6:.2f} M" for r, c in zip(runs, counts, strict=True)))
    ok = worst <= TARGET_MS
    print(f"worst rule pass {worst:.2f} ms (target <= {TARGET_MS} ms): {'OK' if ok else 'ABOVE TARGET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
