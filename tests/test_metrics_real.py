"""The metrics source on real SGLang expositions: every file in tests/data/sglang/metrics and every
cpu-real scrape sequence (a real SGLang 0.5.23 engine, one /metrics scrape every ~2 s), with the values
read asserted against the run's own timeline.tsv."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang import metrics as m
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import DATA

METRICS_DIR = DATA / "sglang" / "metrics"
CPU_REAL = DATA / "sglang-cpu-real"
RUNS = sorted(p.name for p in CPU_REAL.iterdir()) if CPU_REAL.exists() else []
EXPOSITIONS = sorted(METRICS_DIR.glob("*.prom")) if METRICS_DIR.exists() else []


def scrape_files(run: str) -> list[Path]:
    return sorted((CPU_REAL / run / "metrics").glob("metrics_*.prom"))


def file_ts(p: Path) -> float:
    return float(p.stem.rsplit("_", 1)[1])


def ingest(texts: list[tuple[float, str]], fast: bool = True) -> tuple[Timeline, MetricsTarget]:
    t = MetricsTarget("http://127.0.0.1:1", ADAPTER)
    tl = Timeline(target="t")
    for ts, text in texts:
        assert t.ingest_text(text, ts, tl, fast=fast), t.last_error
    finalize(tl, t.state.version)
    return tl, t


def last(tl: Timeline, sig: str, rank: str = "") -> float:
    s = tl.get(sig, rank)
    assert s is not None, f"no {sig}[{rank}]"
    return s.values[-1]


def read_tsv(run: str) -> list[dict[str, str]]:
    with open(CPU_REAL / run / "timeline.tsv") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(autouse=True)
def _shared(data_dir: Path) -> None:
    return None


def test_every_shared_exposition_is_read() -> None:
    names = {p.name for p in EXPOSITIONS}
    assert names == {
        "metrics_docs_production_metrics_2026.prom",
        "metrics_docs_production_metrics_prerelease_2024-11.prom",
        "sglang-0.5.23_collector_metrics.prom",
    }, "a new exposition arrived in tests/data: add its asserted values here"


def test_sglang_0_5_23_collector_exposition() -> None:
    tl, t = ingest([(1000.0, (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text())])
    assert last(tl, "running_reqs") == 44
    assert last(tl, "queue_reqs") == 37
    assert last(tl, "token_usage") == 1.0
    assert last(tl, "used_tokens") == 20000
    assert last(tl, "gen_throughput_tps") == pytest.approx(1060.0044818231188)
    assert last(tl, "cache_hit_rate_last_prefill") == pytest.approx(0.35730482424035487)
    assert last(tl, "cuda_graph") == 0
    assert last(tl, "spec_accept_len") == 0
    assert last(tl, "new_token_ratio") == pytest.approx(0.4)
    assert last(tl, "retracted_reqs") == 3  # the pid-labelled gauge, first scrape
    assert last(tl, "retractions_total") == 69
    assert last(tl, "requests_completed") == 166  # is_streaming false 91 + true 75
    assert tl.cfg("max_total_tokens") == 20000
    assert tl.cfg("context_len") == 2048
    assert tl.cfg("page_size") == 1
    assert tl.cfg("weight_mem_gb") == pytest.approx(0.7)
    assert tl.version == ">=0.5.23"
    assert t.state.model_names == {"tiny-llama"}
    # a single scrape has no interval: no rates, no quantiles
    assert tl.get("prompt_tps") is None and tl.get("ttft_seconds_p95") is None


def test_docs_2026_sample_old_label_set() -> None:
    tl, t = ingest([(1.0, (METRICS_DIR / "metrics_docs_production_metrics_2026.prom").read_text())])
    assert last(tl, "running_reqs") == 162
    assert last(tl, "queue_reqs") == 2826
    assert last(tl, "token_usage") == pytest.approx(0.28)
    assert last(tl, "used_tokens") == 123859
    assert last(tl, "gen_throughput_tps") == pytest.approx(86.50814177726902)
    assert last(tl, "cache_hit_rate") == pytest.approx(0.007507552643049313)
    # labels are model_name only → 0.3.5.post1–0.4.3, and the TTFT buckets are the 0.3.5.post1–0.4.1
    # defaults; the 2026 doc edit's spec_num_steps contradicts both and is reported, not applied
    assert tl.version == ">=0.3.5,<=0.4.1"
    assert any("TTFT histogram buckets of 0.3.5–0.4.1" in r for r in t.state.version.reasons or [])
    assert any("spec_num_steps" in c for c in t.state.version.conflicts or [])
    assert tl.cfg("version_detected") == ">=0.3.5,<=0.4.1" and "TTFT histogram buckets" in tl.cfg_source("version_detected")
    assert any("spec_num_steps" in c for c in tl.cfg("version_conflicts"))
    assert t.state.model_names == {"meta-llama/Llama-3.1-8B-Instruct"}  # not func_latency's name="generate_request"


def test_prerelease_2024_names_with_name_label() -> None:
    tl, t = ingest([(1.0, (METRICS_DIR / "metrics_docs_production_metrics_prerelease_2024-11.prom").read_text())])
    assert last(tl, "running_reqs") == 0  # sglang:num_requests_running
    assert last(tl, "queue_reqs") == 0  # sglang:num_requests_waiting
    assert last(tl, "token_usage") == pytest.approx(0.01)
    assert last(tl, "cache_hit_rate") == pytest.approx(0.1061)  # a percentage (10.61) then
    assert last(tl, "prefill_new_tokens") == 0
    assert tl.cfg("max_total_tokens") == 161721
    assert tl.cfg("max_running_requests") == 4097
    assert tl.cfg("max_prefill_tokens") == 16384
    assert tl.cfg("context_len") == 8192
    assert tl.version == "0.3.5"
    assert t.state.model_names == {"google/gemma-2-9b-it"}


def test_underscore_spelling_reads_the_same() -> None:
    text = (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text()
    a, _ = ingest([(1.0, text)])
    b, _ = ingest([(1.0, text.replace("sglang:", "sglang_"))])
    assert {k: s.values.tolist() for k, s in a.series.items()} == {k: s.values.tolist() for k, s in b.series.items()}
    assert b.version == ">=0.5.23"


def _issue_thread_lines(marker: str) -> str:
    lines = (DATA / "sglang" / "logs" / "lines_from_issue_threads.txt").read_text().splitlines()
    out, on = [], False
    for line in lines:
        if line.startswith("# "):
            on = marker in line
            continue
        if on and line.startswith("sglang:"):
            out.append(line)
    return "\n".join(out) + "\n"


def test_dp_ranks_kept_apart_and_summed() -> None:
    tl, t = ingest([(1.0, _issue_thread_lines("pull/7597"))])
    assert last(tl, "gen_throughput_tps", "dp0") == pytest.approx(386.20832953491475)
    assert last(tl, "gen_throughput_tps", "dp1") == pytest.approx(386.2656119271815)
    assert last(tl, "gen_throughput_tps") == pytest.approx(386.20832953491475 + 386.2656119271815)
    assert t.state.version.low >= (0, 4, 10)


def test_pipeline_stage_kept_apart_not_summed() -> None:
    tl, _ = ingest([(1.0, _issue_thread_lines("pull/7720"))])
    assert last(tl, "gen_throughput_tps") == pytest.approx(192.24507350455715)
    assert last(tl, "gen_throughput_tps", "pp1") == pytest.approx(192.28060837134453)


def test_token_usage_is_never_summed_across_dp_ranks() -> None:
    base = (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text()
    lines = [ln for ln in base.splitlines() if ln.startswith(("sglang:token_usage{", "sglang:num_running_reqs{"))]
    dp = []
    for i, (usage, running) in enumerate([("0.5", "10"), ("0.9", "30")]):
        for ln in lines:
            v = usage if "token_usage" in ln else running
            dp.append(ln.replace("tp_rank=", f'dp_rank="{i}",tp_rank=').rsplit(" ", 1)[0] + " " + v)
    tl, _ = ingest([(1.0, "\n".join(dp) + "\n")])
    assert last(tl, "running_reqs") == 40
    assert last(tl, "token_usage") == pytest.approx(0.9)


def test_label_generations_do_not_double_count() -> None:
    """pid series, --extra-metric-labels, priority splits and all-schedulers TP replicas."""
    base = (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text()
    ref, _ = ingest([(1.0, base)])
    extra = []
    for ln in base.splitlines():
        if ln.startswith("sglang:num_running_reqs{"):
            extra.append(ln.replace("model_name=", 'priority="1",model_name=').rsplit(" ", 1)[0] + " 7.0")
            extra.append(ln.replace('tp_rank="0"', 'tp_rank="1"').rsplit(" ", 1)[0] + " 999.0")
        if ln.startswith("sglang:num_retracted_reqs{"):
            extra.append(ln.replace('pid="4576"', 'pid="4577"').rsplit(" ", 1)[0] + " 2.0")
    labelled = base.replace('model_name="tiny-llama"', 'model_name="tiny-llama",team="search"')
    tl, t = ingest([(1.0, labelled + "\n".join(extra) + "\n")])
    assert last(tl, "running_reqs") == last(ref, "running_reqs") == 44
    assert last(tl, "retracted_reqs") == 5  # pid series of a `all`-mode gauge add up: 3 + 2
    assert t.state.version.low >= (0, 5, 10)  # the priority label


@pytest.mark.parametrize("run", RUNS)
def test_cpu_real_sequence_matches_its_timeline(run: str) -> None:
    files = scrape_files(run)
    rows = read_tsv(run)
    assert len(files) == len(rows) > 10
    tl, t = ingest([(file_ts(p), p.read_text()) for p in files])
    t0 = file_ts(files[0])
    cols = {
        "num_running_reqs": "running_reqs",
        "num_queue_reqs": "queue_reqs",
        "token_usage": "token_usage",
        "kv_used_tokens": "used_tokens",
        "kv_available_tokens": "kv_available_tokens",
        "new_token_ratio": "new_token_ratio",
        "gen_throughput": "gen_throughput_tps",
        "num_requests_total": "requests_completed",
        "num_retracted_requests_total": "retractions_total",
        "cache_hit_rate": "cache_hit_rate_last_prefill",
    }
    checked = 0
    for col, sig in cols.items():
        s = tl.get(sig)
        by_ts = {round(ts - t0, 1): v for ts, v in zip(s.ts.tolist(), s.values.tolist(), strict=True)} if s else {}
        for row in rows:
            if row[col] == "":
                continue
            got = by_ts.get(round(float(row["t_s"]), 1))
            if got is None:  # the tsv's t_s is rounded; match the nearest scrape
                got = min(by_ts.items(), key=lambda kv: abs(kv[0] - float(row["t_s"])))[1]
            assert got == pytest.approx(float(row[col]), rel=1e-4, abs=0.006), (run, col, row["t_s"])
            checked += 1
    assert checked > 100
    # counter rates: output tok/s between consecutive rows of the tsv
    out = tl.get("output_tps")
    gen = [(file_ts(p), float(r["generation_tokens_total"])) for p, r in zip(files, rows, strict=True) if r["generation_tokens_total"]]
    expected = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(gen, gen[1:], strict=False)]
    assert out is not None and out.values[-len(expected):] == pytest.approx(expected, rel=1e-9)
    pr = tl.get("prompt_tps")
    ptok = [(file_ts(p), float(r["prompt_tokens_total"])) for p, r in zip(files, rows, strict=True) if r["prompt_tokens_total"]]
    expected = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(ptok, ptok[1:], strict=False)]
    assert pr is not None and pr.values[-len(expected):] == pytest.approx(expected, rel=1e-9)
    assert tl.version == ">=0.5.23"
    assert t.report.scrapes == len(files) and t.report.errors == 0


def test_kv_full_retract_sequence_signals() -> None:
    files = scrape_files("kv-full-retract")
    tl, t = ingest([(file_ts(p), p.read_text()) for p in files])
    st = tl.stats("retracted_reqs")
    rr = tl.get("retracted_reqs")
    assert sum(rr.values) == 9  # README: 9 retractions, counter 9
    assert len(set(rr.ts.tolist())) == len(rr.ts) == len(files)  # one reading per scrape: gauge first, then counter
    assert st["max"] >= 1
    assert max(tl.get("token_usage").values) == pytest.approx(0.96)
    # prefill tokens from prefill_effective_tokens_total{mode}: sums over the window match the counter
    first, final = files[0].read_text(), files[-1].read_text()

    def eff(text: str, mode: str) -> float:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "sglang:prefill_effective_tokens_total" and s.labels.get("mode") == mode:
                    return s.value
        raise AssertionError(mode)

    assert sum(tl.get("prefill_new_tokens").values) == eff(final, "input") - eff(first, "input")
    assert sum(tl.get("prefill_cached_tokens").values) == eff(final, "device_hit") - eff(first, "device_hit")
    assert all(0 <= v <= 1 for v in tl.get("cache_hit_rate").values)
    # quantiles over each interval and over the whole window
    p50, p95 = tl.get("ttft_seconds_p50"), tl.get("ttft_seconds_p95")
    assert all(a <= b for a, b in zip(p50.values, p95.values, strict=True))
    wq = m.window_quantiles(t.state)
    assert 2.0 <= wq["ttft_seconds_p50"] <= 10.0  # README: mean TTFT 5.88 s
    assert wq["ttft_seconds_p50"] <= wq["ttft_seconds_p95"]
    assert 1.0 <= wq["queue_time_seconds_p95"] <= 20.0


def test_counter_reset_is_survived() -> None:
    files = scrape_files("kv-full-retract")
    texts = [(file_ts(p), p.read_text()) for p in files[:8]]
    # the server restarts: the next scrape shows the counters of an early scrape again
    texts.append((texts[-1][0] + 2.0, files[1].read_text()))
    tl, t = ingest(texts)
    assert t.state.resets >= 1
    assert all(v >= 0 for v in tl.get("request_rate").values)
    assert all(v >= 0 for v in tl.get("prompt_tps").values)


def test_histogram_quantile_matches_prometheus_definition() -> None:
    # buckets le=0.1:10, 0.2:30, 0.4:40, +Inf:40 → p50 at rank 20 lies halfway in (0.1, 0.2]
    b = [(0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (math.inf, 40.0)]
    assert m.histogram_quantile(0.5, b) == pytest.approx(0.15)
    assert m.histogram_quantile(0.95, b) == pytest.approx(0.2 + 0.2 * (38 - 30) / 10)
    assert m.histogram_quantile(1.0, [(0.1, 1.0), (math.inf, 2.0)]) == pytest.approx(0.1)  # +Inf → last bound
    assert math.isnan(m.histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))


ALL_FILES = EXPOSITIONS + sorted(CPU_REAL.glob("*/metrics/*.prom")) + sorted(CPU_REAL.glob("*/metrics_*.prom"))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_fast_path_reads_the_same_samples_as_prometheus_client(path: Path) -> None:
    text = path.read_text()
    fast = sorted((n, sorted(lab.items()), v) for n, lab, v in m.fast_samples(text) if not math.isnan(v))
    ref = sorted((n, sorted(lab.items()), v) for n, lab, v in m.samples_from_families(text_string_to_metric_families(text)) if not math.isnan(v))
    assert fast == ref
    assert len(fast) > 5


@pytest.mark.parametrize("run", RUNS)
def test_fast_and_reference_paths_give_identical_signals(run: str) -> None:
    texts = [(file_ts(p), p.read_text()) for p in scrape_files(run)]
    a, ta = ingest(texts, fast=True)
    b, tb = ingest(texts, fast=False)
    pa = sorted((k, s.ts.tolist(), s.values.tolist()) for k, s in a.series.items())
    pb = sorted((k, s.ts.tolist(), s.values.tolist()) for k, s in b.series.items())
    assert pa == pb
    assert {k: v.value for k, v in a.config.items()} == {k: v.value for k, v in b.config.items()}
    assert a.version == b.version


def test_fast_path_matches_library_on_label_escapes_and_spacing() -> None:
    base = (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text()
    run_line = next(ln for ln in base.splitlines() if ln.startswith("sglang:num_running_reqs{"))
    odd = [
        run_line.replace('model_name="tiny-llama"', r'model_name="org/m \"q\" \\ x\ny"'),
        run_line.replace("} ", "}   ").replace("44.0", "4.4e+01 1732000000000"),  # spacing, timestamp
        'sglang_num_queue_reqs{engine_type="unified",model_name="m",cache_source="device",} 3',  # trailing comma
        "sglang:gen_throughput 12.5",  # no labels
        'sglang:token_usage{model_name="m"} NaN',
        'sglang:num_used_tokens{model_name="m"} +Inf',
    ]
    text = "\n".join(odd) + "\n"
    fast = m.fast_samples(text)
    ref = m.samples_from_families(text_string_to_metric_families(text))

    def norm(samples: list) -> list:
        return sorted((n, sorted(lab.items()), "nan" if math.isnan(v) else v) for n, lab, v in samples)

    assert norm(fast) == norm(ref) and len(fast) == 6
    assert fast[0][1]["model_name"] == 'org/m "q" \\ x\ny'


@pytest.mark.parametrize(("drop_from", "extra", "expected"), [
    # names of 0.5.17+ removed, and a name that 0.5.17 removed added: a 0.5.16 server
    ((0, 5, 17), 'sglang:engine_startup_time{model_name="tiny-llama"} 12.0', "0.5.16"),
    ((0, 5, 12), 'sglang:num_prefill_prealloc_queue_reqs{model_name="tiny-llama"} 0.0', "0.5.11"),
])
def test_version_from_added_and_removed_names(drop_from: tuple[int, int, int], extra: str, expected: str) -> None:
    """The 0.5.23 exposition with the names of newer releases taken out reads as the older release."""
    from diagnoser.engines.sglang.metric_names import VERSION_HINTS

    newer = {n.removesuffix("_count") for n, low, _ in VERSION_HINTS if low and low >= drop_from}
    keep = [ln for ln in (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text().splitlines()
            if not any(ln.startswith((f"sglang:{n}{{", f"sglang:{n}_", f"sglang:{n} ")) for n in newer)]
    tl, t = ingest([(1.0, "\n".join(keep + [extra]) + "\n")])
    assert tl.version == expected, t.state.version.reasons


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_line_fast_path_equals_the_whole_text_regex_on_first_and_repeated_scrapes(path: Path) -> None:
    """fast_samples reads a label text with the grammar once, then from its cache: both reads must equal
    the whole-text grammar (fast_samples_regex) sample for sample, in order."""
    text = path.read_text()
    m._LABEL_CACHE.clear()

    def norm(samples: list) -> list:
        return [(n, sorted(lab.items()), "nan" if math.isnan(v) else v) for n, lab, v in samples]

    ref = norm(m.fast_samples_regex(text))
    first = norm(m.fast_samples(text))
    assert m._LABEL_CACHE, "label texts of wanted lines are cached"
    again = norm(m.fast_samples(text))
    assert first == ref and again == ref and len(ref) > 5


def test_line_fast_path_odd_lines_agree_with_the_regex_and_the_library() -> None:
    base = (METRICS_DIR / "sglang-0.5.23_collector_metrics.prom").read_text()
    run_line = next(ln for ln in base.splitlines() if ln.startswith("sglang:num_running_reqs{"))
    lab = run_line[run_line.index("{"):run_line.rindex("}") + 1]
    odd = [
        run_line,
        run_line.replace("} ", "}\t").replace("sglang:", "sglang_"),  # tab, underscore spelling
        run_line.replace("} ", "}"),  # no blank before the value: not a sample (both grammars)
        run_line.replace("sglang:num_running_reqs", "sglang:num_running_reqs_x"),  # unwanted name
        run_line.replace("sglang:", "sglangX"),  # not the prefix
        f"sglang:num_queue_reqs{lab} 7 1732000000000",  # same label text, other family, timestamp
        'sglang:token_usage{model_name="a}b",x="{"} 0.5',  # braces inside quoted values
        "sglang:gen_throughput 12.5",  # no labels
        "sglang:gen_throughput\t13.5",
        "sglang:gen_throughput 1 {junk}",  # a brace after the value
        'sglang:num_used_tokens{model_name="m"} notanumber',
        "sglang",
    ]
    text = "\n".join(odd) + "\n"

    def norm(samples: list) -> list:
        return [(n, sorted(lab.items()), "nan" if math.isnan(v) else v) for n, lab, v in samples]

    m._LABEL_CACHE.clear()
    ref = norm(m.fast_samples_regex(text))
    assert norm(m.fast_samples(text)) == ref and norm(m.fast_samples(text)) == ref
    names = [s[0] for s in ref]
    assert names == ["num_running_reqs", "num_running_reqs", "num_queue_reqs", "token_usage",
                     "gen_throughput", "gen_throughput", "gen_throughput"]
    assert ref[3][1] == [("model_name", "a}b"), ("x", "{")]
    lib = [s for s in m.samples_from_families(text_string_to_metric_families("\n".join(odd[:2] + odd[5:9]) + "\n"))]
    assert sorted(norm(lib)) == sorted(r for r in ref if r[0] != "gen_throughput" or r[2] != 1)


def test_label_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m, "LABEL_CACHE_MAX", 10)
    m._LABEL_CACHE.clear()
    text = "".join(f'sglang:num_running_reqs{{model_name="m{i}"}} {i}\n' for i in range(25))
    got = m.fast_samples(text)
    assert [s[2] for s in got] == [float(i) for i in range(25)]
    assert [s[1]["model_name"] for s in got] == [f"m{i}" for i in range(25)]
    assert 0 < len(m._LABEL_CACHE) <= 10
