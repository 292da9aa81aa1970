"""The MoE feed-forward block: routing in a few lines, expert compute handed to
one switch layer, optional shared expert."""
from __future__ import annotations

import torch

from ..models.common import linear, swiglu_ffn
from .router import RouterSpec, route


class SharedExpert:
    """A dense SwiGLU expert every token uses; qwen2moe gates it by
    sigmoid(gate_inp · x), deepseek2 adds it unweighted."""

    def __init__(self, gate, up, down, gate_inp: torch.Tensor | None = None):
        self.gate, self.up, self.down, self.gate_inp = gate, up, down, gate_inp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = swiglu_ffn(x, self.gate, self.up, self.down)  # [T, H]
        if self.gate_inp is not None:
            y = y * torch.sigmoid(x @ self.gate_inp)[:, None]  # gate_inp [H]
        return y


class MoEFFN:
    def __init__(self, router_w: torch.Tensor, experts, spec: RouterSpec,
                 bias: torch.Tensor | None = None, shared: SharedExpert | None = None):
        self.router_w, self.experts, self.spec = router_w, experts, spec  # router_w [E, H]
        self.bias, self.shared = bias, shared
        self.last_ids: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, H] -> [T, H]
        ids, w = route(linear(x, self.router_w), self.spec, self.bias)  # [T, k], [T, k]
        self.last_ids = ids
        out = self.experts(x, ids, w)
        if self.shared is not None:
            out = out + self.shared(x)
        return out
