"""``diagnose plan`` never replaces a size the config lacks by a rule of thumb without saying so.

Real configs: the seed case's Kimi-K2.5 (tests/cases/seed-kimi-k25/config.json, a 1 T-parameter MoE
under ``text_config``) and the public configs in tests/capacity_configs/ (README there gives each source),
with fields removed in the test to build the gap a trimmed or hand-written config has. Before, a MoE config
without ``moe_intermediate_size`` and ``intermediate_size`` was counted at 4 × hidden per expert: 14,252 B
parameters and 3.2 TiB per rank at TP 8 for Kimi-K2.5.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from diagnoser.capacity.kvbytes import (
    CapacityInputError,
    apply_model_overrides,
    load_model_config,
    model_shape,
)
from diagnoser.capacity.weights import estimate_weights
from diagnoser.cli import main

HERE = Path(__file__).parent
CONFIGS = HERE / "capacity_configs"
KIMI = HERE / "cases" / "seed-kimi-k25" / "config.json"
PUBLIC = ["qwen3-8b.json", "qwen3-30b-a3b.json", "deepseek-v2-lite.json", "deepseek-v3.json", "qwen2.5-7b-instruct-awq.json",
          "llama-3.1-8b.json", "llama-3.1-70b.json", "tiny-llama.json"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _without(name: str | Path, *keys: str, tmp_path: Path | None = None, sub: str | None = None, **extra: Any) -> Any:
    cfg = load_model_config(name if isinstance(name, Path) else CONFIGS / name)
    cfg = copy.deepcopy(cfg)
    target = cfg[sub] if sub else cfg
    for k in keys:
        del target[k]
    target.update(extra)
    if tmp_path is None:
        return cfg
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_a_1t_moe_without_its_expert_width_is_named_not_guessed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _without(KIMI, "moe_intermediate_size", "intermediate_size", tmp_path=tmp_path, sub="text_config")
    code, out, err = run(["plan", "--model-config", str(cfg), "--gpu", "H200", "--tp", "8"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert "text_config.moe_intermediate_size (the 384 experts of 60 MoE layer(s))" in err
    assert "text_config.intermediate_size (the MLP of 1 dense layer(s))" in err
    assert "--weights-gb" in err and "--json-model-override-args" in err
    assert "4 ×" not in err and "TiB" not in err


def test_the_override_supplies_the_sizes_as_sglang_takes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sizes given back with --json-model-override-args (merged into text_config, as SGLang merges a
    dict into a sub-config) give exactly the full config's weights."""
    full = ["plan", "--model-config", str(KIMI), "--gpu", "H200", "--tp", "8", "--format", "json"]
    code, out, _ = run(full, capsys)
    want = json.loads(out)
    assert code == 0 and 900e9 < want["weights_estimate"]["params"] < 1.1e12  # Kimi-K2: about 1 T parameters
    cfg = _without(KIMI, "moe_intermediate_size", "intermediate_size", tmp_path=tmp_path, sub="text_config")
    over = '{"text_config": {"moe_intermediate_size": 2048, "intermediate_size": 18432}}'
    code, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "H200", "--tp", "8", "--format", "json",
                        "--json-model-override-args", over], capsys)
    got = json.loads(out)
    assert code == 0 and got["weights_estimate"]["params"] == want["weights_estimate"]["params"]
    assert got["pool_tokens"] == want["pool_tokens"]
    assert any(n.startswith("model config with text_config from --json-model-override-args") for n in got["notes"])


def test_weights_gb_supplies_the_weights_and_the_gap_is_still_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _without("deepseek-v3.json", "moe_intermediate_size", "intermediate_size", tmp_path=tmp_path)
    code, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "H200", "--tp", "8", "--weights-gb", "80", "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["weights_source"] == "--weights-gb" and doc["weights_estimate"] is None and doc["pool_tokens"] > 0
    note = doc["notes"][0]
    assert note.startswith("weights not estimated: the model config has no intermediate_size"), doc["notes"]
    assert "moe_intermediate_size (the 256 experts of 58 MoE layer(s))" in note and "--weights-gb" not in note


def test_from_the_config_alone_the_kv_bytes_stand_and_the_weights_gap_is_named(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _without("deepseek-v3.json", "moe_intermediate_size", tmp_path=tmp_path)
    code, out, err = run(["plan", "--model-config", str(cfg)], capsys)
    assert code == 0 and err == ""
    assert "KV 70,272 B/token/rank" in out and "weights" not in out.splitlines()[1]
    text = " ".join(out.split())
    # DeepSeek-V3's intermediate_size (18432) is its dense layers' width: never taken for its experts
    assert "no moe_intermediate_size (the 256 experts of 58 MoE layer(s))" in text and "intermediate_size (the MLP" not in text
    assert "--weights-gb" in text and '\'{"moe_intermediate_size": N}\'' in text


@pytest.mark.parametrize(("name", "drop", "field"), [
    ("qwen3-30b-a3b.json", ("moe_intermediate_size",), "moe_intermediate_size (the 128 experts of 48 MoE layer(s))"),
    ("qwen3-8b.json", ("intermediate_size",), "intermediate_size (the MLP of 36 dense layer(s))"),
    ("deepseek-v2-lite.json", ("v_head_dim",), "v_head_dim (the MLA attention)"),
])
def test_every_size_the_count_needs_is_named(name: str, drop: tuple[str, ...], field: str) -> None:
    with pytest.raises(CapacityInputError) as e:
        estimate_weights(_without(name, *drop))
    assert f"no {field}" in str(e.value) and "--weights-gb" in str(e.value) and "\n" not in str(e.value)


def test_mla_kv_bytes_need_the_rope_dim() -> None:
    with pytest.raises(CapacityInputError, match="no qk_rope_head_dim, so the KV bytes per token cannot be computed"):
        model_shape(_without("deepseek-v3.json", "qk_rope_head_dim"))


def test_a_default_the_count_takes_is_listed_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B without num_key_value_heads: transformers' default (as many as the query heads, MHA)
    is what SGLang would read too, so it is taken, and said first, with its 4x KV bytes."""
    cfg = _without("llama-3.1-8b.json", "num_key_value_heads", tmp_path=tmp_path)
    code, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "H100", "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["bytes_per_token_per_rank"] == 4 * 131072
    assert doc["notes"][0] == "num_key_value_heads not in the config: taken as num_attention_heads (32), as transformers does (MHA)"
    assert doc["notes"].count(doc["notes"][0]) == 1  # the KV shape and the weight count say it once
    code, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "H100"], capsys)
    assert "note: num_key_value_heads not in the config" in out


def test_experts_at_the_mlp_width_are_said_unless_the_architecture_defines_it() -> None:
    """An MoE config of an architecture not known here, with intermediate_size but no moe_intermediate_size,
    is counted at intermediate_size (the Mixtral convention) and says so; a Mixtral-style type does not need to."""
    unknown = _without("qwen3-30b-a3b.json", "moe_intermediate_size", model_type="acme_moe", intermediate_size=768)
    e = estimate_weights(unknown)
    assert any(a.startswith("moe_intermediate_size not in the config: each expert counted at intermediate_size (768)") for a in e.assumed)
    ref = estimate_weights(load_model_config(CONFIGS / "qwen3-30b-a3b.json"))
    assert e.part("experts").params == ref.part("experts").params  # type: ignore[union-attr]  # 768 is Qwen3-30B-A3B's expert width
    mixtral = estimate_weights(dict(unknown, model_type="mixtral"))
    assert mixtral.assumed == [] and mixtral.part("experts").params == e.part("experts").params  # type: ignore[union-attr]


def test_gpt2_mlp_width_is_the_architectures_own() -> None:
    """GPT-2 with n_inner unset (its published config) uses 4 × hidden by definition: taken, and listed."""
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_inner": None,
            "vocab_size": 50257, "n_positions": 1024}
    e = estimate_weights(gpt2)
    assert e.part("mlp").params == 12 * 2 * 768 * 3072  # type: ignore[union-attr]
    assert e.assumed == ["the MLP width is not in the config: 4 × hidden = 3,072, what gpt2 uses when it is unset"]
    with pytest.raises(CapacityInputError, match="no intermediate_size"):
        estimate_weights(dict(gpt2, model_type="llama"))


@pytest.mark.parametrize("name", PUBLIC)
def test_the_real_configs_need_no_default(name: str) -> None:
    """Audit: the whole configs in tests/capacity_configs are counted from their own fields alone."""
    cfg = load_model_config(CONFIGS / name)
    assert estimate_weights(cfg, tp=8 if "deepseek-v3" in name or "70b" in name else 1).assumed == []
    assert model_shape(cfg).assumed == ()


def test_kimi_counts_from_its_own_fields() -> None:
    assert estimate_weights(load_model_config(KIMI), tp=8).assumed == []


@pytest.mark.parametrize(("value", "msg"), [
    ("{not json", "is not JSON"),
    ("[1, 2]", "must be a JSON object"),
])
def test_a_bad_override_is_one_sentence(value: str, msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(["plan", "--model-config", str(CONFIGS / "qwen3-8b.json"), "--json-model-override-args", value], capsys)
    assert code == 2 and msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_override_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(["plan", "--gpu", "H100", "--json-model-override-args", "{}"], capsys)
    assert code == 2 and "pass --model-config too" in err


def test_overrides_merge_into_a_sub_config_as_sglang_does() -> None:
    cfg = {"text_config": {"a": 1, "b": 2}, "c": 3}
    assert apply_model_overrides(cfg, {"text_config": {"b": 5}, "c": 4}) == {"text_config": {"a": 1, "b": 5}, "c": 4}
    assert cfg == {"text_config": {"a": 1, "b": 2}, "c": 3}  # the loaded config is not changed in place


@pytest.mark.parametrize(("cfg", "kv_heads"), [
    # StarCoder (gpt_bigcode) is multi-query unless multi_query is false; Falcon-7B too; Falcon-40B says num_kv_heads
    ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40}, 1),
    ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "multi_query": False}, 48),
    ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32, "multi_query": True}, 1),
    ({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
      "new_decoder_architecture": True, "num_kv_heads": 8}, 8),
    ({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12}, 12),
])
def test_kv_heads_follow_the_architecture_without_a_field(cfg: dict[str, Any], kv_heads: int) -> None:
    s = model_shape(cfg)
    assert s.kv_heads == kv_heads and s.assumed == ()


def test_mixer_indexer_and_quantization_defaults_are_listed() -> None:
    """Qwen3-Next (written by us from the published shape) without its linear_* head sizes: counted at
    Qwen3NextConfig's defaults, each listed; AWQ without bits/group_size likewise."""
    full = dict(load_model_config(CONFIGS / "qwen3-next-80b.json"), vocab_size=151936, intermediate_size=5120, moe_intermediate_size=512,
                shared_expert_intermediate_size=512, num_experts=512, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, tie_word_embeddings=False)
    trimmed = {k: v for k, v in full.items() if k not in ("linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")}
    a, b = estimate_weights(full), estimate_weights(trimmed)
    assert a.assumed == [] and b.params == a.params
    assert [x.split(" not in")[0] for x in b.assumed] == ["linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"]
    awq = load_model_config(CONFIGS / "qwen2.5-7b-instruct-awq.json")
    q = {k: v for k, v in awq["quantization_config"].items() if k not in ("bits", "group_size")}
    e = estimate_weights(dict(awq, quantization_config=q))
    assert estimate_weights(awq).assumed == [] and e.bytes_total == estimate_weights(awq).bytes_total
    assert any("no bits" in x for x in e.assumed) and any("no group_size" in x for x in e.assumed)
    v32 = dict(load_model_config(CONFIGS / "deepseek-v3.json"), index_topk=2048)  # a DSA indexer without its sizes
    assert [x.split(" not in")[0] for x in estimate_weights(v32).assumed] == ["index_n_heads", "index_head_dim"]


def test_the_logs_override_is_the_servers_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real CPU-engine log (tests/data/sglang-cpu-before-after) whose server_args are edited to carry
    --json-model-override-args: the plan reads the model the server ran, and says where that came from;
    the flag given on the command line wins."""
    log = (HERE / "data" / "sglang-cpu-before-after" / "kv-full" / "before" / "server.log").read_text()
    assert log.count("'json_model_override_args': '{}'") == 1
    edited = tmp_path / "server.log"
    edited.write_text(log.replace("'json_model_override_args': '{}'", "'json_model_override_args': '{\"num_key_value_heads\": 1}'"))
    base = ["plan", "--model-config", str(CONFIGS / "tiny-llama.json"), "--format", "json"]
    docs = []
    for extra in (["--log", str(edited)], ["--log", str(edited), "--json-model-override-args", "{}"]):
        code, out, _ = run(base + extra, capsys)
        assert code == 0
        docs.append(json.loads(out))
    assert docs[0]["bytes_per_token_per_rank"] == 256 and docs[1]["bytes_per_token_per_rank"] == 512  # 2 KV heads in the config
    assert "model config with num_key_value_heads from the log's json_model_override_args" in docs[0]["notes"]


def test_a_log_without_server_args_says_tp_1_was_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """Real start-up logs: SGLang's reference start-up log, whose server_args line is elided to
    ``ServerArgs(model_path='Qwen/Qwen3-8B', ...)`` (its first line gives the source), leaves the TP size
    unknown; the CPU engine's whole log does not."""
    note = "the log does not show the server's --tp-size"
    cases = [(HERE / "data" / "sglang" / "logs" / "log_startup_qwen3_8b_tp1_2026-05.log", "qwen3-8b.json", True),
             (HERE / "data" / "sglang-cpu-before-after" / "kv-full" / "before" / "server.log", "tiny-llama.json", False)]
    for log, cfg, said in cases:
        code, out, _ = run(["plan", "--model-config", str(CONFIGS / cfg), "--log", str(log), "--format", "json"], capsys)
        assert code == 0 and any(n.startswith(note) for n in json.loads(out)["notes"]) is said, log
        code, out, _ = run(["plan", "--model-config", str(CONFIGS / cfg), "--log", str(log), "--tp", "1", "--format", "json"], capsys)
        assert not any(n.startswith(note) for n in json.loads(out)["notes"])
