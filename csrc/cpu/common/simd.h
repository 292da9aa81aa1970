// Small helpers shared by the ISA files (*_avx2.cpp, *_avx512.cpp, *_vbmi.cpp, *_avxvnni.cpp and the
// headers they include). Internal linkage on purpose (see ggml_blocks.h on linkage):
// each ISA file compiles its own copy with its own flags. Include only from those files.
#pragma once
#include <immintrin.h>

#include <cstdint>

#ifndef RMOE_INLINE
#define RMOE_INLINE inline __attribute__((always_inline))
#endif

namespace rmoe {
namespace {

// Sum of the 8 floats of a ymm register.
RMOE_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x as Cephes expf (x = k ln2 + r, ln2 split in two, a degree-6 polynomial in r, times
// 2^k by the exponent bits): within 2 ulp of std::exp. x is clamped to [-100, 88.7]: e^x
// overflows to inf near the top as expf does, and flushes to 0 below 2^-126.
RMOE_INLINE __m256 exp8_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-100.f)), _mm256_set1_ps(88.7f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^k (k <= 128 here: 2^128 is inf's bit pattern; k < -126 flushes to 0)
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  const __m256 two_k = _mm256_and_ps(_mm256_castsi256_ps(e), _mm256_cmp_ps(k, _mm256_set1_ps(-126.f), _CMP_GE_OQ));
  return _mm256_mul_ps(p, two_k);
}

// 32 floats at x into v[4]; returns their largest magnitude.
RMOE_INLINE float load_absmax32(const float* x, __m256 v[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

// IEEE half bits (low 16 bits of h) -> float, exact.
RMOE_INLINE float h2f(uint32_t h) { return _cvtsh_ss((unsigned short)h); }

}  // namespace
}  // namespace rmoe
