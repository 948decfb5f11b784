"""What the client saw: the result file of a load tool, read into one engine-neutral :class:`ClientRun`.

``diagnose --once … --client-results FILE`` reads it; :mod:`diagnoser.timeline.client` sets it beside the
server's numbers over the same window. Each format is read from the fields its tool's own writer puts
there (the files cited are in the tools' PyPI releases):

* **SGLang ``bench_serving``** (0.5.23, ``sglang/benchmark/serving.py``, ``run_benchmark``: ``result``
  and ``result_details``, one ``json.dumps`` line appended per run to ``--output-file``, a ``.jsonl``):
  ``duration``, ``completed``, ``total_input_tokens``, ``total_output_tokens``, ``output_throughput``,
  ``input_throughput``, ``total_throughput``, ``mean/median/p95/p99_ttft_ms``, ``…_itl_ms``,
  ``…_tpot_ms``, ``…_e2e_latency_ms``, ``max_concurrency``, ``concurrency`` (mean requests in flight),
  ``server_info``; with ``--output-details`` also ``errors`` (one per request sent, ``""`` for success)
  and ``ttfts``. It writes no timestamp: the run ends about when the line is written (the file's
  modification time), or is placed on the server's busy readings.
* **vLLM ``vllm bench serve``** (0.33.0, ``vllm/benchmarks/serve.py``, ``benchmark`` and ``main``:
  ``json.dump(result_json)`` to ``--result-filename``): ``date`` (local ``%Y%m%d-%H%M%S``, written
  after the run), ``num_prompts``, ``duration``, ``completed``, ``failed``, ``total_input_tokens``,
  ``total_output_tokens``, ``output_throughput``, ``total_token_throughput``, ``mean/median/std/pNN_ttft_ms``
  (and ``tpot``, ``itl``, ``e2el``), ``max_concurrency``, ``max_concurrent_requests``; ``errors`` with
  ``--save-detailed``.
* **GenAI-Perf** (0.0.16, ``genai_perf/export_data/json_exporter.py`` writes ``*_genai_perf.json``, the
  stats of ``genai_perf/metrics/statistics.py``) and **AIPerf** (0.13.0,
  ``aiperf/common/models/export_models.py``, ``JsonExportData``: ``profile_export_aiperf.json``, shaped
  after GenAI-Perf's): one object per metric (``time_to_first_token``, ``output_token_throughput``,
  ``request_throughput``, ``request_count``, ``output_sequence_length``, ``input_sequence_length``, …)
  with ``unit``, ``avg``, ``p50``, ``p95``, …; AIPerf adds ``benchmark_duration``, ``total_output_tokens``,
  ``total_isl``, ``error_request_count``, ``error_summary``, ``start_time``/``end_time`` (the writer's local
  time, ``aiperf/exporters/metrics_json_exporter.py``), ``input_config.phases[].concurrency`` and
  ``schema_version``.
* **GuideLLM** (0.8.1, ``guidellm/benchmark/schemas/report.py``, ``GenerativeBenchmarksReport.save_file``:
  ``benchmarks.json``): ``benchmarks[]``, each with ``start_time``/``end_time``/``duration`` (epoch
  seconds) and ``metrics``: ``request_totals`` (``successful``, ``incomplete``, ``errored``, ``total``),
  ``time_to_first_token_ms``, ``output_token_count``, ``prompt_token_count``,
  ``request_concurrency`` as status breakdowns of distribution summaries (``mean``, ``median``,
  ``total_sum``, ``percentiles.p95``, …). The last benchmark of the report is read.

Bad input is one sentence (:class:`ClientResultsError`), never a traceback.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from diagnoser.redact import redact_text

MAX_BYTES = 256 * 2**20  # a detailed bench_serving line holds every generated text: big, but bounded


class ClientResultsError(ValueError):
    """The file is not a load tool's result that diagnoser reads (the message says why, in one sentence)."""


@dataclass
class ClientRun:
    """One benchmark run as the client measured it. Times are epoch seconds, latencies seconds."""

    tool: str
    source: str
    duration_s: float | None = None
    start: float | None = None
    end: float | None = None
    time_basis: str = ""  # how start/end were found: "the file" / "the file's modification time" / ""
    sent: int | None = None
    completed: int | None = None
    failed: int | None = None
    input_tokens: float | None = None
    output_tokens: float | None = None
    output_tps: float | None = None
    input_tps: float | None = None
    total_tps: float | None = None
    request_rps: float | None = None
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    e2e_mean_s: float | None = None
    max_concurrency: float | None = None  # the client's cap on requests in flight
    mean_concurrency: float | None = None  # requests it actually kept in flight on average
    request_rate: float | None = None  # the configured arrival rate (None: as fast as it can)
    errors: dict[str, int] = field(default_factory=dict)  # first error messages by count
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _f(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ms(v: Any) -> float | None:
    f = _f(v)
    return None if f is None else f / 1000.0


def _int(v: Any) -> int | None:
    f = _f(v)
    return None if f is None else int(round(f))


def _errors(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if isinstance(items, list):
        for e in items:
            if isinstance(e, str) and e.strip():
                key = redact_text(e.strip().splitlines()[0][:160])
                out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:5])


def _load(path: str) -> list[Any]:
    p = Path(path)
    try:
        if not p.is_file():
            raise ClientResultsError(f"--client-results {path}: no such file.")
        if p.stat().st_size > MAX_BYTES:
            raise ClientResultsError(f"--client-results {path}: larger than {MAX_BYTES // 2**20} MiB, not a load tool's result.")
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ClientResultsError(f"--client-results {path}: cannot read it ({e.strerror or e}).") from None
    text = text.strip()
    if not text:
        raise ClientResultsError(f"--client-results {path}: the file is empty.")
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line))
        except json.JSONDecodeError:
            raise ClientResultsError(f"--client-results {path}: line {n} is not JSON (a bench_serving .jsonl, a vLLM, "
                                     "GenAI-Perf, AIPerf or GuideLLM .json is read).") from None
    return docs


def read_client_results(path: str) -> ClientRun:
    """Read ``path`` (the format is told by its fields). A JSONL of several runs: the last line, said in a note."""
    docs = [d for d in _load(path) if isinstance(d, dict)]
    if not docs:
        raise ClientResultsError(f"--client-results {path}: no JSON object in it.")
    doc = docs[-1]
    mtime: float | None
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        mtime = None
    if isinstance(doc.get("benchmarks"), list):
        run = _guidellm(doc, path)
    elif isinstance(doc.get("time_to_first_token"), dict) or isinstance(doc.get("request_throughput"), dict):
        run = _genai_perf(doc, path)
    elif "duration" in doc and ("output_throughput" in doc or "completed" in doc):
        run = _vllm(doc, path) if ("date" in doc or "num_prompts" in doc or "failed" in doc) else _bench_serving(doc, path)
    else:
        raise ClientResultsError(f"--client-results {path}: not a result diagnoser reads (SGLang bench_serving JSONL, "
                                 "vLLM bench serve, GenAI-Perf, AIPerf or GuideLLM JSON).")
    if len(docs) > 1:
        run.notes.append(f"The file holds {len(docs)} runs; the last one is read.")
    if run.end is None and mtime is not None and run.duration_s:
        run.end, run.start = mtime, mtime - run.duration_s
        run.time_basis = "the file's modification time (the tool writes it right after the run)"
    if run.start is None and run.end is not None and run.duration_s:
        run.start = run.end - run.duration_s
    if run.duration_s is None and run.start is not None and run.end is not None:
        run.duration_s = run.end - run.start
    if run.output_tps is None and run.output_tokens is not None and run.duration_s:
        run.output_tps = run.output_tokens / run.duration_s
    if run.sent is None and run.completed is not None and run.failed is not None:
        run.sent = run.completed + run.failed
    if run.failed is None and run.sent is not None and run.completed is not None:
        run.failed = max(0, run.sent - run.completed)
    return run


def _bench_serving(d: dict[str, Any], path: str) -> ClientRun:
    r = ClientRun(tool="SGLang bench_serving", source=path)
    r.duration_s = _f(d.get("duration"))
    r.completed = _int(d.get("completed"))
    errs = d.get("errors")
    if isinstance(errs, list):
        r.sent = len(errs)
        r.failed = sum(1 for e in errs if isinstance(e, str) and e.strip())
        r.errors = _errors(errs)
    else:
        r.notes.append("Requests sent are not in the file (bench_serving writes them with --output-details); "
                       "only the completed ones are known.")
    r.input_tokens = _f(d.get("total_input_tokens"))
    r.output_tokens = _f(d.get("total_output_tokens"))
    r.output_tps = _f(d.get("output_throughput"))
    r.input_tps = _f(d.get("input_throughput"))
    r.total_tps = _f(d.get("total_throughput"))
    r.request_rps = _f(d.get("request_throughput"))
    r.ttft_mean_s, r.ttft_p50_s = _ms(d.get("mean_ttft_ms")), _ms(d.get("median_ttft_ms"))
    r.ttft_p95_s = _ms(d.get("p95_ttft_ms"))
    r.itl_p50_s = _ms(d.get("median_itl_ms"))
    r.e2e_mean_s = _ms(d.get("mean_e2e_latency_ms"))
    r.max_concurrency = _f(d.get("max_concurrency"))
    r.mean_concurrency = _f(d.get("concurrency"))
    r.request_rate = _f(d.get("request_rate"))
    if r.request_rate is not None and math.isinf(r.request_rate):
        r.request_rate = None
    return r


def _vllm(d: dict[str, Any], path: str) -> ClientRun:
    r = ClientRun(tool="vLLM bench serve", source=path)
    r.duration_s = _f(d.get("duration"))
    r.completed, r.failed = _int(d.get("completed")), _int(d.get("failed"))
    r.sent = _int(d.get("num_prompts"))
    r.errors = _errors(d.get("errors"))
    r.input_tokens, r.output_tokens = _f(d.get("total_input_tokens")), _f(d.get("total_output_tokens"))
    r.output_tps, r.total_tps = _f(d.get("output_throughput")), _f(d.get("total_token_throughput"))
    r.request_rps = _f(d.get("request_throughput"))
    r.ttft_mean_s, r.ttft_p50_s = _ms(d.get("mean_ttft_ms")), _ms(d.get("median_ttft_ms"))
    r.ttft_p95_s = _ms(d.get("p95_ttft_ms"))
    r.itl_p50_s = _ms(d.get("median_itl_ms"))
    r.e2e_mean_s = _ms(d.get("mean_e2el_ms"))
    r.max_concurrency = _f(d.get("max_concurrency"))
    rate = d.get("request_rate")
    r.request_rate = _f(rate) if rate not in ("inf", None) else None
    if r.request_rate is not None and math.isinf(r.request_rate):
        r.request_rate = None
    date = d.get("date")
    if isinstance(date, str):
        try:  # local time of the machine that ran it, written after the run
            r.end = datetime.strptime(date, "%Y%m%d-%H%M%S").timestamp()
            r.time_basis = "the file's date (the benchmark machine's local time, read as this machine's)"
        except ValueError:
            pass
    return r


def _metric(d: dict[str, Any], name: str, stat: str = "avg") -> float | None:
    m = d.get(name)
    if not isinstance(m, dict):
        return None
    v = _f(m.get(stat))
    if v is None:
        return None
    unit = str(m.get("unit") or "")
    if unit == "ms":
        return v / 1000.0
    if unit in ("ns",):
        return v / 1e9
    return v


def _find_key(d: Any, key: str, depth: int = 0) -> Any:
    if depth > 6:
        return None
    if isinstance(d, dict):
        if key in d and not isinstance(d[key], dict | list):
            return d[key]
        for v in d.values():
            got = _find_key(v, key, depth + 1)
            if got is not None:
                return got
    elif isinstance(d, list):  # AIPerf: input_config.phases[].concurrency
        for v in d[:20]:
            got = _find_key(v, key, depth + 1)
            if got is not None:
                return got
    return None


def _iso_ts(v: Any) -> float | None:
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return _f(v)


def _genai_perf(d: dict[str, Any], path: str) -> ClientRun:
    aiperf = "aiperf_version" in d or "schema_version" in d or "benchmark_duration" in d
    r = ClientRun(tool="AIPerf" if aiperf else "GenAI-Perf", source=path)
    r.completed = _int(_metric(d, "request_count"))
    r.request_rps = _metric(d, "request_throughput")
    r.output_tps = _metric(d, "output_token_throughput")
    r.ttft_mean_s, r.ttft_p50_s = _metric(d, "time_to_first_token"), _metric(d, "time_to_first_token", "p50")
    r.ttft_p95_s = _metric(d, "time_to_first_token", "p95")
    r.itl_p50_s = _metric(d, "inter_token_latency", "p50")
    r.e2e_mean_s = _metric(d, "request_latency")
    r.duration_s = _metric(d, "benchmark_duration")
    if r.duration_s is None and r.completed and r.request_rps:
        r.duration_s = r.completed / r.request_rps
    r.output_tokens = _metric(d, "total_output_tokens") or _metric(d, "total_osl")
    if r.output_tokens is None and r.completed:
        osl = _metric(d, "output_sequence_length")
        r.output_tokens = None if osl is None else osl * r.completed
    r.input_tokens = _metric(d, "total_isl")
    if r.input_tokens is None and r.completed:
        isl = _metric(d, "input_sequence_length")
        r.input_tokens = None if isl is None else isl * r.completed
    if r.input_tokens is not None and r.duration_s:
        r.input_tps = r.input_tokens / r.duration_s
    r.failed = _int(_metric(d, "error_request_count"))
    if r.failed is None and isinstance(d.get("error_summary"), list):
        r.failed = sum(_int(e.get("count")) or 0 for e in d["error_summary"] if isinstance(e, dict))
    if isinstance(d.get("error_summary"), list):
        for e in d["error_summary"][:5]:
            if isinstance(e, dict):
                det = e.get("error_details") if isinstance(e.get("error_details"), dict) else {}
                msg = str(det.get("message") or det.get("type") or "error")
                r.errors[redact_text(msg[:160])] = _int(e.get("count")) or 0
    if r.failed is None and r.completed is not None:
        r.failed = 0 if aiperf else None
    conc = _find_key(d.get("input_config") or {}, "concurrency")
    r.max_concurrency = _f(conc)
    r.start, r.end = _iso_ts(d.get("start_time")), _iso_ts(d.get("end_time"))
    if r.start is None:  # AIPerf's record timestamps (ns)
        a, b = _f((d.get("min_request_timestamp") or {}).get("avg")), _f((d.get("max_response_timestamp") or {}).get("avg"))
        if a and b and b > a:
            r.start, r.end = a / 1e9, b / 1e9
    if r.start is not None and r.end is not None:
        r.time_basis = "the file"
    return r


def _sds(d: Any, status: str = "successful", stat: str = "mean") -> float | None:
    """A GuideLLM StatusDistributionSummary's ``status`` → DistributionSummary's ``stat`` (or a percentile)."""
    if not isinstance(d, dict):
        return None
    s = d.get(status)
    if not isinstance(s, dict):
        return None
    if stat.startswith("p") and stat[1:].isdigit():
        return _f((s.get("percentiles") or {}).get(stat))
    return _f(s.get(stat))


def _guidellm(d: dict[str, Any], path: str) -> ClientRun:
    benches = [b for b in d["benchmarks"] if isinstance(b, dict)]
    if not benches:
        raise ClientResultsError(f"--client-results {path}: a GuideLLM report with no benchmark in it.")
    b = benches[-1]
    r = ClientRun(tool="GuideLLM", source=path)
    if len(benches) > 1:
        r.notes.append(f"The report holds {len(benches)} benchmarks; the last one is read.")
    m = b.get("metrics") if isinstance(b.get("metrics"), dict) else {}
    r.start, r.end, r.duration_s = _f(b.get("start_time")), _f(b.get("end_time")), _f(b.get("duration"))
    if r.start is not None and r.end is not None:
        r.time_basis = "the file"
    tot = m.get("request_totals") if isinstance(m.get("request_totals"), dict) else {}
    r.completed = _int(tot.get("successful"))
    bad = [_int(tot.get(k)) for k in ("errored", "incomplete")]
    r.failed = sum(x for x in bad if x is not None) if any(x is not None for x in bad) else None
    r.sent = _int(tot.get("total"))
    r.output_tokens = _sds(m.get("output_token_count"), stat="total_sum")
    r.input_tokens = _sds(m.get("prompt_token_count"), stat="total_sum")
    if r.duration_s:
        r.output_tps = None if r.output_tokens is None else r.output_tokens / r.duration_s
        r.input_tps = None if r.input_tokens is None else r.input_tokens / r.duration_s
        if r.completed is not None:
            r.request_rps = r.completed / r.duration_s
    ttft = m.get("time_to_first_token_ms")
    r.ttft_mean_s, r.ttft_p50_s, r.ttft_p95_s = (_ms(_sds(ttft, stat=s)) for s in ("mean", "median", "p95"))
    r.itl_p50_s = _ms(_sds(m.get("inter_token_latency_ms"), stat="median"))
    r.e2e_mean_s = _sds(m.get("request_latency"), stat="mean")
    r.mean_concurrency = _sds(m.get("request_concurrency"), stat="mean")
    strat = ((b.get("config") or {}).get("strategy") or {}) if isinstance(b.get("config"), dict) else {}
    if isinstance(strat, dict):
        r.max_concurrency = _f(strat.get("streams") or strat.get("max_concurrency"))
        r.request_rate = _f(strat.get("rate"))
    return r
