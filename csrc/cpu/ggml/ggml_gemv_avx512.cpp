// AVX-512 kernels of the GGUF matmul:
// * a fused GEMV for T <= 8 activation rows: weights are unpacked into
//   registers (ggml_unpack_avx512.h) and multiplied at once, several rows at a time;
// * an f32 tile kernel (dot products of R dequantized weight rows with T
//   activation rows, 16 lanes at a time, remainders by masked loads).
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx512.h"

namespace rmoe {
namespace ggml {

namespace {

// acc[r][t] over k; R*T <= 16 accumulators + R weight registers fit in 32 zmm.
template <int R, int T>
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t k, float* y, size_t ldy) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w + r * ldw + i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (i < k) {
    const __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w + r * ldw + i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] += _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void rows(const float* w, size_t ldw, const float* x, size_t ldx, size_t nt, size_t k, float* y, size_t ldy) {
  size_t t = 0;
  for (; t + 4 <= nt; t += 4) tile<R, 4>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
  switch (nt - t) {
    case 3: tile<R, 3>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy); break;
    case 2: tile<R, 2>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy); break;
    case 1: tile<R, 1>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy); break;
    default: break;
  }
}

// Weight rows are streamed once: fetch this far ahead of the block being unpacked.
constexpr int PREFETCH = 1024;

// Accumulates unpacked weight vectors against T activation rows.
template <int T>
struct Dot {
  static constexpr bool exact = false;  // products may fuse into FMAs
  __m512 acc[T];
  const float* x;  // activations at the current block
  size_t ldx;
  RMOE_INLINE void put(int off, __m512 v) {
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + t * ldx + off), acc[t]);
  }
};

// R rows (interleaved block by block: R*T independent FMA chains) x T activations.
template <class U, int R, int T>
void fused(const uint8_t* w, size_t rb, size_t nb, const float* x, size_t ldx, float* y, size_t ldy) {
  Dot<T> d[R];
  for (int r = 0; r < R; ++r) {
    d[r].ldx = ldx;
    for (int t = 0; t < T; ++t) d[r].acc[t] = _mm512_setzero_ps();
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
    for (int r = 0; r < R; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(d[r].acc[t]);
}

template <class U, int T, int R>
void fused_rows_r(const uint8_t* w, size_t rb, size_t nb, size_t nr, const float* x, size_t ldx, float* y,
                  size_t ldy) {
  size_t r = 0;
  for (; r + R <= nr; r += R) fused<U, R, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
  for (; r < nr; ++r) fused<U, 1, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
}

// T=1: 8 rows at once (8 FMA chains, and 8 row streams the prefetcher keeps
// fed: measured best for every type, 2 to 16 KiB rows); T=2, T=4: 4 rows.
template <class U, int T>
void fused_rows(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, float* y, size_t ldy) {
  fused_rows_r<U, T, T == 1 ? 8 : 4>(w, rb, k / U::block, nr, x, ldx, y, ldy);
}

// Up to 8 activation rows, 4 at a time: below the tiled path's cost there.
constexpr size_t MAX_T = 8;

template <class U>
bool fused_type(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, size_t nt, float* y,
                size_t ldy) {
  if (k % U::block || nt > MAX_T) return false;
  size_t t = 0;
  for (; t + 4 <= nt; t += 4) fused_rows<U, 4>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  for (; t + 2 <= nt; t += 2) fused_rows<U, 2>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  if (t < nt) fused_rows<U, 1>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  return true;
}

}  // namespace

bool gemv_fused_avx512(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                       float* y, size_t ldy) {
  using namespace avx512;
  switch (type) {
#define RMOE_CASE(T, U) case T: return fused_type<U>(w, rb, k, nr, x, k, nt, y, ldy);
    RMOE_GGML_FOR_TYPES(RMOE_CASE)
#undef RMOE_CASE
    default: return false;
  }
}

void gemm_tile_avx512(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy) {
  size_t r = 0;
  for (; r + 4 <= nr; r += 4) rows<4>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy);
  switch (nr - r) {
    case 3: rows<3>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    case 2: rows<2>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    case 1: rows<1>(w + r * ldw, ldw, x, ldx, nt, k, y + r, ldy); break;
    default: break;
  }
}

}  // namespace ggml
}  // namespace rmoe

#endif
