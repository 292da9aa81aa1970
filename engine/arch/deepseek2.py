"""DeepSeek-V2 / V2-Lite / V3 / R1 (deepseek2): MLA attention (its hyperparameters in
MlaArgs) with a latent-only KV cache, adjacent-pair RoPE with YaRN, leading dense
blocks, a router whose gating and renormalisation are keys of the file, shared
experts. Next-token-prediction blocks after the trunk are not counted in n_layer."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import GATING_SIGMOID, GATING_SOFTMAX, ArchSpec, Need, dense_ffn, shared_ffn


@dataclass(frozen=True)
class MlaArgs:
    """deepseek2's MLA and YaRN hyperparameters, as llama.cpp reads them. MLA files
    (split attn_k_b/attn_v_b) carry key_length_mla/value_length_mla and a one-head
    key_length of kv_lora_rank + rope dims; legacy attn_kv_b files carry the
    per-head sizes in key_length/value_length."""
    q_lora_rank: int  # 0: a plain attn_q (V2-Lite)
    kv_lora_rank: int
    absorbed: bool  # split attn_k_b/attn_v_b (MLA files), not a legacy attn_kv_b
    head_dim_k: int  # per-head key length of the decompressed keys (nope + rope)
    head_dim_v: int
    n_layer_nextn: int  # next-token-prediction blocks after the trunk (not run)
    rope_scaling: str
    yarn_orig_ctx: int
    yarn_log_mul: float
    rope_attn_factor: float
    attn_temp_scale: float  # position-dependent query scaling (Mistral Large 3 in this architecture)
    attn_temp_length: int


def read_hparams(key, read: dict) -> dict:
    """The router's gating and renormalisation (keys here, fixed elsewhere), MLA, the
    trunk's block count and the shared experts' total width."""
    gating_func = key("expert_gating_func", None)
    gating = gating_func or GATING_SOFTMAX  # 0 (none): llama.cpp's softmax too
    norm_topk = key("expert_weights_norm", False, bool)
    mla = _mla_args(key, read["head_dim"], read["n_embd"] // read["n_head"])
    n_layer = read["n_layer"] - mla.n_layer_nextn  # next-token-prediction blocks sit after the trunk
    n_ff_shexp = key("expert_feed_forward_length", 0) * key("expert_shared_count", 0)
    if gating_func is None and n_layer in (47, 48) and read["n_vocab"] == 154880:
        gating = GATING_SIGMOID  # llama.cpp's default for GLM-4.7-Flash files without the key
    return dict(gating=gating, norm_topk=norm_topk, mla=mla, n_layer=n_layer, n_ff_shexp=n_ff_shexp)


def _mla_args(key, head_dim: int, head_dim_default: int) -> MlaArgs:
    absorbed = key("attention.key_length_mla", 0) > 0 and key("attention.value_length_mla", 0) > 0
    log_mul = key("rope.scaling.yarn_log_multiplier", 0.0, float)
    return MlaArgs(
        q_lora_rank=key("attention.q_lora_rank", 0),
        kv_lora_rank=key("attention.kv_lora_rank"),
        absorbed=absorbed,
        head_dim_k=key("attention.key_length_mla") if absorbed else head_dim,
        head_dim_v=key("attention.value_length_mla") if absorbed else key("attention.value_length", head_dim_default),
        n_layer_nextn=key("nextn_predict_layers", 0),
        rope_scaling=key("rope.scaling.type", "linear", str),
        yarn_orig_ctx=key("rope.scaling.original_context_length", 0),
        # converters write 0.1 * mscale_all_dim; llama.cpp divides the 0.1 back out
        yarn_log_mul=float(np.float32(log_mul) / np.float32(0.1)) if log_mul else 0.0,
        rope_attn_factor=key("rope.scaling.attn_factor", 1.0, float),
        attn_temp_scale=key("attention.temperature_scale", 0.0, float),
        attn_temp_length=key("attention.temperature_length", 0),
    )


def check(c, bad) -> None:
    hk, kv = c.mla.head_dim_k, c.mla.kv_lora_rank
    if not 0 < c.rope_dim < hk or kv <= 0 or c.mla.head_dim_v <= 0:
        bad(f"bad MLA sizes: key length {hk}, rope dims {c.rope_dim}, kv_lora_rank {kv}")
    if c.n_layer <= 0 or c.n_layer_dense_lead > c.n_layer:
        bad("bad nextn_predict_layers / leading_dense_block_count")
    if c.mla.attn_temp_scale and c.mla.attn_temp_length <= 0:
        bad("attention.temperature_scale needs a positive attention.temperature_length")
    for name in ("q_lora_rank", "kv_lora_rank", "n_layer_nextn", "yarn_orig_ctx", "attn_temp_length"):
        if not 0 <= getattr(c.mla, name) <= 1 << 20:
            bad(f"bad {name} {getattr(c.mla, name)}")
    if c.mla.rope_scaling not in ("none", "linear", "yarn"):
        bad(f"unsupported rope.scaling.type {c.mla.rope_scaling!r}")


def layer_tensors(c, il: int) -> list[Need]:
    p, H, nh = f"blk.{il}.", c.n_embd, c.n_head
    kv, rd, hk, hv = c.mla.kv_lora_rank, c.rope_dim, c.mla.head_dim_k, c.mla.head_dim_v
    nope, q_lora = hk - rd, c.mla.q_lora_rank
    need = [Need(p + "attn_norm.weight", (H,)), Need(p + "ffn_norm.weight", (H,)),
            Need(p + "attn_kv_a_mqa.weight", (H, kv + rd)), Need(p + "attn_kv_a_norm.weight", (kv,)),
            Need(p + "attn_output.weight", (nh * hv, H))]
    if q_lora:
        need += [Need(p + "attn_q_a.weight", (H, q_lora)), Need(p + "attn_q_a_norm.weight", (q_lora,)),
                 Need(p + "attn_q_b.weight", (q_lora, nh * hk))]
    else:
        need += [Need(p + "attn_q.weight", (H, nh * hk))]
    if c.mla.absorbed:
        need += [Need(p + "attn_k_b.weight", (nope, kv, nh)), Need(p + "attn_v_b.weight", (kv, hv, nh))]
    else:
        need += [Need(p + "attn_kv_b.weight", (kv, nh * (nope + hv)))]
    if il < c.n_layer_dense_lead:
        return need + dense_ffn(c, il)
    need += [Need(p + "ffn_gate_inp.weight", (H, c.n_expert)), Need(p + "exp_probs_b.bias", (c.n_expert,), False)]
    if c.n_ff_shexp:
        need += shared_ffn(c, il, c.n_ff_shexp)
    return need


def moe_layer(c, il: int) -> bool:
    """The leading dense blocks have no routed experts."""
    return bool(c.n_expert) and il >= c.n_layer_dense_lead


def kv_rows(c) -> tuple[int, ...]:
    """One row of latent plus rope key per token and layer; its values are the latent part."""
    return c.mla.kv_lora_rank + c.rope_dim, c.mla.kv_lora_rank


def kv_values_per_token(c) -> int:
    """The latent plus the rope key per layer, as llama.cpp's MLA cache keeps them (legacy
    attn_kv_b files too: they run absorbed here)."""
    return c.n_layer * kv_rows(c)[0]


ARCH = ArchSpec(name="deepseek2", rope="norm", norm_topk=False, layer_tensors=layer_tensors, hparams=read_hparams,
                check=check, moe_layer=moe_layer, kv_rows=kv_rows, kv_values_per_token=kv_values_per_token)
