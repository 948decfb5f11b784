"""The capacity model's cost per pass — ``advice.enrich`` (planner, step-time fit, what-ifs for every
suggestion) — against the rule pass (``evaluate``) on the same window, measured in the same run.

Live mode (``watch``/``serve``) runs both every pass, so enrich should cost no more than the rules do
(target: ratio ≤ 1.0). Inputs: the seed case (written by us, 240 decode lines, 8-rank MLA what-ifs) and
a real SGLang 0.5.23 CPU run (kv-full-retract, 160 decode lines).

Run: ``.venv/bin/python bench/bench_capacity.py`` (exits 1 if a ratio is above 1.0).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnoser.advice import enrich  # noqa: E402
from diagnoser.collect import collect_logs  # noqa: E402
from diagnoser.engines import get_adapter  # noqa: E402
from diagnoser.evaluate import evaluate  # noqa: E402
from tests.conftest import DATA  # noqa: E402

ROUNDS = 7
REPS = 20
SEED = ROOT / "tests" / "cases" / "seed-kimi-k25"


def median_ms(fn) -> float:  # type: ignore[no-untyped-def]
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(REPS):
            fn()
        rounds.append((time.perf_counter() - t0) / REPS * 1000)
    return statistics.median(rounds)


def main() -> int:
    ad = get_adapter("sglang")
    cases = [
        ("seed-kimi-k25 (ours, TP 8 MLA)", SEED / "server.log",
         {"model_config": str(SEED / "config.json"), "client_concurrency": 150, "job_requests": 88000,
          "avg_tokens_per_request": 4340}),
        ("cpu-real kv-full-retract (real 0.5.23)", DATA / "sglang-cpu-real" / "kv-full-retract" / "server.log",
         {"model_config": str(ROOT / "tests" / "capacity_configs" / "tiny-llama.json"), "client_concurrency": 40}),
    ]
    worst = 0.0
    print(f"{'case':42} {'rule pass ms':>13} {'enrich ms':>10} {'ratio':>6}")
    for name, log, extras in cases:
        tl = collect_logs(ad, [str(log)]).timelines[0]
        enrich(evaluate([tl], ad, {}, None, extras), [tl], extras)  # warm up (numpy import, config cache)
        rule_ms = median_ms(lambda tl=tl, extras=extras: evaluate([tl], ad, {}, None, extras))
        reports = [evaluate([tl], ad, {}, None, extras) for _ in range(ROUNDS * REPS)]
        it = iter(reports)
        enrich_ms = median_ms(lambda tl=tl, extras=extras, it=it: enrich(next(it), [tl], extras))
        ratio = enrich_ms / rule_ms
        worst = max(worst, ratio)
        print(f"{name:42} {rule_ms:13.2f} {enrich_ms:10.2f} {ratio:6.2f}")
    print(f"worst ratio {worst:.2f} (target ≤ 1.0)")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
