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
    (["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--dp-attention", "--tp", "4", "--dp", "3"], "DP attention needs"),
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


QWEN_LOG = "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log"


def test_acceptance_qwen3_8b_from_config_gpu_memory_and_fraction_alone(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real Qwen3-8B start-up: 'Load weight begin. avail mem=275.75 GB', '… avail mem=260.48 GB, mem usage=15.28 GB',
    '#tokens: 1707904, K size: 117.28 GB, V size: 117.28 GB'. Its fraction (server_args elided in the log) follows from
    those lines: 1 − (260.48 − 234.56) / 275.75 = 0.906. From the config, that free memory and that fraction alone,
    with no log, the estimate is within 3 % of the engine's weights and pool."""
    log = (data_dir / QWEN_LOG).read_text()
    assert "avail mem=275.75 GB" in log and "mem usage=15.28 GB" in log and "#tokens: 1707904" in log
    fraction = round(1 - (260.48 - (117.28 + 117.28)) / 275.75, 3)
    assert fraction == 0.906
    for memory in (["--free-mem-gb", "275.75"], ["--gpu-mem-gb", str(275.75 + 1.5)]):
        code, out, _ = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), *memory, "--mem-fraction-static", str(fraction),
                            "--format", "json"], capsys)
        assert code == 0
        doc = json.loads(out)
        weights_gib = doc["weights_bytes_per_rank"] / (1 << 30)
        assert abs(weights_gib / 15.28 - 1) < 0.03, weights_gib
        assert abs(doc["pool_tokens"] / 1707904 - 1) < 0.03, doc["pool_tokens"]
        assert doc["weights_source"].startswith("estimate from the model config: 8.19 B parameters, bfloat16")
        assert doc["fits"] and doc["estimate"]["pool_tokens"] == doc["pool_tokens"]
        assert abs(doc["headroom_gib"] / 21.24 - 1) < 0.15  # graphs and buffers are a flat 2.5 GiB estimate


def test_with_the_log_the_engine_wins_and_the_estimate_is_beside_it(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--log", str(data_dir / QWEN_LOG), "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["pool_tokens"] == 1707904 and doc["weights_bytes_per_rank"] == round(15.28 * (1 << 30))
    assert doc["weights_source"].startswith("engine: ") and doc["mem_fraction_static"] == 0.906
    assert "recovered from the engine's memory lines" in doc["mem_fraction_source"]
    rows = {r["what"]: r for r in doc["engine_vs_estimate"]}
    assert rows["weights GiB/rank"]["engine"] == 15.28 and abs(rows["weights GiB/rank"]["difference"]) < 0.01
    assert rows["pool tokens/rank"]["engine"] == 1707904 and abs(rows["pool tokens/rank"]["difference"]) < 0.01
    assert rows["headroom GiB"]["engine"] == 21.24
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--log", str(data_dir / QWEN_LOG)], capsys)
    assert "engine vs estimate" in out and "1,707,904" in out


def test_offline_on_a_named_gpu_with_sglangs_auto_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B on one H100: weights from the config, the H100's usable 81,559 MiB less 1.5 GiB, auto fraction."""
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "H100",
                        "--avg-tokens-per-request", "2000", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["gpu"]["name"] == "H100" and doc["mem_fraction_static"] == 0.83
    assert doc["mem_fraction_source"].startswith("SGLang's automatic value")
    pre = 81559 / 1024 - 1.5
    weights = 8_030_261_248 * 2 / (1 << 30)  # Llama-3.1-8B: 8.03B parameters in bf16
    assert doc["weights_bytes_per_rank"] == 8_030_261_248 * 2
    tokens = int(((pre - weights) - pre * (1 - 0.83)) * (1 << 30) // 131072)
    assert doc["pool_tokens"] == tokens and doc["max_concurrent_requests"] == tokens // 2000
    assert doc["headroom_gib"] == round(pre * 0.17 - 2.5, 2)
    kinds = {c["label"].split()[0] for c in doc["sizing"]}
    assert {"now", "f", "fp8", "TP"} <= kinds
    tp2 = next(s for s in doc["scenarios"] if s["flag"] == "--tp-size")
    assert tp2["proposed"] == 2 and tp2["pool_tokens"] > 2 * tokens  # half the weights and half the KV per token per rank
    keys = {"bytes_per_token_per_rank", "pool_tokens", "pool_source", "max_concurrent_requests", "headroom_gib", "memory",
            "scenarios", "notes", "weights_bytes_per_rank", "weights_source"}
    assert keys <= set(doc)


def test_text_is_one_screen_with_the_scenarios_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "deepseek-v3.json"), "--gpu", "H200", "--tp", "8",
                        "--avg-tokens-per-request", "4096"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) <= 45 and all(len(ln) <= 100 for ln in lines)
    hdr = next(ln for ln in lines if ln.startswith("per GPU rank"))
    for col in ("now", "f 0.", "fp8 KV", "DP attn 8", "TP 16"):
        assert col in hdr
    for row in ("mem fraction", "weights GiB", "KV pool GiB", "headroom GiB", "pool tokens", "requests @ 4,096 tok"):
        assert any(ln.startswith(row) for ln in lines), row
    assert "fp8 e4m3" in out and "H200" in lines[0]


def test_a_model_that_does_not_fit_says_so_and_which_tp_does(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "llama-3.1-70b.json"), "--gpu", "H100", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert not doc["fits"] and doc["pool_tokens"] == 0 and "--tp-size 4" in doc["verdict"]
    tp = next(s for s in doc["scenarios"] if s["flag"] == "--tp-size")
    assert tp["proposed"] == 4 and tp["fits"] and tp["pool_tokens"] > 0
    frac = [s for s in doc["scenarios"] if s["flag"] == "--mem-fraction-static"]
    assert frac and all(s["pool_tokens"] == 0 for s in frac)  # no fraction makes 131 GiB fit in 80


def _hf_cache(root: Path) -> Path:
    repo = root / "hub" / "models--Qwen--Qwen3-8B"
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((CONFIGS / "qwen3-8b.json").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    return repo


def test_model_config_from_a_directory_or_the_local_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    repo = _hf_cache(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    for ref in ("Qwen/Qwen3-8B", str(repo), str(repo / "snapshots" / "0123abc")):
        code, out, _ = run(["plan", "--model-config", ref, "--gpu", "H100", "--format", "json"], capsys)
        assert code == 0, ref
        assert json.loads(out)["bytes_per_token_per_rank"] == 147456
    code, _, err = run(["plan", "--model-config", "Qwen/Qwen3-32B", "--gpu", "H100"], capsys)
    assert code == 2 and "not in the local Hugging Face cache" in err and "nothing is downloaded" in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "msg"), [
    (["--gpu", "TPU-v5"], "unknown --gpu 'TPU-v5'"),
    (["--gpu", "H100", "--tp", "0"], "--tp must be positive"),
    (["--gpu", "H100", "--mem-fraction-static", "1.2"], "between 0 and 1"),
    (["--gpu", "H100", "--tp", "4", "--ep", "3"], "does not divide"),
])
def test_bad_plan_inputs_are_one_sentence(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "--model-config", str(CONFIGS / "qwen3-30b-a3b.json"), *argv], capsys)
    assert code == 2 and out == "" and msg in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_model_configs_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "nokeys.json").write_text('{"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8}')
    (tmp_path / "broken.json").write_text("{not json")
    for path, msg in ((tmp_path / "empty", "has no config.json"), (tmp_path / "nokeys.json", "no hidden_size, vocab_size"),
                      (tmp_path / "broken.json", "is not readable JSON")):
        code, out, err = run(["plan", "--model-config", str(path), "--gpu", "H100"], capsys)
        assert code == 2 and out == "" and msg in err and err.count("\n") == 1, (path, err)
    # weights the config cannot give are not needed when the server's pool is known
    code, out, _ = run(["plan", "--model-config", str(tmp_path / "nokeys.json"), "--max-total-tokens", "1000", "--format", "json"], capsys)
    assert code == 0 and any("weights not estimated" in n for n in json.loads(out)["notes"])


def test_a_given_pool_implies_the_weights_and_a_wrong_config_estimate_is_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    """The seed config says bf16 (no quantization_config): 1 T parameters would not fit, but the server reported
    116,171 tokens at fraction 0.85 on 96 GiB, so its weights were f × free − KV = 0.85 × 94.5 − 7.60 GiB."""
    code, out, _ = run(SEED_ARGS + ["--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    kv = 116171 * 70272 / (1 << 30)
    assert doc["weights_source"].startswith("implied by the pool")
    assert doc["weights_bytes_per_rank"] == round((0.85 * 94.5 - kv) * (1 << 30))
    assert doc["pool_tokens"] == 116171  # the server's pool wins over the estimate
    assert doc["notes"][0].startswith("the config's weights (240.8 GiB/rank) differ from the server's (72.7)")


def test_dp_attention_counts_fp8_attention_weights_at_one_byte(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3 fp8 at TP 8 → DP attention 8: each rank gains 7/8 of the split attention weights, at ~1 B/param."""
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "deepseek-v3.json"), "--gpu", "H200", "--tp", "8", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    dp = next(s for s in doc["scenarios"] if s["flag"] == "--attn-dp-size")
    split = 61 * (1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168)
    extra_gib = split * 7 / 8 * (1 + 4 / 128**2) / (1 << 30)
    assert f"cost {extra_gib:.1f} GiB more per rank" in dp["assumptions"][1] and "quantized attention" in dp["assumptions"][1]
    col = next(c for c in doc["sizing"] if c["label"].startswith("DP attn"))
    now = doc["sizing"][0]
    assert col["weights_gib"] - now["weights_gib"] == pytest.approx(extra_gib, abs=0.01)


def test_from_the_config_alone_kv_bytes_and_weights_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """No GPU given: the KV bytes per token and the weights per rank still come out, with what is missing."""
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "deepseek-v3.json"), "--tp", "8"], capsys)
    assert code == 0
    assert "KV 70,272 B/token/rank (35,136 with --kv-cache-dtype fp8_e4m3)" in out and "weights 79.29 GiB/rank" in out
    assert "experts 76.14" in out and "pass --gpu NAME" in out
    code, out, _ = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--format", "json"], capsys)
    doc = json.loads(out)
    assert doc["bytes_per_token_per_rank"] == 147456 and doc["weights_bytes_per_rank"] == 2 * 8_190_735_360
    assert doc["pool_tokens"] is None and doc["weights_source"].startswith("estimate from the model config")
