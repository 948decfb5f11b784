"""Write guidellm-benchmarks.json with GuideLLM 0.8.1's own models and writer (``GenerativeBenchmarksReport.save_file``),
filled with the per-request numbers of the real bench_serving run beside it (its TTFTs, ITLs, prompt and output
lengths, start and end). Not part of the suite: it needs GuideLLM's package on the path (see README.md here).

    python make_guidellm.py sglang-cpu-bench-serving/bench_serving.jsonl sglang-cpu-bench-serving/client_run.json OUT.json
"""

import json
import sys
import warnings

from guidellm.benchmark.schemas import metrics as m
from guidellm.benchmark.schemas.base import BenchmarkConfig
from guidellm.benchmark.schemas.benchmark import GenerativeBenchmark
from guidellm.benchmark.schemas.report import GenerativeBenchmarksReport
from guidellm.scheduler.strategies import ConcurrentStrategy
from guidellm.schemas.base.base import StatusBreakdown
from guidellm.schemas.base.statistics import StatusDistributionSummary


def sds(vals: list[float]) -> StatusDistributionSummary:
    return StatusDistributionSummary.from_values(successful=vals, incomplete=[], errored=[])


def main(src: str, meta: str, out: str) -> None:
    b = json.loads(open(src).read().splitlines()[-1])
    end = json.load(open(meta))["output_mtime"]
    start = end - b["duration"]
    ok = [i for i, e in enumerate(b["errors"]) if not e]
    metrics = m.GenerativeMetrics.model_construct(
        request_totals=StatusBreakdown[int, int, int, int](successful=len(ok), incomplete=0, errored=len(b["errors"]) - len(ok),
                                                           total=len(b["errors"])),
        request_concurrency=sds([b["concurrency"]]),
        request_latency=sds([b["mean_e2e_latency_ms"] / 1000] * len(ok)),
        time_to_first_token_ms=sds([b["ttfts"][i] * 1000 for i in ok]),
        inter_token_latency_ms=sds([x * 1000 for i in ok for x in b["itls"][i]]),
        prompt_token_count=sds([float(b["input_lens"][i]) for i in ok]),
        output_token_count=sds([float(b["output_lens"][i]) for i in ok]),
    )
    sched = m.SchedulerMetrics.model_construct(start_time=start, request_start_time=start, measure_start_time=start,
                                               measure_end_time=end, request_end_time=end, end_time=end)
    bench = GenerativeBenchmark.model_construct(config=BenchmarkConfig.model_construct(strategy=ConcurrentStrategy(streams=12)),
                                                scheduler_metrics=sched, metrics=metrics)
    report = GenerativeBenchmarksReport.model_construct(benchmarks=[bench], conclusions=[])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # model_construct leaves the fields this run has no numbers for unset
        print(report.save_file(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
