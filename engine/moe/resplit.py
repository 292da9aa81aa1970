"""The residual-split switch layer (DESIGN.md §2): per token, the first r routed
experts (by router weight) are critical — gate/up = x·WQ + x·WR, silu·mul, down
from the D4 copy, or, where the plan runs them from the source file, gate/up/down
in the file's own types — the other k − r run WQ for gate, up and down. One kernel
call per layer (csrc/cpu/resplit/resplit_*)."""
from __future__ import annotations

import numpy as np
import torch

from .. import kernels


class FixedCritical:
    """r critical experts for every token (clamped to k)."""

    def __init__(self, r: int):
        self.r = r

    def __call__(self, w: torch.Tensor, layer: int, prefill: bool) -> np.ndarray:
        # w [T, k] sorted by selection score -> r per token [T]
        return np.full(w.shape[0], min(self.r, w.shape[1]), dtype=np.int32)

    def kernel_args(self, layer: int, prefill: bool) -> tuple[int, float, float, int, int]:
        """This policy as the fused decode kernels take it: (fixed r, 0, 0, 0, 0)."""
        return self.r, 0.0, 0.0, 0, 0


class ResplitExperts:
    """Stacked experts in the pack's formats: *_q [E, rows, rb(wq)], *_r [E, ff, rb(wr)],
    down4 [E, H, rb(d4)] (uint8 views of the pack). source: the source file's experts
    (gate, up, down QWeight stacks) the critical ones run from instead of *_r and down4
    (which are then None: never read, never paged in)."""

    def __init__(self, layer: int, gate_q, up_q, down_q, gate_r, up_r, down4, source=None):
        self.layer = layer
        self.gate_q, self.up_q, self.down_q = gate_q, up_q, down_q
        self.gate_r, self.up_r, self.down4 = gate_r, up_r, down4
        self.source = None if source is None else kernels.source_experts(*source)

    @property
    def parts(self) -> dict[str, np.ndarray]:
        return {"gate_q": self.gate_q, "up_q": self.up_q, "down_q": self.down_q,
                "gate_r": self.gate_r, "up_r": self.up_r, "down4": self.down4}

    @property
    def kernel_args(self) -> dict:
        """The weights as the CPU MoE kernels take them (resplit_moe_forward, decode_moe_block)."""
        return {**self.parts, "source": self.source}

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, step) -> torch.Tensor:
        # x [T, H], ids [T, k], w [T, k] (ids sorted by selection score) -> [T, H]
        order = torch.argsort(w, dim=1, descending=True, stable=True)  # critical = largest weights
        ids, w = ids.gather(1, order), w.gather(1, order)
        r = step.choose(w, self.layer)
        out = kernels.resplit_moe_forward(x.contiguous().numpy(), ids.numpy(), w.contiguous().numpy(), r,
                                          **self.kernel_args)
        return torch.from_numpy(out)
