"""numpy oracle of the residual-split expert formats (WQ, WR, D4).

The C++ quantizers (csrc/cpu/resplit/resplit_quant.cpp) must reproduce these bytes
exactly, so every float step here is float32, every reduction runs in a fixed
order (sequential, or the 16-lane tree of resplit_joint.tree16), and rounding
is round-half-even.

WQ  low-bit part of gate/up/down, 2.0 bpw.  Row = ceil(n/32) blocks of 8 bytes.
    Ternary t in {-1,0,1} with one scale per 32 weights.

      byte:  0       1       2       3       4       5       6           7
           +-------+-------+-------+-------+-------+-------+-----+-----+--------+
           | 5 trits each, base-3 fraction code            |2 tri|s3:0 | s11:4  |
           +-------+-------+-------+-------+-------+-------+-----+-----+--------+
      byte j<6 = ceil(c*256/243), c = sum_i (t_i+1)*3^(4-i): digit i = weight 6i+j
      byte 6 bits 7:4 = ceil(c2*16/9), c2 = 3*(t30+1)+(t31+1); bits 3:0 scale low
      scale s (12 bits) = float16 bits 14:3 (positive, 7-bit mantissa)
      decode digit i of a byte b: u = b*3^i mod 256 ... d_i = (3*u) >> 8

WR  residual of gate/up after WQ, 2.6 bpw (2.602 at n=2048).  5 levels
    r = WR_LEVELS[d] = {-2.25, -1, 0, 1, 2.25}[d], d in 0..4, one 4-bit
    sub-scale code k_s per 16 weights:  w = D * 2^(-k_s/4) * WR_LEVELS[d].
    Row = f16 D, then the blocks of 64 weights in groups of up to 3 (the last
    group holds the remaining m = 1, 2 or 3 blocks).  A group stores 64 codes,
    code j = sum_p d(block p, weight j) * 5^p  (3 digits in 7 bits when m = 3,
    2 in 5 bits, 1 in 3 bits), packed LSB-first, then one 16-bit word of
    sub-scales per block:

      bits:   0 .. w-1 | w .. 2w-1 | ... | 63w .. 64w-1 |  (8w bytes, w = 7, 5, 3)
              code 0   | code 1    | ... | code 63      |
      then m x 16-bit LE: k_s at bits 4s+3:4s, s = 0..3 (weights 16s..16s+15)

    A group of three is 62 bytes for 192 weights (2.583 bpw). Decoding is a
    table lookup per digit position (7-bit index), so the kernels turn a
    register of codes into a register of levels per block in one step.

D4  CPU copy of down_proj, 4.5 bpw + 4 bytes per row (4.516 at n=2048).
    Row = f16 D, f16 M, then ceil(n/32) blocks of 18 bytes.

      bytes 0-15: byte j = q_j | q_{j+16} << 4    (q in 0..15)
      byte 16   : sc (u8)    byte 17: mn (u8)
      w = (D*sc)*q - (M*mn)

WQ and WR are designed together (a nested grid, resplit_joint.py): per 32
weights WQ's scale, each weight's ternary cell and WR's two sub-scales are
searched jointly for the error of deq(WQ)+deq(WR) plus a small penalty on the
error of WQ alone; WR's levels then refine the chosen cell. A residual of an
independently chosen WQ would need ~7 levels for the same error.
"""
from __future__ import annotations

import numpy as np

FORMAT_VERSION = 3  # = kFormatVersion in csrc/cpu/resplit/resplit.h; bumped when bytes or their meaning change
WQ_BLOCK, WQ_BYTES = 32, 8
WR_BLOCK, WR_HEADER = 64, 2
WR_CODE_BITS = {1: 3, 2: 5, 3: 7}    # code width by blocks in the group
D4_BLOCK, D4_BYTES, D4_HEADER = 32, 18, 4

WR_DIV = np.float32(8.0)             # row header D = max|w| / 8
WR_TABLE = np.array([2.0 ** (-k / 4.0) for k in range(16)], np.float32)
WR_LEVELS = np.array([-2.25, -1.0, 0.0, 1.0, 2.25], np.float32)
D4_STEPS = 20                        # scale search steps per 32 weights

_F32 = np.float32


# ---------------------------------------------------------------- helpers
def _f16(x) -> np.ndarray:
    """float32 -> float16 -> float32, round-half-even, clamped to the finite range."""
    return np.clip(np.asarray(x, np.float32), -65504.0, 65504.0).astype(np.float16).astype(np.float32)


def _scale12_encode(d: np.ndarray) -> np.ndarray:
    """Positive float32 -> 12-bit code (float16 bits 14:3, rounded on the bit pattern)."""
    h = np.clip(d, 0, 60000.0).astype(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    return np.minimum((h + 4) >> 3, 0xF7F)


def _scale12_decode(code: np.ndarray) -> np.ndarray:
    return (np.asarray(code, np.uint32) << 3).astype(np.uint16).view(np.float16).astype(np.float32)


def _pad_rows(w: np.ndarray, mult: int) -> np.ndarray:
    w = np.ascontiguousarray(w, dtype=np.float32)
    n = w.shape[-1]
    npad = -(-n // mult) * mult
    if npad == n:
        return w.reshape(-1, n)
    out = np.zeros((int(np.prod(w.shape[:-1])), npad), np.float32)
    out[:, :n] = w.reshape(-1, n)
    return out


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in index order (float32), as the C++ loops do."""
    acc = np.zeros(a.shape[:-1], np.float32)
    for j in range(a.shape[-1]):
        acc = acc + a[..., j]
    return acc


def tree16(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis (16) as v[i]+v[i+8], then 4, 2, 1 lanes: the SIMD order."""
    s = v[..., :8] + v[..., 8:]
    s = s[..., :4] + s[..., 4:]
    s = s[..., :2] + s[..., 2:]
    return s[..., 0] + s[..., 1]


def tree32(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis (32): v[i]+v[i+16], then tree16."""
    return tree16(v[..., :16] + v[..., 16:])


def row_bytes(fmt: str, n: int) -> int:
    """Bytes of one quantized row of n weights."""
    if fmt == "wq":
        return -(-n // WQ_BLOCK) * WQ_BYTES
    if fmt == "wr":
        nb = -(-n // WR_BLOCK)
        return WR_HEADER + sum(8 * WR_CODE_BITS[m] + 2 * m for m in _wr_groups(nb))
    if fmt == "d4":
        return D4_HEADER + -(-n // D4_BLOCK) * D4_BYTES
    raise ValueError(f"unknown resplit format {fmt!r}")


def bits_per_weight(fmt: str, n: int) -> float:
    return row_bytes(fmt, n) * 8.0 / n


# ---------------------------------------------------------------- WQ
def _tern_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """t in {-1,0,1} = clip(rint(x/d)); d == 0 gives 0.  x [B,32], d [B]."""
    # products with a reciprocal, not divisions (the C++ search is division-free)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.clip(np.rint(x * (_F32(1) / d)[:, None]), -1, 1)
    return np.where(d[:, None] > 0, t, 0).astype(np.float32)


def _wq_alone_scale(x: np.ndarray) -> np.ndarray:
    """Least-squares-optimal ternary scale per block: max over k of (top-k sum)^2/k."""
    a = -np.sort(-np.abs(x), axis=1)
    cs = np.cumsum(a, axis=1, dtype=np.float32)
    k = np.arange(1, x.shape[1] + 1, dtype=np.float32)
    score = cs * cs / k
    best = np.argmax(score, axis=1)  # first maximum, as the C++ strict '>' scan
    return (cs[np.arange(len(x)), best] / k[best]).astype(np.float32)


def _pack_wq(t: np.ndarray, code: np.ndarray) -> np.ndarray:
    """t [B,32] in {-1,0,1}, code [B] 12-bit -> [B,8] uint8."""
    u = (t + 1).astype(np.int64)
    out = np.zeros((len(t), 8), np.uint8)
    for j in range(6):
        c = np.zeros(len(t), np.int64)
        for i in range(5):
            c = c * 3 + u[:, 6 * i + j]
        out[:, j] = (c * 256 + 242) // 243
    c2 = u[:, 30] * 3 + u[:, 31]
    v4 = (c2 * 16 + 8) // 9
    out[:, 6] = ((v4 << 4) | (code & 0xF)).astype(np.uint8)
    out[:, 7] = (code >> 4).astype(np.uint8)
    return out


def _digits(v: np.ndarray, base: int, bits: int, n: int) -> np.ndarray:
    """Fraction-code digits: d_i = (base*u) >> bits, u <- base*u mod 2^bits."""
    u = v.astype(np.int64)
    out = []
    for _ in range(n):
        u = u * base
        out.append(u >> bits)
        u = u & ((1 << bits) - 1)
    return np.stack(out, axis=-1)


def _unpack_wq(q: np.ndarray):
    """[B,8] uint8 -> (t [B,32] float32 in {-1,0,1}, dq [B] float32)."""
    t = np.zeros((len(q), 32), np.float32)
    d5 = _digits(q[:, :6], 3, 8, 5)  # [B,6,5]
    for i in range(5):
        t[:, 6 * i:6 * i + 6] = d5[:, :, i] - 1
    d2 = _digits(q[:, 6] & 0xF0, 3, 8, 2)
    t[:, 30:32] = d2 - 1
    code = (q[:, 6].astype(np.uint32) & 0xF) | (q[:, 7].astype(np.uint32) << 4)
    return t, _scale12_decode(code)


def quantize_wq(w: np.ndarray) -> np.ndarray:
    """WQ alone (down_proj): best ternary scale per block. w [..., n] -> [..., row_bytes]."""
    shape = w.shape
    x = _pad_rows(w, WQ_BLOCK).reshape(-1, 32)
    dq = _scale12_decode(code := _scale12_encode(_wq_alone_scale(x)))
    t = _tern_codes(x, dq)
    return _pack_wq(t, code).reshape(*shape[:-1], row_bytes("wq", shape[-1]))


def dequantize_wq(q: np.ndarray, n: int) -> np.ndarray:
    shape = q.shape
    t, dq = _unpack_wq(np.ascontiguousarray(q, np.uint8).reshape(-1, 8))
    w = (dq[:, None] * t).reshape(*shape[:-1], -1)
    return w[..., :n]


# ---------------------------------------------------------------- WR (quantized jointly with WQ: resplit_joint.py)
def _wr_groups(nb: int) -> list[int]:
    """Blocks per group of a row of nb 64-blocks: threes, then the rest."""
    return [3] * (nb // 3) + ([nb % 3] if nb % 3 else [])


def _pack_wr(d: np.ndarray, k: np.ndarray, D: np.ndarray) -> np.ndarray:
    """d [R,n64] level digits 0..4, k [R,n64/16], D [R] -> [R, row_bytes] uint8."""
    R, n64 = d.shape
    nb = n64 // 64
    d = d.astype(np.int64).reshape(R, nb, 64)
    kk = k.reshape(R, nb, 4).astype(np.int64)
    sc = kk[..., 0] | (kk[..., 1] << 4) | (kk[..., 2] << 8) | (kk[..., 3] << 12)   # [R,nb]
    parts = [D.astype(np.float16).view(np.uint8).reshape(R, 2)]
    b0 = 0
    for m in _wr_groups(nb):
        w = WR_CODE_BITS[m]
        code = np.zeros((R, 64), np.int64)
        for p in range(m):
            code += d[:, b0 + p] * 5 ** p
        bits = (code[:, :, None] >> np.arange(w)) & 1                                # [R,64,w] LSB first
        parts.append(np.packbits(bits.reshape(R, 64 * w).astype(np.uint8), axis=1, bitorder="little"))
        parts.append(sc[:, b0:b0 + m].astype("<u2").view(np.uint8).reshape(R, 2 * m))
        b0 += m
    return np.concatenate(parts, axis=1)


def dequantize_wr(q: np.ndarray, n: int) -> np.ndarray:
    shape = q.shape
    q = np.ascontiguousarray(q, np.uint8).reshape(-1, shape[-1])
    R = len(q)
    nb = -(-n // WR_BLOCK)
    assert shape[-1] == row_bytes("wr", n), "row bytes do not match n"
    D = q[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    out = np.zeros((R, nb, 64), np.float32)
    off, b0 = 2, 0
    for m in _wr_groups(nb):
        w = WR_CODE_BITS[m]
        bits = np.unpackbits(q[:, off:off + 8 * w], axis=1, bitorder="little").reshape(R, 64, w).astype(np.int64)
        code = (bits << np.arange(w)).sum(-1)                                          # [R,64]
        off += 8 * w
        sc = q[:, off:off + 2 * m].copy().view("<u2").astype(np.int64)                 # [R,m]
        off += 2 * m
        for p in range(m):
            dig = (code // 5 ** p) % 5
            kq = (sc[:, p, None] >> (4 * np.arange(4))) & 0xF                          # [R,4]
            dr = (D[:, None] * WR_TABLE[kq]).astype(np.float32)
            out[:, b0 + p] = (np.repeat(dr, 16, axis=1) * WR_LEVELS[dig]).astype(np.float32)
        b0 += m
    return out.reshape(*shape[:-1], nb * 64)[..., :n]


# ---------------------------------------------------------------- D4
def _d4_search(x: np.ndarray):
    """Asymmetric 4-bit fit per block: (scale [B], minv [B] >= 0), w ~ scale*q - minv."""
    B = len(x)
    mn = np.zeros(B, np.float32)
    mx = x[:, 0].copy()
    mn = np.minimum(mn, x[:, 0])
    for j in range(1, 32):
        mn = np.minimum(mn, x[:, j])
        mx = np.maximum(mx, x[:, j])
    span = mx - mn
    ok = span > 0
    span1 = np.where(ok, span, _F32(1))
    best_err = np.full(B, np.inf, np.float32)
    best_s = np.zeros(B, np.float32)
    best_m = -mn
    sx = tree32(x)
    for step in range(D4_STEPS + 1):
        iscale = (_F32(14.0) + _F32(0.1) * _F32(step)) / span1
        L = np.clip(np.rint((x - mn[:, None]) * iscale[:, None]), 0, 15).astype(np.float32)
        sl = tree32(L)
        sl2 = tree32(L * L)
        sxl = tree32(x * L)
        det = _F32(32.0) * sl2 - sl * sl
        with np.errstate(divide="ignore", invalid="ignore"):
            s = (_F32(32.0) * sxl - sx * sl) / det
            m = (sl2 * sx - sl * sxl) / det
            pos = m > 0
            s = np.where(pos, sxl / sl2, s)
            m = np.where(pos, _F32(0), m)
        diff = s[:, None] * L + m[:, None] - x
        err = tree32(diff * diff)
        upd = ok & (det > 0) & (err < best_err)
        best_err = np.where(upd, err, best_err)
        best_s = np.where(upd, s, best_s)
        best_m = np.where(upd, -m, best_m)
    return np.where(ok, best_s, 0).astype(np.float32), np.maximum(best_m, 0).astype(np.float32)


def quantize_d4(w: np.ndarray) -> np.ndarray:
    shape = w.shape
    n = shape[-1]
    rows = _pad_rows(w, D4_BLOCK)
    R, n32 = rows.shape
    nb = n32 // 32
    x = rows.reshape(-1, 32)
    s, m = _d4_search(x)
    s = s.reshape(R, nb)
    m = m.reshape(R, nb)
    smax = np.zeros(R, np.float32)
    mmax = np.zeros(R, np.float32)
    for b in range(nb):
        smax = np.maximum(smax, s[:, b])
        mmax = np.maximum(mmax, m[:, b])
    D = _f16(smax / _F32(255.0))
    M = _f16(mmax / _F32(255.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(D[:, None] > 0, np.minimum(np.rint(s / D[:, None]), 255), 0)
        mc = np.where(M[:, None] > 0, np.minimum(np.rint(m / M[:, None]), 255), 0)
    d = (D[:, None] * sc.astype(np.float32)).reshape(-1)
    dm = (M[:, None] * mc.astype(np.float32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.clip(np.rint((x + dm[:, None]) / d[:, None]), 0, 15)
    L = np.where(d[:, None] > 0, L, 0).astype(np.uint8)
    blk = np.zeros((R * nb, 18), np.uint8)
    blk[:, :16] = L[:, :16] | (L[:, 16:] << 4)
    blk[:, 16] = sc.reshape(-1)
    blk[:, 17] = mc.reshape(-1)
    out = np.zeros((R, 4 + nb * 18), np.uint8)
    out[:, 0:2] = D.astype(np.float16).view(np.uint8).reshape(R, 2)
    out[:, 2:4] = M.astype(np.float16).view(np.uint8).reshape(R, 2)
    out[:, 4:] = blk.reshape(R, -1)
    return out.reshape(*shape[:-1], row_bytes("d4", n))


def dequantize_d4(q: np.ndarray, n: int) -> np.ndarray:
    shape = q.shape
    q = np.ascontiguousarray(q, np.uint8).reshape(-1, shape[-1])
    R = len(q)
    D = q[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    M = q[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    nb = (shape[-1] - 4) // 18
    blk = q[:, 4:].reshape(R, nb, 18)
    L = np.concatenate([blk[:, :, :16] & 0xF, blk[:, :, :16] >> 4], axis=2).astype(np.float32)
    d = D[:, None] * blk[:, :, 16].astype(np.float32)
    dm = M[:, None] * blk[:, :, 17].astype(np.float32)
    w = d[:, :, None] * L - dm[:, :, None]
    return w.reshape(*shape[:-1], nb * 32)[..., :n]


def q8_activations(x: np.ndarray, levels: int = 127) -> np.ndarray:
    """x as the SIMD WQ and D4 kernels see it: per 32 values sx*rint(x*L/max|x|), sx = max|x|/L.

    L = 127 (int8); for the z activations of non-critical decode rows (isa_info()["wq_z"]),
    31 with VNNI and 16 without (isa_info()["wq_z_levels"]).
    """
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    pad = np.zeros(x.shape[:-1] + (-(-n // 32) * 32,), np.float32)
    pad[..., :n] = x
    b = pad.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, _F32(levels) / amax, _F32(0)).astype(np.float32)
    xh = (amax / _F32(levels)) * np.rint(b * inv)
    return xh.reshape(pad.shape)[..., :n]


QUANTIZE = {"wq": quantize_wq, "d4": quantize_d4}
DEQUANTIZE = {"wq": dequantize_wq, "wr": dequantize_wr, "d4": dequantize_d4}


def dequantize(fmt: str, q: np.ndarray, n: int) -> np.ndarray:
    """Any resplit format: [..., row_bytes] uint8 -> [..., n] float32."""
    return DEQUANTIZE[fmt](q, n)
