"""Near-miss junk lines against plain junk on the bulk log path (issue 26).

    .venv/bin/python bench/bench_log_nearmiss.py [--lines 200000] [--rounds 3] [--prefix both|with|without] [--compare DIR]

A near-miss line has a batch head but nothing the reader takes
(``[2026-11-29 09:32:06] Decode batch, #x: 12, #y: 3, z: 5``); plain junk has the same prefix and length
without any word the reader looks for. Both are measured with SGLang's time prefix and without any prefix
(``Decode batch, #x: 12, …`` at the start of the line: a log piped through ``cut`` or pasted), each against
plain junk of the same shape. Before issue 26's fix every near-miss line went to the per-line reference
parser (and was counted as recognised); then the bulk reader decided prefixed ones once per message shape
(bare ones still went to the reference parser, 13–21× junk); now bare ones that only tick the untimed
clock are decided once per shape too, and residual near-miss lines are read by a five-group regex.

Method: each log (``--lines`` lines of one kind, written to a temp file) is read by ``LogReader.feed_stream``
in one process (``workers=0``), in a fresh child process per measurement; the figure is the child's CPU time
for the read, best of ``--rounds``. The baseline is plain junk in the same run, read the same way; the ratio
near-miss / plain junk is the result. Both bulk paths are measured: the compiled scanner and the pure-Python
regex path (``DIAGNOSER_NO_SCAN=1``). ``--compare DIR`` measures another checkout (e.g. main before the fix)
the same way in the same run. Exit 0 when every near-miss ratio of this checkout is at most 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 3.0

KINDS = {
    "plain junk": lambda i: f"lorem ipsum dolor {i % 97} sit amet {i % 13}, consectetur {i % 7}",
    "near-miss (fields)": lambda i: f"Decode batch, #x: {i % 97}, #y: {i % 13}, z: {i % 7}",
    "near-miss (no fields)": lambda i: f"Decode batch, #x {i % 97} sit amet {i % 13}, foo {i % 7}",
    "near-miss (prefill)": lambda i: f"Prefill batch. #new-sequence: {i % 97}, #z: {i % 13}, w: {i % 7}",
    "decode lines": lambda i: (f"Decode batch, #running-req: {i % 97}, #token: {i * 7 % 99991}, token usage: 0.{i % 100:02d}, "
                               f"cuda graph: True, gen throughput (token/s): {i % 977}.25, #queue-req: {i % 13}"),
}

CHILD = r"""
import io, json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.logs import finish_report, open_log_reader
from diagnoser.timeline import Timeline
tl = Timeline(target="t")
rd = open_log_reader(ADAPTER, tl, "server.log")
with open(sys.argv[1], "rb") as fh:
    t0 = time.process_time()
    rd.feed_stream(fh, workers=0)
    finish_report(ADAPTER, rd)
    cpu = time.process_time() - t0
import diagnoser
from diagnoser.engines.sglang import logfast
print(json.dumps({"cpu": cpu, "read": rd.report.lines_read, "recognised": rd.report.lines_recognized,
                  "module": diagnoser.__file__, "scanner": logfast.scanner() is not None}))
"""


def _write(path: Path, kind: str, n: int, prefix: bool = True) -> None:
    make = KINDS[kind]
    with path.open("w") as fh:
        for i in range(n):
            fh.write(f"[2026-11-29 09:{i // 60 % 60:02d}:{i % 60:02d}] {make(i)}\n" if prefix else f"{make(i)}\n")


def _measure(repo: Path, path: Path, scan: bool, rounds: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("DIAGNOSER_NO_SCAN", None)
    if not scan:
        env["DIAGNOSER_NO_SCAN"] = "1"
    best: dict[str, float] | None = None
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(repo)], env=env, cwd=repo,
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        if not Path(got["module"]).resolve().is_relative_to(repo) or got["scanner"] != scan:
            raise SystemExit(f"measured {got['module']} (scanner {got['scanner']}), not {repo} (scanner {scan})")
        if best is None or got["cpu"] < best["cpu"]:
            best = got
    assert best is not None
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix", choices=("both", "with", "without"), default="both",
                    help="lines with SGLang's time prefix, without any (a log piped through another tool), or both")
    ap.add_argument("--compare", type=Path, help="another checkout measured the same way (e.g. main)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    repos = [("this", ROOT)] + ([("compare", args.compare.resolve())] if args.compare else [])
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        shapes = {"both": (True, False), "with": (True,), "without": (False,)}[args.prefix]
        files: dict[tuple[bool, str], Path] = {}
        for prefix in shapes:
            for kind in KINDS:
                stem = kind.replace(" ", "_").replace("(", "").replace(")", "")
                files[prefix, kind] = Path(tmp) / f"{stem}{'' if prefix else '_noprefix'}.log"
                _write(files[prefix, kind], kind, args.lines, prefix)
        print(f"{args.lines:,} lines a log, best of {args.rounds} rounds, load {load:.2f} at start")
        for name, repo in repos:
            for prefix, scan in ((p, s) for p in shapes for s in (True, False)):
                path_name = ("compiled scanner" if scan else "regex path") + (", lines with the time prefix" if prefix else ", lines without a prefix")
                res = {kind: _measure(repo, files[prefix, kind], scan, args.rounds) for kind in KINDS}
                base = res["plain junk"]["cpu"]
                print(f"\n{name} ({repo}), {path_name}:")
                print(f"  {'log':<24} {'CPU s':>7} {'µs/line':>8} {'× junk':>7} {'recognised':>12}")
                for kind, r in res.items():
                    ratio = r["cpu"] / base if base > 0 else float("inf")
                    print(f"  {kind:<24} {r['cpu']:7.3f} {r['cpu'] / args.lines * 1e6:8.2f} {ratio:7.2f} "
                          f"{r['recognised']:>6,}/{r['read']:,}")
                    if name == "this" and kind.startswith("near-miss"):
                        ok = ok and ratio <= TARGET and r["recognised"] == 0
    print(f"\nload {os.getloadavg()[0]:.2f} at end; target: near-miss ≤ {TARGET:.0f}× plain junk, none recognised: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
