"""Write profile_export_aiperf.json with AIPerf 0.13.0's own export model (``JsonExportData``, ``JsonMetricResult``,
``ErrorDetailsCount``) and the last steps of its writer (``MetricsJsonExporter._generate_content``:
``model_dump(mode="json", exclude_unset=True, exclude_none=True)`` then ``orjson.dumps(..., OPT_INDENT_2)``), filled with
the per-request numbers of the real bench_serving run beside it, plus two failed requests (503) to exercise the error
path. Not part of the suite: it needs AIPerf's package on the path (see README.md here).

    python make_aiperf.py sglang-cpu-bench-serving/bench_serving.jsonl sglang-cpu-bench-serving/client_run.json OUT.json
"""

import json
import sys
from datetime import datetime

import numpy as np
import orjson
from aiperf.common.models.error_models import ErrorDetails, ErrorDetailsCount
from aiperf.common.models.export_models import JsonExportData, JsonMetricResult
from aiperf.config.config import BenchmarkConfig

PCTS = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def dist(unit: str, vals: list[float]) -> JsonMetricResult:
    a = np.asarray(vals, dtype=float)
    return JsonMetricResult(unit=unit, avg=float(a.mean()), min=float(a.min()), max=float(a.max()), std=float(a.std()),
                            count=len(a), sum=float(a.sum()), **{f"p{p}": float(np.percentile(a, p)) for p in PCTS})


def main(src: str, meta: str, out: str) -> None:
    b = json.loads(open(src).read().splitlines()[-1])
    end = json.load(open(meta))["output_mtime"]
    start = end - b["duration"]
    ok = [i for i, e in enumerate(b["errors"]) if not e]
    ttft = [b["ttfts"][i] * 1000 for i in ok]
    itl = [x * 1000 for i in ok for x in b["itls"][i]]
    latency = [(b["ttfts"][i] + sum(b["itls"][i])) * 1000 for i in ok]  # bench_serving keeps no per-request latency
    osl = [float(b["output_lens"][i]) for i in ok]
    isl = [float(b["input_lens"][i]) for i in ok]
    data = JsonExportData(
        schema_version=JsonExportData.SCHEMA_VERSION, aiperf_version="0.13.0", benchmark_id="sglang-cpu-bench-serving",
        input_config=BenchmarkConfig.model_validate({  # the run's own settings: 12 in flight, 48 requests
            "models": ["tiny-llama"], "endpoint": {"urls": ["http://127.0.0.1:42997"]}, "datasets": [{"name": "main", "type": "synthetic"}],
            "phases": {"type": "concurrency", "concurrency": 12, "requests": 48}}),
        was_cancelled=False, is_complete=True,
        error_summary=[ErrorDetailsCount(error_details=ErrorDetails(code=503, type="ServiceUnavailable", message="Service Unavailable"), count=2)],
        start_time=datetime.fromtimestamp(start), end_time=datetime.fromtimestamp(end),  # local time, as the writer does
    )
    metrics = {
        "request_throughput": JsonMetricResult(unit="requests/sec", avg=len(ok) / b["duration"]),
        "request_latency": dist("ms", latency), "request_count": JsonMetricResult(unit="requests", avg=float(len(ok))),
        "error_request_count": JsonMetricResult(unit="requests", avg=2.0),
        "time_to_first_token": dist("ms", ttft), "inter_token_latency": dist("ms", itl),
        "output_token_throughput": JsonMetricResult(unit="tokens/sec", avg=sum(osl) / b["duration"]),
        "output_sequence_length": dist("tokens", osl), "input_sequence_length": dist("tokens", isl),
        "benchmark_duration": JsonMetricResult(unit="sec", avg=b["duration"]),
        "total_output_tokens": JsonMetricResult(unit="tokens", avg=sum(osl)), "total_isl": JsonMetricResult(unit="tokens", avg=sum(isl)),
    }
    for tag, res in metrics.items():
        setattr(data, tag, res)
    payload = data.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    with open(out, "w") as fh:
        fh.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode("utf-8"))
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
