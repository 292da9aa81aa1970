"""CUDA sources without a GPU: every .cu compiles with the local nvcc for sm_80
and sm_90 (skipped only when there is no nvcc), the JIT build caches by source
hash / arch / toolkit, and the kernels' per-block math (shared with a host
harness built by any C++ compiler) matches the numpy oracles. Whole kernels on
the CPU's emulator are in tests/test_cuda_emulated.py."""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from cuda_types import GGML
from rapidmoe.engine.gpu import cuda_build
from rapidmoe.engine import kernels
from rapidmoe.engine.quant import resplit_oracle as oracle

SRC = Path(__file__).resolve().parent.parent / "csrc" / "cuda"
CU_FILES = sorted(SRC.glob("*.cu"))
NVCC = cuda_build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")


def test_every_module_is_a_source():
    assert {p.stem for p in CU_FILES} == set(cuda_build.MODULES)


@needs_nvcc
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("src", CU_FILES, ids=lambda p: p.name)
def test_nvcc_compiles(src, arch, tmp_path):
    out = tmp_path / f"{src.stem}.cubin"
    cuda_build.nvcc_compile(NVCC, src, arch, out)
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF" and len(data) > 1000
    from rapidmoe.engine.gpu.cuda_kernels import _SIGS

    for name in [n for n, (mod, _) in _SIGS.items() if mod == src.stem]:
        assert name.encode() in data  # extern "C": the driver finds it by this name


@needs_nvcc
def test_build_cache_key(monkeypatch, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("dev"))
    monkeypatch.setenv("RAPIDMOE_CUDA_SRC", str(src))
    monkeypatch.setattr(cuda_build, "MODULES", ("ggml_gemv",))  # one module keeps this quick
    paths = cuda_build.build(90, prefer="nvcc")
    p = paths["ggml_gemv"]
    assert p.is_file() and f"-sm90-nvcc{cuda_build.nvcc_version(NVCC)}" in p.parent.name
    mtime = p.stat().st_mtime_ns
    assert cuda_build.build(90, prefer="nvcc")["ggml_gemv"].stat().st_mtime_ns == mtime  # cached
    (src / "common.cuh").write_text((src / "common.cuh").read_text() + "\n// changed\n")
    assert cuda_build.build(90, prefer="nvcc")["ggml_gemv"].parent != p.parent  # new source hash, new build


# ---------------------------------------------------------------- per-block math on the host
@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("harness") / "block_harness"
    subprocess.run([cxx, "-O2", "-std=c++17", "-o", str(exe), str(SRC / "dev" / "block_harness.cpp")], check=True)

    def run(cmd: str, data: bytes) -> bytes:
        return subprocess.run([str(exe), cmd], input=data, capture_output=True, check=True).stdout
    return run


def test_wq_integer_dot_matches_oracle(harness):
    rng = np.random.default_rng(1)
    n = 2048
    w = (rng.standard_normal((4, n)) * 0.02).astype(np.float32)
    q, _ = kernels.resplit_quantize_wq_wr(w)
    for row in range(4):
        x = (rng.standard_normal(n) * (10.0 ** row)).astype(np.float32)  # any activation scale
        x[::97] *= 30  # outliers
        out = np.frombuffer(harness("wq_dot", struct.pack("<I", n // 32) + x.tobytes() + q[row].tobytes()), np.float32)
        ref = (oracle.dequantize_wq(q[row], n).astype(np.float64) * x).reshape(-1, 32).sum(1)
        # only x's int16 rounding (1/16382 of each block's max) separates them
        bound = np.abs(x).reshape(-1, 32).max(1) / 16382 * np.abs(oracle.dequantize_wq(q[row], n)).reshape(-1, 32).sum(1)
        assert np.all(np.abs(out - ref) <= bound * 1.01 + 1e-30)
        assert abs(out.sum() - ref.sum()) / np.abs(ref).sum() < 1e-4


def test_wq_dequant_matches_oracle_on_any_bytes(harness):
    rng = np.random.default_rng(2)
    q = rng.integers(0, 256, (64, 8), dtype=np.uint8)
    q[:, 7] &= 0x3F  # finite scales
    out = np.frombuffer(harness("wq_deq", struct.pack("<I", 64) + q.tobytes()), np.float32)
    np.testing.assert_array_equal(out, oracle.dequantize_wq(q.reshape(1, -1), 64 * 32)[0])


@pytest.mark.parametrize("qtype", sorted(GGML), ids=lambda t: GGML[t][0])
def test_ggml_chunks_match_cpu_reference(harness, qtype):
    _, blk, nbytes, f16_at = GGML[qtype]
    rng = np.random.default_rng(qtype)
    raw = rng.integers(0, 256, (40, nbytes), dtype=np.uint8)
    for off in f16_at:  # the block's f16 scales: finite, varied
        raw[:, off:off + 2] = (rng.standard_normal(40) * 0.01).astype(np.float16).view(np.uint8).reshape(40, 2)
    out = np.frombuffer(harness("ggml_deq", struct.pack("<iI", qtype, 40) + raw.tobytes()), np.float32)
    ref = kernels.ggml_dequantize(raw, qtype, 40 * blk)  # bit-exact with gguf-py
    np.testing.assert_array_equal(out, ref)


def test_bf16_rounding_matches_torch(harness):
    x = np.concatenate([np.random.default_rng(3).standard_normal(1000).astype(np.float32),
                        np.array([0.0, -0.0, 1e-40, 3.0e38, np.inf, -np.inf], np.float32)])
    out = np.frombuffer(harness("bf16", struct.pack("<I", len(x)) + x.tobytes()), np.uint16)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(out, ref)


def test_nvrtc_compiles_when_present(monkeypatch, tmp_path):
    """The no-toolkit path: NVRTC from pip's CUDA wheels (skipped where it is not installed)."""
    lib = cuda_build.load_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC library")
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path))
    paths = cuda_build.build(90, prefer="nvrtc")
    assert set(paths) == set(cuda_build.MODULES)
    assert all(p.read_bytes()[:4] == b"\x7fELF" for p in paths.values())
    from rapidmoe.engine.gpu.cuda_kernels import _SIGS

    for name, (mod, _) in _SIGS.items():
        assert name.encode() in paths[mod].read_bytes()


def test_no_compiler_is_one_clear_error(monkeypatch, tmp_path):
    from rapidmoe.engine.errors import UserError

    monkeypatch.setattr(cuda_build, "load_nvrtc", lambda: None)
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: None)
    with pytest.raises(UserError, match="no CUDA compiler"):
        cuda_build.build(90)
