#include "attn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "isa.h"
#include "threadpool.h"

namespace rmoe {

namespace {

// x * rsqrt(mean(x^2) + eps) * w over one head.
void rms_head(float* x, size_t n, const float* w, float eps) {
  float ss = 0.f;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / (float)n + eps);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * r * w[i];
}

void rope_head(float* x, const AttnDecode& a) {
  const size_t h = a.rope_dim / 2;
  for (size_t i = 0; i < h; ++i) {
    const size_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * a.cos[i] - x1 * a.sin[i];
    x[i1] = x0 * a.sin[i] + x1 * a.cos[i];
  }
}

// Eight partial sums: the compiler vectorizes them without reassociating a single sum.
inline float dot(const float* a, const float* b, size_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

}  // namespace

void attn_decode(const AttnDecode& a, float* q, float* k, const float* v, float* kc, float* vc, size_t pos, float* out) {
  const size_t hd = a.head_dim, hdv = a.head_dim_v, nkv = a.n_head_kv, rep = a.n_head / a.n_head_kv;
  for (size_t h = 0; h < a.n_head; ++h) {
    if (a.q_norm) rms_head(q + h * hd, hd, a.q_norm, a.eps);
    rope_head(q + h * hd, a);
  }
  for (size_t h = 0; h < nkv; ++h) {
    if (a.k_norm) rms_head(k + h * hd, hd, a.k_norm, a.eps);
    rope_head(k + h * hd, a);
  }
  std::memcpy(kc + pos * nkv * hd, k, nkv * hd * sizeof(float));
  std::memcpy(vc + pos * nkv * hdv, v, nkv * hdv * sizeof(float));
  const size_t S = pos + 1;
  static const bool avx2 = active_isa() != Isa::Scalar;
  // Heads in parallel once the context makes them worth a thread each.
  parallel_for(a.n_head, [&](size_t h0, size_t h1, int) {
    std::vector<float> p(S);
    for (size_t h = h0; h < h1; ++h) {
      const size_t g = h / rep;
      if (avx2) {
        attn_head_avx2(q + h * hd, kc + g * hd, vc + g * hdv, nkv * hd, nkv * hdv, hd, hdv, S, a.scale, p.data(), out + h * hdv);
        continue;
      }
      const float* qh = q + h * hd;
      float mx = -INFINITY;
      for (size_t j = 0; j < S; ++j) {
        p[j] = dot(qh, kc + (j * nkv + g) * hd, hd) * a.scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.f;
      for (size_t j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - mx));
      float* o = out + h * hdv;
      std::fill(o, o + hdv, 0.f);
      for (size_t j = 0; j < S; ++j) {
        const float w = p[j] / sum;
        const float* vj = vc + (j * nkv + g) * hdv;
        for (size_t d = 0; d < hdv; ++d) o[d] += w * vj[d];
      }
    }
  }, std::max<size_t>(1, a.n_head * 64 / S));
}

}  // namespace rmoe
