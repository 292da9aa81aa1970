"""Float64 oracle of one residual-split MoE layer (DESIGN.md §2), from the exact
dequantized weights, one used expert at a time. The GPU path (int16-quantized
activations in the W_Q GEMV, bf16 GEMMs in prefill) and the CPU path (int8
activations in its SIMD kernels) are each measured against it."""
from __future__ import annotations

import numpy as np

from .. import kernels


def split_layer_reference(parts: dict[str, np.ndarray], x: np.ndarray, ids: np.ndarray, w: np.ndarray,
                          r: np.ndarray) -> np.ndarray:
    """x [T, H]; ids, w [T, k] sorted by weight descending; r [T] -> out [T, H] float64.
    Critical slots (j < r[t]): gate/up = WQ + WR, down from D4; others WQ only."""
    x = np.asarray(x, np.float64)
    T, H = x.shape
    F = parts["gate_q"].shape[1]
    out = np.zeros((T, H))
    crit = np.arange(ids.shape[1])[None, :] < np.asarray(r)[:, None]
    for e in np.unique(ids):
        tt, jj = np.nonzero(ids == e)

        def deq(part: str, fmt: str, n: int) -> np.ndarray:
            return kernels.resplit_dequantize(fmt, parts[part][e], n).astype(np.float64)

        c = crit[tt, jj]
        wq_g, wq_u = deq("gate_q", "wq", H), deq("up_q", "wq", H)
        for is_c in (False, True):  # the expert's tokens as one matrix product per group
            sel = c == is_c
            if not sel.any():
                continue
            t, j = tt[sel], jj[sel]
            wg = wq_g + deq("gate_r", "wr", H) if is_c else wq_g
            wu = wq_u + deq("up_r", "wr", H) if is_c else wq_u
            wd = deq("down4", "d4", F) if is_c else deq("down_q", "wq", F)
            g, u = x[t] @ wg.T, x[t] @ wu.T  # [n, F]
            y = (g / (1.0 + np.exp(-g)) * u) @ wd.T  # [n, H]
            np.add.at(out, t, w[t, j][:, None] * y)
    return out
