// The hot loop of the joint WQ+WR quantizer (oracle: engine/quant/resplit_joint.py).
// For 16 weights xs, WQ scale dq and each WR sub-scale dr_k = D*2^(-k/4):
//   per weight, over t in {-1,0,1} (first minimum wins):
//     e = x - dq*t;  v = level(e*inv_k);  s = (e - dr_k*v)^2 + kMu*e^2
//   scores[k] = tree16(min_t s)     (tree16: v[i]+v[i+8], then 4, 2, 1)
// level(z): |z| < 0.5 -> 0, |z| < 1.625 -> 1, else 2.25, with the sign of z (z < 0).
// Every variant performs these IEEE operations in this order (no FMA), so all
// ISA paths choose the same bytes.
#pragma once

namespace rmoe {
namespace resplit {

constexpr float kMu = 0x1.47ae14p-6f;  // 0.02: weight of WQ-alone error

using HalfScoresFn = void (*)(const float* xs /*[16]*/, float dq, float D, float* scores /*[16]*/);
void half_scores_scalar(const float* xs, float dq, float D, float* scores);
void half_scores_avx2(const float* xs, float dq, float D, float* scores);
void half_scores_avx512(const float* xs, float dq, float D, float* scores);

}  // namespace resplit
}  // namespace rmoe
