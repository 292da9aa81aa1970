// AVX-512 row decoders of the resplit formats. Called only
// when isa.cpp reports AVX-512 F/BW/VL/DQ and OS ZMM state support.
#include "resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "convert.h"

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

void dequant_row_wr_avx512(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  q += 2;
  // Lanes 0-7: digit 2s of groups 0-7; lanes 8-15: digit 2s+1. One 16-float store per sub-block.
  const __m512i sh = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
  const __m512i seven = _mm512_set1_epi32(7), mask = _mm512_set1_epi32((1 << 19) - 1);
  const __m512 lv = _mm512_setr_ps(-2.25f, -1.0f, 0.0f, 1.0f, 2.25f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);  // WR levels
  const __m512i p01 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 5, 5, 5, 5, 5, 5, 5, 5);
  const __m512i p25 = _mm512_set1_epi32(25);
  for (size_t b = 0; b < nb; ++b, q += 21, out += 64) {
    const uint32_t hi = q[16] | ((uint32_t)q[17] << 8) | ((uint32_t)q[18] << 16);
    const uint32_t sc = q[19] | ((uint32_t)q[20] << 8);
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)q));
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), lo, 1);
    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)hi), sh), seven), 16));
    // u = v * 5^(2s) (lanes 0-7) or v * 5^(2s+1) (lanes 8-15), mod 2^19.
    __m512i u = _mm512_and_si512(_mm512_mullo_epi32(v, p01), mask);
    for (int s = 0; s < 4; ++s) {
      const __m512 dr = _mm512_set1_ps(D * kWrTable[(sc >> (4 * s)) & 0xF]);
      const __m512i u5 = _mm512_add_epi32(u, _mm512_slli_epi32(u, 2));
      const __m512i d = _mm512_srli_epi32(u5, 19);
      _mm512_storeu_ps(out + 16 * s, _mm512_mul_ps(dr, _mm512_permutexvar_ps(d, lv)));
      u = _mm512_and_si512(_mm512_mullo_epi32(u, p25), mask);
    }
  }
}

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

#else  // non-x86: never selected by the dispatcher
namespace rmoe {
namespace resplit {
void dequant_row_wq_avx512(const uint8_t* q, size_t nb, float* o) { dequant_row_wq_scalar(q, nb, o); }
void dequant_row_wr_avx512(const uint8_t* q, size_t nb, float* o) { dequant_row_wr_scalar(q, nb, o); }
void dequant_row_d4_avx512(const uint8_t* q, size_t nb, float* o) { dequant_row_d4_scalar(q, nb, o); }
}  // namespace resplit
}  // namespace rmoe
#endif
