"""W_Q experts over many tokens (prefill): dequantize each used expert to bf16
and run its tokens through a tensor-core GEMM, a few experts at a time so the
bf16 copies stay small; an expert that is critical for some tokens and not for
others is dequantized once for both. Decode-sized batches use the GEMV kernels
instead."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from . import cuda_kernels as gk

EXPERTS_PER_CHUNK = 16
MIN_TOKENS_PER_EXPERT = 3  # below this a GEMV re-reading the weights per token is cheaper


def use_grouped(eid: torch.Tensor) -> bool:
    n = eid.numel()
    return n > 0 and n >= MIN_TOKENS_PER_EXPERT * len(np.unique(eid.numpy()))


def _groups(eid: np.ndarray):
    """(expert, slot indices) for each used expert, in expert order."""
    order = np.argsort(eid, kind="stable")
    uniq, starts = np.unique(eid[order], return_index=True)
    ends = np.append(starts[1:], len(order))
    return [(int(e), order[a:b]) for e, a, b in zip(uniq, starts, ends)]


def _chunks(groups, n):
    for i in range(0, len(groups), n):
        yield groups[i:i + n]


def grouped_gate_up(wg: torch.Tensor, wu: torch.Tensor, eid: torch.Tensor, x: torch.Tensor, xrow: torch.Tensor,
                    swiglu: bool):
    """As kernels.wq_gate_up, for many slots per expert. x [N, H] on the device."""
    dev = wg.device
    S, Fd, H = eid.numel(), wg.shape[1], x.shape[1]
    g_out = torch.empty(S, Fd, dtype=torch.float32, device=dev)
    u_out = None if swiglu else torch.empty(S, Fd, dtype=torch.float32, device=dev)
    xr = xrow.numpy()
    for chunk in _chunks(_groups(eid.numpy()), EXPERTS_PER_CHUNK):
        ids = torch.tensor([e for e, _ in chunk], dtype=torch.int32).to(dev)
        Wg, Wu = gk.wq_dequant_bf16(wg, ids, H), gk.wq_dequant_bf16(wu, ids, H)  # [G, F, H]
        for i, (_, slots) in enumerate(chunk):
            sl = torch.from_numpy(slots).to(dev)
            xe = x[torch.from_numpy(xr[slots]).long().to(dev)].to(torch.bfloat16)  # [n, H]
            g = (xe @ Wg[i].T).float()
            u = (xe @ Wu[i].T).float()
            if swiglu:
                g_out[sl] = F.silu(g) * u
            else:
                g_out[sl], u_out[sl] = g, u
    return g_out if swiglu else (g_out, u_out)


def _on(a: np.ndarray, dev) -> torch.Tensor:
    return torch.from_numpy(a).to(dev)


def grouped_gate_up_split(wg: torch.Tensor, wu: torch.Tensor, eid: torch.Tensor, x: torch.Tensor,
                          xrow: torch.Tensor, n_crit: int, on_crit):
    """Slots [0, n_crit) are critical (raw gate and up: the CPU adds the residuals),
    the rest get silu(gate)·up, in one pass where each used expert is dequantized
    once. Experts with critical slots go first, and on_crit(g, u) is called as soon
    as their products are issued, so that copy overlaps the rest.
    -> (on_crit's result or None, h [S - n_crit, F] or None)."""
    dev = wg.device
    S, Fd, H = eid.numel(), wg.shape[1], x.shape[1]
    g_c = torch.empty(n_crit, Fd, dtype=torch.float32, device=dev)
    u_c = torch.empty(n_crit, Fd, dtype=torch.float32, device=dev)
    h = torch.empty(S - n_crit, Fd, dtype=torch.float32, device=dev)
    groups = sorted(_groups(eid.numpy()), key=lambda g: bool(g[1][0] >= n_crit))  # slots ascend per expert
    n_crit_experts = sum(1 for _, slots in groups if slots[0] < n_crit)
    xr = xrow.numpy()
    sent, done = None, 0
    for chunk in _chunks(groups, EXPERTS_PER_CHUNK):
        ids = torch.tensor([e for e, _ in chunk], dtype=torch.int32).to(dev)
        Wg, Wu = gk.wq_dequant_bf16(wg, ids, H), gk.wq_dequant_bf16(wu, ids, H)  # [G, F, H]
        for i, (_, slots) in enumerate(chunk):
            xe = x[torch.from_numpy(xr[slots]).long().to(dev)].to(torch.bfloat16)  # [n, H]
            g = (xe @ Wg[i].T).float()
            u = (xe @ Wu[i].T).float()
            # this expert's critical and other rows, as index lists from the host (a
            # boolean mask would make the device sync)
            ic, ir = np.nonzero(slots < n_crit)[0], np.nonzero(slots >= n_crit)[0]
            if len(ic):
                gc, uc = (g, u) if not len(ir) else (g[_on(ic, dev)], u[_on(ic, dev)])
                sl = _on(slots[ic], dev)
                g_c[sl], u_c[sl] = gc, uc
            if len(ir):
                gr, ur = (g, u) if not len(ic) else (g[_on(ir, dev)], u[_on(ir, dev)])
                h[_on(slots[ir] - n_crit, dev)] = F.silu(gr) * ur
            done += 1
            if done == n_crit_experts and n_crit:
                sent = on_crit(g_c, u_c)
    return sent, (h if S > n_crit else None)


def grouped_down(wd: torch.Tensor, eid: torch.Tensor, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """As kernels.wq_gemv on slot rows of h [S, F], scaled per slot -> [S, H]."""
    dev = wd.device
    S, H, Fd = eid.numel(), wd.shape[1], h.shape[1]
    y = torch.empty(S, H, dtype=torch.float32, device=dev)
    for chunk in _chunks(_groups(eid.numpy()), EXPERTS_PER_CHUNK):
        ids = torch.tensor([e for e, _ in chunk], dtype=torch.int32).to(dev)
        Wd = gk.wq_dequant_bf16(wd, ids, Fd)  # [G, H, F]
        for i, (_, slots) in enumerate(chunk):
            sl = torch.from_numpy(slots).to(dev)
            y[sl] = (h[sl].to(torch.bfloat16) @ Wd[i].T).float() * scale[sl][:, None]
    return y
