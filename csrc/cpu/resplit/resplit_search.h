// Quantizer internals shared by resplit_quant*.cpp: rounding helpers, the hot
// loop of the joint WQ+WR search (oracle: engine/quant/resplit_joint.py) and D4's fit.
//
// The joint search:
// For 16 weights xs, WQ scale dq and WR sub-scales dr_k = D*2^(-k/4), k in ks:
//   per weight, over t in {t0, t1} (t0 wins ties): t0 = clip(rint(x*iq), -1, 1),
//   iq = 1/dq (0 if dq = 0), t1 = clip(t0 + (x - dq*t0 < 0 ? -1 : 1), -1, 1):
//     e = x - dq*t;  v = level(e*inv_k);  s = (e - dr_k*v)^2 + kMu*e^2
//   scores[j] = tree16(min_t s) for k = ks[j]   (tree16: v[i]+v[i+8], then 4, 2, 1)
// level(z): |z| < 0.5 -> 0, |z| < 1.625 -> 1, else 2.25, with the sign of z (z < 0).
// Every variant performs these IEEE operations in this order (no FMA), so all
// ISA paths choose the same bytes; what does not depend on the weights (dr_k, inv_k,
// the products dr_k*level, the level cuts as |e| thresholds) is computed once per row.
#pragma once
#include <algorithm>
#include <cmath>

#include "common/convert.h"
#include "resplit/resplit.h"

namespace rmoe {
namespace resplit {

// Round-half-even as np.rint, without a libm call: exact for |x| < 2^22; larger
// values stay large with their sign, and every caller clamps to a few levels.
// (Without -ffast-math the compiler may not fold (x + c) - c.)
static inline float rnd(float x) {
  constexpr float c = 12582912.0f;  // 1.5 * 2^23
  return (x + c) - c;
}
static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
static inline float f16r(float x) { return f16_to_f32(f32_to_f16_bits(clampf(x, -65504.f, 65504.f))); }

constexpr float kMu = 0x1.47ae14p-6f;  // 0.02: weight of WQ-alone error

// Sub-scale codes of the search: these four first, then the best one -2, -1, +1, +2
// (clipped to 0..15; a repeated code scores the same and never replaces).
constexpr int kKCoarse[4] = {1, 5, 9, 13};

void half_scores_scalar(const float* xs /*[16]*/, float dq, float D, const int* ks /*[nk]*/, int nk,
                        float* scores /*[nk]*/);
// Both halves of a 32-weight block at once, four sub-scale codes each:
// scores[h*4 + j] for half h (weights 16h..16h+15) and code ks[h*4 + j].
void block_scores_scalar(const float* x /*[32]*/, float dq, float D, const int* ks /*[2*4]*/,
                         float* scores /*[2*4]*/);
// The least e >= 0 with e*inv >= c as rounded (inv >= 0), +inf if none: rounding is
// monotone, so for |e| (not NaN) |e|*inv < c exactly when |e| < the result.
static inline float least_reaching(float inv, float c) {
  if (!(inv > 0.f)) return INFINITY;
  float e = c / inv;
  while (e > 0.f && e * inv >= c) e = std::nextafter(e, 0.f);
  while (!(e * inv >= c)) e = std::nextafter(e, INFINITY);
  return e;
}

// A row's WR sub-scales dr_k = D*2^(-k/4), their reciprocals (0 where dr_k is not > 0),
// the products dr_k*L of the levels L = 0, 2.25 (the same roundings as at each use), and
// the |e| where |e|*inv_k reaches the level cuts 0.5 and 1.625: computed once per row.
struct WrScales {
  float D, dr[16], inv[16], dr0[16], dr2[16], cut1[16], cut2[16];
};
static inline WrScales wr_scales(float D) {
  WrScales w;
  w.D = D;
  for (int k = 0; k < 16; ++k) {
    w.dr[k] = D * kWrTable[k];
    w.inv[k] = w.dr[k] > 0.f ? 1.0f / w.dr[k] : 0.f;
    w.dr0[k] = w.dr[k] * 0.0f;
    w.dr2[k] = w.dr[k] * 2.25f;
    w.cut1[k] = least_reaching(w.inv[k], 0.5f);
    w.cut2[k] = least_reaching(w.inv[k], 1.625f);
  }
  return w;
}
// One block at one WQ scale dq: each half's best code (coarse, then refined; the first
// of equal scores wins) -> kbest[2], and the sum of the two halves' best scores.
using BlockBestFn = float (*)(const float* x /*[32]*/, float dq, const WrScales& ws, int* kbest /*[2]*/);
float block_best_scalar(const float* x, float dq, const WrScales& ws, int* kbest);
float block_best_avx2(const float* x, float dq, const WrScales& ws, int* kbest);
// The chosen cell t (-1, 0, 1) and WR digit (0..4) of 16 weights at dq and sub-scale dr:
// per weight the cell with the lower score (t0 on a tie), its digit level(e / dr) + 2.
using HalfEncodeFn = void (*)(const float* xs /*[16]*/, float dq, float dr, float* t /*[16]*/,
                              int* dig /*[16]*/);
void half_encode_scalar(const float* xs, float dq, float dr, float* t, int* dig);
void half_encode_avx2(const float* xs, float dq, float dr, float* t, int* dig);

// Least-squares ternary scale of 32 weights (oracle wq_alone_scale): with a the |x|
// sorted descending and c_k their running sums, c_k / k for the first k of greatest
// c_k^2 / k. The sums run in order; any correct sort gives the same sorted values.
float wq_alone_scale_scalar(const float* x /*[32]*/);
// The scale of each of nb consecutive blocks: x [nb*32] -> out [nb].
using WqAloneFn = void (*)(const float* x, size_t nb, float* out);
void wq_alone_scales_scalar(const float* x, size_t nb, float* out);
void wq_alone_scales_avx2(const float* x, size_t nb, float* out);

// max(0, max |x|) over n values, NaN ignored (std::max(m, |x|) in any order): eight
// independent running maxima instead of one chain of n dependent ones.
static inline float max_abs(const float* x, size_t n) {
  float m[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], std::fabs(x[j + l]));
  for (; j < n; ++j) m[0] = std::max(m[0], std::fabs(x[j]));
  for (int l = 1; l < 8; ++l) m[0] = std::max(m[0], m[l]);
  return m[0];
}

// D4's asymmetric fit of 32 weights x: w ~ s*q - m (q in 0..15, m >= 0), scale
// search over 21 steps with least-squares refits (oracle _d4_search). Sums run
// over the 32 lanes as tree32: v[i]+v[i+16], then tree16.
constexpr int kD4Steps = 20;  // scale steps 0..20 (oracle D4_STEPS)
using D4FitFn = void (*)(const float* x /*[32]*/, float* s, float* m);
void d4_fit_scalar(const float* x, float* s, float* m);
void d4_fit_avx2(const float* x, float* s, float* m);
// Eight consecutive blocks at once (x [8*32]; s, m [8]), each as d4_fit_scalar.
void d4_fit8_avx2(const float* x, float* s, float* m);

// One ISA's quantizer pieces (kernel_table.cpp picks them once). AVX-512 CPUs run the
// AVX2 ones: the work is eight-lane shaped (two 8-weight halves per register pair,
// per-lane compare chains; the D4 fit is a chain of reductions and scalar divisions that
// lanes = weights cannot widen), and on a double-pumped or two-unit AVX-512 core 16 lanes
// save nothing.
struct SearchKernels {
  BlockBestFn block_best;
  HalfEncodeFn half_encode;
  WqAloneFn wq_alone;
  D4FitFn d4_fit;
  void (*d4_fit8)(const float* x, float* s, float* m);  // eight blocks at once; null where none
};

// The range every D4 fit starts from: min(0, min x) .. max x. A zero span (all weights
// equal and >= 0) fits nothing: the fit keeps s = 0 (ok false) and divides by 1.
struct D4Range {
  float mn, span1;
  bool ok;
};
static inline D4Range d4_range(float mn, float mx) {
  const float span = mx - mn;
  return {mn, span > 0.f ? span : 1.f, span > 0.f};
}
static inline D4Range d4_range(const float* x /*[32]*/) {
  float mn = std::min(0.f, x[0]), mx = x[0];
  for (int j = 1; j < 32; ++j) { mn = std::min(mn, x[j]); mx = std::max(mx, x[j]); }
  return d4_range(mn, mx);
}

}  // namespace resplit
}  // namespace rmoe
