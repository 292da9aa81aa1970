"""What an architecture declares about its GGUF files (one module per architecture
beside this one, as llama.cpp's src/models/*.cpp and mlx-lm's models/*.py): its rope
and router conventions, the hyperparameters it reads beyond the common ones, the
tensors each block needs and the rows its KV cache keeps. hparams.py, gguf/validate.py
and kv_types.py ask the ArchSpec; engine/models/<arch>.py builds the network.

Below hparams.py: nothing here imports the engine. A `cfg` is a ModelConfig."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

GATING_SOFTMAX, GATING_SIGMOID = 1, 2


@dataclass(frozen=True)
class Need:
    """A tensor the engine reads, with its ggml shape."""
    name: str
    ne: tuple[int, ...]  # ggml order
    required: bool = True
    ggml_type: int | None = None  # None: any of the types the engine computes with


def has_experts(cfg, il: int) -> bool:
    """Every block of a file with experts routes."""
    return bool(cfg.n_expert)


def per_head_kv_rows(cfg) -> tuple[int, ...]:
    """A K and a V row per KV head."""
    return cfg.head_dim, cfg.head_dim_v


def per_head_kv_values(cfg) -> int:
    """K and V of every KV head in every layer."""
    return cfg.n_layer * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)


@dataclass(frozen=True)
class ArchSpec:
    """One architecture's declaration (its module's ARCH); the defaults fit a llama-style MoE file."""
    name: str  # general.architecture
    # llama.cpp's rope type: "norm" rotates adjacent pairs (x0,x1), "neox" rotates (x_i, x_{i+d/2})
    rope: str
    norm_topk: bool  # renormalise the top-k weights (llama.cpp fixes it per architecture)
    # (cfg, il) -> block il's tensors besides its routed experts
    layer_tensors: Callable[[Any, int], list[Need]]
    ff_exp_from_ff: bool = False  # experts sized by feed_forward_length when expert_feed_forward_length is missing
    needs_experts: bool = True  # False: a file without expert_count is a dense model, not an error
    # (key, read) -> fields of ModelConfig it reads itself; key(name, default, kind) reads `{arch}.{name}`,
    # read holds what the common keys gave (n_embd, n_head, head_dim, n_vocab, n_layer, n_ff_shexp, gating, ...)
    hparams: Callable[[Callable, dict], dict] | None = None
    check: Callable[[Any, Callable[[str], None]], None] | None = None  # (cfg, bad) after the common checks
    moe_layer: Callable[[Any, int], bool] = has_experts  # (cfg, il) -> block il has routed experts
    kv_rows: Callable[[Any], tuple[int, ...]] = per_head_kv_rows  # the lengths of the cache's rows
    kv_values_per_token: Callable[[Any], int] = per_head_kv_values  # cache values per token, all layers


# ---- tensors the architectures share ----

def standard_layer(cfg, il: int, bias: bool = False, qk_norm: str | None = None) -> list[Need]:
    """A llama-style block: norms, q/k/v/o (biases required with bias=True, else
    optional), q/k norms per head ("head") or over the full projections ("full"),
    then a dense FFN or the router."""
    p, H, nh, nkv, hd, hdv = f"blk.{il}.", cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
    need = [Need(p + "attn_norm.weight", (H,)), Need(p + "ffn_norm.weight", (H,)),
            Need(p + "attn_q.weight", (H, nh * hd)), Need(p + "attn_k.weight", (H, nkv * hd)),
            Need(p + "attn_v.weight", (H, nkv * hdv)), Need(p + "attn_output.weight", (nh * hdv, H)),
            Need(p + "attn_q.bias", (nh * hd,), bias), Need(p + "attn_k.bias", (nkv * hd,), bias),
            Need(p + "attn_v.bias", (nkv * hdv,), bias)]
    if qk_norm == "head":
        need += [Need(p + "attn_q_norm.weight", (hd,)), Need(p + "attn_k_norm.weight", (hd,))]
    elif qk_norm == "full":
        need += [Need(p + "attn_q_norm.weight", (nh * hd,)), Need(p + "attn_k_norm.weight", (nkv * hd,))]
    if not cfg.n_expert:
        return need + dense_ffn(cfg, il)
    return need + [Need(p + "ffn_gate_inp.weight", (H, cfg.n_expert))]


def dense_ffn(cfg, il: int) -> list[Need]:
    p, H, ff = f"blk.{il}.", cfg.n_embd, cfg.n_ff
    return [Need(p + "ffn_gate.weight", (H, ff)), Need(p + "ffn_up.weight", (H, ff)),
            Need(p + "ffn_down.weight", (ff, H))]


def shared_ffn(cfg, il: int, ff: int) -> list[Need]:
    p, H = f"blk.{il}.", cfg.n_embd
    return [Need(p + "ffn_gate_shexp.weight", (H, ff)), Need(p + "ffn_up_shexp.weight", (H, ff)),
            Need(p + "ffn_down_shexp.weight", (ff, H))]
