"""One engine's tick — parse one real /metrics scrape and turn it into signals — against a bare
``prometheus_client.parser.text_string_to_metric_families`` on the same text (issue 2 target: ratio ≤ 1.0).

The tick is what ``diagnose`` does per scrape after the HTTP fetch: :meth:`MetricsTarget.ingest_text`
(partial-line cut, junk check, the adapter's fast parse, signals, counter rates, histogram quantiles,
version evidence) into a Timeline that already holds earlier scrapes. Each figure is the median of
several rounds measured in the same run, so the ratio is stable on a noisy 2-core machine.

Run: ``.venv/bin/python bench/bench_tick.py`` (exits 1 if a ratio is above 1.0).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnoser.engines.sglang import ADAPTER  # noqa: E402
from diagnoser.sources.metrics import MetricsTarget  # noqa: E402
from diagnoser.timeline import Timeline  # noqa: E402
from tests.conftest import DATA  # noqa: E402

ROUNDS = 7
REPS = 30


def bare(text: str) -> None:
    list(text_string_to_metric_families(text))


def make_tick(texts: list[str]):  # type: ignore[no-untyped-def]
    """A tick function that ingests the texts in turn (rates and quantiles need a previous scrape)."""
    target = MetricsTarget("http://127.0.0.1:30000", ADAPTER)
    tl = Timeline(target="bench")
    state = {"i": 0, "ts": 1_800_000_000.0}

    def tick() -> None:
        state["ts"] += 2.0
        text = texts[state["i"] % len(texts)]
        state["i"] += 1
        if not target.ingest_text(text, state["ts"], tl):
            raise SystemExit(f"tick failed: {target.last_error}")

    return tick


def per_call(fn, arg=None) -> float:  # type: ignore[no-untyped-def]
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(REPS):
            fn(arg) if arg is not None else fn()
        rounds.append((time.perf_counter() - t0) / REPS)
    return statistics.median(rounds)


def main() -> int:
    collector = (DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom").read_text()
    seq = sorted((DATA / "sglang-cpu-real" / "kv-full-retract" / "metrics").glob("metrics_*.prom"))
    cpu_texts = [p.read_text() for p in seq[1:9]]
    cases = [
        ("sglang 0.5.23 collector exposition", [collector]),
        ("cpu-real 0.5.23 scrape sequence (kv-full-retract)", cpu_texts),
    ]
    worst = 0.0
    print(f"{'case':52} {'bytes':>7} {'bare parse ms':>14} {'tick ms':>8} {'ratio':>6}")
    for name, texts in cases:
        tick = make_tick(texts)
        for _ in range(5):
            tick()  # warm up: state holds earlier scrapes, as in a live run
        base = statistics.median(per_call(bare, t) for t in texts)
        ours = per_call(tick)
        ratio = ours / base
        worst = max(worst, ratio)
        size = int(statistics.mean(len(t) for t in texts))
        print(f"{name:52} {size:>7} {base * 1e3:>14.2f} {ours * 1e3:>8.2f} {ratio:>6.2f}")
    ok = worst <= 1.0
    print(f"worst ratio tick / bare text_string_to_metric_families = {worst:.2f} (target <= 1.0): {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
