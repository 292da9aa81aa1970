// The decode attention of one query head with AVX2 + FMA (called only where isa.cpp
// allows AVX2): dot products of 8 lanes, e^x as Cephes expf (within 2 ulp of std::exp,
// as silu_mul_avx512), and the weighted sum of values.
#include "attn.h"

#if RMOE_X86
#include <immintrin.h>

#include <cmath>

#include "simd.h"

namespace rmoe {

namespace {

inline float dot8(const float* a, const float* b, size_t n) {
  __m256 s = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
  float t = hsum8(s);
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

// e^x for x <= 0 (softmax after subtracting the maximum).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-100.f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^k by the exponent bits (k >= -145 here; below -126 the result flushes to 0, as e^x underflows)
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  const __m256 two_k = _mm256_and_ps(_mm256_castsi256_ps(e), _mm256_cmp_ps(k, _mm256_set1_ps(-126.f), _CMP_GE_OQ));
  return _mm256_mul_ps(p, two_k);
}

}  // namespace

void attn_head_avx2(const float* q, const float* k, const float* v, size_t ks, size_t vs, size_t hd, size_t hdv,
                    size_t S, float scale, float* p, float* out) {
  // scores, 4 keys at a time (independent FMA chains)
  const size_t hd8 = hd / 8 * 8;
  size_t j = 0;
  for (; j + 4 <= S; j += 4) {
    const float* k0 = k + j * ks;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t d = 0; d < hd8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ks + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ks + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ks + d), a3);
    }
    float t[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
    for (size_t d = hd8; d < hd; ++d)
      for (int i = 0; i < 4; ++i) t[i] += q[d] * k0[i * ks + d];
    for (int i = 0; i < 4; ++i) p[j + i] = t[i] * scale;
  }
  for (; j < S; ++j) p[j] = dot8(q, k + j * ks, hd) * scale;
  float mx = -INFINITY;
  for (j = 0; j < S; ++j) mx = p[j] > mx ? p[j] : mx;
  __m256 vs8 = _mm256_setzero_ps();
  const __m256 m8 = _mm256_set1_ps(mx);
  for (j = 0; j + 8 <= S; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), m8));
    _mm256_storeu_ps(p + j, e);
    vs8 = _mm256_add_ps(vs8, e);
  }
  float sum = hsum8(vs8);
  for (; j < S; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (j = 0; j < S; ++j) p[j] /= sum;
  // out = sum_j p_j v_j, 64 outputs at a time in registers
  size_t d0 = 0;
  for (; d0 + 64 <= hdv; d0 += 64) {
    __m256 o[8];
    for (int i = 0; i < 8; ++i) o[i] = _mm256_setzero_ps();
    for (j = 0; j < S; ++j) {
      const __m256 w8 = _mm256_set1_ps(p[j]);
      const float* vj = v + j * vs + d0;
      for (int i = 0; i < 8; ++i) o[i] = _mm256_fmadd_ps(w8, _mm256_loadu_ps(vj + 8 * i), o[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + d0 + 8 * i, o[i]);
  }
  for (; d0 < hdv; ++d0) {
    float o = 0.f;
    for (j = 0; j < S; ++j) o += p[j] * v[j * vs + d0];
    out[d0] = o;
  }
}

}  // namespace rmoe

#else  // non-x86: never selected
namespace rmoe {
void attn_head_avx2(const float*, const float*, const float*, size_t, size_t, size_t, size_t, size_t, float, float*,
                    float*) {}
}  // namespace rmoe
#endif
