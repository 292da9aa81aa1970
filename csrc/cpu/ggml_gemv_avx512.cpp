// AVX-512 f32 tile kernel of the GGUF matmul: dot products of R weight rows
// with T activation rows, 16 lanes at a time, remainders by masked loads.
#include "ggml_kernels.h"

#if RMOE_X86
#include <immintrin.h>

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

}  // namespace

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

#else
namespace rmoe {
namespace ggml {
void gemm_tile_avx512(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy) {
  gemm_tile_scalar(w, ldw, nr, x, ldx, nt, k, y, ldy);
}
}  // namespace ggml
}  // namespace rmoe
#endif
