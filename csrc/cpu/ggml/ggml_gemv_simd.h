// The GGUF matmul's f32 kernels, written once for any vector width: ggml_gemv_avx2.cpp
// runs them on ymm, ggml_gemv_avx512.cpp on zmm. Include only from those files, after
// the width's unpackers (internal linkage: each compiles its own copy with its flags).
// * a fused GEMV for few activation rows: weights are unpacked into registers (the
//   width's ggml_unpack_*.h) and multiplied at once, several rows at a time;
// * an f32 tile kernel: dot products of R dequantized weight rows with T activation
//   rows, a register of lanes at a time, the remainder by masked loads.
#pragma once
#include "common/simd.h"

namespace rmoe {
namespace ggml {
namespace {

// V, one width's f32 ops: type F, lanes, zero(), load(p), fmadd(a, b, c), sum(v), and
// Tail / tail(n) / load(p, Tail) for the last n < lanes values (zero filled). Its shape:
// tile_t, tokens per f32 tile (R * tile_t accumulators + R weights fit the registers);
// fused_max_t, the most activation rows the fused GEMV takes (beyond, the tiles win);
// fused_group, rows it takes at a time (then 2, then 1); rows_one_token, weight rows
// per pass for a single token (independent FMA chains and row streams the prefetcher
// keeps fed).
template <class V, int R, int T>
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t k, float* y, size_t ldy) {
  using F = typename V::F;
  F acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = V::zero();
  size_t i = 0;
  for (; i + V::lanes <= k; i += V::lanes) {
    F wv[R];
    for (int r = 0; r < R; ++r) wv[r] = V::load(w + r * ldw + i);
    for (int t = 0; t < T; ++t) {
      const F xv = V::load(x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = V::fmadd(wv[r], xv, acc[r][t]);
    }
  }
  if (i < k) {
    const typename V::Tail m = V::tail(k - i);
    F wv[R];
    for (int r = 0; r < R; ++r) wv[r] = V::load(w + r * ldw + i, m);
    for (int t = 0; t < T; ++t) {
      const F xv = V::load(x + t * ldx + i, m);
      for (int r = 0; r < R; ++r) acc[r][t] = V::fmadd(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] += V::sum(acc[r][t]);
}

template <class V, int R>
void tile_rows(const float* w, size_t ldw, const float* x, size_t ldx, size_t nt, size_t k, float* y, size_t ldy) {
  constexpr int TT = V::tile_t;
  size_t t = 0;
  for (; t + TT <= nt; t += TT) tile<V, R, TT>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
  if constexpr (TT > 3)
    if (nt - t == 3) return tile<V, R, 3>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
  if (nt - t == 2) tile<V, R, 2>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
  if (nt - t == 1) tile<V, R, 1>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
}

template <class V>
void gemm_tile(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt, size_t k, float* y,
               size_t ldy) {
  size_t r = 0;
  for (; r + 4 <= nr; r += 4) tile_rows<V, 4>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy);
  switch (nr - r) {
    case 3: tile_rows<V, 3>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    case 2: tile_rows<V, 2>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    case 1: tile_rows<V, 1>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    default: break;
  }
}

// Weight rows are streamed once: fetch this far ahead of the block being unpacked.
constexpr int PREFETCH = 1024;

// Accumulates unpacked weight vectors against T activation rows.
template <class V, int T>
struct Dot {
  static constexpr bool exact = false;  // products may fuse into FMAs
  typename V::F acc[T];
  const float* x;  // activations at the current block
  size_t ldx;
  RMOE_INLINE void put(int off, typename V::F v) {
    for (int t = 0; t < T; ++t) acc[t] = V::fmadd(v, V::load(x + t * ldx + off), acc[t]);
  }
};

// R rows (interleaved block by block: R*T independent FMA chains) x T activations.
template <class V, class U, int R, int T>
void fused(const uint8_t* w, size_t rb, size_t nb, const float* x, size_t ldx, float* y, size_t ldy) {
  Dot<V, T> d[R];
  for (int r = 0; r < R; ++r) {
    d[r].ldx = ldx;
    for (int t = 0; t < T; ++t) d[r].acc[t] = V::zero();
  }
  for (size_t i = 0; i < nb; ++i) {
    // PREFETCH bytes ahead in the row, or past its end: the same place in the
    // row the next group of R rows will read (never faults, even past the matrix).
    size_t ahead = i * U::bytes + PREFETCH;
    if (ahead >= rb) ahead += (R - 1) * rb;
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + i * U::bytes;
      for (int p = 0; p < U::bytes; p += 64)  // every cache line of the block
        _mm_prefetch(reinterpret_cast<const char*>(w + r * rb + ahead) + p, _MM_HINT_T0);
      d[r].x = x + i * U::block;
      U::unpack(blk, d[r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = V::sum(d[r].acc[t]);
}

template <class V, class U, int T>
void fused_rows(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, float* y, size_t ldy) {
  constexpr int R = T == 1 ? V::rows_one_token : 4;
  const size_t nb = k / U::block;
  size_t r = 0;
  for (; r + R <= nr; r += R) fused<V, U, R, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
  for (; r < nr; ++r) fused<V, U, 1, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
}

template <class V, class U>
bool fused_type(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, size_t nt, float* y,
                size_t ldy) {
  if (k % U::block || nt > V::fused_max_t) return false;
  size_t t = 0;
  if constexpr (V::fused_group == 4)
    for (; t + 4 <= nt; t += 4) fused_rows<V, U, 4>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  for (; t + 2 <= nt; t += 2) fused_rows<V, U, 2>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  if (t < nt) fused_rows<V, U, 1>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  return true;
}

}  // namespace
}  // namespace ggml
}  // namespace rmoe
