// AVX2/F16C variants; only called after isa.cpp has checked the CPU and OS.
#include "common/convert.h"

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {

void f16_to_f32_row_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

}  // namespace rmoe
#endif
