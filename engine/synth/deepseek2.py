"""What a synthetic deepseek2 (DeepSeek-V2/V2-Lite/V3/R1) model holds, in
llama.cpp's exact layout: MLA attention (with or without q LoRA; split
attn_k_b/attn_v_b or the legacy attn_kv_b), leading dense blocks, routed and
shared experts, YaRN keys, optional next-token-prediction (MTP) blocks.

The presets are the variants the parity tests cover; synth.py writes them like
the other presets (write_synthetic(path, "ds2_v3", seed=0)).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .arch import TensorSpec

# V2-Lite: no q LoRA, softmax gating (no gating key: llama.cpp's default), no
# top-k renormalisation; YaRN with V2's mscale_all_dim 0.707.
_LITE = dict(n_embd=64, n_layer=3, n_head=4, q_lora_rank=0, kv_lora_rank=32, qk_nope=16, qk_rope=16,
             v_head=16, n_ff=96, n_ff_exp=32, n_expert=8, n_expert_used=2, n_expert_shared=2,
             n_layer_dense_lead=1, gating=0, weights_norm=None, weights_scale=1.0,
             rope_factor=4.0, yarn_orig_ctx=4096, yarn_log_mul=0.0707, n_ctx=16384)
# V3/R1: q LoRA, sigmoid gating + selection bias, normalised and scaled weights,
# group-limited top-k, YaRN with mscale_all_dim 1.
_V3 = dict(n_embd=64, n_layer=3, n_head=4, q_lora_rank=48, kv_lora_rank=32, qk_nope=16, qk_rope=16,
           v_head=16, n_ff=96, n_ff_exp=32, n_expert=8, n_expert_used=3, n_expert_shared=1,
           n_layer_dense_lead=1, gating=2, weights_norm=True, weights_scale=2.5, n_group=4, n_group_used=2,
           exp_probs_b=True, rope_factor=40.0, yarn_orig_ctx=4096, yarn_log_mul=0.1, n_ctx=163840)
PRESETS: dict[str, dict] = {
    "ds2_lite": _LITE,
    "ds2_v3": _V3,
    "ds2_v3_nogroup": {**_V3, "n_group": 0, "n_group_used": 0},
    # the same weights as ds2_v3 with the value/key up-projections in one attn_kv_b
    "ds2_v3_legacy": {**_V3, "legacy_kv_b": True},
    # ds2_v3 plus one MTP block after the trunk (llama.cpp skips it)
    "ds2_v3_mtp": {**_V3, "n_nextn": 1},
    # llama.cpp's per-position query temperature (Mistral Large 3 files use this
    # architecture), with a short temperature_length so it varies within a prompt
    "ds2_lite_temp": {**_LITE, "attn_temp_scale": 0.1, "attn_temp_length": 8},
}


@dataclass(frozen=True)
class DS2Shape:
    n_embd: int
    n_layer: int  # trunk blocks (block_count = n_layer + n_nextn)
    n_head: int
    q_lora_rank: int  # 0: a plain attn_q
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int
    n_ff: int  # leading dense blocks' FFN width
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_layer_dense_lead: int
    gating: int = 0  # 0: no key (softmax), 1 softmax, 2 sigmoid
    weights_norm: bool | None = None  # None: no key
    weights_scale: float = 1.0
    n_group: int = 0  # 0: no group keys
    n_group_used: int = 0
    exp_probs_b: bool = False
    rope_factor: float = 0.0  # 0: no YaRN keys
    yarn_orig_ctx: int = 4096
    yarn_log_mul: float = 0.0
    legacy_kv_b: bool = False
    attn_temp_scale: float = 0.0  # 0: no temperature keys
    attn_temp_length: int = 0
    n_nextn: int = 0
    arch: str = "deepseek2"
    n_vocab: int = 0  # filled from the tokenizer
    n_ctx: int = 4096
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    weight_df: int = 0
    router_scale: float = 2.0
    output_scale: float = 2.0
    dtype: str = "f32"


@dataclass(frozen=True)
class DerivedSpec(TensorSpec):
    """A tensor written from other tensors' values: combine(*source values) -> numpy order."""
    sources: tuple[TensorSpec, ...] = ()
    combine: Callable | None = None


def resolve_shape(preset: str, **overrides) -> DS2Shape:
    fields = {f.name for f in dataclasses.fields(DS2Shape)}
    bad = set(overrides) - fields
    if bad:
        raise TypeError(f"unknown shape fields: {', '.join(sorted(bad))}")
    s = DS2Shape(**{**PRESETS[preset], **overrides})
    if not (0 <= s.n_layer_dense_lead < s.n_layer and 0 < s.n_expert_used <= s.n_expert):
        raise ValueError("deepseek2 synthetic shape: need a MoE block and 0 < n_expert_used <= n_expert")
    if s.n_group and (s.n_expert % s.n_group or not 0 < s.n_group_used < s.n_group):
        raise ValueError("deepseek2 synthetic shape: inconsistent expert groups")
    if s.qk_rope % 2 or s.legacy_kv_b and s.n_nextn:
        raise ValueError("deepseek2 synthetic shape: odd rope dims, or MTP with legacy attn_kv_b")
    return s


def _kv_b(H: int, kv: int, nope: int, k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    # k_b [H, kv_lora, nope], v_b [H, v, kv_lora] (flat) -> attn_kv_b [H*(nope+v), kv_lora]:
    # per head, the nope rows that make k_nope from the latent, then the v rows
    k = k_b.reshape(H, kv, nope).transpose(0, 2, 1)
    return np.concatenate([k, v_b.reshape(H, -1, kv)], axis=1).reshape(-1, kv)


def _layer(s: DS2Shape, i: int) -> list[TensorSpec]:
    D, H, kv, rope = s.n_embd, s.n_head, s.kv_lora_rank, s.qk_rope
    hk = s.qk_nope + rope
    p = f"blk.{i}."
    t = [TensorSpec(p + "attn_norm.weight", (D,), "norm")]
    if s.q_lora_rank:
        t += [TensorSpec(p + "attn_q_a_norm.weight", (s.q_lora_rank,), "norm"),
              TensorSpec(p + "attn_q_a.weight", (D, s.q_lora_rank), "weight"),
              TensorSpec(p + "attn_q_b.weight", (s.q_lora_rank, H * hk), "weight")]
    else:
        t.append(TensorSpec(p + "attn_q.weight", (D, H * hk), "weight"))
    t += [TensorSpec(p + "attn_kv_a_norm.weight", (kv,), "norm"),
          TensorSpec(p + "attn_kv_a_mqa.weight", (D, kv + rope), "weight")]
    k_b = TensorSpec(p + "attn_k_b.weight", (s.qk_nope, kv, H), "weight")
    v_b = TensorSpec(p + "attn_v_b.weight", (kv, s.v_head, H), "weight")
    if s.legacy_kv_b:
        t.append(DerivedSpec(p + "attn_kv_b.weight", (kv, H * (s.qk_nope + s.v_head)), "weight",
                             sources=(k_b, v_b), combine=lambda a, b: _kv_b(H, kv, s.qk_nope, a, b)))
    else:
        t += [k_b, v_b]
    t += [TensorSpec(p + "attn_output.weight", (H * s.v_head, D), "weight"),
          TensorSpec(p + "ffn_norm.weight", (D,), "norm")]
    if i < s.n_layer_dense_lead:
        return t + [TensorSpec(p + "ffn_gate.weight", (D, s.n_ff), "weight"),
                    TensorSpec(p + "ffn_up.weight", (D, s.n_ff), "weight"),
                    TensorSpec(p + "ffn_down.weight", (s.n_ff, D), "weight")]
    F, E, Fs = s.n_ff_exp, s.n_expert, s.n_ff_exp * s.n_expert_shared
    t.append(TensorSpec(p + "ffn_gate_inp.weight", (D, E), "router"))
    if s.exp_probs_b:
        t.append(TensorSpec(p + "exp_probs_b.bias", (E,), "bias"))
    t += [TensorSpec(p + "ffn_gate_exps.weight", (D, F, E), "expert"),
          TensorSpec(p + "ffn_up_exps.weight", (D, F, E), "expert"),
          TensorSpec(p + "ffn_down_exps.weight", (F, D, E), "expert"),
          TensorSpec(p + "ffn_gate_shexp.weight", (D, Fs), "weight"),
          TensorSpec(p + "ffn_up_shexp.weight", (D, Fs), "weight"),
          TensorSpec(p + "ffn_down_shexp.weight", (Fs, D), "weight")]
    if i >= s.n_layer:  # an MTP block: a full MoE block plus its input/head projections
        t += [TensorSpec(p + "nextn.eh_proj.weight", (2 * D, D), "weight"),
              TensorSpec(p + "nextn.enorm.weight", (D,), "norm"),
              TensorSpec(p + "nextn.hnorm.weight", (D,), "norm"),
              TensorSpec(p + "nextn.shared_head_norm.weight", (D,), "norm")]
    return t


def tensor_plan(s: DS2Shape) -> list[TensorSpec]:
    t = [TensorSpec("token_embd.weight", (s.n_embd, s.n_vocab), "embed")]
    for i in range(s.n_layer + s.n_nextn):
        t += _layer(s, i)
    t += [TensorSpec("output_norm.weight", (s.n_embd,), "norm"),
          TensorSpec("output.weight", (s.n_embd, s.n_vocab), "output")]
    return t


def hparam_kvs(s: DS2Shape) -> list[tuple[str, object, str]]:
    """(key, value, 'u32'|'f32'|'bool'|'str') as llama.cpp's deepseek2 loader reads them.
    MLA files describe the attention as one latent head (key = kv_lora + rope,
    value = kv_lora) plus the per-head *_mla sizes; legacy files as n_head heads."""
    a = "deepseek2"
    hk = s.qk_nope + s.qk_rope
    if s.legacy_kv_b:
        attn = [("attention.head_count_kv", s.n_head, "u32"), ("attention.key_length", hk, "u32"),
                ("attention.value_length", s.v_head, "u32")]
    else:
        attn = [("attention.head_count_kv", 1, "u32"),
                ("attention.key_length", s.kv_lora_rank + s.qk_rope, "u32"),
                ("attention.value_length", s.kv_lora_rank, "u32"),
                ("attention.key_length_mla", hk, "u32"), ("attention.value_length_mla", s.v_head, "u32")]
    kv = [("context_length", s.n_ctx, "u32"), ("embedding_length", s.n_embd, "u32"),
          ("block_count", s.n_layer + s.n_nextn, "u32"), ("feed_forward_length", s.n_ff, "u32"),
          ("attention.head_count", s.n_head, "u32"), *attn,
          ("rope.dimension_count", s.qk_rope, "u32"), ("rope.freq_base", s.rope_base, "f32"),
          ("attention.layer_norm_rms_epsilon", s.rms_eps, "f32"),
          # llama.cpp requires q_lora_rank unless it recognises a Lite model by its
          # layer count; 0 selects the plain attn_q
          ("attention.q_lora_rank", s.q_lora_rank, "u32"), ("attention.kv_lora_rank", s.kv_lora_rank, "u32"),
          ("leading_dense_block_count", s.n_layer_dense_lead, "u32"),
          ("expert_count", s.n_expert, "u32"), ("expert_used_count", s.n_expert_used, "u32"),
          ("expert_feed_forward_length", s.n_ff_exp, "u32"), ("expert_shared_count", s.n_expert_shared, "u32"),
          ("expert_weights_scale", s.weights_scale, "f32")]
    if s.weights_norm is not None:
        kv.append(("expert_weights_norm", s.weights_norm, "bool"))
    if s.gating:
        kv.append(("expert_gating_func", s.gating, "u32"))
    if s.n_group:
        kv += [("expert_group_count", s.n_group, "u32"), ("expert_group_used_count", s.n_group_used, "u32")]
    if s.rope_factor:
        kv += [("rope.scaling.type", "yarn", "str"), ("rope.scaling.factor", s.rope_factor, "f32"),
               ("rope.scaling.original_context_length", s.yarn_orig_ctx, "u32"),
               ("rope.scaling.yarn_log_multiplier", s.yarn_log_mul, "f32")]
    if s.attn_temp_scale:
        kv += [("attention.temperature_scale", s.attn_temp_scale, "f32"),
               ("attention.temperature_length", s.attn_temp_length, "u32")]
    if s.n_nextn:
        kv.append(("nextn_predict_layers", s.n_nextn, "u32"))
    kv.append(("vocab_size", s.n_vocab, "u32"))
    return [(f"{a}.{k}", v, t) for k, v, t in kv]
