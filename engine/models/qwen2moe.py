"""Qwen2-MoE (qwen2moe): q/k/v biases, NEOX RoPE; softmax router without top-k
renormalisation; a shared expert gated by sigmoid(ffn_gate_inp_shexp · x)."""
from __future__ import annotations

from ..moe.block import MoEFFN, SharedExpert
from ..moe.router import RouterSpec
from .base import Attention, Block, Transformer
from .common import Rope, default_kq_scale
from .experts_loader import load_experts


def build(cfg, W, n_ctx, progress=None) -> Transformer:
    rope = Rope(cfg, n_ctx)
    H = cfg.n_embd
    ff_sh = cfg.n_ff_shexp or cfg.n_ff

    def block(cfg, W, il):
        p = f"blk.{il}."
        attn = Attention(cfg, W, il, rope, default_kq_scale(cfg), bias=True)
        shared = SharedExpert(W.mat(p + "ffn_gate_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_up_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_down_shexp.weight", ff_sh, H),
                              gate_inp=W.get(p + "ffn_gate_inp_shexp.weight", H))
        ffn = MoEFFN(W.mat(p + "ffn_gate_inp.weight", H, cfg.n_expert),
                     load_experts(cfg, W, il), RouterSpec.from_config(cfg), shared=shared)
        return Block(cfg, W, il, attn, ffn)

    return Transformer(cfg, W, block, progress)
