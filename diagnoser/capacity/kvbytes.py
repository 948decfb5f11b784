"""KV-cache bytes per token from a Hugging Face ``config.json`` (docs/sglang.md#kv-bytes).

* MHA/GQA: ``2 × max(1, kv_heads // attention_tp) × head_dim × layers × dtype`` per GPU rank, where
  ``attention_tp = tp`` (or ``tp / dp`` under DP attention).
* MLA (DeepSeek V2/V3, Kimi K2): ``(kv_lora_rank + qk_rope_head_dim) × layers × dtype``, NOT divided by TP
  (every rank holds the whole latent).
* Hybrid models (sliding-window, Mamba/linear attention): only the full-attention layers count for the
  main pool; the SWA/state pools are separate.
* ``--kv-cache-dtype``: auto = the model dtype; bf16/fp16 2 B; fp8 variants 1 B; fp4 variants 0.5 B (scale
  bytes ignored). Pool sizes are rounded down to whole pages.

The engine prints its own numbers (``KV Cache is allocated. #tokens: N, K size: X GB``); :mod:`pool`
prefers those and uses this formula only to extrapolate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = float(1 << 30)


class CapacityInputError(ValueError):
    """Bad capacity input (config file, dtype…): the message is one sentence with the next step."""


DTYPE_BYTES: dict[str, float] = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1, "mxfp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "fp4_e2m1": 0.5, "nvfp4": 0.5, "fp4_mx_block16": 0.5, "fp4": 0.5,
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the KV formula needs from a model config."""

    arch: str
    attention: str  # "mha" (MHA/GQA/MQA) or "mla"
    layers: int  # all decoder layers
    full_attention_layers: int  # layers that use the main KV pool
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    model_dtype_bytes: float = 2.0
    attn_params_sharded: int = 0  # attention weights split by attention-TP (per layer × full layers)
    attn_params_replicated: int = 0  # attention weights every rank holds anyway
    context_length: int | None = None
    notes: tuple[str, ...] = field(default=())
    assumed: tuple[str, ...] = field(default=())  # sizes the config lacks, and what was taken for them

    @property
    def hybrid(self) -> bool:
        return self.full_attention_layers != self.layers


def _hf_cache_dirs() -> list[Path]:
    import os

    out = [Path(os.environ[k]) for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if os.environ.get(k)]
    home = os.environ.get("HF_HOME")
    out.append(Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub")
    return out


def _snapshot_config(repo: Path) -> Path | None:
    """config.json of a Hugging Face cache entry (``models--org--name``): the snapshot ``refs/main`` names,
    else the newest snapshot that has one."""
    snaps = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        ref = ""
    if ref and (snaps / ref / "config.json").is_file():
        return snaps / ref / "config.json"
    try:
        found = [d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda f: f.stat().st_mtime) if found else None


def resolve_model_config(path: str | Path) -> Path:
    """The config.json that ``--model-config`` names: a file, a model directory, a Hugging Face cache entry
    (``…/models--org--name`` or one of its snapshots) or ``org/name`` found in the local cache. Nothing is
    downloaded."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "config.json").is_file():
            return p / "config.json"
        if (p / "snapshots").is_dir():
            cfg = _snapshot_config(p)
            if cfg is not None:
                return cfg
            raise CapacityInputError(f"the Hugging Face cache entry {p} has no snapshot with a config.json; "
                                     "pass the model's config.json with --model-config")
        try:
            next(p.iterdir(), None)
        except OSError as e:
            raise CapacityInputError(f"cannot read the directory {p} ({e.strerror or type(e).__name__}); "
                                     "pass a readable model directory or its config.json") from None
        raise CapacityInputError(f"the directory {p} has no config.json; pass the model directory that holds it, "
                                 "or the config.json itself")
    text = str(path)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        repo_name = "models--" + text.replace("/", "--")
        for cache in _hf_cache_dirs():
            cfg = _snapshot_config(cache / repo_name) if (cache / repo_name).is_dir() else None
            if cfg is not None:
                return cfg
        raise CapacityInputError(f"model config {text} is not a file and {repo_name} is not in the local Hugging Face cache "
                                 f"({_hf_cache_dirs()[-1]}); nothing is downloaded: pass the path of its config.json")
    raise CapacityInputError(f"model config {p} does not exist; pass the model's Hugging Face config.json with --model-config")


def load_model_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json (or a model directory or Hugging Face cache entry holding one)."""
    import json  # only with --model-config: keeps json off the plain --once start-up path

    p = resolve_model_config(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CapacityInputError(f"model config {p} is not readable JSON ({type(e).__name__}); pass the model's config.json") from None
    if not isinstance(data, dict):
        raise CapacityInputError(f"model config {p} is not a JSON object; pass the model's config.json")
    return data


def apply_model_overrides(cfg: dict[str, Any], overrides: Any) -> dict[str, Any]:
    """The config with SGLang's ``--json-model-override-args`` applied as SGLang applies it: each key set
    at the top level, a dict merged into a sub-config that is a dict (``{"text_config": {...}}``)
    (``python/sglang/srt/utils/hf_transformers/config.py`` ``get_config`` at v0.5.23)."""
    if isinstance(overrides, str):
        import json

        try:
            overrides = json.loads(overrides or "{}")
        except json.JSONDecodeError:
            raise CapacityInputError("--json-model-override-args is not JSON; write it like '{\"moe_intermediate_size\": 2048}'") from None
    if not isinstance(overrides, dict):
        raise CapacityInputError("--json-model-override-args must be a JSON object, like '{\"moe_intermediate_size\": 2048}'")
    out = dict(cfg)
    for k, v in overrides.items():
        cur = out.get(k)
        out[k] = {**cur, **v} if isinstance(v, dict) and isinstance(cur, dict) else v
    return out


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal wrappers (Kimi-K2.5, Llava, Qwen-VL…) keep the language model under a sub-key."""
    for key in ("text_config", "language_config", "llm_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and (sub.get("num_hidden_layers") or sub.get("num_layers")):
            merged = dict(sub)
            for k in ("torch_dtype", "dtype"):
                if k not in merged and k in cfg:
                    merged[k] = cfg[k]
            return merged
    return cfg


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


# architectures that are multi-head attention by definition (no KV-head field in their config class)
MHA_ONLY = ("gpt2", "gptj", "bloom", "opt", "gpt_neox", "mpt", "codegen")


def kv_heads_of(cfg: dict[str, Any], heads: int) -> tuple[int, str | None]:
    """KV heads of a (text) config: its own field, the architecture's definition (GPT-BigCode and Falcon
    are multi-query unless they say otherwise; GPT-2 & co. are MHA), else transformers' default for a
    config without the field (as many as the query heads), with a sentence saying it was taken."""
    n = _int(cfg, "num_key_value_heads", "multi_query_group_num", "num_kv_heads", "n_head_kv")
    if n is not None:
        return n, None
    mt = str(cfg.get("model_type") or "")
    if mt == "gpt_bigcode":  # GPTBigCodeConfig multi_query=True: one KV head
        return (1 if cfg.get("multi_query", True) else heads), None
    if mt == "falcon" and not cfg.get("new_decoder_architecture"):  # FalconConfig multi_query=True: one KV head
        return (1 if cfg.get("multi_query", True) else heads), None
    if mt in MHA_ONLY:
        return heads, None
    return heads, f"num_key_value_heads not in the config: taken as num_attention_heads ({heads}), as transformers does (MHA)"


def _full_attention_layers(cfg: dict[str, Any], layers: int) -> tuple[int, str]:
    lt = cfg.get("layer_types")
    if isinstance(lt, list) and lt:
        n = sum(1 for t in lt if str(t) in ("full_attention", "attention", "global_attention", "full"))
        return n, f"layer_types: {n} of {len(lt)} layers are full attention"
    interval = _int(cfg, "full_attention_interval")
    if interval:
        n = layers // interval
        return n, f"full_attention_interval {interval}: {n} of {layers} layers are full attention"
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        n = pattern.count("*")
        return n, f"hybrid_override_pattern: {n} of {len(pattern)} layers are attention"
    period = _int(cfg, "attn_layer_period")
    if period:
        off = int(cfg.get("attn_layer_offset") or 0)
        n = sum(1 for i in range(layers) if i % period == off)
        return n, f"attn_layer_period {period}: {n} of {layers} layers are attention"
    swp = _int(cfg, "sliding_window_pattern")
    if swp and swp > 1:
        n = layers // swp
        return n, f"sliding_window_pattern {swp}: {n} of {layers} layers are global attention"
    return layers, ""


def model_shape(cfg: dict[str, Any]) -> ModelShape:
    """The attention shape of a Hugging Face config (MLA, MHA/GQA, hybrid)."""
    top_arch = (cfg.get("architectures") or ["?"])[0] if isinstance(cfg.get("architectures"), list) else "?"
    c = _text_config(cfg)
    layers = _int(c, "num_hidden_layers", "num_layers", "n_layer")
    if not layers:
        raise CapacityInputError("the model config has no num_hidden_layers; pass the language model's config.json")
    dtype_name = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    notes: list[str] = []
    assumed: list[str] = []
    # a float32 checkpoint runs as float16 under SGLang's --dtype auto (configs/model_config.py, _get_and_verify_dtype),
    # and so does one without a dtype (the weight estimate says so)
    if dtype_name in ("float32", "fp32", "float"):
        mdb = 2.0
    elif dtype_name in DTYPE_BYTES:
        mdb = DTYPE_BYTES[dtype_name]
    else:
        mdb = 2.0
        assumed.append(f"unknown torch_dtype {dtype_name!r}: the KV cache (auto) counted at 2 B per element; pass --kv-cache-dtype")
    full, why = _full_attention_layers(c, layers)
    if why:
        notes.append(why)
    heads = _int(c, "num_attention_heads", "n_head") or 0
    hidden = _int(c, "hidden_size", "n_embd") or 0
    ctx = _int(c, "max_position_embeddings")
    if c.get("kv_lora_rank"):
        kvr = int(c["kv_lora_rank"])
        rope = _int(c, "qk_rope_head_dim")
        if rope is None:  # half of each MLA KV entry: no default would be honest
            raise CapacityInputError("the model config has kv_lora_rank but no qk_rope_head_dim, so the KV bytes per token cannot be "
                                     "computed; supply it with --json-model-override-args '{\"qk_rope_head_dim\": N}'")
        nope = int(c.get("qk_nope_head_dim") or 0)
        vhd = int(c.get("v_head_dim") or 0)
        qlr = int(c.get("q_lora_rank") or 0)
        if not nope or not vhd:
            notes.append("the config has no qk_nope_head_dim / v_head_dim: the attention weights DP attention would replicate are "
                         "not counted")
        if c.get("index_topk") or c.get("index_head_dim"):
            notes.append("NSA/DSA model: the indexer's per-layer cache is not counted (docs/sglang.md#kv-bytes), so bytes per token are a floor")
        q_b = (qlr if qlr else hidden) * heads * (nope + rope)
        kv_b = kvr * heads * (nope + vhd)
        o = heads * vhd * hidden
        q_a = hidden * qlr if qlr else 0
        kv_a = hidden * (kvr + rope)
        return ModelShape(
            arch=top_arch, attention="mla", layers=layers, full_attention_layers=full, kv_lora_rank=kvr,
            qk_rope_head_dim=rope, model_dtype_bytes=mdb, attn_params_sharded=(q_b + kv_b + o) * full,
            attn_params_replicated=(q_a + kv_a) * full, context_length=ctx, notes=tuple(notes), assumed=tuple(assumed),
        )
    kv_heads, why = kv_heads_of(c, heads) if heads else (0, None)
    if why:
        assumed.append(why)
    head_dim = _int(c, "head_dim") or (hidden // heads if heads else 0)  # the definition when head_dim is unset
    if not kv_heads or not head_dim:
        raise CapacityInputError("the model config has no attention heads/head_dim; pass the language model's config.json")
    qkvo = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    return ModelShape(
        arch=top_arch, attention="mha", layers=layers, full_attention_layers=full, kv_heads=kv_heads,
        head_dim=head_dim, model_dtype_bytes=mdb, attn_params_sharded=qkvo * full, context_length=ctx,
        notes=tuple(notes), assumed=tuple(assumed),
    )


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype_bytes: float = 2.0) -> float:
    """Bytes per KV element for ``--kv-cache-dtype`` (``auto`` = the model dtype)."""
    name = str(kv_cache_dtype or "auto").strip().lower().replace("torch.", "")
    if name in ("auto", "", "none"):
        return model_dtype_bytes
    if name in DTYPE_BYTES:
        return DTYPE_BYTES[name]
    raise CapacityInputError(
        f"unknown --kv-cache-dtype {kv_cache_dtype!r}; use auto, bf16, fp16, fp8_e4m3, fp8_e5m2 or fp4_e2m1"
    )


def bytes_per_token(shape: ModelShape, attention_tp: int = 1, kv_cache_dtype: str | None = "auto") -> float:
    """KV bytes one token costs on one GPU rank (main pool only)."""
    s = kv_dtype_bytes(kv_cache_dtype, shape.model_dtype_bytes)
    if shape.attention == "mla":
        return (shape.kv_lora_rank + shape.qk_rope_head_dim) * shape.full_attention_layers * s
    per_rank = max(1, shape.kv_heads // max(1, int(attention_tp)))
    return 2 * per_rank * shape.head_dim * shape.full_attention_layers * s


def tokens_for_budget(budget_gib: float, bpt: float, page_size: int | None = 1) -> int:
    """Pool tokens a KV budget buys: floor(budget × 2^30 / bytes), rounded down to whole pages."""
    if budget_gib <= 0 or bpt <= 0:
        return 0
    n = int(budget_gib * GIB // bpt)
    page = max(1, int(page_size or 1))
    return n // page * page


def kv_gib(tokens: float, bpt: float) -> float:
    return tokens * bpt / GIB


def attention_weight_gib_per_rank(shape: ModelShape, attention_tp: int, weight_bytes: float | None = None) -> float:
    """Attention weights one rank holds at a given attention-TP (sharded part / attn_tp + replicated part)."""
    wb = shape.model_dtype_bytes if weight_bytes is None else weight_bytes
    return (shape.attn_params_sharded / max(1, attention_tp) + shape.attn_params_replicated) * wb / GIB
