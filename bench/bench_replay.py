"""Replay throughput (issue 6 target: ≥ 10,000 recorded snapshots per minute through parse, signals
and rules).

A bundle of N snapshots is built from the real kv-full-retract example (its 20 real SGLang 0.5.23
scrapes, ~80 KB each, cycled with shifted timestamps, plus its full log), then replayed the way
``diagnose --once --replay`` does: read + decompress the bundle, every scrape through
``MetricsTarget.ingest_text`` (parse → signals), the log through the parser, finalise, then the whole
rule catalogue with ``evaluate``. Measured in the same run, as baselines:

* parse only — the adapter's exposition parser on the same texts (what live scraping pays anyway);
* parse + signals — ``ingest_text`` into a Timeline, no bundle I/O and no rules;
* the prometheus_client reference parser (``ingest_text(fast=False)``), for context.

Printed: snapshots/min for each, the full replay's ratio to the 10,000/min target and to parse-only.
CPU (process) time, best of several rounds, because the machine is shared. Exits 1 below target.

Run: ``.venv/bin/python bench/bench_replay.py [N]`` (default N = 600: 20 minutes at 2 s).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnoser.bundle import BundleWriter, read_bundle  # noqa: E402
from diagnoser.engines.sglang import ADAPTER  # noqa: E402
from diagnoser.evaluate import evaluate  # noqa: E402
from diagnoser.replay import collect_replay  # noqa: E402
from diagnoser.sources.metrics import MetricsTarget  # noqa: E402
from diagnoser.timeline import Timeline  # noqa: E402

TARGET_PER_MIN = 10_000
ROUNDS = 3
EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"


def build_bundle(n: int, out: str) -> list[tuple[float, str]]:
    """N snapshots: the example's real scrapes cycled, 2 s apart; its config and log once."""
    src = read_bundle(str(EXAMPLE))
    scr = [r for r in src.records if r["kind"] == "scrape"]
    other = [r for r in src.records if r["kind"] != "scrape"]
    t0 = scr[0]["t"]
    w = BundleWriter(out, fsync=False)
    assert src.manifest is not None
    w.write_member([src.manifest, *[r for r in other if r["kind"] == "config"]])
    texts = []
    for i in range(n):
        r = dict(scr[i % len(scr)])
        r["t"] = t0 + 2.0 * i
        texts.append((r["t"], r["text"]))
        w.write_member([r])
    w.write_member([r for r in other if r["kind"] == "log"] + [{"kind": "end", "t": t0 + 2.0 * n, "reason": "duration"}], final=True)
    w.close()
    return texts


def best_cpu(fn) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.dgb")
        texts = build_bundle(n, path)
        size = os.path.getsize(path)

        def parse_only() -> None:
            for _, text in texts:
                ADAPTER.fast_samples(text)

        def parse_signals(fast: bool = True) -> None:
            tl = Timeline(target="b")
            mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
            for ts, text in texts:
                assert mt.ingest_text(text, ts, tl, fast=fast)

        findings: list[str] = []

        def full_replay() -> None:
            col = collect_replay(path, ADAPTER)
            rep = evaluate(col.timelines, ADAPTER, {}, None, {})
            findings[:] = sorted({f.rule for f in rep.findings})

        t_parse = best_cpu(parse_only)
        t_sig = best_cpu(parse_signals)
        t_full = best_cpu(full_replay)
        ref_n = min(n, 60)
        t_ref = best_cpu(lambda: _ref(texts[:ref_n]))

    per_min = {k: n * 60.0 / t for k, t in (("parse", t_parse), ("signals", t_sig), ("full", t_full))}
    ref_per_min = ref_n * 60.0 / t_ref
    print(f"replay benchmark: {n} snapshots of a real SGLang 0.5.23 exposition (~80 KB each), bundle {size / 1e6:.2f} MB")
    print(f"{'stage':<44}{'CPU s':>9}{'snapshots/min':>16}")
    print(f"{'parse only (adapter fast parser)':<44}{t_parse:>9.3f}{per_min['parse']:>16,.0f}")
    print(f"{'parse + signals (ingest_text)':<44}{t_sig:>9.3f}{per_min['signals']:>16,.0f}")
    print(f"{'full replay: bundle + parse + signals + log + rules':<44}{t_full:>9.3f}{per_min['full']:>16,.0f}")
    print(f"{'reference: prometheus_client parser + signals':<44}{t_ref * n / ref_n:>9.3f}{ref_per_min:>16,.0f}   (measured on {ref_n})")
    ratio = per_min["full"] / TARGET_PER_MIN
    print(f"full replay = {ratio:.2f}x the target of {TARGET_PER_MIN:,}/min; "
          f"{per_min['full'] / per_min['parse']:.2f}x parse-only throughput; findings: {', '.join(findings) or 'none'}")
    return 0 if ratio >= 1.0 else 1


def _ref(texts: list[tuple[float, str]]) -> None:
    tl = Timeline(target="r")
    mt = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    for ts, text in texts:
        assert mt.ingest_text(text, ts, tl, fast=False)


if __name__ == "__main__":
    raise SystemExit(main())
