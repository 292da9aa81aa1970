"""Named tensors of a GGUF model, shape-checked against what the architecture
expects, as float32 torch tensors in numpy order (ggml ne reversed)."""
from __future__ import annotations

import numpy as np
import torch
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from . import kernels
from .errors import ModelFileError
from .gguf.reader import GGUFFile
from .gguf.validate import SUPPORTED_TYPES, same_shape

__all__ = ["SUPPORTED_TYPES", "QWeight", "Weights", "dequantize"]


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes -> float32 array of `shape` (numpy order)."""
    t = T(ggml_type)
    if t == T.F32:
        return raw.view(np.float32).reshape(shape)
    if t == T.F16:
        return kernels.f16_to_f32(raw.view(np.uint16)).reshape(shape)
    if t == T.BF16:
        return kernels.bf16_to_f32(raw.view(np.uint16)).reshape(shape)
    rows = raw.reshape(-1, quants.GGML_QUANT_SIZES[t][1] * shape[-1] // quants.GGML_QUANT_SIZES[t][0])
    return quants.dequantize(rows, t).reshape(shape).astype(np.float32, copy=False)


class QWeight:
    """A matrix kept in its GGUF type: raw bytes [*batch, rows, row_bytes] (a
    zero-copy view of the file) computed with by the CPU kernels."""

    def __init__(self, raw: np.ndarray, qtype: int, shape: tuple[int, ...]):
        self.qtype, self.shape = int(qtype), shape  # shape: numpy order, last = input dim
        self.raw = raw.reshape(*shape[:-1], -1)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, in] -> [T, rows]
        return torch.from_numpy(kernels.ggml_matmul(self.raw, self.qtype, x.detach().numpy()))

    def expert_matmul(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # stacked (E, rows, in): ids [n], x [n, in] -> [n, rows]
        return torch.from_numpy(kernels.ggml_expert_matmul(self.raw, self.qtype, ids.numpy(), x.detach().numpy()))


class Weights:
    """Access to a model's tensors by name with llama.cpp's expected shapes."""

    def __init__(self, gguf: GGUFFile, is_pack: bool = False, source: "Weights | None" = None):
        self.gguf = gguf
        self.path = str(gguf.path)
        self.used: set[str] = set()
        self.is_pack = is_pack  # gguf is a residual-split pack
        self.source = source  # a pack's: the source file, where the critical experts run from it

    def pack_part(self, name: str, n_expert: int, rows: int) -> np.ndarray:
        """A pack's byte tensor as a zero-copy uint8 view [E, rows, row_bytes]."""
        t = self.gguf.tensors.get(name)
        if t is None or t.ne[1:] != (rows, n_expert):
            raise ModelFileError(self.path, f"pack tensor {name} missing or mis-shaped")
        self.used.add(name)
        return self.gguf.raw(name).reshape(n_expert, rows, -1)

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def info(self, name: str, ne: tuple[int, ...]):
        t = self.gguf.tensors.get(name)
        if t is None:
            raise ModelFileError(self.path, f"missing tensor {name}")
        if not same_shape(t.ne, ne):  # trailing 1s aside, as llama.cpp compares them
            raise ModelFileError(self.path, f"tensor {name} has shape {list(t.ne)}, expected {list(ne)}")
        if t.ggml_type not in SUPPORTED_TYPES:
            raise ModelFileError(self.path, f"tensor {name}: unsupported type {t.type_name}")
        self.used.add(name)
        return t

    def get(self, name: str, *ne: int) -> torch.Tensor:
        """The tensor as float32, numpy-order shape (ne reversed)."""
        t = self.info(name, ne)
        arr = dequantize(self.gguf.raw(name), t.ggml_type, tuple(reversed(ne)))  # the shape asked for: {H, 1} -> [H]
        if arr.base is not None and not arr.flags.writeable:
            arr = arr.copy()  # never hand torch a view of the read-only mapping
        return torch.from_numpy(arr)

    def mat(self, name: str, *ne: int) -> "torch.Tensor | QWeight":
        """A weight matrix (or stack of them) for matmuls: F32 as a torch tensor,
        every other type kept as it is in the file (never expanded to f32)."""
        t = self.info(name, ne)
        if t.ggml_type == T.F32:
            return self.get(name, *ne)
        return QWeight(self.gguf.raw(name), t.ggml_type, tuple(reversed(ne)))

    def opt(self, name: str, *ne: int) -> torch.Tensor | None:
        return self.get(name, *ne) if self.has(name) else None
