"""Qwen2-MoE (qwen2moe): q/k/v biases, NEOX RoPE; softmax router without top-k
renormalisation; a shared expert gated by ffn_gate_inp_shexp, as wide as
expert_shared_feed_forward_length (else feed_forward_length)."""
from __future__ import annotations

from .spec import ArchSpec, Need, shared_ffn, standard_layer


def layer_tensors(cfg, il: int) -> list[Need]:
    need = standard_layer(cfg, il, bias=True)
    if cfg.n_expert:
        ff = cfg.n_ff_shexp or cfg.n_ff
        need += [Need(f"blk.{il}.ffn_gate_inp_shexp.weight", (cfg.n_embd,)), *shared_ffn(cfg, il, ff)]
    return need


ARCH = ArchSpec(name="qwen2moe", rope="neox", norm_topk=False, layer_tensors=layer_tensors)
