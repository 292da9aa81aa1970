"""Llama / Mixtral (llama): adjacent-pair RoPE; with experts, a softmax router with
top-k renormalised and experts sized by llama.feed_forward_length; without experts,
a dense model."""
from __future__ import annotations

from .spec import ArchSpec, standard_layer

ARCH = ArchSpec(name="llama", rope="norm", norm_topk=True, layer_tensors=standard_layer, ff_exp_from_ff=True,
                needs_experts=False)
