"""GGUF metadata -> a frozen ModelConfig (hyperparameters as llama.cpp reads them)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .errors import ModelFileError

SUPPORTED_ARCHS = ("qwen3moe", "qwen2moe", "llama", "olmoe", "deepseek2")
# llama.cpp's rope type per architecture: "norm" rotates adjacent pairs (x0,x1),
# "neox" rotates (x_i, x_{i+d/2}).
ROPE_STYLE = {"llama": "norm", "deepseek2": "norm", "qwen3moe": "neox", "qwen2moe": "neox", "olmoe": "neox"}
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
MAX_EXPERTS = 4096  # llama.cpp stops at 512 routed experts; 4096 leaves room and bounds every table


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key length
    head_dim_v: int  # value length
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_style: str
    rope_dim: int
    rope_base: float
    rope_freq_scale: float  # 1 / linear scaling factor
    n_expert: int
    n_expert_used: int
    n_ff: int  # dense FFN width (llama: the per-expert width in MoE files)
    n_ff_exp: int
    n_ff_shexp: int  # 0 when there is no shared expert
    n_expert_shared: int
    n_layer_dense_lead: int  # leading dense blocks (deepseek2)
    gating: int  # GATING_SOFTMAX | GATING_SIGMOID
    norm_topk: bool  # renormalise the top-k weights
    weights_scale: float  # 0 or 1 = none
    n_expert_groups: int
    n_group_used: int
    attn_scale: float  # 0 = 1/sqrt(head_dim)
    mla: MlaArgs | None = None  # deepseek2's attention and YaRN (None for every other architecture)


@dataclass(frozen=True)
class MlaArgs:
    """deepseek2's MLA and YaRN hyperparameters, as llama.cpp reads them. MLA files
    (split attn_k_b/attn_v_b) carry key_length_mla/value_length_mla and a one-head
    key_length of kv_lora_rank + rope dims; legacy attn_kv_b files carry the
    per-head sizes in key_length/value_length."""
    q_lora_rank: int  # 0: a plain attn_q (V2-Lite)
    kv_lora_rank: int
    absorbed: bool  # split attn_k_b/attn_v_b (MLA files), not a legacy attn_kv_b
    head_dim_k: int  # per-head key length of the decompressed keys (nope + rope)
    head_dim_v: int
    n_layer_nextn: int  # next-token-prediction blocks after the trunk (not run)
    rope_scaling: str
    yarn_orig_ctx: int
    yarn_log_mul: float
    rope_attn_factor: float
    attn_temp_scale: float  # position-dependent query scaling (Mistral Large 3 in this architecture)
    attn_temp_length: int


def _scalar(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


_KIND_NAMES = {int: "an integer", float: "a number", bool: "a bool", str: "a string"}


def _typed(path: str, key: str, v: Any, kind):
    """A value of the type llama.cpp reads the key as (an integer key holding
    2.5 or "synthetic-..." is refused, not rounded or parsed)."""
    ok = {int: lambda: isinstance(v, int) and not isinstance(v, bool),
          float: lambda: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          bool: lambda: isinstance(v, bool), str: lambda: isinstance(v, str)}[kind]()
    if not ok:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        raise ModelFileError(path, f"{key} is {shown}, expected {_KIND_NAMES[kind]}")
    return kind(v)


def _key_reader(meta: Mapping[str, Any], arch: str, path: str):
    """key(name, default, kind): the value of `{arch}.{name}` as llama.cpp reads it
    (per-layer arrays must be uniform); a missing key without a default is refused."""

    def key(name: str, default: Any = ..., kind=int):
        full = f"{arch}.{name}"
        if full not in meta:
            if default is ...:
                raise ModelFileError(path, f"missing metadata key {full}")
            return default
        v = _scalar(meta[full])
        if isinstance(v, list):  # per-layer arrays: we need them uniform
            if not v:
                raise ModelFileError(path, f"{full} is an empty array, expected {_KIND_NAMES[kind]}")
            if any(x != v[0] for x in v):
                raise ModelFileError(path, f"per-layer values of {full} differ; not supported")
            v = v[0]
        return _typed(path, full, v, kind)

    return key


def config_from_metadata(meta: Mapping[str, Any], path: str = "<model>") -> ModelConfig:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(path, "no general.architecture key")
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(path, f"unsupported architecture '{arch}' (supported: {', '.join(SUPPORTED_ARCHS)})")

    key = _key_reader(meta, arch, path)
    n_embd = key("embedding_length")
    n_head = key("attention.head_count")
    if n_embd <= 0 or n_head <= 0 or n_embd > 1 << 20 or n_head > 4096:
        raise ModelFileError(path, f"bad embedding_length/head_count {n_embd}/{n_head}")
    head_dim = key("attention.key_length", n_embd // n_head)
    n_expert = key("expert_count", 0)
    n_ff = key("feed_forward_length", 0)
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = key("vocab_size", len(tokens) if isinstance(tokens, list) else 0)
    scale = key("rope.scaling.factor", 0.0, float) or key("rope.scale_linear", 0.0, float)
    if meta.get(f"{arch}.rope.scaling.type") == "none":  # llama.cpp never scales then
        scale = 0.0
    # (olmoe and llama size experts by feed_forward_length, as llama.cpp does.)
    # llama.cpp fixes gating and top-k renormalisation per architecture; only
    # deepseek2 files carry them as keys.
    gating = GATING_SOFTMAX
    norm_topk = arch in ("qwen3moe", "llama")
    mla = None
    n_layer = key("block_count")
    n_ff_shexp = key("expert_shared_feed_forward_length", 0)
    if arch == "deepseek2":
        gating = key("expert_gating_func", GATING_SOFTMAX) or GATING_SOFTMAX  # 0 (none): llama.cpp's softmax too
        norm_topk = key("expert_weights_norm", False, bool)
        mla = _mla_args(key, head_dim, n_embd // n_head)
        n_layer -= mla.n_layer_nextn  # next-token-prediction blocks sit after the trunk
        n_ff_shexp = key("expert_feed_forward_length", 0) * key("expert_shared_count", 0)
        if f"{arch}.expert_gating_func" not in meta and n_layer in (47, 48) and n_vocab == 154880:
            gating = GATING_SIGMOID  # llama.cpp's default for GLM-4.7-Flash files without the key
    cfg = ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=key("attention.head_count_kv", n_head),
        head_dim=head_dim,
        head_dim_v=key("attention.value_length", n_embd // n_head),
        n_vocab=n_vocab,
        n_ctx_train=key("context_length", 4096),
        rms_eps=key("attention.layer_norm_rms_epsilon", 1e-5, float),
        rope_style=ROPE_STYLE[arch],
        rope_dim=key("rope.dimension_count", head_dim),
        rope_base=key("rope.freq_base", 10000.0, float),
        rope_freq_scale=1.0 / scale if scale else 1.0,
        n_expert=n_expert,
        n_expert_used=key("expert_used_count", 0),
        n_ff=n_ff,
        n_ff_exp=key("expert_feed_forward_length", n_ff if arch in ("llama", "olmoe") else 0),
        n_ff_shexp=n_ff_shexp,
        n_expert_shared=key("expert_shared_count", 0),
        n_layer_dense_lead=key("leading_dense_block_count", 0),
        gating=gating,
        norm_topk=bool(norm_topk),
        weights_scale=key("expert_weights_scale", 0.0, float),
        n_expert_groups=key("expert_group_count", 0),
        n_group_used=key("expert_group_used_count", 0),
        attn_scale=key("attention.scale", 0.0, float),
        mla=mla,
    )
    _validate(cfg, path)
    return cfg


def _mla_args(key, head_dim: int, head_dim_default: int) -> MlaArgs:
    absorbed = key("attention.key_length_mla", 0) > 0 and key("attention.value_length_mla", 0) > 0
    log_mul = key("rope.scaling.yarn_log_multiplier", 0.0, float)
    return MlaArgs(
        q_lora_rank=key("attention.q_lora_rank", 0),
        kv_lora_rank=key("attention.kv_lora_rank"),
        absorbed=absorbed,
        head_dim_k=key("attention.key_length_mla") if absorbed else head_dim,
        head_dim_v=key("attention.value_length_mla") if absorbed else key("attention.value_length", head_dim_default),
        n_layer_nextn=key("nextn_predict_layers", 0),
        rope_scaling=key("rope.scaling.type", "linear", str),
        yarn_orig_ctx=key("rope.scaling.original_context_length", 0),
        # converters write 0.1 * mscale_all_dim; llama.cpp divides the 0.1 back out
        yarn_log_mul=float(np.float32(log_mul) / np.float32(0.1)) if log_mul else 0.0,
        rope_attn_factor=key("rope.scaling.attn_factor", 1.0, float),
        attn_temp_scale=key("attention.temperature_scale", 0.0, float),
        attn_temp_length=key("attention.temperature_length", 0),
    )


def _validate(c: ModelConfig, path: str) -> None:
    def bad(msg):
        raise ModelFileError(path, msg)

    if not 0 < c.n_layer <= 512:
        bad(f"bad block_count {c.n_layer}")
    # bounds no real model comes near, so that nothing sized from them can be absurd
    for name, v, lo, hi in (("attention.key_length", c.head_dim, 1, 1 << 14),
                            ("attention.value_length", c.head_dim_v, 1, 1 << 14),
                            ("vocabulary size", c.n_vocab, 0, 1 << 24), ("context_length", c.n_ctx_train, 1, 1 << 28),
                            ("expert_count", c.n_expert, 0, MAX_EXPERTS), ("feed_forward_length", c.n_ff, 0, 1 << 20),
                            ("expert_feed_forward_length", c.n_ff_exp, 0, 1 << 20),
                            ("shared expert FFN width", c.n_ff_shexp, 0, 1 << 22),
                            ("expert_shared_count", c.n_expert_shared, 0, MAX_EXPERTS),
                            ("leading_dense_block_count", c.n_layer_dense_lead, 0, c.n_layer),
                            ("expert_group_count", c.n_expert_groups, 0, MAX_EXPERTS),
                            ("expert_group_used_count", c.n_group_used, 0, MAX_EXPERTS)):
        if not lo <= v <= hi:
            bad(f"{c.arch}.{name} is {v}, expected {lo}..{hi}" if not name.startswith(("vocab", "shared"))
                else f"{name} is {v}, expected {lo}..{hi}")
    if not c.rms_eps >= 0 or not c.rope_base > 0 or not c.rope_freq_scale > 0 or c.attn_scale < 0:
        bad(f"bad layer_norm_rms_epsilon / rope.freq_base / rope scaling / attention.scale "
            f"({c.rms_eps}, {c.rope_base}, {1 / c.rope_freq_scale if c.rope_freq_scale else 0}, {c.attn_scale})")
    if c.n_head_kv <= 0 or c.n_head % c.n_head_kv:
        bad(f"head_count {c.n_head} is not a multiple of head_count_kv {c.n_head_kv}")
    if c.rope_dim <= 0 or c.rope_dim > c.head_dim or c.rope_dim % 2:
        bad(f"bad rope.dimension_count {c.rope_dim}")
    if c.n_vocab <= 0:
        bad("no vocabulary (tokenizer.ggml.tokens missing, empty or not an array of strings)")
    if c.n_expert:
        if not 0 < c.n_expert_used <= c.n_expert:
            bad(f"expert_used_count {c.n_expert_used} does not fit expert_count {c.n_expert}")
        if c.n_ff_exp <= 0:
            bad("expert FFN width unknown")
        if c.gating not in (GATING_SOFTMAX, GATING_SIGMOID):
            bad(f"unsupported expert_gating_func {c.gating}")
        if c.n_expert_groups > 1 and (c.n_expert % c.n_expert_groups or not 0 < c.n_group_used < c.n_expert_groups):
            bad("inconsistent expert_group_count / expert_group_used_count")
    elif c.arch != "llama":
        bad("expert_count missing: not a Mixture-of-Experts model")
    if c.arch == "deepseek2":
        hk, kv = c.mla.head_dim_k, c.mla.kv_lora_rank
        if not 0 < c.rope_dim < hk or kv <= 0 or c.mla.head_dim_v <= 0:
            bad(f"bad MLA sizes: key length {hk}, rope dims {c.rope_dim}, kv_lora_rank {kv}")
        if c.n_layer <= 0 or c.n_layer_dense_lead > c.n_layer:
            bad("bad nextn_predict_layers / leading_dense_block_count")
        if c.mla.attn_temp_scale and c.mla.attn_temp_length <= 0:
            bad("attention.temperature_scale needs a positive attention.temperature_length")
        for name in ("q_lora_rank", "kv_lora_rank", "n_layer_nextn", "yarn_orig_ctx", "attn_temp_length"):
            if not 0 <= getattr(c.mla, name) <= 1 << 20:
                bad(f"bad {name} {getattr(c.mla, name)}")
        if c.mla.rope_scaling not in ("none", "linear", "yarn"):
            bad(f"unsupported rope.scaling.type {c.mla.rope_scaling!r}")
