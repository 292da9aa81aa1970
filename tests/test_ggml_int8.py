"""The int8-activation GEMV of the GGUF-type CPU kernels (csrc/cpu/ggml/ggml_*), beyond
tests/test_ggml_kernels.py's all-types check: odd shapes on every ISA path, the
activations quantized bit for bit as llama.cpp's q8_0 / q8_1 / q8_K (numpy's
quantizer is q8_parts in tests/ggml_oracle.py), NaN and inf activations, and results
that depend neither on the thread count nor on the batch a token comes in.
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

from ggml_oracle import INT8_TYPES, ISAS, assert_int8_close, oracle, q8_parts, random_tensor, run_isa
from rapidmoe.engine import kernels

INT8_MAX_T = 8


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
