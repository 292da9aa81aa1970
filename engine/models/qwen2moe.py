"""Qwen2-MoE (qwen2moe): q/k/v biases, NEOX RoPE; softmax router without top-k
renormalisation; a shared expert gated by sigmoid(ffn_gate_inp_shexp · x)."""
from __future__ import annotations

from ..moe.block import SharedExpert
from .base import build_standard, routed_ffn


def build(cfg, W, n_ctx, progress=None):
    H, ff_sh = cfg.n_embd, cfg.n_ff_shexp or cfg.n_ff

    def ffn(cfg, W, il):
        p = f"blk.{il}."
        shared = SharedExpert(W.mat(p + "ffn_gate_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_up_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_down_shexp.weight", ff_sh, H),
                              gate_inp=W.get(p + "ffn_gate_inp_shexp.weight", H))
        return routed_ffn(cfg, W, il, shared=shared)

    return build_standard(cfg, W, n_ctx, progress, bias=True, ffn=ffn)
