"""Llama / Mixtral (llama): adjacent-pair RoPE; with experts, a softmax router
with top-k renormalised and experts sized by llama.feed_forward_length; without
experts, a dense SwiGLU FFN."""
from __future__ import annotations

from .base import build_standard, routed_ffn
from ..ops import swiglu_ffn


class DenseFFN:
    def __init__(self, cfg, W, il):
        p, H, ff = f"blk.{il}.", cfg.n_embd, cfg.n_ff
        self.gate = W.mat(p + "ffn_gate.weight", H, ff)
        self.up = W.mat(p + "ffn_up.weight", H, ff)
        self.down = W.mat(p + "ffn_down.weight", ff, H)

    def __call__(self, x):
        return swiglu_ffn(x, self.gate, self.up, self.down)


def build(cfg, W, n_ctx, progress=None):
    return build_standard(cfg, W, n_ctx, progress, ffn=routed_ffn if cfg.n_expert else DenseFFN)
