"""Weight bytes per rank from a model config, against figures computed by hand from the public
config.json files in tests/capacity_configs/ (its README names each source), and against the engine's own
"Load weight end … mem usage" line where a real start-up log exists.

Each hand computation below writes out the matrices of one model the way SGLang's model class holds them;
the totals are also checked against the parameter count on the model's card (a second, independent check
that the config fields are read right)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.capacity.kvbytes import (
    GIB,
    CapacityInputError,
    bytes_per_token,
    load_model_config,
    model_shape,
)
from diagnoser.capacity.weights import checkpoint_bytes, estimate_weights
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter

CONFIGS = Path(__file__).parent / "capacity_configs"
FP8_BLOCK = 1 + 4 / (128 * 128)  # fp8 weight + one float32 scale per 128×128 block
AWQ4 = 0.5 + (2 + 0.5) / 128  # int4 packed + fp16 scale + packed int4 zero per group of 128


def cfg(name: str) -> dict:
    return load_model_config(CONFIGS / name)


def test_dense_gqa_qwen3_8b_by_hand_and_against_the_engine(data_dir: Path) -> None:
    """Qwen3-8B (hidden 4096, 36 layers, 32 Q / 8 KV heads of 128, MLP 12288, vocab 151936, untied, bf16)."""
    embed = 151936 * 4096
    attn = 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 32 * 128 * 4096 + 2 * 128  # q, k+v, o, q_norm+k_norm
    mlp = 3 * 4096 * 12288  # gate, up, down
    norms = 36 * 2 * 4096 + 4096
    params = 2 * embed + 36 * (attn + mlp) + norms
    assert params == 8_190_735_360  # the model card: 8.2B parameters, 6.95B non-embedding
    assert round((params - 2 * embed) / 1e9, 2) == 6.95
    e = estimate_weights(cfg("qwen3-8b.json"), tp=1)
    assert e.params == params and e.bytes_per_rank == 2 * params and e.quantization == ""
    # the real start-up of this model: "Load weight end. … type=Qwen3ForCausalLM, … mem usage=15.28 GB"
    tl = collect_logs(get_adapter("sglang"), [str(data_dir / "sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log")]).timelines[0]
    engine = tl.cfg("weight_mem_gb")
    assert engine == 15.28
    assert abs(e.gib_per_rank / engine - 1) < 0.01  # 15.26 GiB: rotary caches and buffers are the rest
    # TP 2: Q/O and the 8 KV heads split in two (4 each), embeddings split by vocab
    e2 = estimate_weights(cfg("qwen3-8b.json"), tp=2)
    per_rank = 2 * embed / 2 + 36 * ((attn - 2 * 128) / 2 + 2 * 128 + mlp / 2) + norms  # the Q/K norms are not split
    assert e2.params == params and e2.bytes_per_rank == pytest.approx(2 * per_rank)


def test_kv_heads_replicate_past_tp_8() -> None:
    """At TP 16 each rank still holds one whole KV head of the 8 (SGLang replicates rather than splits)."""
    e = estimate_weights(cfg("qwen3-8b.json"), tp=16)
    attn = e.part("attention")
    assert attn is not None
    q_o = 2 * 4096 * 32 * 128 / 16
    kv = 2 * 4096 * 1 * 128
    assert attn.per_rank == pytest.approx(36 * (q_o + kv + 2 * 128))
    assert any("replicated" in n for n in e.notes)


def test_moe_qwen3_30b_a3b_by_hand() -> None:
    """Qwen3-30B-A3B: 48 layers, all MoE (128 experts of 768), 32 Q / 4 KV heads of 128, hidden 2048."""
    embed = 151936 * 2048
    attn = 2048 * 4096 + 2 * 2048 * 4 * 128 + 4096 * 2048 + 2 * 128
    experts = 128 * 3 * 2048 * 768
    router = 2048 * 128  # no bias in Qwen3-MoE's gate
    norms = 48 * 2 * 2048 + 2048
    params = 2 * embed + 48 * (attn + experts + router) + norms
    assert round(params / 1e9, 1) == 30.5  # the model card: 30.5B in total, 29.9B non-embedding
    assert round((params - 2 * embed) / 1e9, 1) == 29.9
    e = estimate_weights(cfg("qwen3-30b-a3b.json"), tp=1)
    assert e.params == params and e.bytes_per_rank == 2 * params
    # TP 4 (EP 1 or 4: each rank holds a quarter of the expert weights either way); the router is replicated
    per_rank = 2 * embed / 4 + 48 * (2 * 2048 * 4096 / 4 + 2 * 2048 * 1 * 128 + 2 * 128 + experts / 4 + router) + norms
    for ep in (1, 4):
        e4 = estimate_weights(cfg("qwen3-30b-a3b.json"), tp=4, ep=ep)
        assert e4.bytes_per_rank == pytest.approx(2 * per_rank)
    with pytest.raises(CapacityInputError, match="does not divide"):
        estimate_weights(cfg("qwen3-30b-a3b.json"), tp=4, ep=3)


def test_mla_moe_deepseek_v2_lite_by_hand() -> None:
    """DeepSeek-V2-Lite: MLA without q_lora (kv_lora 512, rope 64, nope 128, v 128, 16 heads), 27 layers,
    the first dense (10944), then 64 routed + 2 shared experts of 1408; hidden 2048, vocab 102400."""
    embed = 102400 * 2048
    attn = 2048 * 16 * (128 + 64) + 2048 * (512 + 64) + 512 + 512 * 16 * (128 + 128) + 16 * 128 * 2048
    dense = 3 * 2048 * 10944
    moe = 64 * 3 * 2048 * 1408 + 3 * 2048 * 2 * 1408 + 2048 * 64
    norms = 27 * 2 * 2048 + 2048
    params = 2 * embed + 27 * attn + dense + 26 * moe + norms
    assert params == 15_706_484_224  # the model card: 15.7B total parameters
    e = estimate_weights(cfg("deepseek-v2-lite.json"), tp=1)
    assert e.params == params
    s = model_shape(cfg("deepseek-v2-lite.json"))
    assert bytes_per_token(s, attention_tp=8) == (512 + 64) * 27 * 2  # the latent is not split by TP


def test_mla_moe_fp8_deepseek_v3_by_hand_at_tp8() -> None:
    """DeepSeek-V3 (fp8 e4m3, 128×128 blocks; embeddings, lm_head, router and norms bf16) on 8 ranks:
    q_a / kv_a replicated, q_b / kv_b / o split; 3 dense layers then 58 MoE layers of 256 + 1 experts.
    The MTP layer in the checkpoint is not loaded by the target model."""
    embed = 129280 * 7168
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168  # q_b, kv_b, o
    repl = 7168 * 1536 + 1536 + 7168 * (512 + 64) + 512  # q_a + its norm, kv_a + its norm
    dense = 3 * 7168 * 18432
    experts = 256 * 3 * 7168 * 2048
    shared = 3 * 7168 * 2048
    router = 7168 * 256 + 256  # the gate and e_score_correction_bias
    norms = 61 * 2 * 7168 + 7168
    params = 2 * embed + 61 * (split + repl) + 3 * dense + 58 * (experts + shared + router) + norms
    assert round(params / 1e9) == 671  # the model card: 671B main-model parameters (+14B MTP)
    per_rank = (2 * embed / 8 * 2 + 61 * (split / 8 + repl) * FP8_BLOCK + 3 * dense / 8 * FP8_BLOCK
                + 58 * ((experts + shared) / 8 * FP8_BLOCK + router * 2) + norms * 2)
    e = estimate_weights(cfg("deepseek-v3.json"), tp=8)
    assert e.params == params
    assert e.bytes_per_rank == pytest.approx(per_rank)
    assert 79 < e.gib_per_rank < 80
    assert "fp8 e4m3" in e.quantization and any("MTP" in n for n in e.notes)
    # DP attention 8: attention whole on every rank (attn TP 1), embeddings too; MoE stays split
    d = estimate_weights(cfg("deepseek-v3.json"), tp=8, attn_tp=1)
    more = 61 * split * 7 / 8 * FP8_BLOCK + embed * 7 / 8 * 2
    assert d.bytes_per_rank - e.bytes_per_rank == pytest.approx(more)


def test_awq_int4_qwen2_5_7b_by_hand() -> None:
    """Qwen2.5-7B-Instruct-AWQ: int4 weights in groups of 128 for every linear layer, embeddings and
    lm_head fp16 (hidden 3584, 28 layers, 28 Q / 4 KV heads of 128 with QKV biases, MLP 18944, vocab 152064)."""
    embed = 152064 * 3584
    attn = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584
    mlp = 3 * 3584 * 18944
    norms = 28 * 2 * 3584 + 3584
    params = 2 * embed + 28 * (attn + mlp) + norms
    assert round(params / 1e9, 2) == 7.62  # the model card: 7.61B (6.53B non-embedding)
    assert round(28 * (attn + mlp) / 1e9, 2) == 6.53
    total = 2 * embed * 2 + 28 * (attn + mlp) * AWQ4 + norms * 2
    e = estimate_weights(cfg("qwen2.5-7b-instruct-awq.json"), tp=1)
    assert e.params == params and e.bytes_per_rank == pytest.approx(total)
    assert e.quantization == "AWQ int4, group 128"
    assert 5.1 < e.gib_per_rank < 5.3  # vs 14.2 GiB for the same model in fp16


@pytest.mark.parametrize(("quant", "bpp", "label"), [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, AWQ4, "GPTQ int4"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 64}, 1 + 3 / 64, "GPTQ int8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, 1.0, "fp8 e4m3"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                                       "group_size": 128, "symmetric": True}}}},
     0.5 + 2 / 128, "compressed-tensors int4"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     1.0, "compressed-tensors float8"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 0.5 + 1 / 16, "NVFP4"),
])
def test_other_quantization_schemes_size_the_linear_layers(quant: dict, bpp: float, label: str) -> None:
    """Written by us: Qwen3-8B's public config with each scheme's quantization_config put in."""
    c = dict(cfg("qwen3-8b.json"), quantization_config=quant)
    e = estimate_weights(c)
    linear = 36 * (4096 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 + 2 * 128 + 3 * 4096 * 12288)
    assert e.bytes_per_rank == pytest.approx(linear * bpp + 2 * 151936 * 4096 * 2 + (36 * 2 * 4096 + 4096) * 2)
    assert e.quantization.startswith(label)


def test_compressed_tensors_ignore_list_keeps_attention_unquantized() -> None:
    """Kimi-K2-style: only the routed experts int4; attention, shared experts and dense MLPs ignored."""
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
         "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}}
    e = estimate_weights(dict(cfg("deepseek-v3.json"), quantization_config=q), tp=8)
    by = {p.name: p.bytes_per_param for p in e.parts}
    assert by["experts"] == 0.5 + 2 / 32
    assert by["attention"] == by["shared_experts"] == by["mlp"] == by["lm_head"] == 2.0


def test_mxfp4_quantizes_only_the_experts_and_tied_embeddings_count_once() -> None:
    base = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
            "vocab_size": 201088, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}
    e = estimate_weights(base)
    by = {p.name: p.bytes_per_param for p in e.parts}
    assert by["experts"] == 0.5 + 1 / 32 and by["attention"] == 2.0
    assert 20 < e.params / 1e9 < 22  # gpt-oss-20b: 21B parameters
    tied = estimate_weights(dict(base, tie_word_embeddings=True))
    assert e.params - tied.params == 201088 * 2880


def test_float32_checkpoints_run_as_float16_and_missing_keys_are_one_sentence() -> None:
    c = dict(cfg("qwen3-8b.json"), torch_dtype="float32")
    e = estimate_weights(c)
    assert e.runtime_dtype == "float16" and e.bytes_per_rank == 2 * e.params
    assert model_shape(c).model_dtype_bytes == 2.0  # KV 'auto' follows the runtime dtype
    with pytest.raises(CapacityInputError, match="no hidden_size, vocab_size") as err:
        estimate_weights({"num_hidden_layers": 4, "num_attention_heads": 2})
    assert "\n" not in str(err.value)


def test_unknown_quantization_is_an_upper_bound_not_a_crash() -> None:
    e = estimate_weights(dict(cfg("qwen3-8b.json"), quantization_config={"quant_method": "hqq", "nbits": 3}))
    assert e.quantization == "" and any("'hqq' is not sized here" in n for n in e.notes)


def test_hybrid_linear_attention_counts_its_own_mixers() -> None:
    """Qwen3-Next (written by us from the published shape, see the README): 12 of 48 layers attention,
    the other 36 Gated DeltaNet mixers sized from the linear_* fields."""
    c = dict(cfg("qwen3-next-80b.json"), vocab_size=151936, intermediate_size=5120, moe_intermediate_size=512,
             shared_expert_intermediate_size=512, num_experts=512, linear_key_head_dim=128, linear_value_head_dim=128,
             linear_conv_kernel_dim=4, tie_word_embeddings=False)
    e = estimate_weights(c)
    assert e.part("mixer") is not None and e.part("attention") is not None
    assert 75 < e.params / 1e9 < 85  # Qwen3-Next-80B-A3B: 80B parameters


def test_checkpoint_index_total_is_read_when_present(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "qwen3-8b.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 16381470720}, "weight_map": {}}')
    assert checkpoint_bytes(tmp_path / "config.json") == (16381470720, str(tmp_path / "model.safetensors.index.json"))
    assert checkpoint_bytes(CONFIGS / "qwen3-8b.json") is None
    assert estimate_weights(load_model_config(tmp_path)).bytes_total == 16381470720
    assert GIB == 2**30
