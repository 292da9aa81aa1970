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

// IEEE half bits (low 16 bits of h) -> float, exact.
RMOE_INLINE float h2f(uint32_t h) { return _cvtsh_ss((unsigned short)h); }

}  // namespace
}  // namespace rmoe
