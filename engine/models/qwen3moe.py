"""Qwen3-MoE (qwen3moe): per-head RMS q/k norms before NEOX RoPE; softmax router,
top-k renormalised; no shared expert."""
from __future__ import annotations

from ..moe.block import MoEFFN
from ..moe.router import RouterSpec
from .base import Attention, Block, Transformer
from .common import Rope, default_kq_scale
from .experts_loader import load_experts


def build(cfg, W, n_ctx, progress=None) -> Transformer:
    rope = Rope(cfg, n_ctx)

    def block(cfg, W, il):
        attn = Attention(cfg, W, il, rope, default_kq_scale(cfg), qk_norm="head")
        ffn = MoEFFN(W.mat(f"blk.{il}.ffn_gate_inp.weight", cfg.n_embd, cfg.n_expert),
                     load_experts(cfg, W, il), RouterSpec.from_config(cfg))
        return Block(cfg, W, il, attn, ffn)

    return Transformer(cfg, W, block, progress)
