"""The GPU step of a loaded residual-split model, exactly as its Plan says:
each MoE layer's ResplitExperts becomes a SplitSchedule on the device that owns
the layer (plan.gpu_layers), with the W_Q of the experts the plan caches
(plan.cached, hottest first) in that device's memory; the non-expert weights,
norms and KV cache of the layer go to the same device, the output head to the
last one. The embedding stays on the host (row lookups)."""
from __future__ import annotations

import numpy as np
import torch

from ..moe.block import MoEFFN
from ..moe.resplit import ResplitExperts
from ..weights import QWeight
from .schedule import SplitSchedule
from .wq_cache import build_layer_cache


class GpuSplitExperts:
    """Same call as ResplitExperts; the schedule runs W_Q on the device."""

    def __init__(self, sched: SplitSchedule, device):
        self.sched, self.device = sched, device
        self.layer = sched.layer

    @property
    def n_cached(self) -> int:
        return self.sched.cache.n_cached

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, step) -> torch.Tensor:
        out = self.device.result(self.sched(x, ids, w, step))
        return out if out.device == x.device else out.to(x.device)


def layer_devices(plan, n_layer: int) -> list[str]:
    """The device of each layer, from plan.gpu_layers (layers outside every span:
    the first span's device)."""
    owner = [plan.gpu_layers[0][0]] * n_layer
    for dev, a, b in plan.gpu_layers:
        for il in range(a, b + 1):
            owner[il] = dev
    return owner


def attach_plan(net, plan, devices: dict) -> None:
    """Move net onto the plan's devices. devices: plan device name ("cuda:0") ->
    its device object (engine/gpu/device.py), which says where its tensors live
    (torch_device) and how a non-expert weight is kept there (place_weight)."""
    owner = layer_devices(plan, len(net.blocks))
    cached_by_layer: dict[int, list[int]] = {}
    for il, e in plan.cached:
        cached_by_layer.setdefault(il, []).append(e)
    for il, blk in enumerate(net.blocks):
        name = owner[il]
        _place_block(blk, devices[name])
        ffn = blk.ffn
        if isinstance(ffn, MoEFFN) and isinstance(ffn.experts, ResplitExperts):
            ex = ffn.experts
            ids = np.asarray(cached_by_layer.get(il, []), dtype=np.int32)
            cache = build_layer_cache(devices[name], ex.gate_q, ex.up_q, ex.down_q, ids)
            ffn.experts = GpuSplitExperts(SplitSchedule(il, ex.parts, devices[name], cache), devices[name])
    head = next((c.device for c in plan.components if c.name.startswith("output head")), owner[-1])
    net.head_device = devices[head].torch_device
    net.output_norm = devices[head].place_weight(net.output_norm)
    net.output = devices[head].place_weight(net.output)


def _place_block(blk, device) -> None:
    """The block's attention and dense/shared/router weights onto device."""
    blk.device = device.torch_device
    place = device.place_weight
    blk.attn_norm, blk.ffn_norm = place(blk.attn_norm), place(blk.ffn_norm)
    parts = [blk.attn, blk.ffn]
    if isinstance(blk.ffn, MoEFFN) and blk.ffn.shared is not None:
        parts.append(blk.ffn.shared)
    for obj in parts:
        for k, v in list(vars(obj).items()):
            if k in ("rope", "cfg", "experts", "spec", "shared") or k.startswith("_"):
                continue
            if isinstance(v, (torch.Tensor, QWeight)):
                setattr(obj, k, place(v))
