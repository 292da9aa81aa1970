"""The rows that hold one layer's keys or values in a KV cache type (engine/kv_types.py).

Rows are written as float32 and read back as float32; the CPU decode kernels
(csrc/cpu/attn.h) read and write the same bytes in place, so a cache filled by a
prefill here and extended by the kernels is one cache."""
from __future__ import annotations

import numpy as np
import torch

from .kv_types import Q8_BLOCK, Q8_BYTES, check_kv_type


class KVRows:
    """One layer's rows [n_ctx, heads, dim] in kv_type, on device (None: host memory)."""

    def __init__(self, n_ctx: int, heads: int, dim: int, kv_type: str, device=None):
        self.kv_type, self.heads, self.dim = check_kv_type(kv_type, (dim,)), heads, dim
        if kv_type == "q8_0":
            self.data = torch.zeros(n_ctx, heads, dim // Q8_BLOCK * Q8_BYTES, dtype=torch.uint8, device=device)
        else:
            self.data = torch.zeros(n_ctx, heads, dim, device=device,
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

    def write(self, pos0: int, x: torch.Tensor) -> None:
        """x [T, heads, dim] float32 into positions pos0.."""
        T = x.shape[0]
        if self.kv_type != "q8_0":
            self.data[pos0:pos0 + T] = x
            return
        xb = x.float().reshape(T, self.heads, -1, Q8_BLOCK)
        d = xb.abs().amax(-1, keepdim=True) / 127  # as kv_store: float scale, f32 inverse, ties to even
        inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
        q = torch.round(xb * inv).to(torch.int8)
        rows = self.data[pos0:pos0 + T].view(T, self.heads, -1, Q8_BYTES)
        rows[..., :2] = d.half().view(torch.uint8)
        rows[..., 2:] = q.view(torch.uint8)

    def read(self, S: int, dim: int | None = None) -> torch.Tensor:
        """Positions 0..S-1 as float32 [S, heads, dim] (dim: a leading part of each row)."""
        dim = self.dim if dim is None else dim
        if self.kv_type != "q8_0":
            return self.data[:S, :, :dim].float()
        nb = -(-dim // Q8_BLOCK)
        blocks = self.data[:S].view(S, self.heads, -1, Q8_BYTES)[:, :, :nb]
        d = blocks[..., :2].contiguous().view(torch.float16).float()
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(S, self.heads, nb * Q8_BLOCK)[..., :dim]
