// AVX2+FMA kernels of the GGUF matmul:
// * a fused GEMV for T <= 4 activation rows (two at a time): weights are unpacked into
//   registers (ggml_unpack_avx2.h) and multiplied at once, 4 rows at a time;
// * an f32 tile kernel (dot products of R dequantized weight rows with T
//   activation rows, 8 lanes at a time, remainders by masked loads).
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx2.h"

namespace rmoe {
namespace ggml {

namespace {

// R*T <= 12 accumulators + R weight registers fit in 16 ymm.
template <int R, int T>
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t k, float* y, size_t ldy) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + r * ldw + i);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (i < k) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_maskload_ps(w + r * ldw + i, m);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_maskload_ps(x + t * ldx + i, m);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] += hsum8(acc[r][t]);
}

template <int R>
void rows(const float* w, size_t ldw, const float* x, size_t ldx, size_t nt, size_t k, float* y, size_t ldy) {
  size_t t = 0;
  for (; t + 3 <= nt; t += 3) tile<R, 3>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy);
  switch (nt - t) {
    case 2: tile<R, 2>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy); break;
    case 1: tile<R, 1>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy); break;
    default: break;
  }
}

// Weight rows are streamed once: fetch this far ahead of the block being unpacked.
constexpr int PREFETCH = 1024;

template <int T>
struct Dot {
  static constexpr bool exact = false;  // products may fuse into FMAs
  __m256 acc[T];
  const float* x;  // activations at the current block
  size_t ldx;
  RMOE_INLINE void put(int off, __m256 v) {
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + t * ldx + off), acc[t]);
  }
};

// R rows (interleaved block by block: R*T independent FMA chains) x T activations.
template <class U, int R, int T>
void fused(const uint8_t* w, size_t rb, size_t nb, const float* x, size_t ldx, float* y, size_t ldy) {
  Dot<T> d[R];
  for (int r = 0; r < R; ++r) {
    d[r].ldx = ldx;
    for (int t = 0; t < T; ++t) d[r].acc[t] = _mm256_setzero_ps();
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
    for (int r = 0; r < R; ++r) y[t * ldy + r] = hsum8(d[r].acc[t]);
}

template <class U, int T>
void fused_rows(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, float* y, size_t ldy) {
  const size_t nb = k / U::block;
  size_t r = 0;
  for (; r + 4 <= nr; r += 4) fused<U, 4, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
  for (; r < nr; ++r) fused<U, 1, T>(w + r * rb, rb, nb, x, ldx, y + r, ldy);
}

template <class U>
bool fused_type(const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t ldx, size_t nt, float* y,
                size_t ldy) {
  if (k % U::block || nt > 4) return false;  // beyond, the tiled path wins
  size_t t = 0;
  for (; t + 2 <= nt; t += 2) fused_rows<U, 2>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  if (t < nt) fused_rows<U, 1>(w, rb, k, nr, x + t * ldx, ldx, y + t * ldy, ldy);
  return true;
}

}  // namespace

bool gemv_fused_avx2(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                     float* y, size_t ldy) {
  using namespace avx2;
  switch (type) {
#define RMOE_CASE(T, U) case T: return fused_type<U>(w, rb, k, nr, x, k, nt, y, ldy);
    RMOE_GGML_FOR_TYPES(RMOE_CASE)
#undef RMOE_CASE
    default: return false;
  }
}

void gemm_tile_avx2(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
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

