"""Weight bytes per GPU rank from a Hugging Face ``config.json``: what SGLang's "Load weight end … mem
usage=X GB" line will say, before the server exists.

The model is counted part by part, as SGLang's model classes shard it:

* embeddings and ``lm_head``: ``vocab × hidden`` each (one matrix when ``tie_word_embeddings``), the vocab
  padded to a multiple of 64 and split across TP ranks (``VocabParallelEmbedding`` / ``ParallelLMHead``);
* attention (MHA/GQA/MQA): Q and O split by the attention TP; K and V hold ``max(1, kv_heads // attn_tp)``
  heads per rank (replicated when there are fewer KV heads than ranks); Qwen2-style QKV biases and
  Qwen3-style Q/K norms included;
* MLA (DeepSeek V2/V3, Kimi K2): ``q_a`` / ``kv_a_proj_with_mqa`` replicated on every rank, ``q_b`` /
  ``kv_b`` / ``o`` split by the attention TP;
* dense MLP: gate, up and down (``2 × hidden × intermediate`` for the non-gated GPT/Falcon style), split by TP;
* MoE: routed experts split over TP ranks whatever the EP size (``moe_tp × ep = tp``: each rank holds
  ``experts / ep`` experts of ``1 / moe_tp`` of the width), shared experts split like a dense MLP, the
  router replicated; dense layers before ``first_k_dense_replace`` / outside ``decoder_sparse_step`` or
  ``mlp_only_layers`` counted as dense;
* hybrid models: sliding-window layers carry ordinary attention weights; linear-attention (Gated DeltaNet,
  Qwen3-Next) and Mamba-2 mixers are counted from their own fields;
* a vision tower (``vision_config``) as ``depth × (4 h² + 2 h × intermediate)``, split by TP (approximate);
* multi-token-prediction layers (``num_nextn_predict_layers``) are not counted: SGLang loads them only as
  the draft model of speculative decoding.

Bytes per parameter: the runtime dtype for what is not quantized (``torch_dtype``; a float32 or missing
dtype runs as float16 under SGLang's ``--dtype auto``, ``python/sglang/srt/configs/model_config.py``
``_get_and_verify_dtype`` at v0.5.23), and for the quantized linear layers of ``quantization_config``:

* ``fp8`` / ``fbgemm_fp8`` / ModelOpt FP8 / compressed-tensors 8-bit float: 1 B (+ a float32 scale per
  128 × 128 block when ``weight_block_size`` says so);
* AWQ / GPTQ ``bits``-bit with ``group_size`` g: ``bits/8 + (2 + bits/8) / g`` (packed weights, an fp16
  scale and a packed zero per group);
* compressed-tensors ``config_groups``: ``num_bits/8`` plus its scale per group/block/channel; NVFP4
  (ModelOpt or compressed-tensors ``nvfp4-pack-quantized``): 0.5 B + one fp8 scale per 16;
* ``mxfp4`` (gpt-oss): MoE experts at 0.5 B + one scale byte per 32, the rest at the runtime dtype;
* bitsandbytes 4-bit: 0.5 B + its absmax (fp32 per 64, or about 1 B per 64 with double quantization).

A size the count needs and the config lacks is never replaced by a rule of thumb silently: either the
architecture itself defines it (GPT-2's MLP is 4 × hidden when ``n_inner`` is unset; transformers' own
defaults for a field the config class fills in) and :attr:`WeightEstimate.assumed` says what was taken,
or the estimate stops with :class:`CapacityInputError` naming the field and how to supply it
(``--weights-gb``, or SGLang's own ``--json-model-override-args '{"field": N}'``).

Layers named in ``ignore`` / ``modules_to_not_convert`` / ``ignored_layers`` / ``exclude_modules`` stay
at the runtime dtype; embeddings stay unquantized. The estimate leaves out buffers SGLang allocates at load
(rotary caches, MLA's absorbed ``w_kc``/``w_vc`` copies): tens to hundreds of MiB. Every figure that rests
on an assumption carries a note.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnoser.capacity.kvbytes import (
    GIB,
    CapacityInputError,
    _full_attention_layers,
    _int,
    _text_config,
    kv_heads_of,
)

VOCAB_PADDING = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE (python/sglang/srt/layers/vocab_parallel_embedding.py)
RUNTIME_BYTES = {"bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0}
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "opt", "falcon", "bloom", "starcoder2", "gpt_bigcode")
# architectures whose MLP is 4 × hidden when the config leaves its width unset (GPT2Config / GPTJConfig
# n_inner=None, FalconConfig ffn_hidden_size=None, BLOOM's fixed 4 × hidden)
FOUR_X_MLP = ("gpt2", "gpt_bigcode", "gptj", "falcon", "bloom")
# MoE architectures whose experts are intermediate_size wide (no moe_intermediate_size in their config class)
EXPERTS_AT_INTERMEDIATE = ("mixtral", "gpt_oss", "olmoe", "phimoe", "granitemoe", "granitemoehybrid", "jamba", "minimax", "grok")
# MoE architectures whose config class has its own moe_intermediate_size (intermediate_size is the dense width)
OWN_EXPERT_WIDTH = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_vl_moe",
                    "qwen3_omni_moe", "glm4_moe", "glm4v_moe", "ernie4_5_moe", "hunyuan_v1_moe", "dots1", "bailing_moe", "step3_text")
SUPPLY = ("give --weights-gb G (the weights one GPU rank holds: the 'Load weight end … mem usage' of a start-up) "
          "or supply it with --json-model-override-args")
NON_GATED_MLP = ("gpt2", "gpt_neox", "falcon", "phi", "starcoder2", "opt", "bloom", "gpt_bigcode", "mpt", "gptj")

# Representative module names, for matching a quantization config's ignore lists.
MODULE_NAMES: dict[str, tuple[str, ...]] = {
    "attention": ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"),
    "mlp": ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"),
    "experts": ("model.layers.3.mlp.experts.0.gate_proj", "model.layers.3.mlp.experts.0.down_proj"),
    "shared_experts": ("model.layers.3.mlp.shared_experts.gate_proj", "model.layers.3.mlp.shared_expert.down_proj"),
    "router": ("model.layers.3.mlp.gate", "model.layers.3.mlp.router"),
    "mixer": ("model.layers.0.linear_attn.in_proj_qkvz", "model.layers.0.mixer.in_proj"),
    "vision": ("visual.blocks.0.attn.qkv", "vision_tower.encoder.layers.0.mlp.fc1"),
    "lm_head": ("lm_head",),
}
# Parts a quantization scheme covers by default: SGLang quantizes LinearBase and fused-MoE layers, not the
# embeddings, the vocab-parallel lm_head or the MoE router (a plain gate).
LINEAR_PARTS = ("attention", "mlp", "experts", "shared_experts", "mixer", "vision")


@dataclass(frozen=True, slots=True)
class Part:
    """One kind of weight: parameters in the model, and how they spread over ranks."""

    name: str
    params: float  # in the whole model
    per_rank: float  # parameters one rank holds
    bytes_per_param: float


@dataclass(slots=True)
class WeightEstimate:
    """Weights of a model, total and per GPU rank (bytes), with how each was counted."""

    parts: list[Part]
    runtime_dtype: str
    quantization: str  # "" when none, else a short description ("fp8 e4m3, 128×128 blocks")
    tp: int = 1
    ep: int = 1
    attn_tp: int = 1
    notes: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # sizes the config lacks, and what was taken for them

    @property
    def params(self) -> float:
        return sum(p.params for p in self.parts)

    @property
    def bytes_total(self) -> float:
        return sum(p.params * p.bytes_per_param for p in self.parts)

    @property
    def bytes_per_rank(self) -> float:
        return sum(p.per_rank * p.bytes_per_param for p in self.parts)

    @property
    def gib_per_rank(self) -> float:
        return self.bytes_per_rank / GIB

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def source(self) -> str:
        q = f", {self.quantization}" if self.quantization else ""
        split = f", split over TP {self.tp}" if self.tp > 1 else ""
        return f"estimate from the model config: {self.params / 1e9:.2f} B parameters, {self.runtime_dtype}{q}{split}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": round(self.params), "bytes_total": round(self.bytes_total), "bytes_per_rank": round(self.bytes_per_rank),
            "runtime_dtype": self.runtime_dtype, "quantization": self.quantization or None, "tp": self.tp, "ep": self.ep,
            "attn_tp": self.attn_tp,
            "parts": {p.name: {"params": round(p.params), "params_per_rank": round(p.per_rank), "bytes_per_param": round(p.bytes_per_param, 4)}
                      for p in self.parts},
            "notes": list(self.notes), "assumed": list(self.assumed),
        }


# -- quantization ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Quant:
    label: str
    bytes_per_param: float
    parts: tuple[str, ...] = LINEAR_PARTS  # which parts the scheme covers
    skip: tuple[str, ...] = ()  # patterns of modules left unquantized
    style: str = "substring"  # how ``skip`` patterns match: substring, glob or ct (compressed-tensors)

    def covers(self, part: str) -> bool:
        if part not in self.parts:
            return False
        names = MODULE_NAMES.get(part, ())
        return not any(self._match(pat, n) for pat in self.skip for n in names)

    def _match(self, pat: str, name: str) -> bool:
        if self.style == "ct":
            if pat.startswith("re:"):
                return re.match(pat[3:], name) is not None
            return name == pat or name.endswith("." + pat)
        if self.style == "glob":
            return fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(name, pat + ".*") or name.endswith("." + pat) or name == pat
        return pat in name


def _missing(lacking: list[tuple[tuple[str, ...], str]], under: str | None = None) -> CapacityInputError:
    """The error for sizes the count cannot do without: each field (alternatives joined by "or") with
    what it sizes, and how to supply them (under the sub-config ``under`` of a multimodal wrapper, which
    SGLang's override merges into)."""
    parts = [f"{' or '.join(names)} ({what})" for names, what in lacking]
    example = "{" + ", ".join(f'"{names[0]}": N' for names, _ in lacking) + "}"
    if under:
        parts = [f"{under}.{p}" for p in parts]
        example = f'{{"{under}": {example}}}'
    supply = SUPPLY.replace("supply it", "supply them") if len(lacking) > 1 else SUPPLY
    return CapacityInputError(f"the model config has no {' and no '.join(parts)}, so the weights cannot be sized; {supply} '{example}'")


def _group_bytes(bits: float, group: int | None, scale_bytes: float = 2.0, zero_bits: float = 0.0) -> float:
    """Packed ``bits``-bit weights plus one scale (and a packed zero) per group."""
    g = group if group and group > 0 else 0
    return bits / 8 + ((scale_bytes + zero_bits / 8) / g if g else 0.0)


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list) else ()


def _quant(cfg: dict[str, Any], notes: list[str], assumed: list[str] | None = None) -> _Quant | None:
    q = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(q, dict) or not q:
        return None
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    skip = _strs(q.get("modules_to_not_convert")) + _strs(q.get("ignored_layers")) + _strs(q.get("exclude_modules"))
    if method in ("fp8", "fbgemm_fp8", "w8a8_fp8", "ptpc_fp8") or (method == "modelopt" and "fp8" in str(q.get("quant_algo", "")).lower()):
        block = q.get("weight_block_size")
        extra = 4.0 / (block[0] * block[1]) if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block) else 0.0
        fmt = str(q.get("fmt") or "e4m3")
        label = f"fp8 {fmt}" + (f", {block[0]}×{block[1]} blocks" if extra else "")
        return _Quant(label, 1.0 + extra, skip=skip, style="glob")
    if method == "modelopt" or method in ("modelopt_fp4", "nvfp4"):
        algo = str(q.get("quant_algo") or method).upper()
        if "FP4" in algo:
            return _Quant("NVFP4 (ModelOpt)", 0.5 + 1 / 16, skip=skip, style="glob")
        notes.append(f"ModelOpt quant_algo {algo!r} is not sized here: weights counted at the runtime dtype (an upper bound)")
        return None
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "auto_round"):
        bits = _int(q, "bits", "w_bit")
        if bits is None:
            bits = 4
            if assumed is not None:
                assumed.append(f"quantization_config gives no bits: {method} taken as 4-bit (its usual width)")
        if "group_size" not in q and "q_group_size" not in q and assumed is not None:
            assumed.append(f"quantization_config gives no group_size: {method} groups taken as 128")
        group = q.get("group_size", q.get("q_group_size", 128))
        group = int(group) if isinstance(group, int | float) and group > 0 else None
        name = "AWQ" if method.startswith("awq") else ("AutoRound" if "round" in method else "GPTQ")
        per = _group_bytes(bits, group, 2.0, bits)
        if group is None:
            notes.append(f"{name} group_size is per channel (-1): scales counted as negligible")
        parts = LINEAR_PARTS + (("lm_head",) if q.get("lm_head") is True else ())
        return _Quant(f"{name} int{bits}, group {group or 'channel'}", per, parts=parts, skip=skip)
    if method == "mxfp4":
        return _Quant("MXFP4 MoE experts", 0.5 + 1 / 32, parts=("experts",), skip=skip, style="glob")
    if method == "bitsandbytes":
        if q.get("load_in_4bit"):
            per = 0.5 + (1 / 64 + 4 / (64 * 256) if q.get("bnb_4bit_use_double_quant") else 4 / 64)
            return _Quant(f"bitsandbytes 4-bit {q.get('bnb_4bit_quant_type') or 'fp4'}", per,
                          skip=skip + _strs(q.get("llm_int8_skip_modules")))
        if q.get("load_in_8bit"):
            return _Quant("bitsandbytes 8-bit", 1.0, skip=skip + _strs(q.get("llm_int8_skip_modules")))
    if method == "compressed-tensors" or "config_groups" in q:
        return _compressed_tensors(q, notes, assumed)
    notes.append(f"quantization method {method or '?'!r} is not sized here: weights counted at the runtime dtype (an upper bound)")
    return None


def _compressed_tensors(q: dict[str, Any], notes: list[str], assumed: list[str] | None = None) -> _Quant | None:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        notes.append("compressed-tensors config without config_groups: weights counted at the runtime dtype (an upper bound)")
        return None
    # the first group that quantizes Linear weights sets the size; a model with several schemes is rare
    for g in groups.values():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict) or not w.get("num_bits"):
            continue
        bits = float(w["num_bits"])
        kind = str(w.get("type") or "int")
        strategy = str(w.get("strategy") or "tensor")
        fmt = str(q.get("format") or "")
        if "nvfp4" in fmt or (bits == 4 and kind == "float"):
            per, label = 0.5 + 1 / 16, "NVFP4 (compressed-tensors)"
        elif strategy == "group" or strategy == "tensor_group":
            gs = _int(w, "group_size")
            if gs is None:
                gs = 128
                if assumed is not None:
                    assumed.append("compressed-tensors group strategy without group_size: groups taken as 128")
            per = _group_bytes(bits, gs, 2.0, 0.0 if w.get("symmetric", True) else bits)
            label = f"compressed-tensors {kind}{bits:g}, group {gs}"
        elif strategy == "block":
            bs = w.get("block_structure")
            if not (isinstance(bs, list) and len(bs) == 2 and all(isinstance(b, int) and b > 0 for b in bs)):
                bs = [128, 128]
                if assumed is not None:
                    assumed.append("compressed-tensors block strategy without a block_structure: blocks taken as 128 × 128")
            per = bits / 8 + 4.0 / (bs[0] * bs[1])
            label = f"compressed-tensors {kind}{bits:g}, {bs[0]}×{bs[1]} blocks"
        else:
            per, label = bits / 8, f"compressed-tensors {kind}{bits:g}, per {strategy}"
        targets = _strs(g.get("targets"))
        parts = LINEAR_PARTS
        if targets and not any(t == "Linear" for t in targets):
            want = [t for t in targets if t.startswith("re:")]
            parts = tuple(p for p in LINEAR_PARTS if any(re.match(t[3:], n) for t in want for n in MODULE_NAMES[p]))
            if not parts:
                notes.append(f"compressed-tensors targets {list(targets)} match no layer kind known here: weights at the runtime dtype")
                return None
        return _Quant(label, per, parts=parts, skip=_strs(q.get("ignore")), style="ct")
    notes.append("compressed-tensors config_groups quantize no weights: weights counted at the runtime dtype")
    return None


# -- the count -------------------------------------------------------------------------------------------
def _padded_vocab(vocab: int, tp: int) -> int:
    """``VocabParallelEmbedding``'s padded size: a multiple of 64, or of 64 × tp when that does not split."""
    pad = math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING
    if pad % tp:
        step = VOCAB_PADDING * tp
        pad = math.ceil(vocab / step) * step
    return pad


def _runtime_dtype(c: dict[str, Any], notes: list[str]) -> tuple[str, float]:
    name = str(c.get("torch_dtype") or c.get("dtype") or "").replace("torch.", "").lower()
    if name in RUNTIME_BYTES:
        return name, RUNTIME_BYTES[name]
    if name in ("float32", "fp32", "float", ""):
        notes.append(f"the config's dtype is {name or 'not given'}: SGLang's --dtype auto runs it as float16 (2 B per parameter)")
        return "float16", 2.0
    notes.append(f"unknown torch_dtype {name!r}: counted as 2 B per parameter")
    return name, 2.0


def _moe_layers(c: dict[str, Any], layers: int) -> list[bool]:
    """Which decoder layers hold a MoE block."""
    k = int(c.get("first_k_dense_replace") or 0)
    freq = _int(c, "moe_layer_freq") or 1
    step = _int(c, "decoder_sparse_step") or 1
    only = {int(i) for i in c.get("mlp_only_layers") or [] if isinstance(i, int)}
    step_offset = 1 if "decoder_sparse_step" in c else 0
    return [i >= k and i % freq == 0 and (i + step_offset) % step == 0 and i not in only for i in range(layers)]


def _field(c: dict[str, Any], keys: tuple[str, ...], default: int, why: str, assumed: list[str]) -> int:
    """A size from the config, else ``default`` with a line in ``assumed`` saying so."""
    v = _int(c, *keys)
    if v is not None:
        return v
    assumed.append(f"{keys[0]} not in the config: taken as {default:,} ({why})")
    return default


def _mixer_params(c: dict[str, Any], hidden: int, notes: list[str], assumed: list[str] | None = None) -> tuple[float, float] | None:
    """(sharded, replicated) parameters of one non-attention mixer layer, from its own fields (a field
    the config lacks is taken at its transformers default and listed in ``assumed``)."""
    assumed = [] if assumed is None else assumed
    nk = _int(c, "linear_num_key_heads")
    if nk:  # Gated DeltaNet (Qwen3-Next; defaults of transformers' Qwen3NextConfig)
        nv = _field(c, ("linear_num_value_heads",), nk, "as many value heads as key heads", assumed)
        dk = _field(c, ("linear_key_head_dim",), 128, "the Qwen3NextConfig default", assumed)
        dv = _field(c, ("linear_value_head_dim",), 128, "the Qwen3NextConfig default", assumed)
        conv = _field(c, ("linear_conv_kernel_dim",), 4, "the Qwen3NextConfig default", assumed)
        kd, vd = nk * dk, nv * dv
        sharded = hidden * (2 * kd + 2 * vd) + hidden * 2 * nv + (2 * kd + vd) * conv + 2 * nv + vd * hidden
        return float(sharded), float(dv)
    d_state = _int(c, "ssm_state_size", "mamba_d_state", "state_size")
    if d_state:  # Mamba-2 style mixer
        heads = _int(c, "mamba_num_heads", "mamba_n_heads")
        head_dim = _int(c, "mamba_head_dim", "mamba_d_head")
        if heads and head_dim:
            inner = heads * head_dim
        else:
            expand = _field(c, ("mamba_expand", "expand"), 2, "the Mamba-2 default", assumed)
            inner = expand * hidden
        if not heads:
            heads = max(1, inner // 64)
            assumed.append(f"mamba_num_heads not in the config: taken as {heads:,} (heads of 64 channels, the Mamba-2 default)")
        groups = _field(c, ("mamba_n_groups", "n_groups"), 1, "one group", assumed)
        conv = _field(c, ("mamba_d_conv", "conv_kernel", "mamba_conv_kernel"), 4, "the Mamba-2 default", assumed)
        sharded = hidden * (2 * inner + 2 * groups * d_state + heads) + (inner + 2 * groups * d_state) * conv + 3 * heads + inner + inner * hidden
        notes.append("Mamba mixer layers counted as Mamba-2 (in_proj, conv, out_proj); a Mamba-1 model differs a little")
        return float(sharded), 0.0
    return None


def _vision_params(cfg: dict[str, Any], notes: list[str], assumed: list[str]) -> float:
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        return 0.0
    depth = _int(v, "depth", "num_hidden_layers", "num_layers")
    h = _int(v, "hidden_size", "embed_dim", "width")
    if not depth or not h:
        assumed.append("the vision_config gives no depth/hidden size: the vision encoder is not counted (--weights-gb gives the real figure)")
        return 0.0
    inter = _int(v, "intermediate_size")
    how = ""
    if inter is None:
        ratio = v.get("mlp_ratio")
        ratio = float(ratio) if isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 0 else None
        inter = int(h * (ratio or 4))
        how = f", MLP {inter:,} wide ({'mlp_ratio' if ratio else 'no intermediate_size or mlp_ratio: taken as 4 × width'})"
    out = _int(v, "out_hidden_size", "projection_dim") or h
    params = depth * (4 * h * h + 2 * h * inter) + 2 * h * out
    notes.append(f"vision encoder estimated from vision_config ({depth} blocks of width {h}{how}): {params / 1e9:.2f} B parameters, approximate")
    return float(params)


def estimate_weights(cfg: dict[str, Any], tp: int = 1, ep: int = 1, attn_tp: int | None = None) -> WeightEstimate:
    """Weights of the model in ``cfg`` on one rank at TP ``tp`` (attention TP ``attn_tp``, ``tp / dp`` under DP
    attention), EP ``ep``. Raises :class:`CapacityInputError` when the config lacks the sizes."""
    tp, ep = max(1, int(tp)), max(1, int(ep))
    attn_tp = max(1, int(attn_tp or tp))
    if tp % ep:
        raise CapacityInputError(f"--ep {ep} does not divide --tp {tp}; SGLang needs the EP size to divide the TP size")
    notes: list[str] = []
    assumed: list[str] = []
    c = _text_config(cfg)
    under = next((k for k in ("text_config", "language_config", "llm_config") if c is not cfg and isinstance(cfg.get(k), dict)
                  and (cfg[k].get("num_hidden_layers") or cfg[k].get("num_layers"))), None)  # the sub-config _text_config took
    model_type = str(c.get("model_type") or cfg.get("model_type") or "")
    layers = _int(c, "num_hidden_layers", "num_layers", "n_layer")
    hidden = _int(c, "hidden_size", "n_embd", "d_model")
    vocab = _int(c, "vocab_size", "padded_vocab_size")
    missing = [n for n, v in (("num_hidden_layers", layers), ("hidden_size", hidden), ("vocab_size", vocab)) if not v]
    if missing:
        raise CapacityInputError(f"the model config has no {', '.join(missing)}, so its weights cannot be sized; "
                                 "pass the language model's config.json, or give --weights-gb")
    assert layers and hidden and vocab
    dtype, b = _runtime_dtype(c, notes)
    quant = _quant(c, notes, assumed) or (_quant(cfg, notes, assumed) if c is not cfg else None)
    parts: list[tuple[str, float, float]] = []  # name, params, per rank

    # embeddings and lm_head (under DP attention the input embedding splits over the attention-TP group)
    emb = float(_padded_vocab(vocab, 1) * hidden)
    parts.append(("embedding", emb, _padded_vocab(vocab, attn_tp) // attn_tp * hidden))
    tied = c.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    if tied is None:
        tied = model_type in TIED_BY_DEFAULT
        notes.append(f"tie_word_embeddings not in the config: taken as {str(tied).lower()} (the {model_type or 'model'} default)")
    if not tied:
        parts.append(("lm_head", emb, _padded_vocab(vocab, tp) // tp * hidden))

    # attention layers (full and sliding-window share weights) vs other mixers
    full, _ = _full_attention_layers(c, layers)
    lt = c.get("layer_types")
    swa_hybrid = isinstance(lt, list) and any("sliding" in str(t) or "local" in str(t) for t in lt)
    pattern = c.get("hybrid_override_pattern") if isinstance(c.get("hybrid_override_pattern"), str) else None
    attn_layers = layers if swa_hybrid or full == layers else full
    mixer_layers = 0 if pattern else layers - attn_layers
    heads = _int(c, "num_attention_heads", "n_head") or 0
    if not heads:
        raise CapacityInputError("the model config has no num_attention_heads, so its weights cannot be sized; pass the language model's config.json")
    if c.get("kv_lora_rank"):
        kvr = int(c["kv_lora_rank"])
        lacking = tuple(n for n in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim") if not _int(c, n))
        if lacking:
            raise _missing([(lacking, "the MLA attention")], under)
        rope, nope, vhd = int(c["qk_rope_head_dim"]), int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
        qlr = int(c.get("q_lora_rank") or 0)  # null: no q compression (DeepSeek-V2-Lite)
        sharded = (qlr if qlr else hidden) * heads * (nope + rope) + kvr * heads * (nope + vhd) + heads * vhd * hidden
        replicated = (hidden * qlr + qlr if qlr else 0) + hidden * (kvr + rope) + kvr
        if c.get("index_topk") or c.get("index_head_dim"):
            ih = _field(c, ("index_n_heads",), 64, "DeepSeek-V3.2's indexer", assumed)
            ihd = _field(c, ("index_head_dim",), 128, "DeepSeek-V3.2's indexer", assumed)
            replicated += (qlr or hidden) * ih * ihd + hidden * ihd + hidden * ih
            notes.append("NSA/DSA indexer weights counted as replicated on every rank")
        parts.append(("attention", float((sharded + replicated) * attn_layers), sharded * attn_layers / attn_tp + replicated * attn_layers))
    else:
        kv_heads, why = kv_heads_of(c, heads)
        if why:
            assumed.append(why)
        hd = _int(c, "head_dim") or hidden // heads  # the definition when head_dim is unset
        bias = bool(c.get("attention_bias") or c.get("qkv_bias") or model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"))
        qo = 2 * hidden * heads * hd + (heads * hd if bias else 0)
        kv = 2 * hidden * kv_heads * hd + (2 * kv_heads * hd if bias else 0)
        kv_rank = (2 * hidden * hd + (2 * hd if bias else 0)) * max(1, kv_heads // attn_tp)
        qk_norm = 2 * hd if model_type.startswith(("qwen3", "olmo2", "gemma3")) else 0
        per_layer = qo + kv + qk_norm
        parts.append(("attention", float(per_layer * attn_layers), (qo / attn_tp + kv_rank + qk_norm) * attn_layers))
        if attn_tp > kv_heads:
            notes.append(f"{kv_heads} KV heads over {attn_tp} attention ranks: each rank holds a whole KV head (replicated)")
    if mixer_layers:
        mp = _mixer_params(c, hidden, notes, assumed)
        if mp is None:
            mp = (parts[-1][1] / max(1, attn_layers), 0.0)
            assumed.append(f"{mixer_layers} non-attention mixer layers have no sizes this tool reads: counted as attention layers "
                           "(approximate; --weights-gb gives the real figure)")
        parts.append(("mixer", (mp[0] + mp[1]) * mixer_layers, (mp[0] / attn_tp + mp[1]) * mixer_layers))

    # MLP / MoE
    inter = _int(c, "intermediate_size", "ffn_hidden_size", "n_inner")
    if inter is None and model_type in FOUR_X_MLP:
        inter = 4 * hidden
        assumed.append(f"the MLP width is not in the config: 4 × hidden = {inter:,}, what {model_type} uses when it is unset")
    mats = 2 if model_type in NON_GATED_MLP else 3
    n_exp = _int(c, "n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
    if pattern:
        dense_layers = pattern.count("-")
        moe_layers = pattern.count("E")
        mamba_in_pattern = pattern.count("M")  # Nemotron-H: one block kind per layer (M, *, -, E)
        mp = _mixer_params(c, hidden, notes, assumed) if mamba_in_pattern else None
        if mp:
            parts.append(("mixer", (mp[0] + mp[1]) * mamba_in_pattern, (mp[0] / attn_tp + mp[1]) * mamba_in_pattern))
    else:
        moe_flags = _moe_layers(c, layers) if n_exp else [False] * layers
        moe_layers = sum(moe_flags)
        dense_layers = layers - moe_layers
    lacking: list[tuple[tuple[str, ...], str]] = []
    if dense_layers and inter is None:
        lacking.append((("intermediate_size",), f"the MLP of {dense_layers} dense layer(s)"))
    moe_inter = _int(c, "moe_intermediate_size", "expert_intermediate_size") if moe_layers and n_exp else None
    if moe_layers and n_exp and moe_inter is None:
        if inter is None or model_type in OWN_EXPERT_WIDTH:
            # e.g. a DeepSeek-V3 / Kimi-K2 config without it: 4 × hidden gave 14 T parameters for a 1 T model
            names = (("moe_intermediate_size",) if model_type in OWN_EXPERT_WIDTH else ("intermediate_size",)
                     if model_type in EXPERTS_AT_INTERMEDIATE else ("moe_intermediate_size", "intermediate_size"))
            what = f"the {n_exp} experts of {moe_layers} MoE layer(s)"
            if lacking and lacking[0][0] == names:
                lacking[0] = (names, f"{lacking[0][1]} and {what}")
            else:
                lacking.append((names, what))
        else:
            moe_inter = inter
            if model_type not in EXPERTS_AT_INTERMEDIATE:
                assumed.append(f"moe_intermediate_size not in the config: each expert counted at intermediate_size ({inter:,}), as "
                               "Mixtral's are; if this model's experts are narrower, supply it with --json-model-override-args")
    if lacking:
        raise _missing(lacking, under)
    if dense_layers:
        assert inter is not None
        dense = mats * hidden * inter
        parts.append(("mlp", float(dense * dense_layers), dense * dense_layers / tp))
    if moe_layers and n_exp:
        assert moe_inter is not None
        exp_bias = 2 * moe_inter + hidden if model_type == "gpt_oss" else 0  # gate_up and down biases
        per_expert = 3 * hidden * moe_inter + exp_bias
        parts.append(("experts", float(per_expert * n_exp * moe_layers), per_expert * n_exp * moe_layers / tp))
        if n_exp % ep:
            notes.append(f"{n_exp} experts do not split evenly over EP {ep}: the busiest rank holds {math.ceil(n_exp / ep)}")
        shared_inter = (_int(c, "n_shared_experts") or 0) * moe_inter + (_int(c, "shared_expert_intermediate_size") or 0)
        if shared_inter:
            sh = 3 * hidden * shared_inter
            parts.append(("shared_experts", float(sh * moe_layers), sh * moe_layers / tp))
        bias = c.get("topk_method") == "noaux_tc" or model_type == "gpt_oss"  # V3's e_score_correction_bias, gpt-oss' router bias
        router = hidden * n_exp + (n_exp if bias else 0) + (hidden if _int(c, "shared_expert_intermediate_size") else 0)
        parts.append(("router", float(router * moe_layers), float(router * moe_layers)))
    if _int(c, "num_nextn_predict_layers"):
        notes.append(f"{c['num_nextn_predict_layers']} MTP layer(s) in the checkpoint are not counted: SGLang loads them only as "
                     "the speculative-decoding draft")
    norms = float(2 * hidden * layers + hidden)
    vision = _vision_params(cfg, notes, assumed)
    if vision:
        parts.append(("vision", vision, vision / tp))

    out: list[Part] = []
    for name, params, per_rank in parts:
        bpp = quant.bytes_per_param if quant is not None and quant.covers(name) else b
        out.append(Part(name, params, per_rank, bpp))
    out.append(Part("norms", norms, norms, b))
    est = WeightEstimate(out, dtype, quant.label if quant else "", tp=tp, ep=ep, attn_tp=attn_tp, notes=notes, assumed=assumed)
    if quant is not None:
        done = [p.name for p in out if p.bytes_per_param != b and p.params]
        kept = [p.name for p in out if p.bytes_per_param == b and p.params]
        notes.append(f"{quant.label}: {', '.join(done) or 'no part'} at {quant.bytes_per_param:.3g} B/param; "
                     f"{', '.join(kept)} at {dtype}")
    return est


def checkpoint_bytes(model_dir: str | Path | None) -> tuple[int, str] | None:
    """Total tensor bytes from ``model.safetensors.index.json`` (``metadata.total_size``) beside a config, if any."""
    if model_dir is None:
        return None
    import json

    d = Path(model_dir)
    d = d.parent if d.is_file() else d
    idx = d / "model.safetensors.index.json"
    try:
        data = json.loads(idx.read_text(encoding="utf-8"))
        total = int(data["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (total, str(idx)) if total > 0 else None


__all__ = ["Part", "WeightEstimate", "checkpoint_bytes", "estimate_weights"]
