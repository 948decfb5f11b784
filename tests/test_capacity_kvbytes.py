"""KV bytes per token (docs/sglang.md#kv-bytes), checked against the engine's own lines in tests/data.

The model configs in tests/capacity_configs/ are written by us from the published architectures (see
its README); the numbers they are checked against are the engine's, read by the real parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.capacity.kvbytes import (
    GIB,
    CapacityInputError,
    bytes_per_token,
    kv_dtype_bytes,
    load_model_config,
    model_shape,
    tokens_for_budget,
)
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline

CONFIGS = Path(__file__).parent / "capacity_configs"
SEED = Path(__file__).parent / "cases" / "seed-kimi-k25"


def shape(name: str):
    return model_shape(load_model_config(CONFIGS / name))


def test_qwen3_8b_reproduces_the_engine_k_size(data_dir: Path) -> None:
    """'KV Cache is allocated. … #tokens: 1707904, K size: 117.28 GB' (Qwen3-8B, TP1, bf16)."""
    col = collect_logs(get_adapter("sglang"), [str(data_dir / "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log")])
    tl = col.timelines[0]
    tokens = tl.cfg("kv_pool_tokens_log")
    k_gb = tl.cfg("kv_k_size_gb")
    assert (tokens, k_gb) == (1707904, 117.28)
    s = shape("qwen3-8b.json")
    assert (s.attention, s.kv_heads, s.head_dim, s.full_attention_layers) == ("mha", 8, 128, 36)
    bpt = bytes_per_token(s, attention_tp=1, kv_cache_dtype="auto")
    assert bpt == 2 * 8 * 128 * 36 * 2 == 147456
    k_formula = tokens * (bpt / 2) / GIB  # K is half of K+V
    assert abs(k_formula / k_gb - 1) < 0.01
    assert abs(2 * k_formula / tl.cfg("kv_cache_gb") - 1) < 0.01  # K + V as the parser sums them


def _scrape_kv_gb(run: Path) -> tuple[float, int]:
    tl = Timeline(target="t")
    target = MetricsTarget("http://127.0.0.1:30000", get_adapter("sglang"))
    first = sorted((run / "metrics").glob("*.prom"))[0]
    assert target.ingest_text(first.read_text(), float(first.stem.split("_")[-1]), tl)
    return float(tl.cfg("kv_cache_gb")), int(tl.cfg("max_total_tokens"))


@pytest.mark.parametrize(("run", "config", "expected_bpt"), [
    ("kv-full-retract", "tiny-llama.json", 2 * 2 * 32 * 2 * 2),
    ("medium-engine-bound-kv-full", "medium-llama.json", 2 * 4 * 64 * 8 * 2),
])
def test_cpu_real_runs_match_kv_cache_memory_usage(data_dir: Path, run: str, config: str, expected_bpt: int) -> None:
    """sglang:kv_cache_memory_usage_gb of a real SGLang 0.5.23 engine vs the formula × the pool (+1 page slot)."""
    kv_gb, pool = _scrape_kv_gb(data_dir / "sglang-cpu-real" / run)
    assert pool == 2048
    bpt = bytes_per_token(shape(config), 1, "auto")
    assert bpt == expected_bpt
    formula_gib = (pool + 1) * bpt / GIB  # SGLang allocates size + page_size slots (slot 0 is padding)
    assert abs(formula_gib / kv_gb - 1) < 0.01
    assert abs(pool * bpt / GIB / kv_gb - 1) < 0.01


def test_reference_examples_gqa_split_by_tp() -> None:
    s8, s70 = shape("llama-3.1-8b.json"), shape("llama-3.1-70b.json")
    assert bytes_per_token(s8, 1) == 131072
    assert bytes_per_token(s8, 2) == 65536
    assert bytes_per_token(s70, 8) == 40960
    assert bytes_per_token(s70, 16) == 40960  # kv_heads // tp floors at one head per rank


def test_mla_is_not_split_by_tp() -> None:
    ds = shape("deepseek-v3.json")
    assert ds.attention == "mla"
    assert bytes_per_token(ds, 1) == bytes_per_token(ds, 8) == (512 + 64) * 61 * 2 == 70272
    assert bytes_per_token(ds, 8, "fp8_e4m3") == 35136


def test_kimi_k25_text_config_is_mla() -> None:
    s = model_shape(load_model_config(SEED / "config.json"))
    assert (s.attention, s.full_attention_layers, s.kv_lora_rank, s.qk_rope_head_dim) == ("mla", 61, 512, 64)
    assert bytes_per_token(s, 8) == 70272
    # the attention weights DP attention would replicate: q_b + kv_b + o per layer, 64 heads
    assert s.attn_params_sharded == (1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * 7168) * 61


def test_hybrid_models_count_only_full_attention_layers() -> None:
    oss = shape("gpt-oss-20b.json")  # layer_types: 12 sliding + 12 full
    assert (oss.layers, oss.full_attention_layers, oss.hybrid) == (24, 12, True)
    assert bytes_per_token(oss, 1) == 2 * 8 * 64 * 12 * 2
    nxt = shape("qwen3-next-80b.json")  # full_attention_interval 4 of 48 layers
    assert nxt.full_attention_layers == 12
    assert bytes_per_token(nxt, 1) == 2 * 2 * 256 * 12 * 2
    assert bytes_per_token(nxt, 4) == 2 * 1 * 256 * 12 * 2


@pytest.mark.parametrize(("dtype", "size"), [("auto", 2), ("bf16", 2), ("fp16", 2), ("fp8_e4m3", 1), ("fp8_e5m2", 1),
                                             ("fp4_e2m1", 0.5), ("nvfp4", 0.5), ("torch.bfloat16", 2)])
def test_kv_dtypes(dtype: str, size: float) -> None:
    assert kv_dtype_bytes(dtype, 2.0) == size


def test_unknown_dtype_is_one_sentence() -> None:
    with pytest.raises(CapacityInputError, match=r"unknown --kv-cache-dtype 'int3'; use auto"):
        kv_dtype_bytes("int3")


def test_page_rounding() -> None:
    n = tokens_for_budget(117.28 * 2, 147456, page_size=64)
    assert n % 64 == 0
    assert abs(n - 1707904) < 64 * 40  # the engine's pool from its own K+V size
    assert tokens_for_budget(-1.0, 100) == 0


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(CapacityInputError, match="does not exist"):
        load_model_config(tmp_path / "nope.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(CapacityInputError, match="not readable JSON"):
        load_model_config(bad)
    bad.write_text(json.dumps({"model_type": "x"}))
    with pytest.raises(CapacityInputError, match="num_hidden_layers"):
        model_shape(load_model_config(tmp_path))  # a directory holding config.json
