"""Llama / Mixtral (llama): adjacent-pair RoPE; with experts, a softmax router
with top-k renormalised and experts sized by llama.feed_forward_length; without
experts, a dense SwiGLU FFN."""
from __future__ import annotations

from ..moe.block import MoEFFN
from ..moe.router import RouterSpec
from .base import Attention, Block, Transformer
from .common import Rope, default_kq_scale, swiglu_ffn
from .experts_loader import load_experts


class DenseFFN:
    def __init__(self, cfg, W, il):
        p, H, ff = f"blk.{il}.", cfg.n_embd, cfg.n_ff
        self.gate = W.mat(p + "ffn_gate.weight", H, ff)
        self.up = W.mat(p + "ffn_up.weight", H, ff)
        self.down = W.mat(p + "ffn_down.weight", ff, H)

    def __call__(self, x):
        return swiglu_ffn(x, self.gate, self.up, self.down)


def build(cfg, W, n_ctx, progress=None) -> Transformer:
    rope = Rope(cfg, n_ctx)

    def block(cfg, W, il):
        attn = Attention(cfg, W, il, rope, default_kq_scale(cfg))
        if cfg.n_expert:
            ffn = MoEFFN(W.mat(f"blk.{il}.ffn_gate_inp.weight", cfg.n_embd, cfg.n_expert),
                         load_experts(cfg, W, il), RouterSpec.from_config(cfg))
        else:
            ffn = DenseFFN(cfg, W, il)
        return Block(cfg, W, il, attn, ffn)

    return Transformer(cfg, W, block, progress)
