"""Putting a loaded residual-split model's experts on the GPU: every
ResplitExperts layer of the network becomes a SplitSchedule whose W_Q (the
hottest experts first, within the VRAM budget) lives on the device. The rest
of the model is untouched, so this also serves a model whose attention still
runs on the CPU: outputs come back as tensors on the caller's device."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..moe.resplit import ResplitExperts
from .schedule import SplitSchedule
from .wq_cache import build_layer_cache, choose_cached, wq_expert_bytes


class GpuSplitExperts:
    """Same call and `last_r` as ResplitExperts; the schedule runs W_Q on the device."""

    def __init__(self, sched: SplitSchedule, device):
        self.sched, self.device = sched, device
        self.layer = sched.layer

    @property
    def last_r(self):
        return self.sched.last_r

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = self.device.result(self.sched(x, ids, w))
        return out if out.device == x.device else out.to(x.device)


@dataclass
class GpuPlacement:
    layers: int
    cached_experts: int
    total_experts: int
    wq_bytes: int

    def describe(self) -> str:
        return (f"W_Q on the GPU: {self.cached_experts}/{self.total_experts} experts over {self.layers} layers "
                f"({self.wq_bytes / 1e9:.2f} GB)")


def attach_gpu_experts(net, device, budget_bytes: int, hotness: dict[int, np.ndarray] | None = None) -> GpuPlacement:
    """Replace each ResplitExperts in net.blocks[*].ffn.experts by a GpuSplitExperts.
    device: one device, or a list of them (consecutive layers split evenly across
    them, each with budget_bytes of W_Q); hotness: layer -> routing counts [E]
    (missing: even spread)."""
    layers = [(b.ffn, b.ffn.experts) for b in net.blocks
              if isinstance(getattr(getattr(b, "ffn", None), "experts", None), ResplitExperts)]
    if not layers:
        return GpuPlacement(0, 0, 0, 0)
    if isinstance(device, (list, tuple)):
        n = len(device)
        parts = [_attach(layers[i * len(layers) // n:(i + 1) * len(layers) // n], d, budget_bytes, hotness)
                 for i, d in enumerate(device)]
        return GpuPlacement(*(sum(getattr(p, f) for p in parts) for f in ("layers", "cached_experts", "total_experts",
                                                                           "wq_bytes")))
    return _attach(layers, device, budget_bytes, hotness)


def _attach(layers, device, budget_bytes, hotness) -> GpuPlacement:
    if not layers:
        return GpuPlacement(0, 0, 0, 0)
    ex0 = layers[0][1]
    E = ex0.gate_q.shape[0]
    nbytes = wq_expert_bytes(ex0.gate_q, ex0.up_q, ex0.down_q)
    hot = None
    if hotness:
        hot = np.stack([np.asarray(hotness.get(ex.layer, np.ones(E)), np.float64) for _, ex in layers])
    chosen = choose_cached(len(layers), E, nbytes, budget_bytes, hot)
    for (ffn, ex), cached in zip(layers, chosen):
        parts = {"gate_q": ex.gate_q, "up_q": ex.up_q, "down_q": ex.down_q,
                 "gate_r": ex.gate_r, "up_r": ex.up_r, "down4": ex.down4}
        cache = build_layer_cache(device, ex.gate_q, ex.up_q, ex.down_q, cached)
        ffn.experts = GpuSplitExperts(SplitSchedule(ex.layer, parts, ex.policy, device, cache), device)
    n_cached = sum(len(c) for c in chosen)
    return GpuPlacement(len(layers), n_cached, len(layers) * E, n_cached * nbytes)
