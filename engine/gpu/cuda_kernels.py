"""The one door to the CUDA kernels (csrc/cuda): torch CUDA tensors in, torch
CUDA tensors out, launched on torch's current stream. The modules are built on
first use (engine/gpu/cuda_build.py) for this GPU's architecture.

References (tests/gpu/check.py): the numpy oracles of the formats and torch."""
from __future__ import annotations

import ctypes
import threading

import torch

from .cuda_build import build
from .driver import Driver, EmulatedKernel, Kernel
from .formats import GGUF_GEMV_TYPES

# name -> (module, signature)
_SIGS = {
    "wq_prep": ("resplit_wq", "piiipp"),
    "wq_gemv_gate_up": ("resplit_wq", "pplippppiiipp"),
    "wq_gemv_gate_up_r1": ("resplit_wq", "pplippppiiipp"),
    "wq_gemv_gate_up_r4": ("resplit_wq", "pplippppiiipp"),
    "wq_gemv": ("resplit_wq", "plippppiipp"),
    "wq_gemv_r2": ("resplit_wq", "plippppiipp"),
    "wq_gemv_r8": ("resplit_wq", "plippppiipp"),
    "wq_dequant_bf16": ("resplit_wq", "plipiip"),
    "ggml_quant_x": ("ggml_gemv", "pipp"),
    "ggml_dequant_bf16": ("ggml_gemv", "ipiiip"),
}
# GGUF-type GEMV (csrc/cuda/ggml_gemv.cu): one entry point per format and token
# capacity, ggml_gemv_<format>_t<NT> (W, rb, n, R, XQ, XS, T, y, tpr, heads)
GG_FORMATS = {8: "q8_0", 12: "q4_k", 13: "q5_k", 14: "q6_k"}
GG_NT = (1, 2, 4, 8)
GG_TMAX = GG_NT[-1]  # tokens per launch
_SIGS.update({f"ggml_gemv_{f}_t{nt}": ("ggml_gemv", "piiippipii") for f in GG_FORMATS.values() for nt in GG_NT})
# rows per warp of each W_Q GEMV entry point (resplit_wq.cu); 8 warps per CTA
GU_VARIANTS = {2: "wq_gemv_gate_up", 1: "wq_gemv_gate_up_r1", 4: "wq_gemv_gate_up_r4"}
DN_VARIANTS = {4: "wq_gemv", 2: "wq_gemv_r2", 8: "wq_gemv_r8"}
GU_RPW, DN_RPW = 2, 4  # defaults
GGML_TYPES = GGUF_GEMV_TYPES  # Q8_0, Q4_K, Q5_K, Q6_K: (block, bytes)

_lock = threading.Lock()
_state: dict = {}


def load(device: torch.device) -> dict[str, Kernel]:
    """Build (or load the cached) kernels for this device: loading does it as a visible step."""
    return _kernels(device)


def _kernels(device: torch.device) -> dict[str, Kernel]:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if idx in _state:
            return _state[idx]

        major, minor = torch.cuda.get_device_capability(idx)
        paths = build(major * 10 + minor)
        drv = _state.get("driver") or Driver()
        _state["driver"] = drv
        torch.cuda.init()
        with torch.cuda.device(idx):
            torch.empty(1, device=f"cuda:{idx}")  # the primary context exists and is torch's
            drv.ensure_context(idx)
            mods = {m: drv.load_module(p.read_bytes()) for m, p in paths.items()}
        ks = {n: Kernel(drv, drv.function(mods[m], n), n, sig) for n, (m, sig) in _SIGS.items()}
        _state[idx] = ks
        return ks


def use_emulator(lib_path: str | None) -> None:
    """Run every kernel through the CPU emulation library instead of a GPU (tests;
    tensors are then CPU tensors). None switches back."""
    if lib_path is None:
        _state.pop("emu", None)
        return
    lib = ctypes.CDLL(lib_path)
    lib.emu_call.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    _state["emu"] = {n: EmulatedKernel(lib, n, sig) for n, (_, sig) in _SIGS.items()}


def _launch(name: str, device: torch.device, grid, *args) -> None:
    if "emu" in _state:
        _state["emu"][name](grid, 256, 0, *args)
        return
    ks = _kernels(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ks[name].drv.ensure_context(idx)
    ks[name](grid, 256, torch.cuda.current_stream(device).cuda_stream, *args)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _check(t: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    if not (t.is_cuda or "emu" in _state) or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"{what}: a contiguous CUDA {dtype} tensor expected")


# ---------------------------------------------------------------- W_Q
def wq_prep(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, n] float32 -> prepared activations (Z [N, 4, nb, 4] int32, SF [N, nb, 2] float32)."""
    _check(x, torch.float32, "wq_prep x")
    N, n = x.shape
    nb = -(-n // 32)
    Z = torch.empty(N, 4, nb, 4, dtype=torch.int32, device=x.device)
    SF = torch.empty(N, nb, 2, dtype=torch.float32, device=x.device)
    _launch("wq_prep", x.device, (-(-nb // 8), N), x.data_ptr(), n, n, nb, Z.data_ptr(), SF.data_ptr())
    return Z, SF


def wq_gate_up(wg: torch.Tensor, wu: torch.Tensor, eid: torch.Tensor, xrow: torch.Tensor,
               prep: tuple[torch.Tensor, torch.Tensor], swiglu: bool, rpw: int = GU_RPW):
    """wg, wu [C, F, rb] uint8; eid [S] int32 (positions in wg); xrow [S] int32 (rows of prep).
    swiglu: h = silu(g)*u [S, F]; else (g [S, F], u [S, F])."""
    Z, SF = prep
    C, F, rb = wg.shape
    nb = Z.shape[2]
    if rb != nb * 8 or wu.shape != wg.shape:
        raise ValueError("wq_gate_up: weights and activations disagree on the input width")
    for t, what in ((wg, "wg"), (wu, "wu")):
        _check(t, torch.uint8, what)
    S = eid.numel()
    out0 = torch.empty(S, F, dtype=torch.float32, device=wg.device)
    out1 = None if swiglu else torch.empty(S, F, dtype=torch.float32, device=wg.device)
    _launch(GU_VARIANTS[rpw], wg.device, (-(-F // (8 * rpw)), S), wg.data_ptr(), wu.data_ptr(), F * rb, rb,
            eid.data_ptr(), xrow.data_ptr(), Z.data_ptr(), SF.data_ptr(), nb, F, 1 if swiglu else 0,
            out0.data_ptr(), _ptr(out1))
    return out0 if swiglu else (out0, out1)


def wq_gemv(w: torch.Tensor, eid: torch.Tensor, xrow: torch.Tensor, prep, scale: torch.Tensor | None = None,
            rpw: int = DN_RPW):
    """w [C, R, rb] uint8 -> y [S, R] = scale[s] * W[eid[s]] . x[xrow[s]]."""
    Z, SF = prep
    _check(w, torch.uint8, "wq_gemv w")
    C, R, rb = w.shape
    nb = Z.shape[2]
    if rb != nb * 8:
        raise ValueError("wq_gemv: weights and activations disagree on the input width")
    S = eid.numel()
    y = torch.empty(S, R, dtype=torch.float32, device=w.device)
    _launch(DN_VARIANTS[rpw], w.device, (-(-R // (8 * rpw)), S), w.data_ptr(), R * rb, rb, eid.data_ptr(),
            xrow.data_ptr(), Z.data_ptr(), SF.data_ptr(), nb, R, _ptr(scale), y.data_ptr())
    return y


def wq_dequant_bf16(w: torch.Tensor, eid: torch.Tensor, n: int) -> torch.Tensor:
    """w [C, R, rb] uint8, eid [S] -> bf16 [S, R, n]."""
    _check(w, torch.uint8, "wq_dequant w")
    C, R, rb = w.shape
    S = eid.numel()
    out = torch.empty(S, R, n, dtype=torch.bfloat16, device=w.device)
    nb = rb // 8
    _launch("wq_dequant_bf16", w.device, (-(-(R * nb) // 256), S), w.data_ptr(), R * rb, rb, eid.data_ptr(), n, R,
            out.data_ptr())
    return out


# ---------------------------------------------------------------- GGUF types
def ggml_supported(qtype: int) -> bool:
    return int(qtype) in GGML_TYPES


def ggml_quant_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, n] float32 -> (XQ [T, n] int8 as uint8, XS [T, n/16, 2] float32): per 32
    elements q = rint(x / dx), dx = amax / 127; XS holds {dx, dx * sum of 16 q}."""
    _check(x, torch.float32, "ggml_quant_x x")
    T, n = x.shape
    if n % 32:
        raise ValueError(f"ggml_quant_x: n = {n} is not a multiple of 32")
    if x.data_ptr() % 16:
        x = x.clone()  # rows read 16 bytes at a time
    XQ = torch.empty(T, n, dtype=torch.uint8, device=x.device)
    XS = torch.empty(T, n // 16, 2, dtype=torch.float32, device=x.device)
    _launch("ggml_quant_x", x.device, (-(-(n // 4) // 256), T), x.data_ptr(), n, XQ.data_ptr(), XS.data_ptr())
    return XQ, XS


def ggml_tpr(qtype: int, n: int, R: int) -> int:
    """Threads per row for ggml_gemv: enough items per thread to keep two loads in
    flight, more threads per row when the rows are too few to fill the GPU."""
    blk, _ = GGML_TYPES[int(qtype)]
    items = n // blk * (2 if int(qtype) == 8 else 8)  # 16-byte work items per row
    tpr = 8
    while tpr < 256 and 4 * tpr <= items:
        tpr *= 2
    while tpr < 256 and 2 * tpr <= items and -(-R * tpr // 256) < 264:  # fewer than ~2 CTAs per SM
        tpr *= 2
    return tpr


def ggml_gemv(w: torch.Tensor, qtype: int, n: int, x: torch.Tensor, tpr: int | None = None,
              heads: int = 1) -> torch.Tensor:
    """w [R, rb] uint8 in GGUF type qtype (Q8_0/Q4_K/Q5_K/Q6_K); x [T, n] float32 -> y [T, R].
    heads > 1: w stacks one matrix per head ([heads * R, rb], head h's rows after
    head h-1's) and x [T, heads * n] one slice per head; y [T, heads * R] (MLA's
    per-head attn_k_b / attn_v_b in one launch).
    x is quantized to int8 per 32 elements first (ggml_quant_x), once for all rows.
    tpr: threads per row (a power of two, 8..256; default ggml_tpr)."""
    _check(w, torch.uint8, "ggml_gemv w")
    _check(x, torch.float32, "ggml_gemv x")
    qtype = int(qtype)
    rows, rb = w.shape
    R = rows // heads
    blk, bb = GGML_TYPES[qtype]
    if heads < 1 or rows % heads or n % blk or rb != n // blk * bb or x.shape[-1] != heads * n:
        raise ValueError(f"ggml_gemv: w [{rows}, {rb}] of type {qtype} in {heads} heads and x {tuple(x.shape)} "
                         f"disagree on n = {n}")
    if w.data_ptr() % 16:
        raise ValueError("ggml_gemv: w must start on a 16-byte boundary (the kernel reads it 16 bytes at a time)")
    tpr = tpr or ggml_tpr(qtype, n, rows)
    if tpr not in (8, 16, 32, 64, 128, 256):
        raise ValueError(f"ggml_gemv: tpr = {tpr} is not a power of two in 8..256")
    T = x.shape[0]
    y = torch.empty(T, rows, dtype=torch.float32, device=w.device)
    if T == 0 or R == 0:
        return y
    XQ, XS = ggml_quant_x(x)
    for t0 in range(0, T, GG_TMAX):
        t1 = min(T, t0 + GG_TMAX)
        nt = next(c for c in GG_NT if c >= t1 - t0)
        _launch(f"ggml_gemv_{GG_FORMATS[qtype]}_t{nt}", w.device, (-(-R // (256 // tpr)), heads), w.data_ptr(), rb,
                n, R, XQ[t0].data_ptr(), XS[t0].data_ptr(), t1 - t0, y[t0].data_ptr(), tpr, heads)
    return y


def ggml_dequant_bf16(w: torch.Tensor, qtype: int, n: int) -> torch.Tensor:
    """w [R, rb] uint8 -> bf16 [R, n]."""
    _check(w, torch.uint8, "ggml_dequant w")
    R, rb = w.shape
    out = torch.empty(R, n, dtype=torch.bfloat16, device=w.device)
    _launch("ggml_dequant_bf16", w.device, (-(-(R * (n // 32)) // 256),), int(qtype), w.data_ptr(), rb, n, R,
            out.data_ptr())
    return out
