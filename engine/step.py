"""What one forward call carries through the layers, and what it leaves behind.

`Step` goes down the layer loop: the critical-set policy of this call (an
argument, never a field of the model), the phase, whether the CPU's fused decode
blocks may run, and the records each MoE layer writes (r, expert ids, where its
slots ran). The runner (engine/runner.py) turns it into a frozen `StepTrace`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# (w [T, k] sorted descending, MoE layer, prefill) -> r [T]
Policy = Callable[..., np.ndarray]


@dataclass
class Step:
    policy: Policy | None  # None: a model without split experts
    prefill: bool
    fused: bool = True  # the CPU step: fused decode blocks where a layer allows them
    graphs: dict | None = None  # a GPU step's decode token: graph segments by device (engine/gpu/graphs.py)
    r: dict[int, np.ndarray] = field(default_factory=dict)  # MoE layer -> r per token [T]
    ids: dict[int, np.ndarray] = field(default_factory=dict)  # MoE layer -> expert ids [T, k]
    groups: dict[int, dict[str, int]] = field(default_factory=dict)  # MoE layer -> slots per schedule group
    cpu_expert_s: float = 0.0  # the CPU's expert work in the split layers (GPU step)
    host_wait_s: float = 0.0  # the host blocked on the device (GPU step)
    device_busy_s: float = 0.0  # device time inside the MoE layers (GPU step)

    def choose(self, w, layer: int) -> np.ndarray:
        """r per token for w [T, k] (sorted descending) at this layer, recorded."""
        if self.policy is None:
            raise RuntimeError("a split layer ran without a critical-set policy")
        r = np.asarray(self.policy(w, layer, self.prefill), dtype=np.int32)
        self.r[layer] = r
        return r


@dataclass(frozen=True)
class StepTrace:
    """One prefill or decode call: critical-set sizes and expert ids per MoE
    layer, time per phase, and where each part ran."""
    phase: str  # "prefill" | "decode"
    n_tokens: int
    r: dict[int, np.ndarray]
    ids: dict[int, np.ndarray]
    seconds: float
    where: str  # the loaded placement, e.g. "cpu" or "cuda:0"
    groups: dict[int, dict[str, int]] = field(default_factory=dict)
    cpu_expert_s: float = 0.0
    host_wait_s: float = 0.0  # incl. the wait for the logits
    device_busy_s: float = 0.0

    @property
    def orchestration_s(self) -> float:
        """Host time that is neither the CPU's expert work nor a wait on the device:
        issuing the step (Python, launches, routing bookkeeping)."""
        return max(0.0, self.seconds - self.cpu_expert_s - self.host_wait_s)

    @property
    def critical(self) -> tuple[int, ...] | None:
        """r of the last token per MoE layer (None: nothing split)."""
        if not self.r:
            return None
        return tuple(int(self.r[il][-1]) for il in sorted(self.r))

    @property
    def mean_r(self) -> float | None:
        """Mean r over the MoE layers and every token of the call."""
        if not self.r:
            return None
        return float(np.mean([v.mean() for v in self.r.values()]))
