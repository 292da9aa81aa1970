"""Joint WQ+WR search of the gate/up quantizer (numpy oracle of the C++ search).

Per 32 weights, for each candidate WQ scale dq (its least-squares ternary scale
and fractions of max|w|) and each 16-weight half with each of WR's 16
sub-scales dr = D*2^(-k/4), every weight takes the ternary cell t in {-1,0,1}
that minimises

    (w - dq*t - dr*L(w - dq*t))^2 + MU * (w - dq*t)^2

where L rounds to WR's levels {-2.25,-1,0,1,2.25}*dr; MU keeps WQ usable on its
own (it runs alone for non-critical experts). The half-block scores are summed
over 16 lanes in a fixed tree (tree16), the order the SIMD code uses.
"""
from __future__ import annotations

import numpy as np

from .resplit_oracle import WR_LEVELS, WR_TABLE, _scale12_decode, _scale12_encode, _wq_alone_scale

_F32 = np.float32
FRACS = np.array([0.3 + 0.05 * i for i in range(13)], np.float32)  # of max|w| per 32 weights
MU = np.float32(0.02)


def tree16(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis (16) as ((v[i]+v[i+8]) + ...) halving pairwise."""
    s = v[..., :8] + v[..., 8:]
    s = s[..., :4] + s[..., 4:]
    s = s[..., :2] + s[..., 2:]
    return s[..., 0] + s[..., 1]


def wr_level(z: np.ndarray) -> np.ndarray:
    """Nearest WR level digit (0..4) of z = e/dr; NaN goes to the top level."""
    a = np.abs(z)
    idx = np.where(a < _F32(0.5), 0, np.where(a < _F32(1.625), 1, 2))
    return np.where(z < 0, 2 - idx, 2 + idx)


def half_eval(xs: np.ndarray, dq: np.ndarray, dr: np.ndarray):
    """xs [B,16], dq [B], dr [B] -> (score [B], t [B,16], digit [B,16])."""
    with np.errstate(divide="ignore"):
        inv = np.where(dr > 0, _F32(1) / np.where(dr > 0, dr, _F32(1)), _F32(0)).astype(np.float32)
    best = bt = bd = None
    for tv in (-1, 0, 1):
        e = xs - (dq * _F32(tv))[:, None]
        with np.errstate(invalid="ignore"):
            d = wr_level(e * inv[:, None])
        diff = e - dr[:, None] * WR_LEVELS[d]
        sc = diff * diff + MU * (e * e)
        if best is None:
            best, bt, bd = sc, np.full(xs.shape, tv, np.float32), d
        else:
            upd = sc < best
            best = np.where(upd, sc, best)
            bt = np.where(upd, _F32(tv), bt)
            bd = np.where(upd, d, bd)
    return tree16(best), bt, bd


def joint_search(x: np.ndarray, D: np.ndarray):
    """x [B,32] float32, D [B] row header per block -> (code [B], t [B,32], k [B,2], digits [B,32])."""
    B = len(x)
    am = np.zeros(B, np.float32)
    for j in range(32):
        am = np.maximum(am, np.abs(x[:, j]))
    best = np.full(B, np.inf, np.float32)
    best_code = np.zeros(B, np.uint32)
    best_k = np.zeros((B, 2), np.int64)
    for d in [_wq_alone_scale(x)] + [am * f for f in FRACS]:
        code = _scale12_encode(d)
        dq = _scale12_decode(code)
        total = np.zeros(B, np.float32)
        ks = []
        for s in range(2):
            hb = np.full(B, np.inf, np.float32)
            hk = np.zeros(B, np.int64)
            for k in range(16):
                sc, _, _ = half_eval(x[:, 16 * s:16 * s + 16], dq, (D * WR_TABLE[k]).astype(np.float32))
                upd = sc < hb
                hb = np.where(upd, sc, hb)
                hk = np.where(upd, k, hk)
            total = hb if s == 0 else total + hb
            ks.append(hk)
        upd = total < best
        best = np.where(upd, total, best)
        best_code = np.where(upd, code, best_code)
        best_k = np.where(upd[:, None], np.stack(ks, 1), best_k)
    dq = _scale12_decode(best_code)
    t = np.zeros((B, 32), np.float32)
    dig = np.zeros((B, 32), np.int64)
    for s in range(2):
        dr = (D * WR_TABLE[best_k[:, s]]).astype(np.float32)
        _, t[:, 16 * s:16 * s + 16], dig[:, 16 * s:16 * s + 16] = half_eval(x[:, 16 * s:16 * s + 16], dq, dr)
    return best_code, t, best_k, dig
