"""OLMoE (olmoe): RMS q/k norms over the full projections, NEOX RoPE; softmax router
without top-k renormalisation; experts sized by feed_forward_length when the file has
no expert_feed_forward_length, as llama.cpp does."""
from __future__ import annotations

from .spec import ArchSpec, standard_layer


def layer_tensors(cfg, il: int):
    return standard_layer(cfg, il, qk_norm="full")


ARCH = ArchSpec(name="olmoe", rope="neox", norm_topk=False, layer_tensors=layer_tensors, ff_exp_from_ff=True)
