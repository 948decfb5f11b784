"""``diagnose plan``: the offline calculator, text table and JSON, on the seed numbers and a real log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.cli import main

SEED = Path(__file__).parent / "cases" / "seed-kimi-k25"
CONFIGS = Path(__file__).parent / "capacity_configs"
SEED_ARGS = ["plan", "--model-config", str(SEED / "config.json"), "--tp", "8", "--mem-fraction-static", "0.85",
             "--max-total-tokens", "116171", "--gpu-mem-gb", "96", "--host-mem-gb", "449", "--avg-tokens-per-request", "4340",
             "--avg-output-tokens", "4116", "--client-concurrency", "150", "--job-requests", "88000",
             "--gen-throughput", "835", "--running", "52"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_text_is_a_short_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SEED_ARGS, capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "MLA" in lines[0] and "TP 8" in lines[0]
    assert "70,272 B/token/rank" in lines[1] and "116,171" in lines[1]
    hdr = next(i for i, ln in enumerate(lines) if ln.startswith("change"))
    for col in ("pool tok", "max req", "running", "gen tok/s", "ETA", "conf"):
        assert col in lines[hdr]
    rows = []
    for ln in lines[hdr + 2:]:
        if not ln.strip():
            break
        rows.append(ln)
    assert 4 <= len(rows) <= 10  # readable in ten seconds: a handful of rows
    assert rows[0].startswith("current settings") and "5.0 d" in rows[0]
    changes = " ".join(rows)
    assert "--enable-dp-attention" in changes or "--attn-dp-size" in changes
    assert "--mem-fraction-static 0.85 →" in changes and "fp8_e4m3" in changes and "--hicache-ratio" in changes
    assert "--cpu-offload-gb" not in out
    assert all(len(ln) <= 100 for ln in lines)
    # every row has numbers in the pool column
    assert all(any(ch.isdigit() for ch in r[42:52]) for r in rows)


def test_plan_json_keys_and_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(SEED_ARGS + ["--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["bytes_per_token_per_rank"] == 70272 and doc["pool_tokens"] == 116171
    assert doc["max_concurrent_requests"] == 116171 // 4340
    assert 4.5 * 24 < doc["job_eta_hours"] < 5.5 * 24
    keys = {"change", "pool_tokens", "max_concurrent_requests", "projected_running", "projected_gen_throughput_tps",
            "job_eta_hours", "confidence", "assumptions"}
    assert doc["scenarios"] and all(keys <= set(s) for s in doc["scenarios"])
    fp8 = next(s for s in doc["scenarios"] if "fp8" in s["change"])
    assert fp8["pool_tokens"] == 2 * 116171
    frac = [s for s in doc["scenarios"] if s["change"].startswith("--mem-fraction-static") and not s["risky"]]
    assert frac and frac[0]["headroom_gib"] >= 6.0
    hic = next(s for s in doc["scenarios"] if "hicache" in s["change"])
    assert hic["projected_running"] == 52 and hic["pool_tokens"] == 116171  # prefix cache only


def test_plan_from_a_real_log(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = data_dir / "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log"
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--log", str(log), "--mem-fraction-static", "0.9",
                        "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["pool_tokens"] == 1707904 and doc["bytes_per_token_per_rank"] == 147456
    assert doc["memory"]["free_before_weights_gib"] == 275.75 and doc["headroom_gib"] == 21.24
    up = next(s for s in doc["scenarios"] if s["change"].startswith("--mem-fraction-static 0.9 →"))
    per_001 = 0.01 * 275.75 * (1 << 30) / 147456
    assert up["pool_tokens"] - 1707904 == pytest.approx(per_001 * (float(up["change"].split("→ ")[1]) - 0.9) * 100, rel=0.01)


def test_plan_sizes_the_pool_from_gpu_and_weights(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--tp", "1", "--gpu-mem-gb", "80",
                        "--weights-gb", "15", "--mem-fraction-static", "0.9", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    pre = 80 - 1.5
    budget = (pre - 15) - pre * 0.1
    assert doc["pool_tokens"] == int(budget * (1 << 30) // 131072)
    assert "formula" in doc["pool_source"]


@pytest.mark.parametrize(("argv", "msg"), [
    (["plan", "--tp", "8", "--max-total-tokens", "1000"], "pass --model-config"),
    (["plan", "--model-config", "/nonexistent/config.json"], "does not exist"),
    (["plan", "--model-config", str(CONFIGS / "qwen3-8b.json")], "cannot size the pool"),
    (["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--running", "3"], "go together"),
    (["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--max-total-tokens", "9", "--kv-cache-dtype", "int3"], "unknown --kv-cache-dtype"),
    (["plan", "--tp", "x"], "invalid int value"),
])
def test_plan_errors_are_one_sentence(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert msg in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(("version", "flag", "extra"), [("0.5.23", "--attn-dp-size", None), ("0.5.8", "--enable-dp-attention", "--dp-size 8")])
def test_plan_spells_dp_attention_for_the_version(version: str, flag: str, extra: str | None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(SEED_ARGS + ["--sglang-version", version, "--format", "json"], capsys)
    assert code == 0
    dp = next(s for s in json.loads(out)["scenarios"] if s["flag"] in ("--attn-dp-size", "--enable-dp-attention"))
    assert dp["flag"] == flag
    assert (extra in dp["extra_flags"]) if extra else not any(e.startswith("--dp-size") for e in dp["extra_flags"])


def test_plan_rejects_a_bad_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(SEED_ARGS + ["--sglang-version", "banana"], capsys)
    assert code == 2 and "is not a version" in err


def test_plan_from_the_seed_log_agrees_with_diagnose_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The offline calculator and the live advice are one model: same log, same numbers."""
    common = ["--model-config", str(SEED / "config.json"), "--client-concurrency", "150", "--job-requests", "88000",
              "--avg-tokens-per-request", "4340"]
    code, out, _ = run(["plan", "--log", str(SEED / "server.log"), *common, "--format", "json"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert plan["workload"]["kv_bound"] and plan["workload"]["demand"] >= 140
    code, out, _ = run(["--once", "--log", str(SEED / "server.log"), *common, "--format", "json"], capsys)
    live = json.loads(out)
    fp8_live = next(s["projection"] for f in live["findings"] for s in f["suggestions"] if s["flag"] == "--kv-cache-dtype")
    fp8_plan = next(s for s in plan["scenarios"] if s["flag"] == "--kv-cache-dtype")
    for k in ("pool_tokens", "projected_running", "projected_gen_throughput_tps", "job_eta_hours"):
        assert fp8_live[k] == fp8_plan[k], k
