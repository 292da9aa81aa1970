"""The one door to the compiled kernels. Everything else imports from here."""
from __future__ import annotations

import os

import numpy as np

from .errors import UserError

# RAPIDMOE_ISA values the compiled module knows (csrc/cpu/common/isa.cpp); it reads the
# variable itself and would take anything else as "no override"
ISA_PATHS = ("scalar", "avx2-novnni", "avx2", "avx512", "avx512-novbmi", "avx512-novnni")


def check_isa_override(env=os.environ) -> None:
    forced = env.get("RAPIDMOE_ISA")
    if forced and forced not in ISA_PATHS:
        raise UserError(f"RAPIDMOE_ISA={forced!r} is not a kernel path; use one of {', '.join(ISA_PATHS)} "
                        "(or unset it: the best path this CPU allows)")


check_isa_override()  # before the compiled module reads it

from . import _cpu  # noqa: E402


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


def read_bandwidth_gbs(nbytes: int = 1 << 30, passes: int = 3) -> float:
    """STREAM-like DRAM read bandwidth with the kernel threads (buffer >> caches)."""
    buf = np.ones(nbytes, dtype=np.uint8)  # touched, so every page is resident
    return float(_cpu.read_bandwidth_gbs(buf, passes))


# ---- GGUF tensor types kept in their source format (csrc/cpu/ggml/ggml_*.cpp) ----
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


def ggml_int8_gemv(qtype: int, k: int) -> bool:
    """Rows of k weights of this type run the int8-activation GEMV on this CPU (what the
    residual split's critical experts need to run from the source file)."""
    return bool(_cpu.ggml_int8_gemv(int(qtype), int(k)))


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


# ---- decode attention and the fused decode block halves (csrc/cpu/attn/attn.h, decode.h) ----
def _f32(a):
    return None if a is None else np.ascontiguousarray(a, dtype=np.float32)


def attn_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: int,
                n_head: int, cos: np.ndarray, sin: np.ndarray, rope_dim: int, neox: bool,
                q_norm: np.ndarray | None, k_norm: np.ndarray | None, eps: float, scale: float) -> np.ndarray:
    """One decode token of GQA attention after its projections: per-head RMS norms of q
    and k (when given), RoPE (cos/sin of the position), k and v written into the caches
    kc [n_kv, n_ctx, hd] / vc [n_kv, n_ctx, hdv] (rows as attn_cached takes them) at pos
    (in place), then attention over
    positions 0..pos -> [n_head * hdv]. q and k are scratch (rotated in place)."""
    return _cpu.attn_decode(_f32(q), _f32(k), _f32(v), kc, vc, int(pos), int(n_head), _f32(cos), _f32(sin),
                            int(rope_dim), bool(neox), _f32(q_norm), _f32(k_norm), float(eps), float(scale))


def attn_cached(q: np.ndarray, kc: np.ndarray, vc: np.ndarray | None, pos0: int, n_head: int, scale: float,
                v_dim: int = 0) -> np.ndarray:
    """Causal softmax(scale * q.K^T) V of queries q [T, n_head, dim] at positions pos0..
    (query t sees positions 0..pos0 + t) over the cache rows kc [groups, n_ctx, dim] and
    vc [groups, n_ctx, dim_v] (float32, float16 or q8_0 rows, engine/kv_cache.KVRows);
    vc None: the values are the first v_dim of each key row (MLA's latent) -> flat
    [T * n_head * dim_v]."""
    return _cpu.attn_cached(_f32(q).reshape(-1), kc, vc, int(pos0), int(n_head), float(scale), int(v_dim))


def kv_store(cache: np.ndarray, pos: int, x: np.ndarray) -> None:
    """x [heads * dim] float32 into the cache rows (as attn_cached takes them) at pos, in place."""
    _cpu.kv_store(cache, int(pos), _f32(x))


def ggml_operand(w) -> tuple[np.ndarray, int]:
    """A weight matrix as the fused decode kernels take it: (raw rows uint8 [rows, row_bytes],
    GGUF type) from a QWeight or an f32 torch tensor [rows, k]."""
    if hasattr(w, "qtype"):
        return _as_bytes(w.raw), int(w.qtype)
    return _as_bytes(w.detach().numpy()), 0  # GGML type F32


def source_experts(gate, up, down) -> tuple:
    """The source file's stacked experts (QWeight [E, rows, in] each) as the MoE kernels'
    `source` takes them: ((rows [E * rows, row_bytes], type) for gate, up, down)."""
    return tuple((_as_bytes(w.raw).reshape(-1, w.raw.shape[-1]), int(w.qtype)) for w in (gate, up, down))


def decode_attn_block(x: np.ndarray, norm_w: np.ndarray, norm_eps: float, wq, wk, wv, wo, bq, bk, bv,
                      kc: np.ndarray, vc: np.ndarray, pos: int, n_head: int, cos: np.ndarray, sin: np.ndarray,
                      rope_dim: int, neox: bool, q_norm, k_norm, eps: float, scale: float,
                      qk_full: bool = False) -> np.ndarray:
    """x [H] + Wo . attention(rms_norm(x)) for one decode token (attn_decode's steps after
    the q/k/v projections, biases optional); w*: ggml_operand pairs -> [H]. q_norm/k_norm:
    per head [head_dim], or over the whole q / k with qk_full (olmoe)."""
    return _cpu.decode_attn_block(_f32(x), _f32(norm_w), float(norm_eps), wq, wk, wv, wo, _f32(bq), _f32(bk),
                                  _f32(bv), kc, vc, int(pos), int(n_head), _f32(cos), _f32(sin), int(rope_dim),
                                  bool(neox), _f32(q_norm), _f32(k_norm), float(eps), float(scale), bool(qk_full))


def decode_mla_block(x: np.ndarray, norm_w: np.ndarray, norm_eps: float, wq, wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm,
                     k_b, v_b, wo, cache: np.ndarray, pos: int, n_head: int, cos: np.ndarray, sin: np.ndarray,
                     rope_dim: int, neox: bool, scale: float, nope: int, hv: int) -> np.ndarray:
    """x [H] + Wo . mla(rms_norm(x)) for one decode token (DeepSeek's latent attention,
    engine/models/mla.py): w*, k_b, v_b as ggml_operand pairs of 2-D rows (the per-head
    stacks k_b [n_head * kv, nope] and v_b [n_head * hv, kv]); wq None, or wq_a, q_a_norm
    and wq_b None; cache: the layer's rows [1, n_ctx, kv + rope_dim] (position pos written)."""
    return _cpu.decode_mla_block(_f32(x), _f32(norm_w), float(norm_eps), wq, wq_a, _f32(q_a_norm), wq_b, wkv_a,
                                 _f32(kv_a_norm), k_b, v_b, wo, cache, int(pos), int(n_head), _f32(cos), _f32(sin),
                                 int(rope_dim), bool(neox), float(scale), int(nope), int(hv))


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * w over the last axis, rounded as ggml does (float
    squares summed in double); the fused decode blocks use the same function."""
    return _cpu.rms_norm(_f32(x), _f32(w), float(eps))


def route(logits: np.ndarray, k: int, sigmoid: bool, norm_topk: bool, scale: float, bias=None, n_groups: int = 0,
          n_group_used: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Router logits [T, E] -> (ids int32, weights f32) [T, k]: softmax (or sigmoid)
    probabilities; the k of the largest selection score (probability + bias [E]; with
    n_groups > 1 only within the n_group_used groups whose top-2 scores sum highest), in
    that order (ties: lower id first); weights the unbiased probabilities, optionally
    renormalised over the k and scaled."""
    return _cpu.route(_f32(logits), int(k), bool(sigmoid), bool(norm_topk), float(scale),
                      None if bias is None else _f32(bias), int(n_groups), int(n_group_used))


def decode_moe_block(h: np.ndarray, norm_w: np.ndarray, eps: float, router, k: int, sigmoid: bool,
                     norm_topk: bool, scale: float, fixed: int, ab: float, theta: float, r_min: int, r_max: int,
                     gate_q, up_q, down_q, gate_r=None, up_r=None, down4=None, shared_gate=None, shared_up=None,
                     shared_down=None, shared_gate_inp=None, bias=None, n_groups: int = 0, n_group_used: int = 0,
                     source=None):
    """h [H] + the routed residual-split experts of rms_norm(h) for one decode token,
    plus a shared expert where shared_gate/up/down (ggml_operand pairs [F, H], [F, H],
    [H, F]) are given, weighted by sigmoid(shared_gate_inp [H] . x) where that is. The
    router selects as route (bias, n_groups, n_group_used); the critical experts are the
    r of the largest weights. fixed >= 0: r = min(fixed, k); fixed < 0: UMIA, r = clip(
    leading run of ab * w_j > theta, r_min, min(r_max, k)), w sorted descending. router: a
    ggml_operand pair [E, H]. source: the critical experts run from these (source_experts)
    instead of gate_r/up_r/down4. -> (out [H], ids [k] int32, weights [k], r)."""
    return _cpu.decode_moe_block(_f32(h), _f32(norm_w), float(eps), router, int(k), bool(sigmoid), bool(norm_topk),
                                 float(scale), int(fixed), float(ab), float(theta), int(r_min), int(r_max),
                                 gate_q, up_q, down_q, gate_r, up_r, down4, source, shared_gate, shared_up, shared_down,
                                 None if shared_gate_inp is None else _f32(shared_gate_inp),
                                 None if bias is None else _f32(bias), int(n_groups), int(n_group_used))


def decode_chain():
    """An empty run of fused decode blocks (DecodeChain: `add` a block's attention and
    routed-expert operands once, then `run` one token through all of them per call)."""
    return _cpu.DecodeChain()


# ---- resplit expert formats: WQ / WR / D4 (csrc/cpu/resplit/resplit.h, oracle engine/quant/resplit_oracle.py) ----
def resplit_format_version() -> int:
    """Version of the WQ/WR/D4 bytes and their meaning (a pack made with another is stale)."""
    return int(_cpu.resplit_format_version())


def resplit_row_bytes(fmt: str, n: int) -> int:
    """Bytes of one row of n weights in 'wq', 'wr' or 'd4'."""
    return int(_cpu.resplit_row_bytes(fmt, int(n)))


def resplit_quantize(fmt: str, w: np.ndarray) -> np.ndarray:
    """w [..., n] float32 -> [..., row_bytes] uint8; fmt 'wq' (alone, e.g. down_proj) or 'd4'."""
    return _cpu.resplit_quantize(fmt, np.ascontiguousarray(w, dtype=np.float32))


def resplit_quantize_wq_wr(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gate/up w [..., n] float32 -> (wq, wr) uint8 rows, searched jointly for deq(wq)+deq(wr)."""
    q, r = _cpu.resplit_quantize_wq_wr(np.ascontiguousarray(w, dtype=np.float32))
    return q, r


def resplit_dequantize(fmt: str, q: np.ndarray, n: int) -> np.ndarray:
    """[..., row_bytes] uint8 -> [..., n] float32."""
    return _cpu.resplit_dequantize(fmt, np.ascontiguousarray(q, dtype=np.uint8), int(n))


def resplit_expert_matmul(fmt: str, w: np.ndarray, in_dim: int, ids: np.ndarray, x: np.ndarray,
                          counts: np.ndarray | None = None, z: bool = False) -> np.ndarray:
    """Batched over experts: w [E, out, row_bytes]; ids [S]; x [N, in_dim] -> y [N, out].

    Rows of x come grouped by slot: counts[s] consecutive rows use expert ids[s]
    (default: one row per slot, the decode case). The SIMD paths run 'wq' and 'd4'
    on int8 activations (per 32 values, see resplit_oracle.q8_activations); 'wr'
    and the scalar path use float32. z: 'wq' on the z activations of the MoE
    layer's non-critical rows, where they exist (isa_info()["wq_z"]).
    """
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    counts = np.ones(len(ids), np.int64) if counts is None else np.ascontiguousarray(counts, dtype=np.int64)
    return _cpu.resplit_expert_matmul(fmt, np.ascontiguousarray(w, dtype=np.uint8), int(in_dim), ids, counts,
                                      np.ascontiguousarray(x, dtype=np.float32), bool(z))


def resplit_moe_forward(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, ncrit: np.ndarray,
                        gate_q: np.ndarray, up_q: np.ndarray, down_q: np.ndarray,
                        gate_r: np.ndarray | None = None, up_r: np.ndarray | None = None,
                        down4: np.ndarray | None = None, source=None) -> np.ndarray:
    """Split execution of one MoE layer on the CPU -> out [T, H].

    x [T, H]; ids, weights [T, k]; ncrit [T]: the first ncrit[t] slots of token t
    are critical (gate/up = WQ + WR, down from D4), the others use WQ only.
    gate_q/up_q [E, F, rb(wq,H)], down_q [E, H, rb(wq,F)], gate_r/up_r [E, F, rb(wr,H)],
    down4 [E, H, rb(d4,F)]. source (source_experts): the critical experts run from the
    source file's tensors instead (gate/up/down in the file's types, int8 activations).
    """
    u8 = lambda a: None if a is None else np.ascontiguousarray(a, dtype=np.uint8)  # noqa: E731
    return _cpu.resplit_moe_forward(
        np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int32),
        np.ascontiguousarray(weights, dtype=np.float32), np.ascontiguousarray(ncrit, dtype=np.int32),
        u8(gate_q), u8(up_q), u8(down_q), u8(gate_r), u8(up_r), u8(down4), source)


def resplit_residual_forward(x: np.ndarray, tok: np.ndarray, ids: np.ndarray, weights: np.ndarray, gq: np.ndarray,
                             uq: np.ndarray, parts: dict[str, np.ndarray]) -> np.ndarray:
    """Critical slots whose x . W_Q of gate and up came from elsewhere (the GPU's share of the
    residual split) -> out [T, H] = sum over slots i of weights[i] * (silu(gq[i] + x[tok[i]] . W_R
    gate) * (uq[i] + x[tok[i]] . W_R up)) . D4, at row tok[i]. x [T, H]; tok, ids, weights [n];
    gq, uq [n, F]; parts: the layer's pack arrays (gate_q, up_q, down_q, gate_r, up_r, down4)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    return _cpu.resplit_residual_forward(f32(x), i32(tok), i32(ids), f32(weights), f32(gq), f32(uq),
                                         *(np.ascontiguousarray(parts[n], dtype=np.uint8) for n in
                                           ("gate_q", "up_q", "down_q", "gate_r", "up_r", "down4")))
