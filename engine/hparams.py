"""GGUF metadata -> a frozen ModelConfig (hyperparameters as llama.cpp reads them)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .arch import ARCHS
from .arch.deepseek2 import MlaArgs  # cfg.mla's type
from .arch.spec import GATING_SIGMOID, GATING_SOFTMAX, ArchSpec
from .errors import ModelFileError

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
    spec = ARCHS.get(arch)
    if spec is None:
        raise ModelFileError(path, f"unsupported architecture '{arch}' (supported: {', '.join(ARCHS)})")

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
    # llama.cpp fixes gating and top-k renormalisation per architecture; an architecture
    # whose files carry them as keys (deepseek2) reads them in its own hparams
    h = dict(gating=GATING_SOFTMAX, norm_topk=spec.norm_topk, mla=None, n_layer=key("block_count"),
             n_ff_shexp=key("expert_shared_feed_forward_length", 0))
    if spec.hparams is not None:
        h.update(spec.hparams(key, dict(h, n_embd=n_embd, n_head=n_head, head_dim=head_dim, n_vocab=n_vocab)))
    cfg = ModelConfig(
        arch=arch,
        n_layer=h["n_layer"],
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=key("attention.head_count_kv", n_head),
        head_dim=head_dim,
        head_dim_v=key("attention.value_length", n_embd // n_head),
        n_vocab=n_vocab,
        n_ctx_train=key("context_length", 4096),
        rms_eps=key("attention.layer_norm_rms_epsilon", 1e-5, float),
        rope_style=spec.rope,
        rope_dim=key("rope.dimension_count", head_dim),
        rope_base=key("rope.freq_base", 10000.0, float),
        rope_freq_scale=1.0 / scale if scale else 1.0,
        n_expert=n_expert,
        n_expert_used=key("expert_used_count", 0),
        n_ff=n_ff,
        n_ff_exp=key("expert_feed_forward_length", n_ff if spec.ff_exp_from_ff else 0),
        n_ff_shexp=h["n_ff_shexp"],
        n_expert_shared=key("expert_shared_count", 0),
        n_layer_dense_lead=key("leading_dense_block_count", 0),
        gating=h["gating"],
        norm_topk=bool(h["norm_topk"]),
        weights_scale=key("expert_weights_scale", 0.0, float),
        n_expert_groups=key("expert_group_count", 0),
        n_group_used=key("expert_group_used_count", 0),
        attn_scale=key("attention.scale", 0.0, float),
        mla=h["mla"],
    )
    _validate(cfg, spec, path)
    return cfg


def _validate(c: ModelConfig, spec: ArchSpec, path: str) -> None:
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
    elif spec.needs_experts:
        bad("expert_count missing: not a Mixture-of-Experts model")
    if spec.check is not None:
        spec.check(c, bad)
