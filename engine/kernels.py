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
