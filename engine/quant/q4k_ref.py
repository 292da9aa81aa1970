"""Q4_K quantizer port in numpy: the accuracy yardstick for the resplit formats.

Follows llama.cpp's reference Q4_K quantizer (per 32 weights: an asymmetric
4-bit fit with importance av+|x| and a 21-step scale search; per 256 weights:
6-bit scales and mins under two float16 super-scales), written from its
description. Output is the GGUF Q4_K block bytes (144 per 256 weights): it
decodes with gguf-py's Q4_K dequantizer and reproduces llama.cpp's own bytes
on real weights (tests/refs/q4k_llamacpp.npz, scripts/make_q4k_reference.py).
"""
from __future__ import annotations

import numpy as np

QK_K = 256
_F32 = np.float32


def _fit(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1, nstep: int = 20):
    """Weighted asymmetric fit of blocks x [B,32] -> (scale [B], min [B] >= 0)."""
    mn = np.minimum(x.min(1), 0).astype(np.float32)
    mx = x.max(1)
    sw = w.sum(1, dtype=np.float32)
    sx = (w * x).sum(1, dtype=np.float32)
    ok = mx > mn
    span = np.where(ok, mx - mn, _F32(1))
    iscale = _F32(nmax) / span
    scale = _F32(1) / iscale
    L = np.clip(np.rint(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    best = (w * (scale[:, None] * L + mn[:, None] - x) ** 2).sum(1, dtype=np.float32)
    bs, bm = scale.copy(), mn.copy()
    for i in range(nstep + 1):
        iscale = (_F32(rmin) + _F32(rdelta) * _F32(i) + _F32(nmax)) / span
        La = np.clip(np.rint(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(np.float32)
        sl = (w * La).sum(1, dtype=np.float32)
        sl2 = (w * La * La).sum(1, dtype=np.float32)
        sxl = (w * La * x).sum(1, dtype=np.float32)
        D = sw * sl2 - sl * sl
        with np.errstate(all="ignore"):
            ts = (sw * sxl - sx * sl) / D
            tm = (sl2 * sx - sl * sxl) / D
            pos = tm > 0
            ts = np.where(pos, sxl / sl2, ts)
            tm = np.where(pos, _F32(0), tm)
            err = (w * (ts[:, None] * La + tm[:, None] - x) ** 2).sum(1, dtype=np.float32)
        upd = (D > 0) & (err < best)
        best = np.where(upd, err, best)
        bs = np.where(upd, ts, bs)
        bm = np.where(upd, tm, bm)
    return np.where(ok, bs, 0).astype(np.float32), (-np.where(ok, bm, mn)).astype(np.float32)


def quantize_q4k(w: np.ndarray) -> np.ndarray:
    """w [..., n], n % 256 == 0 -> GGUF Q4_K bytes [..., n/256*144]."""
    shape = w.shape
    x = np.ascontiguousarray(w, np.float32).reshape(-1, 8, 32)
    nsb = len(x)
    av = np.sqrt((x * x).sum(2, dtype=np.float32) / _F32(32))
    imp = av[:, :, None] + np.abs(x)
    s, m = _fit(x.reshape(-1, 32), imp.reshape(-1, 32))
    s = s.reshape(nsb, 8)
    m = m.reshape(nsb, 8)
    ms = s.max(1)
    mm = m.max(1)
    with np.errstate(all="ignore"):
        ls = np.minimum(63, np.rint(np.where(ms > 0, _F32(63) / ms, 0)[:, None] * s)).astype(np.uint8)
        lm = np.minimum(63, np.rint(np.where(mm > 0, _F32(63) / mm, 0)[:, None] * m)).astype(np.uint8)
    d16 = (ms / _F32(63)).astype(np.float16)
    dm16 = (mm / _F32(63)).astype(np.float16)
    d = d16.astype(np.float32)[:, None] * ls.astype(np.float32)
    dm = dm16.astype(np.float32)[:, None] * lm.astype(np.float32)
    with np.errstate(all="ignore"):
        L = np.clip(np.rint((x + dm[:, :, None]) / d[:, :, None]), 0, 15)
    L = np.where(d[:, :, None] != 0, L, 0).astype(np.uint8).reshape(nsb, 4, 2, 32)
    sc = np.zeros((nsb, 12), np.uint8)
    sc[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    sc[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    out = np.zeros((nsb, 144), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(nsb, 2)
    out[:, 2:4] = dm16.view(np.uint8).reshape(nsb, 2)
    out[:, 4:16] = sc
    out[:, 16:] = (L[:, :, 0, :] | (L[:, :, 1, :] << 4)).reshape(nsb, 128)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)
