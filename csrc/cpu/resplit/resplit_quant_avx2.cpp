// AVX2 quantizer kernels (see resplit_search.h), also run by AVX-512 CPUs: the joint
// WQ+WR search (two registers hold the 16 weights of a WR sub-block), its final
// encode, the WQ-alone scale, and D4's fit (eight blocks at once, lanes = blocks).
// No FMA: every product is rounded before it is added, exactly as in the oracle.
#pragma GCC optimize("fp-contract=off")
#include "resplit/resplit.h"
#include "resplit/resplit_search.h"

#if RMOE_X86
#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace rmoe {
namespace resplit {

namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// The two ternary cells of 16 weights at dq (two registers of 8), as |e| and mu*e^2:
// per weight t0 = nearest, t1 = the neighbour toward x. Levels are symmetric, so
// (e - dr*sign(e)*L)^2 = (|e| - dr*L(|e|*inv))^2 exactly.
struct Cells {
  __m256 ae[2][2], m[2][2];  // [cell][lanes 0-7, 8-15]
};

inline void cells16(const float* xs, float dq, Cells& c) {
  const __m256 one = _mm256_set1_ps(1.0f), mone = _mm256_set1_ps(-1.0f), zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f), mu = _mm256_set1_ps(kMu), dqv = _mm256_set1_ps(dq);
  const __m256 iq = _mm256_set1_ps(dq > 0.f ? 1.0f / dq : 0.f);
  for (int h = 0; h < 2; ++h) {
    const __m256 x = _mm256_loadu_ps(xs + 8 * h);
    const __m256 t0 = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(x, iq), kRound), mone), one);
    const __m256 e0 = _mm256_sub_ps(x, _mm256_mul_ps(dqv, t0));
    const __m256 below = _mm256_cmp_ps(e0, zero, _CMP_LT_OQ);
    const __m256 t1 = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t0, _mm256_blendv_ps(one, mone, below)), mone), one);
    const __m256 e1 = _mm256_sub_ps(x, _mm256_mul_ps(dqv, t1));
    c.m[0][h] = _mm256_mul_ps(mu, _mm256_mul_ps(e0, e0));
    c.m[1][h] = _mm256_mul_ps(mu, _mm256_mul_ps(e1, e1));
    c.ae[0][h] = _mm256_andnot_ps(sign, e0);
    c.ae[1][h] = _mm256_andnot_ps(sign, e1);
  }
}

// tree16 level 1 (lanes i + (i+8)) of the per-weight best score at sub-scale code k.
// dr*L is taken from the row's products dr*0, dr (= dr*1), dr*2.25, and |e|*inv < 0.5
// (1.625) is |e| < cut1 (cut2).
inline __m256 score16(const Cells& c, const WrScales& ws, int k) {
  const __m256 c1 = _mm256_set1_ps(ws.cut1[k]), c2 = _mm256_set1_ps(ws.cut2[k]);
  const __m256 d0 = _mm256_set1_ps(ws.dr0[k]), d1 = _mm256_set1_ps(ws.dr[k]), d2 = _mm256_set1_ps(ws.dr2[k]);
  __m256 best[2];
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h) {
      const __m256 a = c.ae[t][h];
      __m256 drl = _mm256_blendv_ps(d2, d1, _mm256_cmp_ps(a, c2, _CMP_LT_OQ));
      drl = _mm256_blendv_ps(drl, d0, _mm256_cmp_ps(a, c1, _CMP_LT_OQ));
      const __m256 diff = _mm256_sub_ps(c.ae[t][h], drl);
      const __m256 sc = _mm256_add_ps(_mm256_mul_ps(diff, diff), c.m[t][h]);
      best[h] = t == 0 ? sc : _mm256_min_ps(sc, best[h]);  // sc < best ? sc : best
    }
  return _mm256_add_ps(best[0], best[1]);
}

// tree16 levels 2-4 of two level-1 vectors (the oracle's lane pairs).
inline void tree16_tail2(__m256 a, __m256 b, float* sa, float* sb) {
  const __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
  const __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xB1));
  *sa = _mm256_cvtss_f32(s1);
  *sb = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
}

// One half's best code at one dq: its cells are computed once for all eight codes.
inline float half_best(const float* xs, float dq, const WrScales& ws, int* kbest) {
  Cells c;
  cells16(xs, dq, c);
  float sc[4], hb = INFINITY;
  int kb = 0, ks[4];
  tree16_tail2(score16(c, ws, kKCoarse[0]), score16(c, ws, kKCoarse[1]), &sc[0], &sc[1]);
  tree16_tail2(score16(c, ws, kKCoarse[2]), score16(c, ws, kKCoarse[3]), &sc[2], &sc[3]);
  for (int j = 0; j < 4; ++j)
    if (sc[j] < hb) { hb = sc[j]; kb = kKCoarse[j]; }
  int j = 0;
  for (int off : {-2, -1, 1, 2}) ks[j++] = std::min(15, std::max(0, kb + off));
  tree16_tail2(score16(c, ws, ks[0]), score16(c, ws, ks[1]), &sc[0], &sc[1]);
  tree16_tail2(score16(c, ws, ks[2]), score16(c, ws, ks[3]), &sc[2], &sc[3]);
  for (j = 0; j < 4; ++j)
    if (sc[j] < hb) { hb = sc[j]; kb = ks[j]; }
  *kbest = kb;
  return hb;
}

// Bitonic network over 32 values in four registers, descending (as the scalar
// sort32_desc; values only, so any correct network gives the same array). No NaN.
inline void sort32_desc(__m256* v) {
  // fully unrolled, so that v stays in registers and the lane masks are constants
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), zero = _mm256_setzero_si256();
#pragma GCC unroll 5
  for (int k = 2; k <= 32; k <<= 1)
#pragma GCC unroll 5
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= 8) {  // partner in another register; direction by register (k >= 16)
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const int p = r ^ (j >> 3);
          if (p < r) continue;
          const __m256 hi = _mm256_max_ps(v[r], v[p]), lo = _mm256_min_ps(v[r], v[p]);
          const bool desc = ((8 * r) & k) == 0;
          v[r] = desc ? hi : lo;
          v[p] = desc ? lo : hi;
        }
        continue;
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m256 pv = j == 4   ? _mm256_permute2f128_ps(v[r], v[r], 0x01)
                          : j == 2 ? _mm256_permute_ps(v[r], 0x4E)
                                   : _mm256_permute_ps(v[r], 0xB1);
        const __m256 hi = _mm256_max_ps(v[r], pv), lo = _mm256_min_ps(v[r], pv);
        // element i = 8r + lane keeps the larger value when it is the lower of its pair
        // ((i & j) == 0) exactly when its run is descending ((i & k) == 0)
        const __m256i i = _mm256_add_epi32(_mm256_set1_epi32(8 * r), lane);
        const __m256i lower = _mm256_cmpeq_epi32(_mm256_and_si256(i, _mm256_set1_epi32(j)), zero);
        const __m256i desc = _mm256_cmpeq_epi32(_mm256_and_si256(i, _mm256_set1_epi32(k)), zero);
        v[r] = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_cmpeq_epi32(lower, desc)));
      }
    }
}

}  // namespace

float block_best_avx2(const float* x, float dq, const WrScales& ws, int* kbest) {
  const float h0 = half_best(x, dq, ws, &kbest[0]);
  const float h1 = half_best(x + 16, dq, ws, &kbest[1]);
  return h0 + h1;
}

void half_encode_avx2(const float* xs, float dq, float dr, float* t, int* dig) {
  const __m256 one = _mm256_set1_ps(1.0f), mone = _mm256_set1_ps(-1.0f), zero = _mm256_setzero_ps();
  const __m256 half = _mm256_set1_ps(0.5f), cut = _mm256_set1_ps(1.625f), top = _mm256_set1_ps(2.25f);
  const __m256 sign = _mm256_set1_ps(-0.0f), mu = _mm256_set1_ps(kMu), dqv = _mm256_set1_ps(dq);
  const __m256 drv = _mm256_set1_ps(dr), inv = _mm256_set1_ps(dr > 0.f ? 1.0f / dr : 0.f);
  const __m256 iq = _mm256_set1_ps(dq > 0.f ? 1.0f / dq : 0.f);
  const __m256i two = _mm256_set1_epi32(2);
  for (int h = 0; h < 2; ++h) {
    const __m256 x = _mm256_loadu_ps(xs + 8 * h);
    __m256 tc[2], sc[2];
    __m256i d[2];
    tc[0] = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(x, iq), kRound), mone), one);
    const __m256 below = _mm256_cmp_ps(_mm256_sub_ps(x, _mm256_mul_ps(dqv, tc[0])), zero, _CMP_LT_OQ);
    tc[1] = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(tc[0], _mm256_blendv_ps(one, mone, below)), mone), one);
    for (int c = 0; c < 2; ++c) {
      const __m256 e = _mm256_sub_ps(x, _mm256_mul_ps(dqv, tc[c]));
      const __m256 z = _mm256_mul_ps(e, inv), a = _mm256_andnot_ps(sign, z);
      // wr_digit: idx = !(|z| < 0.5) + !(|z| < 1.625) (NaN past both), digit 2 -/+ idx by z < 0
      const __m256 past1 = _mm256_cmp_ps(a, half, _CMP_NLT_UQ), past2 = _mm256_cmp_ps(a, cut, _CMP_NLT_UQ);
      const __m256 neg = _mm256_cmp_ps(z, zero, _CMP_LT_OQ);
      __m256 lev = _mm256_blendv_ps(_mm256_blendv_ps(zero, one, past1), top, past2);
      lev = _mm256_blendv_ps(lev, _mm256_sub_ps(zero, lev), neg);  // kWrLevels[d]
      const __m256 diff = _mm256_sub_ps(e, _mm256_mul_ps(drv, lev));
      sc[c] = _mm256_add_ps(_mm256_mul_ps(diff, diff), _mm256_mul_ps(mu, _mm256_mul_ps(e, e)));
      const __m256i idx = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_add_epi32(_mm256_castps_si256(past1), _mm256_castps_si256(past2)));
      d[c] = _mm256_blendv_epi8(_mm256_add_epi32(two, idx), _mm256_sub_epi32(two, idx), _mm256_castps_si256(neg));
    }
    const __m256 take1 = _mm256_cmp_ps(sc[1], sc[0], _CMP_LT_OQ);
    _mm256_storeu_ps(t + 8 * h, _mm256_blendv_ps(tc[0], tc[1], take1));
    _mm256_storeu_si256((__m256i*)(dig + 8 * h), _mm256_blendv_epi8(d[0], d[1], _mm256_castps_si256(take1)));
  }
}

void wq_alone_scales_avx2(const float* x, size_t nb, float* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  alignas(32) float sorted[8][32], cs[32][8];
  size_t b0 = 0;
  for (; b0 < nb; b0 += 8) {
    const size_t m = std::min<size_t>(8, nb - b0);
    int nan = 0;  // blocks with a NaN take the scalar network: its order decides where NaN goes
    for (size_t b = 0; b < m; ++b) {
      __m256 v[4];
      int bad = 0;
      for (int r = 0; r < 4; ++r) {
        v[r] = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * (b0 + b) + 8 * r));
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(v[r], v[r], _CMP_UNORD_Q));
      }
      if (bad) nan |= 1 << b;
      sort32_desc(v);
      for (int r = 0; r < 4; ++r) _mm256_store_ps(sorted[b] + 8 * r, v[r]);
    }
    for (size_t b = m; b < 8; ++b) std::fill(sorted[b], sorted[b] + 32, 0.f);
    // lanes = blocks: running sums in order, and the first k of the greatest c_k^2 / k
    // (score > best, from best = -1: the scalar loop's test per lane)
    __m256 acc = _mm256_setzero_ps(), best = _mm256_set1_ps(-1.f), bestk = _mm256_setzero_ps();
    for (int j = 0; j < 32; ++j) {
      const __m256 a = _mm256_setr_ps(sorted[0][j], sorted[1][j], sorted[2][j], sorted[3][j], sorted[4][j],
                                      sorted[5][j], sorted[6][j], sorted[7][j]);
      acc = _mm256_add_ps(acc, a);
      _mm256_store_ps(cs[j], acc);
      const __m256 kf = _mm256_set1_ps((float)(j + 1));
      const __m256 score = _mm256_div_ps(_mm256_mul_ps(acc, acc), kf);
      const __m256 upd = _mm256_cmp_ps(score, best, _CMP_GT_OQ);
      best = _mm256_blendv_ps(best, score, upd);
      bestk = _mm256_blendv_ps(bestk, kf, upd);
    }
    alignas(32) float k[8];
    _mm256_store_ps(k, bestk);
    for (size_t b = 0; b < m; ++b) {
      const int kb = (int)k[b];
      out[b0 + b] = (nan >> b) & 1 ? wq_alone_scale_scalar(x + 32 * (b0 + b)) : kb ? cs[kb - 1][b] / (float)kb : 0.f;
    }
  }
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

namespace {
// tree32 across 32 vectors (one per weight, lanes = blocks), as the scalar tree32:
// v[i]+v[i+16], then +8, +4, and (s4[0]+s4[2]) + (s4[1]+s4[3]). v16 holds level 1.
inline __m256 tree32_tail(__m256* v16) {
  for (int i = 0; i < 8; ++i) v16[i] = _mm256_add_ps(v16[i], v16[i + 8]);
  for (int i = 0; i < 4; ++i) v16[i] = _mm256_add_ps(v16[i], v16[i + 4]);
  return _mm256_add_ps(_mm256_add_ps(v16[0], v16[2]), _mm256_add_ps(v16[1], v16[3]));
}
}  // namespace

void d4_fit8_avx2(const float* x, float* s_out, float* m_out) {
  __m256 X[32], dv[32], L[32], a16[16], b16[16], c16[16];
  for (int j = 0; j < 32; ++j)  // lanes = the eight blocks
    X[j] = _mm256_setr_ps(x[j], x[32 + j], x[64 + j], x[96 + j], x[128 + j], x[160 + j], x[192 + j], x[224 + j]);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f), fifteen = _mm256_set1_ps(15.f);
  const __m256 n32 = _mm256_set1_ps(32.0f);
  // d4_range: mn = min(0, x...), mx = max(x...) in the scalar order (std::min/max operands)
  __m256 mn = _mm256_min_ps(X[0], zero), mx = X[0];
  for (int j = 1; j < 32; ++j) { mn = _mm256_min_ps(X[j], mn); mx = _mm256_max_ps(X[j], mx); }
  const __m256 span = _mm256_sub_ps(mx, mn), ok = _mm256_cmp_ps(span, zero, _CMP_GT_OQ);
  const __m256 span1 = _mm256_blendv_ps(one, span, ok);
  for (int i = 0; i < 16; ++i) a16[i] = _mm256_add_ps(X[i], X[i + 16]);
  const __m256 sx = tree32_tail(a16);
  for (int j = 0; j < 32; ++j) dv[j] = _mm256_sub_ps(X[j], mn);
  const __m256 sign = _mm256_set1_ps(-0.0f);  // -v is a sign flip (not 0 - v: -(+0) is -0)
  __m256 best_err = _mm256_set1_ps(INFINITY), best_s = zero, best_m = _mm256_xor_ps(mn, sign);
  for (int step = 0; step <= kD4Steps; ++step) {
    const __m256 is = _mm256_div_ps(_mm256_set1_ps(14.0f + 0.1f * (float)step), span1);
    for (int j = 0; j < 32; ++j)
      L[j] = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(dv[j], is), kRound), zero), fifteen);
    for (int i = 0; i < 16; ++i) {
      a16[i] = _mm256_add_ps(L[i], L[i + 16]);
      b16[i] = _mm256_add_ps(_mm256_mul_ps(L[i], L[i]), _mm256_mul_ps(L[i + 16], L[i + 16]));
      c16[i] = _mm256_add_ps(_mm256_mul_ps(X[i], L[i]), _mm256_mul_ps(X[i + 16], L[i + 16]));
    }
    const __m256 sl = tree32_tail(a16), sl2 = tree32_tail(b16), sxl = tree32_tail(c16);
    const __m256 det = _mm256_sub_ps(_mm256_mul_ps(n32, sl2), _mm256_mul_ps(sl, sl));
    __m256 sv = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(n32, sxl), _mm256_mul_ps(sx, sl)), det);
    __m256 mv = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sl2, sx), _mm256_mul_ps(sl, sxl)), det);
    const __m256 pos = _mm256_cmp_ps(mv, zero, _CMP_GT_OQ);  // m > 0: s = sxl / sl2, m = 0
    sv = _mm256_blendv_ps(sv, _mm256_div_ps(sxl, sl2), pos);
    mv = _mm256_blendv_ps(mv, zero, pos);
    for (int i = 0; i < 16; ++i) {
      const __m256 e0 = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sv, L[i]), mv), X[i]);
      const __m256 e1 = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sv, L[i + 16]), mv), X[i + 16]);
      a16[i] = _mm256_add_ps(_mm256_mul_ps(e0, e0), _mm256_mul_ps(e1, e1));
    }
    const __m256 err = tree32_tail(a16);
    const __m256 take = _mm256_and_ps(_mm256_and_ps(ok, _mm256_cmp_ps(det, zero, _CMP_GT_OQ)),
                                      _mm256_cmp_ps(err, best_err, _CMP_LT_OQ));
    best_err = _mm256_blendv_ps(best_err, err, take);
    best_s = _mm256_blendv_ps(best_s, sv, take);
    best_m = _mm256_blendv_ps(best_m, _mm256_xor_ps(mv, sign), take);
  }
  _mm256_storeu_ps(s_out, _mm256_and_ps(ok, best_s));
  _mm256_storeu_ps(m_out, _mm256_max_ps(zero, best_m));  // std::max(best_m, 0.f)
}

}  // namespace resplit
}  // namespace rmoe

#endif
