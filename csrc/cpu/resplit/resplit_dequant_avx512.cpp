// AVX-512 row decoders of the resplit formats. Called only
// when isa.cpp reports AVX-512 F/BW/VL/DQ and OS ZMM state support.
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "common/convert.h"

namespace rmoe {
namespace resplit {

void dequant_row_wq_avx512(const uint8_t* q, size_t nb, float* out) {
  size_t b = 0;
  if (nb >= 2) {
    // Two blocks per register: lanes 0-7 block b, 8-15 block b+1.
    const __m512i keep = _mm512_setr_epi32(255, 255, 255, 255, 255, 255, 0xF0, 0, 255, 255, 255, 255, 255, 255, 0xF0, 0);
    const __m512i m255 = _mm512_set1_epi32(255), one = _mm512_set1_epi32(1);
    for (; b + 2 <= nb; b += 2, q += 16, out += 64) {
      const uint32_t c0 = (q[6] & 0xFu) | ((uint32_t)q[7] << 4), c1 = (q[14] & 0xFu) | ((uint32_t)q[15] << 4);
      const __m512 dq = _mm512_insertf32x8(_mm512_set1_ps(f16_to_f32((uint16_t)(c0 << 3))),
                                           _mm256_set1_ps(f16_to_f32((uint16_t)(c1 << 3))), 1);
      __m512i u = _mm512_and_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)), keep);
      alignas(64) float l6[2][16];
      for (int i = 0; i < 5; ++i) {
        u = _mm512_add_epi32(u, _mm512_slli_epi32(u, 1));  // u *= 3
        const __m512i d = _mm512_sub_epi32(_mm512_srli_epi32(u, 8), one);
        u = _mm512_and_si512(u, m255);
        const __m512 v = _mm512_mul_ps(dq, _mm512_cvtepi32_ps(d));
        _mm256_storeu_ps(out + 6 * i, _mm512_castps512_ps256(v));
        _mm256_storeu_ps(out + 32 + 6 * i, _mm512_extractf32x8_ps(v, 1));
        if (i < 2) _mm512_store_ps(l6[i], v);
      }
      out[30] = l6[0][6];
      out[31] = l6[1][6];
      out[62] = l6[0][14];
      out[63] = l6[1][14];
    }
  }
  if (b < nb) dequant_row_wq_avx2(q, nb - b, out);
}

// D4's header read as in dequant_row_d4_avx2, on purpose; the blocks are the width's own.
void dequant_row_d4_avx512(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  const float M = f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
  q += 4;
  const __m512i m4 = _mm512_set1_epi32(0xF);
  for (size_t b = 0; b < nb; ++b, q += 18, out += 32) {
    const __m512 d = _mm512_set1_ps(D * (float)q[16]), dm = _mm512_set1_ps(M * (float)q[17]);
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(raw, m4));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw, 4));
    _mm512_storeu_ps(out, _mm512_sub_ps(_mm512_mul_ps(d, lo), dm));
    _mm512_storeu_ps(out + 16, _mm512_sub_ps(_mm512_mul_ps(d, hi), dm));
  }
}

}  // namespace resplit
}  // namespace rmoe

#endif
