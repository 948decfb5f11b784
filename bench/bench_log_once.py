"""The whole command on a big log: ``diagnose --once --log`` end to end, its peak memory and when it first
prints, beside ``grep -c`` and the bare reader on the same file in the same run.

    .venv/bin/python bench/bench_log_once.py [--size-mb 1024] [--memory-size-mb 1536] [--repeat 3] [--keep DIR] [--no-whole]

Targets (issue 19): at least 1 M lines/s for the whole command on a 1 GB log, and under 1 GB of peak
memory on a 1.5 GiB log. Generates both logs with ``bench_log_backfill.generate`` (a busy server's mix of
real SGLang line shapes, the same seed each time) in a temp dir, never in git (``--keep DIR`` keeps them
there for the next run). Each repeat prints the load average first (the machine is shared) and runs, one
after the other on the same file:

* ``grep -c ''``: the floor, reading every byte once;
* the bare reader: ``read_log`` into a Timeline in a fresh process, every point kept (the reader-only
  figure the README used to give);
* ``diagnose --once --log FILE``: the command as a user runs it, stdout to /dev/null, stderr on a
  pseudo-terminal so that its progress line is drawn as on a desk (the time of its first byte is the
  "first output" figure);
* once (not with ``--no-whole``): ``diagnose --once --log FILE --last 1000d``, the command judging the
  whole file, as it did before it kept a log to its window: what the window saves, same run.

Peak memory is sampled every 20 ms from /proc: the largest single process and the sum over the process
tree (the reading process and its forked workers; shared pages count in each, so the sum is an upper
bound). CPU time (user + system, the workers included) is the steadier figure on a shared machine: wall
time at a load average of several processes per CPU says more about the neighbours than about us.
Exit 0 when the median of the repeats meets both targets.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_log_backfill import generate  # noqa: E402

TARGET_LPS = 1_000_000
TARGET_RSS = 1 << 30  # bytes
ROOT = Path(__file__).resolve().parent.parent
DIAGNOSE = [sys.executable, "-m", "diagnoser"]
BARE = ("import sys\nfrom diagnoser.engines.sglang import ADAPTER\nfrom diagnoser.sources.logs import read_log\n"
        "from diagnoser.timeline import Timeline\ntl = Timeline(target='bench')\nr = read_log(ADAPTER, tl, sys.argv[1])\n"
        "print(r.report.lines_read, sum(len(s) for s in tl.series.values()))\n")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Run:
    """One process tree, timed and sampled until it ends."""

    def __init__(self, args: list[str], tty_stderr: bool = False) -> None:
        self.args = args
        self.tty_stderr = tty_stderr
        self.wall = 0.0
        self.first_output: float | None = None
        self.peak_one = 0
        self.peak_tree = 0
        self.stdout = b""
        self.code = 0
        self.cpu = 0.0  # user + system seconds of the process and every child it waited for (its workers)

    def go(self) -> Run:
        master = slave = None
        if self.tty_stderr:
            master, slave = pty.openpty()
        t0 = time.perf_counter()
        proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=slave if slave is not None else subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
        if slave is not None:
            os.close(slave)
        assert proc.stdout is not None
        fds = [proc.stdout.fileno()] + ([master] if master is not None else [])
        out = bytearray()
        next_sample = 0.0
        done = None
        while True:
            now = time.perf_counter()
            if now >= next_sample:
                pids = [proc.pid]
                i = 0
                while i < len(pids):
                    pids += _children(pids[i])
                    i += 1
                sizes = [_rss(p) for p in pids]
                self.peak_tree = max(self.peak_tree, sum(sizes))
                self.peak_one = max(self.peak_one, max(sizes))
                next_sample = now + 0.02
            if not fds:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # not poll(): its rusage is the CPU figure
                if pid:
                    done = (status, usage)
                    break
                time.sleep(0.005)
                continue
            ready, _, _ = select.select(fds, [], [], 0.02)
            for fd in ready:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    fds.remove(fd)
                elif fd == master:
                    if self.first_output is None:
                        self.first_output = time.perf_counter() - t0
                else:
                    out += chunk
        if done is None:
            _, status, usage = os.wait4(proc.pid, 0)
            done = (status, usage)
        self.wall = time.perf_counter() - t0
        self.code = proc.returncode = os.waitstatus_to_exitcode(done[0])
        self.cpu = done[1].ru_utime + done[1].ru_stime
        if master is not None:
            os.close(master)
        self.stdout = bytes(out)
        return self


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _lines(path: Path) -> int:
    return int(subprocess.run(["grep", "-c", "", str(path)], check=True, capture_output=True, text=True).stdout)


def bench(path: Path, lines: int, repeat: int, whole: bool, label: str) -> list[dict[str, float]]:
    print(f"\n== {label}: {path.stat().st_size / 1e6:,.0f} MB, {lines:,} lines ==")
    rows = []
    for k in range(repeat):
        load = os.getloadavg()
        grep = Run(["grep", "-c", "", str(path)]).go()
        bare = Run([sys.executable, "-c", BARE, str(path)]).go()
        once = Run(DIAGNOSE + ["--once", "--log", str(path)], tty_stderr=True).go()
        print(f"run {k + 1}/{repeat}  load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"  grep -c          {grep.wall:7.2f} s  {lines / grep.wall:13,.0f} lines/s  (floor)   CPU {grep.cpu:5.2f} s")
        print(f"  bare reader      {bare.wall:7.2f} s  {lines / bare.wall:13,.0f} lines/s  {bare.wall / grep.wall:5.1f}x grep   "
              f"CPU {bare.cpu:5.2f} s   peak {_mb(bare.peak_one)} (tree {_mb(bare.peak_tree)}), every point kept")
        first = f"{once.first_output:.2f} s" if once.first_output is not None else "none"
        print(f"  diagnose --once  {once.wall:7.2f} s  {lines / once.wall:13,.0f} lines/s  {once.wall / grep.wall:5.1f}x grep, "
              f"{once.wall / bare.wall:.2f}x the bare reader   CPU {once.cpu:5.2f} s ({lines / once.cpu:,.0f} lines per CPU-second)   "
              f"peak {_mb(once.peak_one)} (tree {_mb(once.peak_tree)}); first output (progress) after {first}; exit {once.code}")
        row = {"load": load[0], "grep": grep.wall, "bare": bare.wall, "once": once.wall, "once_cpu": once.cpu, "once_rss_one": once.peak_one,
               "once_rss_tree": once.peak_tree, "bare_rss_tree": bare.peak_tree, "first": once.first_output if once.first_output is not None else float("nan")}
        if whole and k == 0:
            full = Run(DIAGNOSE + ["--once", "--log", str(path), "--last", "1000d"], tty_stderr=True).go()
            print(f"  whole file       {full.wall:7.2f} s  {lines / full.wall:13,.0f} lines/s  (--last 1000d: every point judged, "
                  f"as before the window)   CPU {full.cpu:5.2f} s   peak {_mb(full.peak_one)} (tree {_mb(full.peak_tree)}); "
                  f"the window: {full.wall / once.wall:.1f}x faster, {full.cpu / once.cpu:.1f}x less CPU, "
                  f"{full.peak_tree / max(once.peak_tree, 1):.1f}x less memory")
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=float, default=1024.0, help="the log timed end to end (target >= 1 M lines/s)")
    ap.add_argument("--memory-size-mb", type=float, default=1536.0, help="the log whose peak memory is checked (target < 1 GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="generate the logs in this directory (and reuse them when they are there)")
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-file run (--last 1000d)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        logs = []
        for size in dict.fromkeys((args.size_mb, args.memory_size_mb)):
            path = where / f"server-{size:.0f}mb.log"
            if not path.exists() or abs(path.stat().st_size - size * 2**20) > 2**20:
                t0 = time.perf_counter()
                generate(path, size)
                print(f"generated {path} in {time.perf_counter() - t0:.0f} s")
            logs.append((size, path, _lines(path)))
        results = {}
        for size, path, lines in logs:
            label = "speed" if size == args.size_mb else "memory"
            if args.size_mb == args.memory_size_mb:
                label = "speed and memory"
            results[size] = (lines, bench(path, lines, args.repeat, not args.no_whole, label))

    speed_lines, speed_rows = results[args.size_mb]
    mem_rows = results[args.memory_size_mb][1]
    lps = speed_lines / statistics.median(r["once"] for r in speed_rows)
    rss = statistics.median(r["once_rss_tree"] for r in mem_rows)
    first = statistics.median(r["first"] for r in mem_rows)
    cpu = statistics.median(r["once_cpu"] for r in speed_rows)
    loads = [r["load"] for r in speed_rows + mem_rows]
    ok_speed, ok_mem = lps >= TARGET_LPS, rss < TARGET_RSS
    print(f"\nmedian of {args.repeat}: diagnose --once --log on {args.size_mb:.0f} MB: {lps:,.0f} lines/s end to end "
          f"(target >= {TARGET_LPS:,}: {'met' if ok_speed else 'NOT met'}); "
          f"peak memory on {args.memory_size_mb:.0f} MB: {_mb(int(rss))} for the process tree "
          f"(target < {_mb(TARGET_RSS)}: {'met' if ok_mem else 'NOT met'}); first output after {first:.2f} s; "
          f"{speed_lines / cpu:,.0f} lines per CPU-second (the steadier figure); load average {min(loads):.1f}–{max(loads):.1f}")
    return 0 if ok_speed and ok_mem else 1


if __name__ == "__main__":
    raise SystemExit(main())
