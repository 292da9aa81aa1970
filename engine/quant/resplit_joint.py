"""Joint WQ+WR search of the gate/up quantizer (numpy oracle of the C++ search).

Per 32 weights, for each candidate WQ scale dq and each 16-weight half with a
WR sub-scale dr = D*2^(-k/4), every weight takes the better of two ternary
cells, its nearest t0 = clip(rint(w/dq)) and the neighbour toward w
(t1 = clip(t0 +- 1); t0 wins ties), scoring

    (w - dq*t - dr*L(w - dq*t))^2 + MU * (w - dq*t)^2

where L rounds to WR's levels {-2.25,-1,0,1,2.25}*dr; MU keeps WQ usable on its
own (it runs alone for non-critical experts). Half scores are summed over the
16 lanes in a fixed tree (tree16), the order the SIMD code uses.
Search order (ties keep the earlier): sub-scales k = 1,5,9,13 then kc-2..kc+2
around the best; WQ scales: the least-squares ternary scale, fractions
0.3,0.4,..,0.9 of max|w|, then the best fraction -0.05 and +0.05.
"""
from __future__ import annotations

import numpy as np

from .resplit_oracle import (WQ_BLOCK, WR_BLOCK, WR_DIV, WR_LEVELS, WR_TABLE, _f16, _pack_wq, _pack_wr, _pad_rows,
                             _scale12_decode, _scale12_encode, _wq_alone_scale, row_bytes, tree16)

_F32 = np.float32
FRACS = np.array([0.3 + 0.1 * i for i in range(7)], np.float32)   # coarse, of max|w| per 32
REFINE = (-0.05, 0.05)
MU = np.float32(0.02)
K_COARSE = (1, 5, 9, 13)
K_FINE = (-2, -1, 1, 2)


def wr_level(z: np.ndarray) -> np.ndarray:
    """Nearest WR level digit (0..4) of z = e/dr; NaN goes to the top level."""
    a = np.abs(z)
    idx = np.where(a < _F32(0.5), 0, np.where(a < _F32(1.625), 1, 2))
    return np.where(z < 0, 2 - idx, 2 + idx)


def half_eval(xs: np.ndarray, dq: np.ndarray, dr: np.ndarray):
    """xs [B,16], dq [B], dr [B] -> (score [B], t [B,16], digit [B,16])."""
    inv = _recip(dr)
    t0 = np.clip(np.rint(xs * _recip(dq)[:, None]), -1, 1).astype(np.float32)
    e0 = xs - dq[:, None] * t0
    t1 = np.clip(t0 + np.where(e0 < 0, _F32(-1), _F32(1)), -1, 1).astype(np.float32)
    best = bt = bd = None
    for tt in (t0, t1):
        e = xs - dq[:, None] * tt
        with np.errstate(invalid="ignore"):
            d = wr_level(e * inv[:, None])
        diff = e - dr[:, None] * WR_LEVELS[d]
        sc = diff * diff + MU * (e * e)
        if best is None:
            best, bt, bd = sc, tt, d
        else:
            upd = sc < best
            best = np.where(upd, sc, best)
            bt = np.where(upd, tt, bt)
            bd = np.where(upd, d, bd)
    return tree16(best), bt, bd


def _recip(v: np.ndarray) -> np.ndarray:
    """1/v where v > 0, else 0 (float32)."""
    with np.errstate(divide="ignore"):
        return np.where(v > 0, _F32(1) / np.where(v > 0, v, _F32(1)), _F32(0)).astype(np.float32)


def _half_best(xs: np.ndarray, dq: np.ndarray, D: np.ndarray):
    """Best sub-scale code per row of xs [B,16]: coarse codes, then around the best."""
    B = len(xs)
    hb = np.full(B, np.inf, np.float32)
    hk = np.zeros(B, np.int64)

    def try_k(k):
        nonlocal hb, hk
        sc, _, _ = half_eval(xs, dq, (D * WR_TABLE[k]).astype(np.float32))
        upd = sc < hb
        hb = np.where(upd, sc, hb)
        hk = np.where(upd, k, hk)

    for k in K_COARSE:
        try_k(np.full(B, k))
    kc = hk.copy()
    for off in K_FINE:
        try_k(np.clip(kc + off, 0, 15))  # a clipped repeat scores equal: never replaces
    return hb, hk


def joint_search(x: np.ndarray, D: np.ndarray):
    """x [B,32] float32, D [B] row header per block -> (code [B], t [B,32], k [B,2], digits [B,32])."""
    B = len(x)
    am = np.zeros(B, np.float32)
    for j in range(32):
        am = np.maximum(am, np.abs(x[:, j]))
    best = np.full(B, np.inf, np.float32)
    best_code = np.zeros(B, np.uint32)
    best_k = np.zeros((B, 2), np.int64)

    def try_scale(d):
        nonlocal best, best_code, best_k
        code = _scale12_encode(d)
        dq = _scale12_decode(code)
        s0, k0 = _half_best(x[:, :16], dq, D)
        s1, k1 = _half_best(x[:, 16:], dq, D)
        total = s0 + s1
        upd = total < best
        best = np.where(upd, total, best)
        best_code = np.where(upd, code, best_code)
        best_k = np.where(upd[:, None], np.stack([k0, k1], 1), best_k)
        return total

    try_scale(_wq_alone_scale(x))
    cb = np.full(B, np.inf, np.float32)
    ci = np.zeros(B, np.int64)
    for i, f in enumerate(FRACS):
        total = try_scale(am * f)
        upd = total < cb
        cb = np.where(upd, total, cb)
        ci = np.where(upd, i, ci)
    for df in REFINE:
        try_scale(am * (0.3 + 0.1 * ci + df).astype(np.float32))
    dq = _scale12_decode(best_code)
    t = np.zeros((B, 32), np.float32)
    dig = np.zeros((B, 32), np.int64)
    for s in range(2):
        dr = (D * WR_TABLE[best_k[:, s]]).astype(np.float32)
        _, t[:, 16 * s:16 * s + 16], dig[:, 16 * s:16 * s + 16] = half_eval(x[:, 16 * s:16 * s + 16], dq, dr)
    return best_code, t, best_k, dig


def quantize_wq_wr(w: np.ndarray):
    """gate/up: (WQ bytes, WR bytes), searched jointly."""
    shape = w.shape
    n = shape[-1]
    rows = _pad_rows(w, WR_BLOCK)                       # [R, n64]
    R, n64 = rows.shape
    amax_row = np.zeros(R, np.float32)
    for j in range(n64):
        amax_row = np.maximum(amax_row, np.abs(rows[:, j]))
    D = _f16(amax_row / WR_DIV)                         # [R]
    code, t, k, d = joint_search(rows.reshape(-1, 32), np.repeat(D, n64 // 32))
    nbq = -(-n // WQ_BLOCK)  # WR pads to 64; WQ keeps only its own 32-blocks
    wq = _pack_wq(t, code).reshape(R, n64 // 32, 8)[:, :nbq].reshape(*shape[:-1], row_bytes("wq", n))
    wr = _pack_wr(d.reshape(R, n64), k.reshape(R, -1), D)
    return wq, wr.reshape(*shape[:-1], row_bytes("wr", n))
