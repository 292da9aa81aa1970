"""Non-expert weights on the GPU in their source GGUF types (attention, MLA's
per-head stacks, shared experts, dense FFNs, output head): Q8_0/Q4_K/Q5_K/Q6_K
stay quantized and run through the dequantize-GEMV kernels (decode) or a
dequantize-to-bf16 + tensor-core GEMM (prefill); F16 stays f16, other types go to bf16,
F32 stays f32.
DeepSeek-V3's ~17 B non-expert parameters: ~34 GB in bf16, ~9.5 GB at ~4.5 bpw."""
from __future__ import annotations

import numpy as np
import torch

from . import cuda_kernels as gk

F16 = 1  # GGML type

DECODE_MAX_TOKENS = 8  # up to this many rows of x the GEMV kernel wins (weights read once)


class GpuQWeight:
    """A matrix [rows, n], or a stack of per-head matrices [heads, rows, n] (MLA's
    attn_k_b / attn_v_b), kept as its GGUF bytes on the GPU."""

    def __init__(self, raw: np.ndarray, qtype: int, shape: tuple[int, ...], device="cuda"):
        if len(shape) not in (2, 3) or not gk.ggml_supported(qtype):
            raise ValueError(f"GPU GGUF matrices: Q8_0/Q4_K/Q5_K/Q6_K, 2-D or per-head 3-D (got type {qtype}, "
                             f"shape {shape})")
        self.qtype, self.shape = int(qtype), tuple(shape)
        arr = np.ascontiguousarray(raw).view(np.uint8).reshape(int(np.prod(shape[:-1])), -1)  # [heads * rows, rb]
        if not arr.flags.writeable and torch.device(device).type == "cpu":
            arr = arr.copy()  # torch never aliases a read-only mapping (the emulated GPU's case)
        self.raw = torch.from_numpy(arr).to(device)

    @classmethod
    def from_device_bytes(cls, raw: torch.Tensor, qtype: int, shape: tuple[int, int]) -> "GpuQWeight":
        """Bytes already on the device, uint8 [rows, row bytes]."""
        self = cls.__new__(cls)
        self.qtype, self.shape, self.raw = int(qtype), tuple(shape), raw.contiguous()
        return self

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, n] float32 on the device -> [T, rows]
        x = x.to(self.raw.device, torch.float32).contiguous()
        if x.shape[0] <= DECODE_MAX_TOKENS:
            return gk.ggml_gemv(self.raw, self.qtype, self.shape[1], x)
        w = gk.ggml_dequant_bf16(self.raw, self.qtype, self.shape[1])  # [rows, n], freed after use
        return (x.to(torch.bfloat16) @ w.T).float()

    def per_head(self, x: torch.Tensor) -> torch.Tensor:
        """A stack's heads, each on its own slice: x [T, heads, n] -> [T, heads, rows]."""
        heads, rows, n = self.shape
        T = x.shape[0]
        x = x.to(self.raw.device, torch.float32).reshape(T, heads * n).contiguous()
        if T <= DECODE_MAX_TOKENS:
            return gk.ggml_gemv(self.raw, self.qtype, n, x, heads=heads).view(T, heads, rows)
        w = gk.ggml_dequant_bf16(self.raw, self.qtype, n).view(heads, rows, n)  # freed after use
        return torch.einsum("thi,hoi->tho", x.view(T, heads, n).to(torch.bfloat16), w).float()


def place(weight, device="cuda", float_dtype=torch.bfloat16):
    """A CPU weight (engine.weights.QWeight or a float torch tensor) -> its GPU twin.
    Types the GPU kernels lack are expanded to float_dtype."""
    from .. import kernels as cpu_kernels  # deferred: loads the compiled kernels

    if isinstance(weight, torch.Tensor):
        return weight.to(device, float_dtype)
    if gk.ggml_supported(weight.qtype) and len(weight.shape) in (2, 3):
        return GpuQWeight(weight.raw, weight.qtype, weight.shape, device)
    n = int(np.prod(weight.shape))
    w = cpu_kernels.ggml_dequantize(weight.raw, weight.qtype, n).reshape(weight.shape)
    # F16 stays f16 (exact; the product then rounds activations to f16, as llama.cpp and the CPU do)
    return torch.from_numpy(w).to(device, torch.float16 if weight.qtype == F16 else float_dtype)


def gpu_linear(x: torch.Tensor, w) -> torch.Tensor:
    """y = x @ W^T for any placed weight."""
    if isinstance(w, GpuQWeight):
        return w.matmul(x)
    return (x.to(w.dtype) @ w.T).float()
