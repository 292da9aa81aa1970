"""What a synthetic MoE model holds, per architecture, in llama.cpp's exact layout.

Tensor names, shapes (ggml ne order: ne[0] is the contiguous row length) and
hyperparameter keys follow llama.cpp's loader for qwen3moe, qwen2moe, llama
with experts (Mixtral layout) and olmoe. Nothing here writes files: synth.py
turns a plan into a GGUF.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Preset name -> llama.cpp architecture and shape. The tiny fixtures exercise each
# architecture's particulars (GQA, head_dim != n_embd/n_head where allowed, qkv
# biases, shared expert, q/k norms) at sizes that write in well under a second.
FIXTURES: dict[str, dict] = {
    "qwen3moe": dict(arch="qwen3moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
                     n_ff_exp=32, n_expert=8, n_expert_used=4, rope_base=1e6),
    "qwen2moe": dict(arch="qwen2moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16,
                     n_ff_exp=32, n_expert=4, n_expert_used=2, n_ff_shexp=64, rope_base=1e6),
    "llama_moe": dict(arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16,
                      n_ff_exp=64, n_expert=8, n_expert_used=2, rms_eps=1e-5),
    # olmoe's k norm spans n_embd in llama.cpp, so it has no GQA: n_head_kv == n_head.
    "olmoe": dict(arch="olmoe", n_embd=64, n_layer=2, n_head=4, n_head_kv=4, head_dim=16,
                  n_ff_exp=32, n_expert=8, n_expert_used=2, rms_eps=1e-5),
}
# Qwen3-30B-A3B layer shapes with fewer experts and layers: a realistic workload (its
# trained context too, so that long-context decode can be measured).
BENCH: dict = dict(arch="qwen3moe", n_embd=2048, n_layer=8, n_head=32, n_head_kv=4, head_dim=128,
                   n_ff_exp=768, n_expert=32, n_expert_used=8, n_ctx=40960, rope_base=1e6,
                   dtype="f16")
PRESETS: dict[str, dict] = {**FIXTURES, "llama": FIXTURES["llama_moe"], "bench": BENCH}
ARCHES = ("qwen3moe", "qwen2moe", "llama", "olmoe")


@dataclass(frozen=True)
class SynthShape:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff_exp: int  # per-expert FFN width
    n_expert: int
    n_expert_used: int
    n_ff_shexp: int = 0  # qwen2moe shared expert width
    n_vocab: int = 0  # filled from the tokenizer
    n_ctx: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False  # no output.weight (qwen3moe, llama allow it)
    weight_df: int = 0  # 0: Gaussian weights; > 2: Student-t with this df (outliers)
    router_scale: float = 2.0  # router std, in units of 1/sqrt(n_embd)
    output_scale: float = 2.0  # lm-head std, in units of 1/sqrt(n_embd)
    dtype: str = "f32"

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order
    role: str  # embed | output | weight | expert | router | norm | bias | gate_vec

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


def resolve_shape(preset: str, **overrides) -> SynthShape:
    """The shape of a preset with field overrides, checked against llama.cpp's rules."""
    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    fields = {f.name for f in dataclasses.fields(SynthShape)}
    bad = set(overrides) - fields
    if bad:
        raise TypeError(f"unknown shape fields: {', '.join(sorted(bad))}")
    shape = SynthShape(**{**PRESETS[preset], **overrides})
    _check(shape)
    return shape


def _check(s: SynthShape) -> None:
    def need(cond: bool, why: str) -> None:
        if not cond:
            raise ValueError(f"{s.arch} synthetic shape: {why}")

    need(s.arch in ARCHES, f"architecture must be one of {ARCHES}")
    need(s.n_head % s.n_head_kv == 0, "n_head must be a multiple of n_head_kv")
    need(0 < s.n_expert_used <= s.n_expert, "need 0 < n_expert_used <= n_expert")
    need(s.head_dim % 2 == 0, "head_dim must be even (RoPE)")
    if s.arch in ("qwen2moe", "olmoe"):
        need(s.q_dim == s.n_embd, "llama.cpp sizes attn_output as n_embd x n_embd: n_head*head_dim == n_embd")
    if s.arch == "olmoe":
        need(s.n_head_kv == s.n_head, "llama.cpp sizes attn_k_norm as n_embd: n_head_kv == n_head")
    if s.arch == "qwen2moe":
        need(s.n_ff_shexp > 0, "qwen2moe needs a shared expert (n_ff_shexp > 0)")
    else:
        need(s.n_ff_shexp == 0, "only qwen2moe has a shared expert here")
    need(not s.tie_embeddings or s.arch in ("qwen3moe", "llama"),
         "llama.cpp requires output.weight for this architecture")
    need(s.weight_df == 0 or s.weight_df > 2, "weight_df must be 0 or > 2")


def tensor_plan(s: SynthShape) -> list[TensorSpec]:
    """Every tensor, in file order, with ggml shapes as llama.cpp's loader checks them."""
    E, D, F = s.n_embd, s.n_embd, s.n_ff_exp
    t = [TensorSpec("token_embd.weight", (E, s.n_vocab), "embed")]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t.append(TensorSpec(p + "attn_norm.weight", (D,), "norm"))
        t.append(TensorSpec(p + "attn_q.weight", (D, s.q_dim), "weight"))
        t.append(TensorSpec(p + "attn_k.weight", (D, s.kv_dim), "weight"))
        t.append(TensorSpec(p + "attn_v.weight", (D, s.kv_dim), "weight"))
        if s.arch == "qwen2moe":
            t.append(TensorSpec(p + "attn_q.bias", (s.q_dim,), "bias"))
            t.append(TensorSpec(p + "attn_k.bias", (s.kv_dim,), "bias"))
            t.append(TensorSpec(p + "attn_v.bias", (s.kv_dim,), "bias"))
        t.append(TensorSpec(p + "attn_output.weight", (s.q_dim, D), "weight"))
        if s.arch == "qwen3moe":  # per-head norms
            t.append(TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm"))
            t.append(TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm"))
        elif s.arch == "olmoe":  # norms over the whole projection
            t.append(TensorSpec(p + "attn_q_norm.weight", (s.q_dim,), "norm"))
            t.append(TensorSpec(p + "attn_k_norm.weight", (s.kv_dim,), "norm"))
        t.append(TensorSpec(p + "ffn_norm.weight", (D,), "norm"))
        t.append(TensorSpec(p + "ffn_gate_inp.weight", (D, s.n_expert), "router"))
        t.append(TensorSpec(p + "ffn_gate_exps.weight", (D, F, s.n_expert), "expert"))
        t.append(TensorSpec(p + "ffn_up_exps.weight", (D, F, s.n_expert), "expert"))
        t.append(TensorSpec(p + "ffn_down_exps.weight", (F, D, s.n_expert), "expert"))
        if s.arch == "qwen2moe":
            t.append(TensorSpec(p + "ffn_gate_inp_shexp.weight", (D,), "gate_vec"))
            t.append(TensorSpec(p + "ffn_gate_shexp.weight", (D, s.n_ff_shexp), "weight"))
            t.append(TensorSpec(p + "ffn_up_shexp.weight", (D, s.n_ff_shexp), "weight"))
            t.append(TensorSpec(p + "ffn_down_shexp.weight", (s.n_ff_shexp, D), "weight"))
    t.append(TensorSpec("output_norm.weight", (E,), "norm"))
    if not s.tie_embeddings:
        t.append(TensorSpec("output.weight", (E, s.n_vocab), "output"))
    return t


def hparam_kvs(s: SynthShape) -> list[tuple[str, object, str]]:
    """(key, value, 'u32'|'f32') hyperparameters as llama.cpp reads them."""
    a = s.arch
    # llama and olmoe size their experts by feed_forward_length; the qwen MoEs
    # have expert_feed_forward_length and carry top-k * expert width here, as
    # their converters write it.
    ff = s.n_ff_exp if a in ("llama", "olmoe") else s.n_ff_exp * s.n_expert_used
    kv: list[tuple[str, object, str]] = [
        (f"{a}.context_length", s.n_ctx, "u32"),
        (f"{a}.embedding_length", s.n_embd, "u32"),
        (f"{a}.block_count", s.n_layer, "u32"),
        (f"{a}.feed_forward_length", ff, "u32"),
        (f"{a}.attention.head_count", s.n_head, "u32"),
        (f"{a}.attention.head_count_kv", s.n_head_kv, "u32"),
        (f"{a}.attention.key_length", s.head_dim, "u32"),
        (f"{a}.attention.value_length", s.head_dim, "u32"),
        (f"{a}.rope.dimension_count", s.head_dim, "u32"),
        (f"{a}.rope.freq_base", s.rope_base, "f32"),
        (f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps, "f32"),
        (f"{a}.expert_count", s.n_expert, "u32"),
        (f"{a}.expert_used_count", s.n_expert_used, "u32"),
    ]
    if a in ("qwen3moe", "qwen2moe"):
        kv.append((f"{a}.expert_feed_forward_length", s.n_ff_exp, "u32"))
    if a == "qwen2moe":
        kv.append((f"{a}.expert_shared_feed_forward_length", s.n_ff_shexp, "u32"))
    if a == "llama":
        kv.append((f"{a}.vocab_size", s.n_vocab, "u32"))
    return kv
