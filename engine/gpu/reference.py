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
        def deq(name: str, n: int) -> np.ndarray:
            part, fmt = name.split(".")
            return kernels.resplit_dequantize(fmt, parts[part][e], n).astype(np.float64)

        wq_g, wq_u, wq_d = deq("gate_q.wq", H), deq("up_q.wq", H), deq("down_q.wq", F)
        c = crit[tt, jj]
        if c.any():
            wr_g, wr_u, d4 = deq("gate_r.wr", H), deq("up_r.wr", H), deq("down4.d4", F)
        for t, j, is_c in zip(tt, jj, c):
            g = (wq_g + wr_g) @ x[t] if is_c else wq_g @ x[t]
            u = (wq_u + wr_u) @ x[t] if is_c else wq_u @ x[t]
            h = g / (1.0 + np.exp(-g)) * u
            out[t] += w[t, j] * ((d4 if is_c else wq_d) @ h)
    return out
