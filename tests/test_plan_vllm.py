"""``diagnose plan --engine vllm``: vLLM's KV cache, concurrency, tok/s and ETA, against the real vLLM CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.cli import main

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "vllm-configs" / "tiny-llama.json")
MID = str(DATA / "vllm-configs" / "llama-94m.json")
REAL = DATA / "vllm-cpu-real"
SGLANG_LOG = DATA / "sglang-cpu-real"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run(["plan", *argv, "--format", "json"], capsys)
    assert code == 0, err
    return json.loads(out)


def _startup(log: Path) -> tuple[int, float, int]:
    """The run's own 'KV cache size: N tokens, Maximum concurrency for L tokens per request: Xx' line."""
    import re

    text = log.read_text(errors="replace")
    m = re.search(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    assert m
    return int(m.group(1).replace(",", "")), float(m.group(3)), int(m.group(2).replace(",", ""))


@pytest.mark.parametrize("run_dir", ["kv-full-preemption", "max-num-seqs-cap", "small-batched-tokens", "client-bound"])
def test_plan_from_config_matches_each_real_run(run_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No log: the config, VLLM_CPU_KVCACHE_SPACE=1 and the run's flags give the numbers the run printed."""
    log = REAL / run_dir / "server.log"
    tokens, conc, mml = _startup(log)
    args = ["--engine", "vllm", "--model-config", TINY, "--device", "cpu", "--kv-cache-memory-bytes", "1GiB",
            "--max-model-len", str(mml), "--vllm-version", "0.32.0"]
    if "Overriding num_gpu_blocks" in log.read_text(errors="replace"):
        args += ["--num-gpu-blocks-override", "8"]
    doc = plan_json(args, capsys)
    assert doc["engine"] == "vllm" and doc["fits"] is True
    assert doc["pool_tokens"] == tokens and doc["max_concurrency"] == conc
    assert doc["kv_cache"]["block_size"] == 128 and doc["bytes_per_token_per_rank"] == 512


def test_plan_beside_a_real_log_is_detected_as_vllm_and_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    log = REAL / "kv-full-preemption" / "server.log"
    tokens, conc, _ = _startup(log)
    doc = plan_json(["--model-config", TINY, "--log", str(log), "--kv-cache-memory-bytes", "1GiB", "--avg-tokens-per-request", "260",
                     "--job-requests", "1000", "--avg-output-tokens", "200"], capsys)  # no --engine: the log is vLLM's
    assert doc["engine"] == "vllm" and doc["version"] == "0.32.0" and doc["device"] == "cpu"
    assert doc["pool_tokens"] == tokens
    rows = {r["what"]: r for r in doc["engine_vs_estimate"]}
    assert rows["KV cache tokens"]["difference"] == 0 and rows["concurrency @ 512"]["difference"] == 0
    assert rows["blocks before override"]["engine"] == rows["blocks before override"]["estimate"] == 16384
    # the override fixes the blocks: a capacity what-if (fp8, utilization) would change nothing, so none is offered
    assert {s["flag"] for s in doc["scenarios"]} <= {"--max-model-len"}
    # the throughput comes from the run's own decode lines, as a range, and gives the job an ETA
    lo, hi = doc["gen_throughput_tps_range"]
    assert 0 < lo <= doc["gen_throughput_tps"] <= hi
    assert doc["job_eta_hours"] == pytest.approx(1000 * 200 / doc["gen_throughput_tps"] / 3600, abs=1e-3)


def test_plan_text_shows_vllms_own_terms(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--max-model-len", "4096",
                          "--vllm-version", "0.11.0", "--avg-tokens-per-request", "1500"], capsys)
    assert code == 0 and err == ""
    first = " ".join(out.splitlines()[:2])  # the heading, wrapped at the width
    assert "vLLM 0.11.0" in first and "H100" in first and "gpu-memory-utilization 0.9" in first  # 0.11.0's default
    assert "KV cache size" in out and "maximum concurrency" in out
    for flag in ("--gpu-memory-utilization 0.9 → 0.95", "--kv-cache-dtype auto → fp8", "--max-model-len 4,096 →",
                 "--tensor-parallel-size 1 → 2"):
        assert flag in out
    assert "--mem-fraction-static" not in out and "--tp-size" not in out  # no SGLang spelling


def test_a_max_model_len_that_cannot_start_says_vllms_message(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(["--engine", "vllm", "--model-config", MID, "--gpu-mem-gb", "8", "--weights-gb", "2", "--activation-gb", "1.5",
                     "--max-model-len", "524288"], capsys)  # 4 GiB of KV for one request; 7.36 − 4.5 GiB of budget
    assert doc["fits"] is False
    assert doc["verdict"].startswith("vLLM would not start: To serve at least one request with the model's max seq len (524288)")
    assert "the estimated maximum model length is" in doc["verdict"]
    lower = [s for s in doc["scenarios"] if s["flag"] == "--max-model-len"]
    assert lower and lower[0]["proposed"] < 524288 and lower[0]["fits"]
    code, out, err = run(["plan", "--engine", "vllm", "--model-config", MID, "--gpu-mem-gb", "4", "--weights-gb", "3",
                          "--max-model-len", "4096"], capsys)
    assert code == 0 and "No available memory for the cache blocks" in out


def test_cpu_offload_is_a_slowdown_note(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(["--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--max-model-len", "4096", "--cpu-offload-gb", "4"],
                    capsys)
    assert doc["notes"][0].startswith("--cpu-offload-gb 4 streams 4 GiB of weights")
    assert "--cpu-offload-gb" not in {s["flag"] for s in doc["scenarios"]}


def test_wrong_engine_options_are_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--mem-fraction-static", "0.8"], capsys)
    assert code == 2 and "--mem-fraction-static is an SGLang option; with --engine vllm use --gpu-memory-utilization" in err
    assert "Traceback" not in err
    code, out, err = run(["plan", "--model-config", MID, "--gpu", "H100", "--gpu-memory-utilization", "0.8"], capsys)
    assert code == 2 and "--gpu-memory-utilization is a vLLM option: add --engine vllm" in err
    code, out, err = run(["plan", "--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--gpu-memory-utilization", "1.2"], capsys)
    assert code == 2 and "at most 1" in err
    sglang_log = next(SGLANG_LOG.glob("*/server.log"))
    code, out, err = run(["plan", "--engine", "vllm", "--model-config", MID, "--log", str(sglang_log)], capsys)
    assert code == 2 and "is not a vLLM log" in err and "Traceback" not in err


def test_plan_help_mentions_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--engine {sglang,vllm}" in out and "--gpu-memory-utilization" in out and "--kv-cache-memory-bytes" in out


def test_vllm_plan_and_compare_validate_against_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_schema import validator

    doc = plan_json(["--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--max-model-len", "4096"], capsys)
    assert not list(validator("plan").iter_errors(doc))
    code, out, err = run(["compare", str(REAL / "max-num-seqs-cap"), str(REAL / "client-bound"), "--format", "json"], capsys)
    cmp = json.loads(out)
    assert not list(validator("compare").iter_errors(cmp))
    assert cmp["engine"] == "vllm" and cmp["engines"] == {"before": "vllm", "after": "vllm"}
    # vLLM's non-default args are the flags: the one that differs, spelled as vLLM spells it
    assert {"flag": "--max-num-seqs", "before": 2, "after": 16, "kind": "server arg"} in cmp["flags_changed"]
    assert "preemptions" in {h["label"] for h in cmp["headline"]}
    code, out, err = run(["compare", str(REAL / "max-num-seqs-cap"), str(REAL / "client-bound")], capsys)
    assert out.startswith("diagnoser compare · vLLM 0.32.0 · verdict: ")


def test_the_engines_kv_cache_size_wins_over_the_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # lines as vLLM 0.32.0 formats them (gpu_model_runner.py, gpu_worker.py, kv_cache_utils.py)
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) INFO 12-02 10:00:00 [api_utils.py:286] non-default args: {'model': 'x', 'max_model_len': 32768, "
        "'gpu_memory_utilization': 0.9}\n"
        "(EngineCore_DP0 pid=2) INFO 12-02 10:00:10 [gpu_model_runner.py:5150] Model loading took 15.26 GiB memory and 10.0 seconds\n"
        "(EngineCore_DP0 pid=2) INFO 12-02 10:00:20 [gpu_worker.py:761] Available KV cache memory: 52.10 GiB\n"
        "(EngineCore_DP0 pid=2) INFO 12-02 10:00:21 [kv_cache_utils.py:2327] GPU KV cache size: 379,392 tokens, "
        "Maximum concurrency for 32,768 tokens per request: 11.58x\n")
    cfg = Path(__file__).parent / "capacity_configs" / "llama-3.1-8b.json"
    doc = plan_json(["--log", str(log), "--model-config", str(cfg), "--gpu", "H100", "--vllm-version", "0.32.0"], capsys)
    assert doc["engine"] == "vllm" and doc["gpu_memory_utilization"] == 0.9
    assert doc["pool_tokens"] == 379392 and doc["max_concurrency"] == 11.58  # the engine's, not the estimate's
    est = {r["what"]: r for r in doc["engine_vs_estimate"]}["KV cache tokens"]
    assert est["engine"] == 379392 and est["estimate"] != 379392  # the estimate is shown beside, with the difference
    fp8 = next(s for s in doc["scenarios"] if s["flag"] == "--kv-cache-dtype")
    assert fp8["pool_tokens"] == 2 * 379392  # a what-if moves the engine's own figure


def test_free_memory_below_the_request_is_vllms_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(["--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--free-mem-gb", "60", "--max-model-len", "4096",
                     "--gpu-memory-utilization", "0.9"], capsys)
    assert doc["fits"] is False and "is less than desired GPU memory utilization (0.9" in doc["verdict"]
    doc = plan_json(["--engine", "vllm", "--model-config", MID, "--gpu", "H100", "--free-mem-gb", "74", "--max-model-len", "4096",
                     "--gpu-memory-utilization", "0.9"], capsys)
    util = [s for s in doc["scenarios"] if s["flag"] == "--gpu-memory-utilization"]
    assert doc["fits"] and util and util[0]["proposed"] <= 74 / 79.6 and util[0]["fits"]  # never above what is free


def test_plan_on_a_real_refused_start_up_names_vllms_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    log = DATA / "vllm-cpu-startup" / "b-override4.log"  # vLLM 0.32.0 refused: 4 blocks for a 512-token request
    doc = plan_json(["--model-config", TINY, "--log", str(log), "--kv-cache-memory-bytes", "1GiB"], capsys)
    assert doc["engine"] == "vllm" and doc["device"] == "cpu" and doc["kv_cache"]["block_size"] == 128
    assert doc["fits"] is False and "the estimated maximum model length is 384" in doc["verdict"]
    fix = next(s for s in doc["scenarios"] if s["flag"] == "--max-model-len")
    assert fix["proposed"] == 384 and fix["fits"] is True  # the longest that starts, as vLLM itself says
