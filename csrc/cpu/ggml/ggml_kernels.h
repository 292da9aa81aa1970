// Entry points of the GGUF-type kernels (ggml_dequant.cpp, ggml_gemv.cpp) and
// the per-ISA pieces they dispatch to. All pointers are raw; nothing here
// touches Python, and callers release the GIL first.
#pragma once
#include <cstddef>
#include <cstdint>

namespace rmoe {
namespace ggml {

bool supported(int type);
// Bytes one row of k weights takes; 0 when k is not a whole number of blocks.
size_t row_bytes(int type, size_t k);

// src: n weights of `type` (n a multiple of the block) -> dst [n] f32,
// bit-exact with gguf-py's dequantizer. Multithreaded.
void dequantize(int type, const uint8_t* src, float* dst, size_t n);

// y [T, rows] = x [T, k] @ W^T, W [rows, rb] raw rows of `type` (rb = row_bytes).
void matmul(int type, const uint8_t* w, size_t rows, size_t rb, size_t k,
            const float* x, size_t T, float* y);

// n matrices (their own types, rows and row bytes) against one x [k]: ys[i] = W_i x.
void matvec_multi(size_t n, const int* types, const uint8_t* const* ws, const size_t* rows, const size_t* rbs, size_t k,
                  const float* x, float* const* ys);

// Stacked experts W [E, rows, rb]: y[j] = W[ids[j]] @ x[j] for j < n.
// ids are checked by the caller (0 <= id < E).
void expert_matmul(int type, const uint8_t* w, size_t E, size_t rows, size_t rb, size_t k,
                   const int32_t* ids, const float* x, size_t n, float* y);

// The int8-activation GEMV of the active ISA as matmul uses it, for callers that schedule
// their own rows (the residual-split MoE layer's critical experts from the source file):
// q8_act_layout: the activation layout for `type` at inner size k (-1: none, matmul runs
// f32 activations); q8_act_row_bytes: one quantized row (a multiple of 64);
// q8_act_quantize: T rows of x [T, k] -> dst, ld bytes apart; q8_act_gemv: y[t*ldy + r] =
// dot(row r of W [nr, rb], row t of xq), t < nt <= 8.
int q8_act_layout(int type, size_t k);
size_t q8_act_row_bytes(int layout, size_t k);
void q8_act_quantize(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld);
void q8_act_gemv(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq, size_t nt,
                 float* y, size_t ldy);

// dequant_blocks_* of the active ISA (single-threaded).
void dequant_blocks(int type, const uint8_t* src, float* dst, size_t nblk);
// One row of k weights (row_bytes(type, k) > 0), single-threaded.
void dequantize_row(int type, const uint8_t* src, float* dst, size_t k);

// ---- per-ISA pieces (raw pointers, no STL: see ggml_blocks.h on linkage) ----

// nblk blocks (elements for F16/BF16/F32) of `type` -> dst, bit-exact.
void dequant_blocks_scalar(int type, const uint8_t* src, float* dst, size_t nblk);
void dequant_blocks_avx2(int type, const uint8_t* src, float* dst, size_t nblk);
void dequant_blocks_avx512(int type, const uint8_t* src, float* dst, size_t nblk);

// Fused GEMV for few activation rows: y[t*ldy + r] = dot(row r of W [nr, rb], x[t*k ..]),
// t < nt. Returns false (nothing done) where the ISA file has no fused path.
bool gemv_fused_avx2(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                     float* y, size_t ldy);
bool gemv_fused_avx512(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                       float* y, size_t ldy);

// ---- int8 activations (ggml_q8.h) ----
// Layout (Q8Layout) the active ISA's int8 GEMV wants for `type`; Q8_NONE: none.
int q8_layout_scalar(int type);
int q8_layout_avx2(int type);
int q8_layout_avx512(int type);
// T rows of x [T, k] -> dst, ld bytes a row (q8_row_bytes); identical bytes on every ISA.
void quantize_q8_scalar(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld);
void quantize_q8_avx2(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld);
void quantize_q8_avx512(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld);
// y[t*ldy + r] = dot(row r of W [nr, rb], row t of xq), t < nt <= 8; xq as the
// ISA's q8_layout_* for type. Returns false (nothing done) for other types.
bool gemv_q8_scalar(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                    size_t nt, float* y, size_t ldy);
bool gemv_q8_avx2(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                  size_t nt, float* y, size_t ldy);
bool gemv_q8_avx512(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                    size_t nt, float* y, size_t ldy);       // maddubs + madd
bool gemv_q8_avx512vnni(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq,
                        size_t ldq, size_t nt, float* y, size_t ldy);  // vpdpbusd / vpdpwssd

// y[t*ldy + r] += dot(w[r*ldw .. +k], x[t*ldx .. +k]) for r < nr, t < nt.
void gemm_tile_scalar(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy);
void gemm_tile_avx2(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                    size_t k, float* y, size_t ldy);
void gemm_tile_avx512(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy);

// One ISA's set of the pieces above (kernel_table.cpp picks it once).
struct Kernels {
  void (*dequant_blocks)(int type, const uint8_t* src, float* dst, size_t nblk);
  bool (*gemv_fused)(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                     float* y, size_t ldy);  // null: no fused path
  void (*gemm_tile)(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt, size_t k,
                    float* y, size_t ldy);
  int (*q8_layout)(int type);
  bool (*gemv_q8)(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                  size_t nt, float* y, size_t ldy);
  void (*quantize_q8)(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld);
};

}  // namespace ggml
}  // namespace rmoe
