// AVX-512 hot loop of the joint WQ+WR quantizer (see resplit_search.h): one
// register holds the 16 weights of a WR sub-block. No FMA: every product is
// rounded before it is added, exactly as in the oracle.
#pragma GCC optimize("fp-contract=off")
#include "resplit.h"
#include "resplit_search.h"

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {
namespace resplit {

void half_scores_avx512(const float* xs, float dq, float D, float* scores) {
  const __m512 x = _mm512_loadu_ps(xs);
  const __m512 mu = _mm512_set1_ps(kMu), half = _mm512_set1_ps(0.5f), cut = _mm512_set1_ps(1.625f);
  const __m512 one = _mm512_set1_ps(1.0f), top = _mm512_set1_ps(2.25f), zero = _mm512_setzero_ps();
  const __m512i sign = _mm512_set1_epi32((int)0x80000000u), absm = _mm512_set1_epi32(0x7fffffff);
  __m512 e[3], m[3];
  for (int t = 0; t < 3; ++t) {
    e[t] = _mm512_sub_ps(x, _mm512_set1_ps(dq * (float)(t - 1)));
    m[t] = _mm512_mul_ps(mu, _mm512_mul_ps(e[t], e[t]));
  }
  for (int k = 0; k < 16; ++k) {
    const float drs = D * kWrTable[k];
    const __m512 dr = _mm512_set1_ps(drs), inv = _mm512_set1_ps(drs > 0.f ? 1.0f / drs : 0.f);
    __m512 best = zero;
    for (int t = 0; t < 3; ++t) {
      const __m512 z = _mm512_mul_ps(e[t], inv);
      const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(z), absm));
      __m512 v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, cut, _CMP_LT_OQ), top, one);
      v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, half, _CMP_LT_OQ), v, zero);
      const __mmask16 neg = _mm512_cmp_ps_mask(z, zero, _CMP_LT_OQ);
      v = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(v), neg, _mm512_castps_si512(v), sign));
      const __m512 diff = _mm512_sub_ps(e[t], _mm512_mul_ps(dr, v));
      const __m512 sc = _mm512_add_ps(_mm512_mul_ps(diff, diff), m[t]);
      best = t == 0 ? sc : _mm512_mask_blend_ps(_mm512_cmp_ps_mask(sc, best, _CMP_LT_OQ), best, sc);
    }
    // tree16: lanes i + (i+8), then 4, then 2, then 1 (same pairs as the oracle)
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(best), _mm512_extractf32x8_ps(best, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    scores[k] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}

}  // namespace resplit
}  // namespace rmoe

#else
namespace rmoe {
namespace resplit {
void half_scores_avx512(const float* xs, float dq, float D, float* s) { half_scores_scalar(xs, dq, D, s); }
}  // namespace resplit
}  // namespace rmoe
#endif
