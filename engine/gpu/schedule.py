"""The residual-split schedule of one MoE layer across GPU and CPU (DESIGN.md §2,
execution parallelism). Each (token, routed expert) slot falls in one group:

    A  critical, W_Q cached   GPU: W_Q gate/up first -> pinned host -> CPU adds
                              x·W_R, silu·mul, down from D4
    B  critical, uncached     CPU: the whole critical path (W_Q + W_R, D4)
    C  other,    cached       GPU: W_Q gate, up, silu·mul, down
    D  other,    uncached     CPU: W_Q gate, up, silu·mul, down

The GPU issues A's gate/up before anything else, so the CPU's residual work
starts while the GPU runs C; the CPU does B and D first (they need nothing from
the GPU). The two partial sums meet at the layer's output on the device.
Same call as moe.resplit.ResplitExperts: (x [T, H], ids [T, k], w [T, k]) -> [T, H].
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import kernels
from . import cuda_kernels as gk
from .device import Pending
from .wq_cache import LayerWQ


@dataclass
class LayerStats:
    """Per call: critical sizes, the CPU's share of the wall time, slots per group.
    The device's busy time is read with device.layer_begin()/layer_busy() around
    whatever the caller counts as the layer (attention included)."""
    r: np.ndarray | None = None
    cpu_s: float = 0.0  # the CPU's expert work (waits excluded)
    wait_s: float = 0.0  # the host blocked on the device (routing copy, critical partials)
    groups: dict = field(default_factory=dict)


@dataclass
class SlotPlan:
    """Slot groups of one call: token index, expert id, weight per slot."""
    tok: np.ndarray
    eid: np.ndarray
    w: np.ndarray
    crit: np.ndarray
    cached: np.ndarray

    def group(self, crit: bool, cached: bool) -> np.ndarray:
        return np.nonzero((self.crit == crit) & (self.cached == cached))[0]


def plan_slots(ids: np.ndarray, w: np.ndarray, r: np.ndarray, slot_of: np.ndarray) -> SlotPlan:
    """ids, w [T, k] sorted by weight descending; r [T]; slot_of [E] -> SlotPlan."""
    T, k = ids.shape
    tok = np.repeat(np.arange(T), k)
    j = np.tile(np.arange(k), T)
    eid = ids.reshape(-1).astype(np.int64)
    return SlotPlan(tok=tok, eid=eid, w=w.reshape(-1).astype(np.float32), crit=j < np.repeat(r, k),
                    cached=slot_of[eid] >= 0)


class SplitSchedule:
    """One MoE layer. parts: the pack's host arrays (gate_q, up_q, down_q, gate_r,
    up_r, down4), uint8 [E, rows, row bytes]; cache: its W_Q on the device."""

    def __init__(self, layer: int, parts: dict[str, np.ndarray], device, cache: LayerWQ):
        self.layer, self.p, self.dev, self.cache = layer, parts, device, cache
        self.H = parts["down_q"].shape[1]
        self.stats = LayerStats()

    def __call__(self, x, ids: torch.Tensor, w: torch.Tensor, step):
        dev, p = self.dev, self.p
        # staging buffers are free again: the host took the previous layer's copies, and
        # every host-written upload of this layer comes after the routing copy's wait
        dev.new_layer()
        x_dev = dev.to_device(x)
        x_host = dev.to_host(x_dev)  # issued before the routing copy below: done when it is
        # routing to the host in one packed copy (ids as floats are exact below 2^24): the
        # CPU's share depends on it. This and the critical partials are the layer's waits.
        T, k = ids.shape
        t_wait = time.perf_counter()
        packed = torch.cat([ids.to(torch.float32), w.to(torch.float32)], dim=1).cpu().numpy()  # [T, 2k]
        route_wait = time.perf_counter() - t_wait
        ids_h, w_h = packed[:, :k].astype(np.int64), packed[:, k:]
        step.ids[self.layer] = ids_h  # selection order, as the CPU step records them
        order = np.argsort(-w_h, axis=1, kind="stable")  # critical = largest weights (ties: selection order)
        ids_h, w_h = np.take_along_axis(ids_h, order, 1), np.ascontiguousarray(np.take_along_axis(w_h, order, 1))
        r = step.choose(torch.from_numpy(w_h), self.layer)
        plan = plan_slots(ids_h, w_h, r, self.cache.slot_of)
        A, B = plan.group(True, True), plan.group(True, False)
        C, D = plan.group(False, True), plan.group(False, False)
        t_long = lambda g: torch.from_numpy(plan.tok[g]).long()  # noqa: E731
        if T == 1 and step.graphs is not None and dev.segments:
            gu_host, out_dev = self._wq_segments(step.graphs[str(dev.torch_device)], x_dev, plan, A, C)
        else:
            gu_host, out_dev = self._wq(x_dev, plan, A, C, T)

        t0 = time.perf_counter()
        xh = x_host.wait().float().contiguous()  # [T, H]
        wait_s = time.perf_counter() - t0
        out_cpu = torch.zeros(T, self.H)
        BD = np.concatenate([B, D])
        if len(BD):  # uncached experts: the CPU's own split path, one row per slot
            xs = xh[plan.tok[BD]].numpy()
            y = kernels.resplit_moe_forward(xs, plan.eid[BD].reshape(-1, 1).astype(np.int32),
                                            plan.w[BD].reshape(-1, 1), plan.crit[BD].astype(np.int32),
                                            p["gate_q"], p["up_q"], p["down_q"], p["gate_r"], p["up_r"], p["down4"])
            out_cpu.index_add_(0, t_long(BD), torch.from_numpy(y))
        if len(A):  # W_R and D4 of the critical slots on their W_Q partials from the device
            t_wait = time.perf_counter()
            g, u = gu_host.wait()  # [nA, F] each
            wait_s += time.perf_counter() - t_wait
            out_cpu += torch.from_numpy(kernels.resplit_residual_forward(
                xh.numpy(), plan.tok[A], plan.eid[A], plan.w[A], g.numpy(), u.numpy(), p))
        cpu_s = time.perf_counter() - t0 - wait_s
        wait_s += route_wait
        out = dev.add(out_dev, dev.to_device(out_cpu)) if len(BD) or len(A) else out_dev
        self.stats = LayerStats(r=r, cpu_s=cpu_s, wait_s=wait_s,
                                groups={"A": len(A), "B": len(B), "C": len(C), "D": len(D)})
        step.groups[self.layer] = self.stats.groups
        step.cpu_expert_s += cpu_s
        step.host_wait_s += wait_s
        return out

    def _wq(self, x_dev, plan: SlotPlan, A: np.ndarray, C: np.ndarray, T: int):
        """The cached slots' W_Q on the device -> (Pending (g, u) of A on the host or None,
        the sum of C's outputs [T, H] on the device)."""
        dev, slot = self.dev, self.cache.slot_of
        # W_Q gate/up of every cached slot, the critical ones (A) first: the CPU is waiting
        # for them; in prefill each expert's W_Q is dequantized once for both groups
        AC = np.concatenate([A, C])
        gu_host, h = dev.gate_up_split(self.cache.gate, self.cache.up, torch.from_numpy(slot[plan.eid[AC]]), x_dev,
                                       torch.from_numpy(plan.tok[AC].astype(np.int32)), len(A))
        out_dev = dev.zeros(T, self.H)
        if len(C):
            dev.segment_begin("W_Q down")
            y = dev.down(self.cache.down, torch.from_numpy(slot[plan.eid[C]]), h, torch.from_numpy(plan.w[C]))
            out_dev = dev.index_add(out_dev, torch.from_numpy(plan.tok[C]).long(), y)
            dev.segment_end("W_Q down")
        return gu_host, out_dev

    def _wq_segments(self, g, x_dev, plan: SlotPlan, A: np.ndarray, C: np.ndarray):
        """_wq for a decode token as two graph segments (engine/gpu/graphs.py) keyed by the
        group sizes: A's gate/up (copied to the host after it), then C's gate/up, down
        and sum. One upload carries the slots of A and C and C's weights (as f32 bits)."""
        dev, c, nA, nC = self.dev, self.cache, len(A), len(C)
        tab = np.concatenate([c.slot_of[plan.eid[np.concatenate([A, C])]].astype(np.int32),
                              plan.w[C].astype(np.float32).view(np.int32)])
        tab_dev = dev.to_device(torch.from_numpy(tab))
        zeros = lambda n, like, dt=torch.int32: torch.zeros(n, dtype=dt, device=like.device)  # noqa: E731
        gu_host = None
        if nA:
            def crit(xs, ts):  # raw gate and up of A, one [2 nA, F] block for one copy
                return torch.cat(gk.wq_gate_up(c.gate, c.up, ts[:nA], zeros(nA, ts), gk.wq_prep(xs), False))
            dev.segment_begin("critical gate/up")
            gu = dev.to_host(dev.segment(g, ("wq-critical", self.layer, nA), crit, x_dev, tab_dev))
            dev.segment_end("critical gate/up")
            gu_host = Pending(lambda: (lambda b: (b[:nA], b[nA:]))(gu.wait()))
        if not nC:
            return gu_host, dev.zeros(1, self.H)

        def rest(xs, ts):
            eid, w = ts[nA:nA + nC], ts[nA + nC:].view(torch.float32)
            h = gk.wq_gate_up(c.gate, c.up, eid, zeros(nC, ts), gk.wq_prep(xs), True)
            y = gk.wq_gemv(c.down, eid, torch.arange(nC, dtype=torch.int32, device=ts.device), gk.wq_prep(h), w)
            return zeros((1, self.H), y, torch.float32).index_add_(0, zeros(nC, ts, torch.long), y)
        dev.segment_begin("W_Q gate/up/down")
        out_dev = dev.segment(g, ("wq-rest", self.layer, nA, nC), rest, x_dev, tab_dev)
        dev.segment_end("W_Q gate/up/down")
        return gu_host, out_dev
