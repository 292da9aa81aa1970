"""The one door to the compiled kernels. Everything else imports from here."""
from __future__ import annotations

import numpy as np

from . import _cpu


def isa_info() -> dict:
    """CPU features seen at run time and the kernel path in use."""
    return dict(_cpu.isa_info())


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    """float16 (or its uint16 bits), any shape -> float32, same shape."""
    return _cpu.f16_to_f32(np.ascontiguousarray(bits).view(np.uint16))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16), any shape -> float32, same shape."""
    return _cpu.bf16_to_f32(np.ascontiguousarray(bits).view(np.uint16))


def set_num_threads(n: int) -> None:
    """Threads the CPU kernels use (<= 0: all usable cores)."""
    _cpu.set_num_threads(int(n))


def num_threads() -> int:
    return int(_cpu.num_threads())


# ---- GGUF tensor types kept in their source format (csrc/cpu/ggml_*.cpp) ----
# `qtype` is the GGUF type id (gguf.GGMLQuantizationType): F32, F16, BF16, Q8_0,
# Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Weights are passed as the
# tensor's own bytes (e.g. a memory-mapped GGUF view) and never copied.

def _as_bytes(w: np.ndarray) -> np.ndarray:
    """Any C-contiguous array -> uint8 view, last axis in bytes (no copy)."""
    if not w.flags.c_contiguous:
        raise ValueError("GGUF weights must be C-contiguous (a copy of a large tensor is never made silently)")
    return w.view(np.uint8).reshape(w.shape[:-1] + (-1,))


def ggml_row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of k weights (0: unsupported type, or k not whole blocks)."""
    return int(_cpu.ggml_row_bytes(int(qtype), int(k)))


def ggml_dequantize(raw: np.ndarray, qtype: int, n: int) -> np.ndarray:
    """Tensor bytes (any shape/dtype, C-contiguous) holding n weights -> float32 [n].
    Bit-exact with gguf.quants.dequantize."""
    return _cpu.ggml_dequantize(_as_bytes(raw).reshape(-1), int(qtype), int(n))


def ggml_matmul(w: np.ndarray, qtype: int, x: np.ndarray) -> np.ndarray:
    """y = x @ W^T with W in its GGUF type.
    w: [rows, row_bytes] bytes (or the typed [rows, k] view of an F32/F16/BF16 tensor);
    x: [T, k] or [k] float32 -> y: [T, rows] or [rows] float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = _cpu.ggml_matmul(_as_bytes(w), int(qtype), x.reshape(1, -1) if x.ndim == 1 else x)
    return y.reshape(-1) if x.ndim == 1 else y


def ggml_expert_matmul(w: np.ndarray, qtype: int, expert_ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Stacked experts in their GGUF type: y[j] = W[expert_ids[j]] @ x[j].
    w: [E, rows, row_bytes] bytes (or typed [E, rows, k]); expert_ids: [n] ints;
    x: [n, k] float32 -> y: [n, rows] float32. Each used expert's weights are read once."""
    ids = np.ascontiguousarray(expert_ids, dtype=np.int32).reshape(-1)
    x = np.ascontiguousarray(x, dtype=np.float32)
    return _cpu.ggml_expert_matmul(_as_bytes(w), int(qtype), ids, x)
