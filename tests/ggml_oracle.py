"""The numpy side of the GGUF-type CPU kernel tests (tests/test_ggml_kernels.py,
tests/test_ggml_int8.py): random valid blocks, gguf-py's dequantizer as the oracle,
the kernels' int8 activation quantizer (q8_parts) and the bounds a result must
meet, and a runner for one ISA path in its own process."""
from __future__ import annotations

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from rapidmoe.engine import kernels

# byte offsets of the f16 scale fields in one block: set to finite values, the rest stays random
F16_FIELDS = {G.Q4_0: [0], G.Q4_1: [0, 2], G.Q5_0: [0], G.Q5_1: [0, 2], G.Q8_0: [0], G.Q2_K: [80, 82],
              G.Q3_K: [108], G.Q4_K: [0, 2], G.Q5_K: [0, 2], G.Q6_K: [208]}
# ISA paths: avx512-novnni is the AVX-512 int8 GEMV without VNNI instructions
ISAS = ["scalar", "avx2", "avx512", "avx512-novnni"]
INT8_TYPES = [G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q4_K, G.Q5_K, G.Q6_K]


def random_tensor(rng: np.random.Generator, qtype: G, rows: int, k: int) -> np.ndarray:
    """Random valid tensor bytes [rows, row_bytes] of a GGUF type."""
    if qtype == G.F32:
        return rng.standard_normal((rows, k)).astype(np.float32).view(np.uint8)
    if qtype == G.F16:
        return (rng.standard_normal((rows, k)) * 3).astype(np.float16).view(np.uint8)
    if qtype == G.BF16:
        return (rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * k // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = (rng.standard_normal(nb) * 0.02).astype(np.float16)
        scale[::11] = np.float16(6e-6)  # an f16 subnormal
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def oracle(raw: np.ndarray, qtype: G) -> np.ndarray:
    return gguf.quants.dequantize(raw, qtype).astype(np.float32)


def isa_env(isa: str, f32act: bool = False) -> dict:
    available = kernels.isa_info()
    base = isa.split("-")[0]
    if base != "scalar" and not available[base]:
        pytest.skip(f"this CPU has no {base}")
    env = dict(os.environ, RAPIDMOE_ISA=isa, RAPIDMOE_GGML_F32ACT="1" if f32act else "0")
    return env


def run_isa(isa: str, inputs, tmp_path, *, worker: str, f32act: bool = False) -> dict:
    out = tmp_path / f"out_{isa}_{int(f32act)}.npz"
    env = isa_env(isa, f32act)
    subprocess.run([sys.executable, "-c", worker, str(inputs), str(out)], env=env, check=True, timeout=300)
    res = dict(np.load(out))
    assert str(res["isa"]) == isa.split("-")[0]
    return res


def q8_group(qtype: G) -> int:
    return 256 if qtype in (G.Q4_K, G.Q5_K, G.Q6_K) else 32


def f16(a) -> np.ndarray:
    """f32 values rounded to the nearest IEEE half (ties to even), back in f32."""
    with np.errstate(over="ignore"):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def q8_parts(x: np.ndarray, group: int):
    """The kernels' activation quantizer (llama.cpp's q8_0 / q8_1 for groups of
    32, q8_K for 256): q = rint(x * (127 / amax)) per group, all in f32, and
    d = amax / 127, rounded to f16, for groups of 32; d = 1 / (127 / amax) for 256
    (llama.cpp's q8_K keeps 1/iscale). Returns q [T, k], d [T, k/group]
    and, for groups of 32, s = f16(d * sum q) (unrounded d), the term a weight
    block's min multiplies (None for 256)."""
    x = np.asarray(x, np.float32)
    T, k = x.shape
    xg = x.reshape(T, k // group, group)
    amax = np.abs(xg).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xg * inv[..., None])  # f32 product, ties to even
    assert np.abs(q).max(initial=0) <= 127
    if group != 32:
        with np.errstate(divide="ignore"):
            return q.reshape(T, k), np.where(inv > 0, np.float32(1) / inv, np.float32(0)).astype(np.float32), None
    d = amax / np.float32(127)
    s = f16(d * q.sum(-1, dtype=np.float32))  # exact integer sum, one f32 product
    return q.reshape(T, k), f16(d), s


def q8(x: np.ndarray, group: int) -> np.ndarray:
    """q8(x) dequantized (float64): d * q."""
    q, d, _ = q8_parts(x, group)
    return np.repeat(d.astype(np.float64), group, axis=1) * q.astype(np.float64)


def split_min(raw: np.ndarray, qtype: G):
    """Q4_1 / Q5_1 rows -> (d * c as float64 [rows, k], the block mins m [rows, k/32])."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.ascontiguousarray(raw).reshape(-1, size).copy()
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(raw.shape[0], -1)
    blocks[:, 2:4] = 0
    return oracle(blocks.reshape(raw.shape), qtype).astype(np.float64), m


def assert_int8_close(y: np.ndarray, raw: np.ndarray, wf: np.ndarray, x: np.ndarray, qtype: G) -> None:
    group = q8_group(qtype)
    q, d, s = q8_parts(x, group)
    xq = np.repeat(d.astype(np.float64), group, axis=1) * q.astype(np.float64)
    w64, x64 = wf.astype(np.float64), x.astype(np.float64)
    if qtype in (G.Q4_1, G.Q5_1):  # sum w*x = sum (d*c) * (dx*q) + m * s per block
        wc, m = split_min(raw, qtype)
        s64 = s.astype(np.float64)
        ref_q = xq @ wc.T + s64 @ m.T
        mag_q = np.abs(xq) @ np.abs(wc).T + np.abs(s64) @ np.abs(m).T
        xsum = x64.reshape(x.shape[0], -1, 32).sum(-1)
        rounding = np.abs(x64 - xq) @ np.abs(wc).T + np.abs(xsum - s64) @ np.abs(m).T
    else:
        ref_q = xq @ w64.T
        mag_q = np.abs(xq) @ np.abs(w64).T
        rounding = np.abs(x64 - xq) @ np.abs(w64).T  # what int8 activations may move each output
    # exact integer sums: only f32 rounding
    err_q = np.abs(y.astype(np.float64) - ref_q)
    assert y.shape == ref_q.shape
    assert np.all(err_q <= 1e-5 * mag_q + 1e-30), f"max err/bound {np.max(err_q / (1e-5 * mag_q + 1e-30)):.3g}"
    ref = x64 @ w64.T
    mag = np.abs(x64) @ np.abs(w64).T
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= 1e-2 * mag + 1e-30), f"max err/(sum|w*x|) {np.max(err / (mag + 1e-30)):.3g}"
    assert np.all(err <= 1.001 * rounding + 1e-5 * mag + 1e-30)
    # the int8 path ran: the result follows q8(x), not x
    assert np.max(err_q) < 0.1 * np.max(err)


def assert_result(y: np.ndarray, raw: np.ndarray, x: np.ndarray, qtype: G, int8: bool) -> None:
    wf = oracle(raw, qtype)
    if int8 and qtype in INT8_TYPES:
        assert_int8_close(y, raw, wf, x, qtype)
    else:
        assert_matmul_close(y, wf, x, qtype)


def bf16(a) -> np.ndarray:
    """f32 values rounded to the nearest bfloat16 (ties to even), back in f32."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


def assert_matmul_close(y: np.ndarray, wf: np.ndarray, x: np.ndarray, qtype: G = G.F32) -> None:
    """y = x @ wf.T up to f32 summation order; against F16 / BF16 weights the
    activations are rounded to the weight's type first, as llama.cpp does."""
    xr = {G.F16: f16, G.BF16: bf16}.get(qtype, np.asarray)(x)
    ref = xr.astype(np.float64) @ wf.astype(np.float64).T
    bound = 1e-5 * (np.abs(xr).astype(np.float64) @ np.abs(wf).astype(np.float64).T) + 1e-30
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"
    if qtype in (G.F16, G.BF16):  # the rounding ran: the result follows round(x), not x
        exact = np.abs(y.astype(np.float64) - x.astype(np.float64) @ wf.astype(np.float64).T)
        assert np.max(err) < 0.1 * np.max(exact)
