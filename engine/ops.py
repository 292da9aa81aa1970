"""Tensor operations shared by the model code and the MoE layer: a linear map
over a float or GGUF-typed weight, and the SwiGLU feed-forward."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    # x [T, in], w [out, in] (a float tensor, or a QWeight kept in its GGUF type) -> [T, out] f32
    if isinstance(w, torch.Tensor):
        if w.dtype != x.dtype:  # f16/bf16 weights on a GPU: the product in their type, f32 out
            return F.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype)).float()
        return F.linear(x, w, b)
    y = w.matmul(x.contiguous())
    return y + b if b is not None else y


def swiglu_ffn(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    # x [T, H]; gate/up [ff, H]; down [H, ff] -> [T, H]
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)
