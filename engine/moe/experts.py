"""The expert 'switch' layer: stacked experts (E, out, in) applied to the tokens
routed to them. This one computes in float32 from dequantized weights; the
residual-split layer (same call) lives beside it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseExperts:
    """SwiGLU experts in full precision: gate/up [E, ff, H], down [E, H, ff]."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # x [T, H], ids [T, k], w [T, k] -> [T, H]
        T, k = ids.shape
        out = torch.zeros_like(x)
        flat = ids.reshape(-1)  # [T*k]
        order = torch.argsort(flat, stable=True)
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        tok = order // k  # token of each sorted slot
        start = 0
        # one matmul per selected expert over all of its tokens
        for e, n in zip(experts.tolist(), counts.tolist()):
            slots = order[start:start + n]
            t = tok[start:start + n]
            start += n
            xe = x[t]  # [n, H]
            h = F.silu(xe @ self.gate[e].T) * (xe @ self.up[e].T)  # [n, ff]
            ye = h @ self.down[e].T  # [n, H]
            out.index_add_(0, t, ye * w.reshape(-1)[slots, None])
        return out
