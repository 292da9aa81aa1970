"""Qwen3-MoE (qwen3moe): per-head RMS q/k norms, NEOX RoPE; softmax router, top-k
renormalised; no shared expert."""
from __future__ import annotations

from .spec import ArchSpec, standard_layer


def layer_tensors(cfg, il: int):
    return standard_layer(cfg, il, qk_norm="head")


ARCH = ArchSpec(name="qwen3moe", rope="neox", norm_topk=True, layer_tensors=layer_tensors)
