"""OLMoE (olmoe): RMS q/k norms over the full projections (before the head
split), NEOX RoPE; softmax router without top-k renormalisation."""
from __future__ import annotations

from ..moe.block import MoEFFN
from ..moe.router import RouterSpec
from .base import Attention, Block, Transformer
from .common import Rope, default_kq_scale
from .experts_loader import load_experts


def build(cfg, W, n_ctx, progress=None) -> Transformer:
    rope = Rope(cfg, n_ctx)

    def block(cfg, W, il):
        attn = Attention(cfg, W, il, rope, default_kq_scale(cfg), qk_norm="full")
        ffn = MoEFFN(W.mat(f"blk.{il}.ffn_gate_inp.weight", cfg.n_embd, cfg.n_expert),
                     load_experts(cfg, W, il), RouterSpec.from_config(cfg))
        return Block(cfg, W, il, attn, ffn)

    return Transformer(cfg, W, block, progress)
