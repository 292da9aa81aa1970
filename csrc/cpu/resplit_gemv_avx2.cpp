// AVX2+FMA fused decode x activation kernels of the resplit formats (the tiles of
// resplit_tiles_avx2.h without VNNI) and the activation quantizer. Called only when
// isa.cpp reports AVX2, FMA, F16C and OS YMM state.
#include "resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "resplit_tiles_avx2.h"

#include <cstring>

namespace rmoe {
namespace resplit {

// 32 activations (n < 32: zero padded) -> int8 as q8_block: sx = max|x|/L,
// q = rint(x * L/max|x|) with L = levels (127; 31 for z activations); returns sum(q).
int q8_block_avx2(const float* x, size_t n, int8_t* q, float* sx, float levels) {
  alignas(32) float f[32] = {0};
  std::memcpy(f, x, (n < 32 ? n : 32) * sizeof(float));
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_load_ps(f + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  *sx = amax / levels;
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? levels / amax : 0.f);
  __m256i qv[4], s = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    qv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    s = _mm256_add_epi32(s, qv[i]);
  }
  // int32 -> int8 (|q| <= 127: no saturation); the packs interleave 128-bit lanes, the permute undoes it
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qv[0], qv[1]), _mm256_packs_epi32(qv[2], qv[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

RMOE_TILED(row_dot_wq_avx2, wq_tile, false)
RMOE_TILED(row_dot_d4_avx2, d4_tile, false)
RMOE_TILED(row_dot_wr_avx2, wr_tile, false)


}  // namespace resplit
}  // namespace rmoe

#else  // non-x86: never selected by the dispatcher
namespace rmoe {
namespace resplit {
void row_dot_wq_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_wq_scalar(q, nb, xp, xs, T, y, ys);
}
void row_dot_wr_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_wr_scalar(q, nb, xp, xs, T, y, ys);
}
void row_dot_d4_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_d4_scalar(q, nb, xp, xs, T, y, ys);
}
}  // namespace resplit
}  // namespace rmoe
#endif
