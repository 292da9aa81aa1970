"""DeepSeek-V2 / V2-Lite / V3 / R1 (deepseek2): MLA attention with a latent-only
KV cache (mla.py), adjacent-pair RoPE with YaRN scaling, leading dense blocks,
then MoE blocks whose router may be sigmoid with a selection bias
(exp_probs_b), group-limited top-k, renormalised and scaled weights, plus
shared experts added unweighted. Next-token-prediction (MTP) blocks stored
after the trunk are not loaded (config.n_layer counts the trunk only)."""
from __future__ import annotations

import math

from ..hparams import ModelConfig
from ..kv_types import DEFAULT_KV_TYPE
from ..moe.block import MoEFFN, SharedExpert
from ..moe.router import RouterSpec
from .base import Block, Transformer
from .common import Rope, Yarn
from .experts_loader import load_experts
from .llama import DenseFFN
from .mla import MLACache, MLAttention, kq_scale


def yarn_attn_factor(cfg: ModelConfig) -> float:
    """The context's attention factor as llama.cpp sets it for deepseek2: the
    YaRN magnitude ratio (1 whenever the file has a log multiplier, because
    llama.cpp then takes mscale = mscale_all_dim), divided by the
    1 + 0.1 ln(factor) that the rope itself multiplies back in."""
    af = 1.0
    if cfg.mla.rope_scaling == "yarn":
        factor = 1.0 / cfg.rope_freq_scale
        if not cfg.mla.yarn_log_mul and factor > 1.0:
            af = 1.0 + 0.1 * math.log(factor)
        af /= 1.0 + 0.1 * math.log(factor)
    return af * cfg.mla.rope_attn_factor


class DeepSeek2(Transformer):
    def new_cache(self, n_ctx: int, devices=None, kv_type: str = DEFAULT_KV_TYPE) -> MLACache:
        return MLACache(self.cfg, n_ctx, devices, kv_type)


def build(cfg, W, n_ctx, progress=None) -> Transformer:
    af = yarn_attn_factor(cfg)
    yarn = Yarn(attn_factor=af, n_ctx_orig=cfg.mla.yarn_orig_ctx or cfg.n_ctx_train,
                ext_factor=1.0 if cfg.mla.rope_scaling == "yarn" else 0.0)
    rope = Rope(cfg, n_ctx, yarn)
    scale = kq_scale(cfg, af)
    H, ff_sh = cfg.n_embd, cfg.n_ff_shexp

    def block(cfg, W, il):
        p = f"blk.{il}."
        attn = MLAttention(cfg, W, il, rope, scale)
        if il < cfg.n_layer_dense_lead:
            return Block(cfg, W, il, attn, DenseFFN(cfg, W, il))
        shared = SharedExpert(W.mat(p + "ffn_gate_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_up_shexp.weight", H, ff_sh),
                              W.mat(p + "ffn_down_shexp.weight", ff_sh, H)) if ff_sh else None
        ffn = MoEFFN(il, W.mat(p + "ffn_gate_inp.weight", H, cfg.n_expert), load_experts(cfg, W, il),
                     RouterSpec.from_config(cfg), bias=W.opt(p + "exp_probs_b.bias", cfg.n_expert), shared=shared)
        return Block(cfg, W, il, attn, ffn)

    return DeepSeek2(cfg, W, block, progress)
