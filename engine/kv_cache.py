"""The rows that hold one layer's keys or values in a KV cache type (engine/kv_types.py).

Rows are written as float32 and read back as float32; the CPU decode kernels
(csrc/cpu/attn/attn.h) read and write the same bytes in place, so a cache filled by a
prefill here and extended by the kernels is one cache."""
from __future__ import annotations

import numpy as np
import torch

from .kv_types import Q8_BLOCK, Q8_BYTES, check_kv_type


class KVRows:
    """One layer's rows in kv_type, on device (None: host memory), head by head: data
    [heads, n_ctx, dim] (q8_0: [heads, n_ctx, dim / 32 * 34] bytes), so that each head's
    rows are one stream for the decode kernels (and one matrix for a GPU's matmuls)."""

    def __init__(self, n_ctx: int, heads: int, dim: int, kv_type: str, device=None):
        self.kv_type, self.heads, self.dim = check_kv_type(kv_type, (dim,)), heads, dim
        if kv_type == "q8_0":
            self.data = torch.zeros(heads, n_ctx, dim // Q8_BLOCK * Q8_BYTES, dtype=torch.uint8, device=device)
        else:
            self.data = torch.zeros(heads, n_ctx, dim, device=device,
                                    dtype=torch.float32 if kv_type == "f32" else torch.float16)

    @property
    def device(self):
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def array(self) -> np.ndarray:
        """The host rows themselves, as the CPU kernels take them (written in place)."""
        return self.data.numpy()

    def write(self, pos0: int | torch.Tensor, x: torch.Tensor) -> None:
        """x [T, heads, dim] float32 into positions pos0.. (pos0: an int, or a device tensor
        [1] holding the position of one row: a decode token in a graph segment)."""
        T = x.shape[0]
        if self.kv_type != "q8_0":
            rows = x.transpose(0, 1)
        else:
            xb = x.float().transpose(0, 1).reshape(self.heads, T, -1, Q8_BLOCK)
            d = xb.abs().amax(-1, keepdim=True) / 127  # as kv_store: float scale, f32 inverse, ties to even
            inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
            q = torch.round(xb * inv).to(torch.int8)
            rows = torch.cat([d.half().view(torch.uint8), q.view(torch.uint8)], dim=-1).view(self.heads, T, -1)
        if isinstance(pos0, torch.Tensor):
            self.data.index_copy_(1, pos0, rows.to(self.data.dtype))
        else:
            self.data[:, pos0:pos0 + T] = rows

    def read(self, S: int, dim: int | None = None) -> torch.Tensor:
        """Positions 0..S-1 as float32 [S, heads, dim] (dim: a leading part of each row)."""
        dim = self.dim if dim is None else dim
        if self.kv_type != "q8_0":
            return self.data[:, :S, :dim].float().transpose(0, 1)
        nb = -(-dim // Q8_BLOCK)
        blocks = self.data[:, :S].view(self.heads, S, -1, Q8_BYTES)[:, :, :nb]
        d = blocks[..., :2].contiguous().view(torch.float16).float()
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(self.heads, S, nb * Q8_BLOCK)[..., :dim].transpose(0, 1)
