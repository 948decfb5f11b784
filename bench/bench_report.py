"""The report of a big fleet, by itself: the CPU of ``report.build`` and of what ``diagnose --once`` prints after
it (the text report, ``--verbose``, ``--format json`` and ``--format markdown``), this checkout against
another one (``--base DIR``, e.g. a worktree of main) in one process, interleaved, best of ``--repeat``.

A pass's collection and evaluation are pickled once (``--save FILE`` with ``--prometheus URL --end T
--targets N``, as bench/bench_fleet.py queries them) and replayed (``--load FILE``), so that only the report
is timed. Both checkouts must give the same document (compared with ``==``, then float bits, types and key
order) and the same text; CPU time (``time.process_time``), since wall time on a shared machine is noise.

    .venv/bin/python bench/bench_report.py --save /tmp/fleet10k.pkl --prometheus http://127.0.0.1:9090 --end T --targets 10000
    .venv/bin/python bench/bench_report.py --load /tmp/fleet10k.pkl --base /path/to/main [--repeat 5] [--fresh]

``--fresh`` drops the series' cached read views first (the parent of forked rule workers never built them).
"""

from __future__ import annotations

import argparse
import gc
import math
import pickle
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.bitsame import same  # noqa: E402


def load_checkout(root: Path) -> dict[str, Any]:
    """Import diagnoser from ``root``: its modules, by name, to swap in before each run."""
    for m in [m for m in sys.modules if m == "diagnoser" or m.startswith("diagnoser.")]:
        del sys.modules[m]
    sys.path.insert(0, str(root))
    try:
        import diagnoser.evaluate  # noqa: F401
        import diagnoser.fleet.capacity  # noqa: F401
        import diagnoser.jsonout  # noqa: F401
        import diagnoser.outputs.fleet  # noqa: F401
        import diagnoser.outputs.markdown  # noqa: F401
        import diagnoser.outputs.report  # noqa: F401
        import diagnoser.outputs.text  # noqa: F401
        import diagnoser.rules  # noqa: F401
    finally:
        sys.path.remove(str(root))
    return {m: mod for m, mod in sys.modules.items() if m == "diagnoser" or m.startswith("diagnoser.")}


def use(mods: dict[str, Any]) -> None:
    for m in [m for m in sys.modules if m == "diagnoser" or m.startswith("diagnoser.")]:
        del sys.modules[m]
    sys.modules.update(mods)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", help="collect and evaluate once, pickle (collection, report) here")
    ap.add_argument("--prometheus"), ap.add_argument("--end", type=float), ap.add_argument("--targets", type=int, default=10000)
    ap.add_argument("--load", help="a pickled (collection, report)")
    ap.add_argument("--base", help="the checkout to compare with (default: none, this one alone)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fresh", action="store_true", help="drop the series' read views before each build")
    ap.add_argument("--outputs", default="build,text,verbose,json,markdown")
    args = ap.parse_args()
    if args.save:
        sys.path.insert(0, str(ROOT / "bench"))
        sys.path.insert(0, str(ROOT))
        from bench_fleet import ns, selector

        from diagnoser.engines import get_adapter
        from diagnoser.evaluate import evaluate
        from diagnoser.fleet import collect_prometheus

        col = collect_prometheus(ns(args.prometheus, args.end, selector(args.targets)), get_adapter())
        with open(args.save, "wb") as f:
            pickle.dump((col, evaluate(col.timelines, get_adapter())), f)
        print(f"saved {len(col.timelines)} targets to {args.save}")
        return
    sides = {"new": load_checkout(ROOT)}
    if args.base:
        sides = {"base": load_checkout(Path(args.base)), **sides}

    def passes() -> dict[str, tuple[Any, Any]]:
        out = {}
        for name, mods in sides.items():  # (unpickled under each checkout's own classes)
            use(mods)
            with open(args.load, "rb") as f:
                col, rep = pickle.load(f)
            if args.fresh:
                for tl in col.timelines:
                    for s in tl.series.values():
                        s._views = None
            out[name] = (col, rep)
        return out

    wanted = args.outputs.split(",")
    best: dict[str, dict[str, float]] = {w: {} for w in wanted}
    docs: dict[str, Any] = {}
    for _ in range(args.repeat):
        inputs = passes()
        for name, mods in sides.items():
            use(mods)
            from diagnoser.outputs.report import build

            c = time.process_time()
            docs[name] = build(*inputs[name])
            t = time.process_time() - c
            best["build"][name] = min(best["build"].get(name, math.inf), t) if "build" in wanted else 0.0
        del inputs
    if len(docs) == 2:
        assert docs["base"] == docs["new"]
        same(docs["base"], docs["new"], any_nan=True)
    gc.disable()
    outs = {}
    for w in (w for w in wanted if w != "build"):
        for _ in range(min(args.repeat, 2)):
            for name, mods in sides.items():
                use(mods)
                from diagnoser.jsonout import dumps
                from diagnoser.outputs.markdown import render_markdown
                from diagnoser.outputs.text import render

                doc = docs[name]
                c = time.process_time()
                outs[name] = (render(doc) if w == "text" else render(doc, verbose=True) if w == "verbose"
                              else dumps(doc, indent=2) if w == "json" else render_markdown(doc))
                best[w][name] = min(best[w].get(name, math.inf), time.process_time() - c)
            if len(outs) == 2:
                assert outs["base"] == outs["new"], w
    gc.enable()
    targets = len(docs["new"]["signals"])
    print(f"{targets:,} targets, {len(docs['new']['findings']):,} findings, {len(docs['new']['checked']):,} checked; CPU s, best of {args.repeat}"
          + (" (series' views dropped first)" if args.fresh else ""))
    for w, by in best.items():
        line = f"  {w:9s}" + "".join(f" {name} {t:7.3f}" for name, t in by.items())
        if len(by) == 2:
            line += f"   new/base {by['new'] / by['base']:.3f}"
        print(line)
    if len(docs) == 2:
        print("  the same document (==, float bits, types, key order) and the same text from both")


if __name__ == "__main__":
    main()
