"""``--client-results``: the load tools' result files, and the reconciliation with the server's numbers.

The acceptance case is REAL: SGLang's ``bench_serving`` run against the real SGLang 0.5.23 CPU engine,
recorded with the server's scrapes and log (tests/data/client-results/sglang-cpu-bench-serving, see its
README). The other tools' files are built from their writers' field lists (tests/data/client-results/
README.md says which files and where each field comes from).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from diagnoser.sources.client_results import ClientResultsError, read_client_results

DATA = Path(__file__).parent / "data" / "client-results"
RUN = DATA / "sglang-cpu-bench-serving"


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """The recorded run, with the result file's modification time set back to when bench_serving wrote it."""
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    meta = json.loads((RUN / "client_run.json").read_text())
    os.utime(d / "bench_serving.jsonl", (meta["output_mtime"], meta["output_mtime"]))
    return d


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnoser", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="80"))


def rows(sec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in sec["rows"]}


def test_reads_a_real_bench_serving_jsonl() -> None:
    raw = json.loads((RUN / "bench_serving.jsonl").read_text().splitlines()[-1])
    run = read_client_results(str(RUN / "bench_serving.jsonl"))
    assert run.tool == "SGLang bench_serving"
    assert run.completed == raw["completed"] == 48 and run.sent == len(raw["errors"]) == 48 and run.failed == 0
    assert run.duration_s == pytest.approx(raw["duration"]) and run.output_tokens == raw["total_output_tokens"]
    assert run.output_tps == pytest.approx(raw["output_throughput"]) and run.total_tps == pytest.approx(raw["total_throughput"])
    assert run.ttft_p50_s == pytest.approx(raw["median_ttft_ms"] / 1000) and run.ttft_p95_s == pytest.approx(raw["p95_ttft_ms"] / 1000)
    assert run.max_concurrency == 12 and run.mean_concurrency == pytest.approx(raw["concurrency"])
    assert run.request_rate is None  # "inf": as fast as it can


def test_reconciles_the_real_run_with_the_servers_scrapes(run_dir: Path) -> None:
    """The recorded server counted the same requests and tokens as the client over the client's window;
    the gap the user would ask about (TTFT of ~9 s, 12 clients on a server that runs 4) is named."""
    out = diagnose("--once", "--replay", str(run_dir), "--client-results", str(run_dir / "bench_serving.jsonl"), "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    sec = json.loads(out.stdout)["client"]
    assert sec["tool"] == "SGLang bench_serving" and "modification time" in sec["window"]["basis"]
    assert sec["window"]["length_s"] == pytest.approx(61.3, abs=0.1)
    r = rows(sec)
    # the same tokens and requests, counted by both sides
    assert r["output_tokens"]["client"] == 3072 and r["output_tokens"]["server"] == pytest.approx(3072, abs=64)
    assert r["requests"]["client"] == 48 and r["requests"]["server"] == pytest.approx(48, abs=1)
    assert r["output_tps"]["diff"] == pytest.approx(0, abs=0.05)
    # the server's decode rate is above what the client saw over its whole run
    assert r["gen_tps_decoding"]["server"] > r["output_tps"]["client"]
    # TTFT: the server's histogram and the client agree within the histogram's bucket width
    assert r["ttft_p50"]["server"] == pytest.approx(r["ttft_p50"]["client"], rel=0.35)
    # requests sent vs admitted vs queued
    assert r["sent"]["client"] == 48 and r["concurrency"]["server"] == 4 and r["queued"]["server"] >= 4
    assert sec["server"]["max_running_requests"] == 4 and sec["server"]["queue_max"] >= 7
    gaps = " ".join(sec["gaps"])
    assert "--max-running-requests" in gaps and "queue" in gaps  # 12 in flight, 4 run: the rest wait
    assert "counts prompt tokens too" in gaps  # 150 total tok/s is not the output rate
    assert "prompt tokens than the client" in gaps  # the server tokenises the decoded ids again: 142 per prompt


def test_without_a_usable_time_the_run_is_placed_on_the_busy_readings(tmp_path: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    now = time.time()
    os.utime(d / "bench_serving.jsonl", (now, now))  # copied today: far from the recording's clock
    out = diagnose("--once", "--replay", str(d), "--client-results", str(d / "bench_serving.jsonl"), "--format", "json")
    sec = json.loads(out.stdout)["client"]
    assert "busy readings" in sec["window"]["basis"] and any("do not meet" in n for n in sec["notes"])
    r = rows(sec)
    assert r["requests"]["server"] == pytest.approx(48, abs=1) and r["output_tokens"]["server"] == pytest.approx(3072, abs=64)


def test_text_section_fits_80_columns(run_dir: Path) -> None:
    out = diagnose("--once", "--replay", str(run_dir), "--client-results", str(run_dir / "bench_serving.jsonl"))
    text = out.stdout
    assert "What the client saw (SGLang bench_serving" in text
    part = text[text.index("What the client saw"):]
    assert "output tok/s" in part and "TTFT median (s)" in part and "queued at the server" in part
    assert max(len(line) for line in part.splitlines()) <= 80


@pytest.mark.parametrize(("name", "tool", "failed"), [
    ("vllm-bench-serve.json", "vLLM bench serve", 0),
    ("genai-perf_genai_perf.json", "GenAI-Perf", None),
    ("profile_export_aiperf.json", "AIPerf", 2),
    ("guidellm-benchmarks.json", "GuideLLM", 0),
])
def test_reads_the_other_tools_files(name: str, tool: str, failed: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")  # vLLM's "date" is the benchmark machine's local time
    time.tzset()
    try:
        run = read_client_results(str(DATA / name))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert run.tool == tool
    assert run.completed == 48 and run.failed == failed
    assert run.output_tps == pytest.approx(50.1, abs=0.1)
    if tool == "GuideLLM":  # its writer's own median (from its distribution summary), not numpy's
        raw = json.loads((DATA / name).read_text())["benchmarks"][-1]["metrics"]["time_to_first_token_ms"]["successful"]
        assert run.ttft_p50_s == pytest.approx(raw["median"] / 1000) and run.ttft_p95_s == pytest.approx(raw["percentiles"]["p95"] / 1000)
    else:
        assert run.ttft_p50_s == pytest.approx(8.969, abs=0.01)
    assert run.duration_s == pytest.approx(61.3, abs=0.1)
    assert run.max_concurrency == 12
    if tool != "GenAI-Perf":  # GenAI-Perf writes no time; the others place the run themselves
        assert run.end == pytest.approx(1796222311.3, abs=1.5) and run.time_basis
    if tool == "AIPerf":
        assert run.errors == {"Service Unavailable": 2} and run.sent == 50


def test_another_tools_file_reconciles_with_the_recorded_server(tmp_path: Path) -> None:
    out = diagnose("--once", "--replay", str(RUN), "--client-results", str(DATA / "guidellm-benchmarks.json"), "--format", "json")
    sec = json.loads(out.stdout)["client"]
    assert sec["tool"] == "GuideLLM" and sec["window"]["basis"] == "the file"
    r = rows(sec)
    assert r["requests"]["server"] == pytest.approx(48, abs=1) and r["output_tokens"]["server"] == pytest.approx(3072, abs=64)
    aip = json.loads(diagnose("--once", "--replay", str(RUN), "--client-results", str(DATA / "profile_export_aiperf.json"),
                              "--format", "json").stdout)["client"]
    assert any("2 of 50 requests failed" in g and "Service Unavailable" in g for g in aip["gaps"]), aip["gaps"]


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    ("", "empty"),
    ("not json\n", "line 1 is not JSON"),
    ('{"hello": 1}', "not a result diagnoser reads"),
    ('{"benchmarks": []}', "no benchmark in it"),
    ("[1, 2]", "no JSON object"),
])
def test_bad_files_are_one_sentence(tmp_path: Path, content: str | None, says: str) -> None:
    p = tmp_path / "results.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(ClientResultsError, match=says):
        read_client_results(str(p))
    out = diagnose("--once", "--log", str(RUN / "server.log"), "--client-results", str(p))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("diagnose: --client-results ") and says in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_serve_shows_what_the_client_saw_on_the_target_page(run_dir: Path, tmp_path: Path) -> None:
    """The dashboard's panel: the recorded run replayed fast as a live target, the client's file beside it."""
    from tests.browser.serve_proc import Serve

    serve = Serve(["--replay", str(run_dir), "--speed", "30", "--interval", "1", "--client-results", str(run_dir / "bench_serving.jsonl")],
                  tmp_path / "serve.log")
    try:
        def done() -> Any:
            sec = serve.get("/target/0.json").json().get("client")
            return sec if sec and rows(sec)["requests"]["server"] and rows(sec)["requests"]["server"] >= 47 else None

        sec = serve.wait_for(done, timeout=60, what="the replay to reach the end of the client's run")
        assert sec["tool"] == "SGLang bench_serving" and rows(sec)["output_tokens"]["server"] == pytest.approx(3072, abs=64)
        html = serve.get("/target/0").text
        assert "What the client saw" in html and "--max-running-requests" in html and "output tok/s" in html
    finally:
        serve.close()


def test_serve_refuses_a_bad_client_file_in_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text('{"hello": 1}')
    out = diagnose("serve", "--log", str(RUN / "server.log"), "--client-results", str(bad), "--port", "1")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "not a result diagnoser reads" in out.stderr, out.stderr


def test_mutated_files_never_raise_anything_but_the_one_sentence(tmp_path: Path) -> None:
    """Every value of each real or writer-built file replaced by a value of another type (seeded): the reader
    and the reconciliation answer, or the reader says one sentence; nothing else is raised."""
    import random

    from diagnoser.timeline import Timeline
    from diagnoser.timeline.client import reconcile

    rnd = random.Random(27)
    odd = [None, "x", -1, 1e308, float("nan"), [], {}, True, "inf", [1, "a"], {"successful": "y"}]
    files = [RUN / "bench_serving.jsonl", *sorted(DATA.glob("*.json"))]
    empty, tl = Timeline(target="t"), Timeline(target="t")  # a small timeline over the run's own clock too
    for i in range(40):
        ts = 1796222250.0 + 2 * i
        for name, v in (("running_reqs", 4.0), ("queue_reqs", 8.0 if i < 30 else 0.0), ("output_tps", 50.0), ("request_rate", 0.8),
                        ("prompt_tps", 110.0), ("gen_throughput_tps", 55.0), ("ttft_seconds_p50", 8.0), ("queue_time_seconds_p95", 9.0)):
            tl.add(name, ts, v, "test")
    tl.set_config("max_running_requests", 4, "test")
    for f in files:
        base = json.loads(f.read_text().splitlines()[-1] if f.suffix == ".jsonl" else f.read_text())

        def paths(d: Any, pre: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            out = [pre] if pre else []
            if isinstance(d, dict):
                for k, v in d.items():
                    out += paths(v, (*pre, k))
            elif isinstance(d, list):
                for i, v in enumerate(d[:3]):
                    out += paths(v, (*pre, i))
            return out

        every = paths(base)
        for _ in range(60):
            doc = json.loads(json.dumps(base))
            for p in rnd.sample(every, min(len(every), rnd.randint(1, 6))):
                node = doc
                try:
                    for k in p[:-1]:
                        node = node[k]
                    node[p[-1]] = rnd.choice(odd)
                except (KeyError, IndexError, TypeError):
                    continue
            path = tmp_path / f.name
            path.write_text(json.dumps(doc))
            try:
                run = read_client_results(str(path))
            except ClientResultsError as e:
                assert str(e).startswith("--client-results ") and str(e).endswith("."), e
                continue
            for t in (empty, tl):
                json.dumps(reconcile(run, t), allow_nan=True)
