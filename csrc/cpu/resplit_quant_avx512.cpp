// AVX-512 hot loop of the joint WQ+WR quantizer (see resplit_search.h): one
// register holds the 16 weights of a WR sub-block. No FMA: every product is
// rounded before it is added, exactly as in the oracle.
#pragma GCC optimize("fp-contract=off")
#include "resplit.h"
#include "resplit_search.h"

#if RMOE_X86
#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace rmoe {
namespace resplit {

void block_scores_avx512(const float* xs, float dq, float D, const int* ks, float* scores) {
  const __m512 mu = _mm512_set1_ps(kMu), half = _mm512_set1_ps(0.5f), cut = _mm512_set1_ps(1.625f);
  const __m512 one = _mm512_set1_ps(1.0f), mone = _mm512_set1_ps(-1.0f), top = _mm512_set1_ps(2.25f);
  const __m512 zero = _mm512_setzero_ps(), dqv = _mm512_set1_ps(dq), iq = _mm512_set1_ps(dq > 0.f ? 1.0f / dq : 0.f);
  const __m512i absm = _mm512_set1_epi32(0x7fffffff);
  // Per half h (one register each): two ternary cells per weight, nearest and the
  // neighbour toward x. Levels are symmetric, so (e - dr*sign(e)*L)^2 equals
  // (|e| - dr*L(|e|*inv))^2 exactly (rounding commutes with negation).
  __m512 ae[2][2], m[2][2];
  for (int h = 0; h < 2; ++h) {
    const __m512 x = _mm512_loadu_ps(xs + 16 * h);
    const __m512 r0 = _mm512_roundscale_ps(_mm512_mul_ps(x, iq), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 t0 = _mm512_min_ps(_mm512_max_ps(r0, mone), one);
    const __m512 e0 = _mm512_sub_ps(x, _mm512_mul_ps(dqv, t0));
    const __mmask16 below = _mm512_cmp_ps_mask(e0, zero, _CMP_LT_OQ);
    const __m512 t1 = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(t0, _mm512_mask_blend_ps(below, one, mone)), mone), one);
    const __m512 e1 = _mm512_sub_ps(x, _mm512_mul_ps(dqv, t1));
    m[h][0] = _mm512_mul_ps(mu, _mm512_mul_ps(e0, e0));
    m[h][1] = _mm512_mul_ps(mu, _mm512_mul_ps(e1, e1));
    ae[h][0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(e0), absm));
    ae[h][1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(e1), absm));
  }
  auto score = [&](int h, int k) {  // tree16 level 1 of half h's best per-weight score
    const float drs = D * kWrTable[k];
    const __m512 dr = _mm512_set1_ps(drs), inv = _mm512_set1_ps(drs > 0.f ? 1.0f / drs : 0.f);
    __m512 best = zero;
    for (int c = 0; c < 2; ++c) {
      const __m512 a = _mm512_mul_ps(ae[h][c], inv);
      __m512 v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, cut, _CMP_LT_OQ), top, one);
      v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, half, _CMP_LT_OQ), v, zero);
      const __m512 diff = _mm512_sub_ps(ae[h][c], _mm512_mul_ps(dr, v));
      const __m512 sc = _mm512_add_ps(_mm512_mul_ps(diff, diff), m[h][c]);
      best = c == 0 ? sc : _mm512_mask_blend_ps(_mm512_cmp_ps_mask(sc, best, _CMP_LT_OQ), best, sc);
    }
    return _mm256_add_ps(_mm512_castps512_ps256(best), _mm512_extractf32x8_ps(best, 1));
  };
  // tree16 levels 2-4 for both halves at once (same lane pairs as the oracle).
  for (int n = 0; n < 4; ++n) {
    const __m256 a = score(0, ks[n]), b = score(1, ks[4 + n]);
    const __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
    const __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xB1));
    scores[n] = _mm256_cvtss_f32(s1);
    scores[4 + n] = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
  }
}

namespace {
// tree32 of the 32 lanes held as lo (0-15) and hi (16-31), two sums at once.
inline void tree32x2(__m512 alo, __m512 ahi, __m512 blo, __m512 bhi, float* sa, float* sb) {
  const __m512 a16 = _mm512_add_ps(alo, ahi), b16 = _mm512_add_ps(blo, bhi);
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(a16), _mm512_extractf32x8_ps(a16, 1));
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(b16), _mm512_extractf32x8_ps(b16, 1));
  const __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
  const __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xB1));
  *sa = _mm256_cvtss_f32(s1);
  *sb = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
}
}  // namespace

void d4_fit_avx512(const float* x, float* s_out, float* m_out) {
  const __m512 xlo = _mm512_loadu_ps(x), xhi = _mm512_loadu_ps(x + 16);
  const auto [mn, span1, ok] = d4_range(std::min(0.f, _mm512_reduce_min_ps(_mm512_min_ps(xlo, xhi))),
                                        _mm512_reduce_max_ps(_mm512_max_ps(xlo, xhi)));
  float best_err = INFINITY, best_s = 0.f, best_m = -mn, sx, unused;
  tree32x2(xlo, xhi, xlo, xhi, &sx, &unused);
  const __m512 mnv = _mm512_set1_ps(mn), zero = _mm512_setzero_ps(), fifteen = _mm512_set1_ps(15.f);
  const __m512 dlo = _mm512_sub_ps(xlo, mnv), dhi = _mm512_sub_ps(xhi, mnv);
  for (int step = 0; step <= kD4Steps; ++step) {
    const __m512 is = _mm512_set1_ps((14.0f + 0.1f * (float)step) / span1);
    const int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 llo = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(dlo, is), rn), zero), fifteen);
    const __m512 lhi = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(dhi, is), rn), zero), fifteen);
    float sl, sl2, sxl, err;
    tree32x2(llo, lhi, _mm512_mul_ps(llo, llo), _mm512_mul_ps(lhi, lhi), &sl, &sl2);
    tree32x2(_mm512_mul_ps(xlo, llo), _mm512_mul_ps(xhi, lhi), zero, zero, &sxl, &unused);
    const float det = 32.0f * sl2 - sl * sl;
    float s = (32.0f * sxl - sx * sl) / det;
    float m = (sl2 * sx - sl * sxl) / det;
    if (m > 0.f) { s = sxl / sl2; m = 0.f; }
    const __m512 sv = _mm512_set1_ps(s), mv = _mm512_set1_ps(m);
    const __m512 elo = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(sv, llo), mv), xlo);
    const __m512 ehi = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(sv, lhi), mv), xhi);
    tree32x2(_mm512_mul_ps(elo, elo), _mm512_mul_ps(ehi, ehi), zero, zero, &err, &unused);
    if (ok && det > 0.f && err < best_err) { best_err = err; best_s = s; best_m = -m; }
  }
  *s_out = ok ? best_s : 0.f;
  *m_out = std::max(best_m, 0.f);
}

}  // namespace resplit
}  // namespace rmoe

#else
namespace rmoe {
namespace resplit {
void block_scores_avx512(const float* x, float dq, float D, const int* ks, float* s) {
  block_scores_scalar(x, dq, D, ks, s);
}
void d4_fit_avx512(const float* x, float* s, float* m) { d4_fit_scalar(x, s, m); }
}  // namespace resplit
}  // namespace rmoe
#endif
