"""The MoE feed-forward block: routing in a few lines, expert compute handed to
one switch layer, optional shared expert."""
from __future__ import annotations

import numpy as np
import torch

from .. import kernels
from ..ops import linear, swiglu_ffn
from .resplit import ResplitExperts
from .router import RouterSpec, route


class SharedExpert:
    """A dense SwiGLU expert every token uses; qwen2moe gates it by
    sigmoid(gate_inp · x), deepseek2 adds it unweighted."""

    def __init__(self, gate, up, down, gate_inp: torch.Tensor | None = None):
        self.gate, self.up, self.down, self.gate_inp = gate, up, down, gate_inp

    def chain_args(self) -> dict:
        """This expert as the fused decode kernels take it (decode_moe_block's shared_* arguments)."""
        gi = self.gate_inp
        return dict(shared_gate=kernels.ggml_operand(self.gate), shared_up=kernels.ggml_operand(self.up),
                    shared_down=kernels.ggml_operand(self.down),
                    shared_gate_inp=None if gi is None else gi.float().contiguous().numpy().reshape(-1))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = swiglu_ffn(x, self.gate, self.up, self.down)  # [T, H]
        if self.gate_inp is not None:
            y = y * torch.sigmoid(x @ self.gate_inp)[:, None]  # gate_inp [H]
        return y


class MoEFFN:
    def __init__(self, layer: int, router_w: torch.Tensor, experts, spec: RouterSpec,
                 bias: torch.Tensor | None = None, shared: SharedExpert | None = None):
        self.layer = layer
        self.router_w, self.experts, self.spec = router_w, experts, spec  # router_w [E, H]
        self.bias, self.shared = bias, shared
        self._ops = None  # the operands as decode_block passes them (built on first use)

    def __call__(self, x: torch.Tensor, step) -> torch.Tensor:
        # x [T, H] -> [T, H]
        return self.expert_sum(x, *self.route(x), step)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (ids [T, k], weights [T, k])."""
        return route(linear(x, self.router_w), self.spec, self.bias)

    def expert_sum(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, step, graphs=None) -> torch.Tensor:
        """The routed experts' weighted sum plus the shared expert's output (graphs: a
        decode token's graph segments, engine/gpu/graphs.py, which run the shared expert)."""
        if ids.device.type == "cpu":  # on a GPU the schedule records them from its one routing copy
            step.ids[self.layer] = ids.numpy()
        out = self.experts(x, ids, w, step)
        if self.shared is not None:
            out = out + (self.shared(x) if graphs is None else graphs.run(("shared", self.layer), self.shared, x))
        return out

    def fusable(self, step) -> bool:
        """decode_block covers this layer: the CPU step, residual-split experts under a
        fixed or UMIA policy (any router, a shared expert or none)."""
        return (step.fused and type(self.experts) is ResplitExperts
                and hasattr(step.policy, "kernel_args"))

    def crit_args(self, step) -> tuple[int, float, float, int, int]:
        """This layer's critical-set policy as the fused kernels take it: (fixed, ab, theta,
        r_min, r_max), fixed >= 0 for a fixed r, -1 for UMIA (ab = α(layer)·β(phase))."""
        return step.policy.kernel_args(self.experts.layer, step.prefill)

    def chain_args(self) -> dict:
        """The expert half's operands as DecodeChain.add takes them."""
        if self._ops is None:
            e, spec = self.experts, self.spec
            self._ops = dict(router=kernels.ggml_operand(self.router_w), k=spec.k, sigmoid=spec.sigmoid,
                             norm_topk=spec.norm_topk, rscale=spec.scale, **e.kernel_args,
                             bias=None if self.bias is None else self.bias.detach().float().numpy(),
                             n_groups=spec.n_groups, n_group_used=spec.n_group_used,
                             **(self.shared.chain_args() if self.shared is not None else {}))
        return self._ops

    def record(self, step, r: int, ids) -> None:
        """What the fused kernels chose for this decode token, into the step's records."""
        step.r[self.experts.layer] = np.array([r], np.int32)
        step.ids[self.layer] = np.asarray(ids, np.int64).reshape(1, -1)

    def decode_block(self, h: torch.Tensor, norm_w: torch.Tensor, eps: float, step) -> torch.Tensor:
        """h [1, H] -> h + self(rms_norm(h)) in one kernel call (routing and policy included)."""
        a = self.chain_args()
        out, ids, w, r = kernels.decode_moe_block(
            h.numpy().reshape(-1), norm_w.numpy(), eps, a["router"], a["k"], a["sigmoid"], a["norm_topk"],
            a["rscale"], *self.crit_args(step), a["gate_q"], a["up_q"], a["down_q"], a["gate_r"], a["up_r"],
            a["down4"], bias=a["bias"], n_groups=a["n_groups"], n_group_used=a["n_group_used"], source=a["source"],
            **{n: v for n, v in a.items() if n.startswith("shared_")})
        self.record(step, r, ids)
        return torch.from_numpy(out).view(1, -1)
