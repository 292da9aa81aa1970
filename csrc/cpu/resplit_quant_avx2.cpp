// AVX2 hot loop of the joint WQ+WR quantizer (see resplit_search.h): two
// registers hold the 16 weights of a WR sub-block. No FMA: every product is
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

void half_scores_avx2(const float* xs, float dq, float D, const int* ks, int nk, float* scores) {
  const __m256 mu = _mm256_set1_ps(kMu), half = _mm256_set1_ps(0.5f), cut = _mm256_set1_ps(1.625f);
  const __m256 one = _mm256_set1_ps(1.0f), mone = _mm256_set1_ps(-1.0f), top = _mm256_set1_ps(2.25f);
  const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f), dqv = _mm256_set1_ps(dq);
  const __m256 iq = _mm256_set1_ps(dq > 0.f ? 1.0f / dq : 0.f);
  __m256 e[2][2], m[2][2];
  for (int h = 0; h < 2; ++h) {
    // Two ternary cells per weight: nearest, and the neighbour toward x.
    const __m256 x = _mm256_loadu_ps(xs + 8 * h);
    const __m256 r0 = _mm256_round_ps(_mm256_mul_ps(x, iq), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 t0 = _mm256_min_ps(_mm256_max_ps(r0, mone), one);
    const __m256 below = _mm256_cmp_ps(_mm256_sub_ps(x, _mm256_mul_ps(dqv, t0)), zero, _CMP_LT_OQ);
    const __m256 t1 = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t0, _mm256_blendv_ps(one, mone, below)), mone), one);
    // Levels are symmetric: (e - dr*sign(e)*L)^2 = (|e| - dr*L(|e|*inv))^2 exactly.
    const __m256 e0 = _mm256_sub_ps(x, _mm256_mul_ps(dqv, t0)), e1 = _mm256_sub_ps(x, _mm256_mul_ps(dqv, t1));
    m[0][h] = _mm256_mul_ps(mu, _mm256_mul_ps(e0, e0));
    m[1][h] = _mm256_mul_ps(mu, _mm256_mul_ps(e1, e1));
    e[0][h] = _mm256_andnot_ps(sign, e0);
    e[1][h] = _mm256_andnot_ps(sign, e1);
  }
  auto score = [&](int k) {
    const float drs = D * kWrTable[k];
    const __m256 dr = _mm256_set1_ps(drs), inv = _mm256_set1_ps(drs > 0.f ? 1.0f / drs : 0.f);
    __m256 best[2] = {zero, zero};
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < 2; ++h) {
        const __m256 a = _mm256_mul_ps(e[c][h], inv);  // e holds |e| here
        __m256 v = _mm256_blendv_ps(top, one, _mm256_cmp_ps(a, cut, _CMP_LT_OQ));
        v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps(a, half, _CMP_LT_OQ));
        const __m256 diff = _mm256_sub_ps(e[c][h], _mm256_mul_ps(dr, v));
        const __m256 sc = _mm256_add_ps(_mm256_mul_ps(diff, diff), m[c][h]);
        best[h] = c == 0 ? sc : _mm256_blendv_ps(best[h], sc, _mm256_cmp_ps(sc, best[h], _CMP_LT_OQ));
      }
    return _mm256_add_ps(best[0], best[1]);  // tree16 level 1: lanes i + (i+8)
  };
  // tree16 levels 2-4 for two sub-scales at once (same lane pairs as the oracle).
  int n = 0;
  for (; n + 2 <= nk; n += 2) {
    const __m256 a = score(ks[n]), b = score(ks[n + 1]);
    const __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
    const __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xB1));
    scores[n] = _mm256_cvtss_f32(s1);
    scores[n + 1] = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
  }
  if (n < nk) {
    const __m256 a = score(ks[n]);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    scores[n] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}

void block_scores_avx2(const float* x, float dq, float D, const int* ks, float* scores) {
  half_scores_avx2(x, dq, D, ks, 4, scores);
  half_scores_avx2(x + 16, dq, D, ks + 4, 4, scores + 4);
}

namespace {
// tree32 of 32 lanes held as v[0..3] (8 each), two sums at once.
inline void tree32x2(const __m256* a, const __m256* b, float* sa, float* sb) {
  const __m256 a8 = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));  // (v[i]+v[i+16]) pairs i, i+8
  const __m256 b8 = _mm256_add_ps(_mm256_add_ps(b[0], b[2]), _mm256_add_ps(b[1], b[3]));
  const __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(a8, b8, 0x20), _mm256_permute2f128_ps(a8, b8, 0x31));
  const __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
  const __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xB1));
  *sa = _mm256_cvtss_f32(s1);
  *sb = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
}
}  // namespace

void d4_fit_avx2(const float* x, float* s_out, float* m_out) {
  __m256 xv[4], dv[4], L[4], t[4], u[4];
  for (int p = 0; p < 4; ++p) xv[p] = _mm256_loadu_ps(x + 8 * p);
  const auto [mn, span1, ok] = d4_range(x);
  float best_err = INFINITY, best_s = 0.f, best_m = -mn, sx, unused;
  tree32x2(xv, xv, &sx, &unused);
  const __m256 mnv = _mm256_set1_ps(mn), zero = _mm256_setzero_ps(), fifteen = _mm256_set1_ps(15.f);
  for (int p = 0; p < 4; ++p) dv[p] = _mm256_sub_ps(xv[p], mnv);
  const __m256 zeros[4] = {zero, zero, zero, zero};
  for (int step = 0; step <= kD4Steps; ++step) {
    const __m256 is = _mm256_set1_ps((14.0f + 0.1f * (float)step) / span1);
    for (int p = 0; p < 4; ++p) {
      L[p] = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(dv[p], is), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero), fifteen);
      t[p] = _mm256_mul_ps(L[p], L[p]);
      u[p] = _mm256_mul_ps(xv[p], L[p]);
    }
    float sl, sl2, sxl, err;
    tree32x2(L, t, &sl, &sl2);
    tree32x2(u, zeros, &sxl, &unused);
    const float det = 32.0f * sl2 - sl * sl;
    float s = (32.0f * sxl - sx * sl) / det;
    float m = (sl2 * sx - sl * sxl) / det;
    if (m > 0.f) { s = sxl / sl2; m = 0.f; }
    const __m256 sv = _mm256_set1_ps(s), mv = _mm256_set1_ps(m);
    for (int p = 0; p < 4; ++p) {
      const __m256 e = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sv, L[p]), mv), xv[p]);
      t[p] = _mm256_mul_ps(e, e);
    }
    tree32x2(t, zeros, &err, &unused);
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
void half_scores_avx2(const float* xs, float dq, float D, const int* ks, int nk, float* s) {
  half_scores_scalar(xs, dq, D, ks, nk, s);
}
void block_scores_avx2(const float* x, float dq, float D, const int* ks, float* s) {
  block_scores_scalar(x, dq, D, ks, s);
}
void d4_fit_avx2(const float* x, float* s, float* m) { d4_fit_scalar(x, s, m); }
}  // namespace resplit
}  // namespace rmoe
#endif
