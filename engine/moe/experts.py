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

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, step=None) -> torch.Tensor:
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


class QuantExperts:
    """SwiGLU experts kept in their GGUF type (QWeight stacks (E, out, in));
    one kernel call per projection for all (token, expert) pairs of a layer."""

    def __init__(self, gate, up, down):
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, step=None) -> torch.Tensor:
        # x [T, H], ids [T, k], w [T, k] -> [T, H]
        T, k = ids.shape
        flat = ids.reshape(-1).to(torch.int32)  # [T*k]
        xr = x.repeat_interleave(k, dim=0)  # [T*k, H]: row j goes through expert flat[j]
        h = F.silu(_emm(self.gate, flat, xr)) * _emm(self.up, flat, xr)  # [T*k, ff]
        y = _emm(self.down, flat, h)  # [T*k, H]
        return (y.view(T, k, -1) * w[:, :, None]).sum(1)


def _emm(wt, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if isinstance(wt, torch.Tensor):  # an f32 stack among quantized ones
        return torch.einsum("nrk,nk->nr", wt[ids.long()], x)
    return wt.expert_matmul(ids, x)
