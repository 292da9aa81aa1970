// AVX2 hot loop of the joint WQ+WR quantizer (see resplit_search.h): two
// registers hold the 16 weights of a WR sub-block. No FMA: every product is
// rounded before it is added, exactly as in the oracle.
#pragma GCC optimize("fp-contract=off")
#include "resplit.h"
#include "resplit_search.h"

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {
namespace resplit {

void half_scores_avx2(const float* xs, float dq, float D, float* scores) {
  const __m256 mu = _mm256_set1_ps(kMu), half = _mm256_set1_ps(0.5f), cut = _mm256_set1_ps(1.625f);
  const __m256 one = _mm256_set1_ps(1.0f), top = _mm256_set1_ps(2.25f), zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 e[3][2], m[3][2];
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < 2; ++h) {
      e[t][h] = _mm256_sub_ps(_mm256_loadu_ps(xs + 8 * h), _mm256_set1_ps(dq * (float)(t - 1)));
      m[t][h] = _mm256_mul_ps(mu, _mm256_mul_ps(e[t][h], e[t][h]));
    }
  for (int k = 0; k < 16; ++k) {
    const float drs = D * kWrTable[k];
    const __m256 dr = _mm256_set1_ps(drs), inv = _mm256_set1_ps(drs > 0.f ? 1.0f / drs : 0.f);
    __m256 best[2] = {zero, zero};
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < 2; ++h) {
        const __m256 z = _mm256_mul_ps(e[t][h], inv);
        const __m256 a = _mm256_andnot_ps(sign, z);
        __m256 v = _mm256_blendv_ps(top, one, _mm256_cmp_ps(a, cut, _CMP_LT_OQ));
        v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps(a, half, _CMP_LT_OQ));
        v = _mm256_xor_ps(v, _mm256_and_ps(_mm256_cmp_ps(z, zero, _CMP_LT_OQ), sign));
        const __m256 diff = _mm256_sub_ps(e[t][h], _mm256_mul_ps(dr, v));
        const __m256 sc = _mm256_add_ps(_mm256_mul_ps(diff, diff), m[t][h]);
        best[h] = t == 0 ? sc : _mm256_blendv_ps(best[h], sc, _mm256_cmp_ps(sc, best[h], _CMP_LT_OQ));
      }
    const __m256 s8 = _mm256_add_ps(best[0], best[1]);  // lanes i + (i+8)
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
void half_scores_avx2(const float* xs, float dq, float D, float* s) { half_scores_scalar(xs, dq, D, s); }
}  // namespace resplit
}  // namespace rmoe
#endif
