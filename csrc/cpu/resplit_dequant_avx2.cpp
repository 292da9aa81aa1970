// AVX2+FMA row decoders of the resplit formats. Called only
// when isa.cpp reports AVX2, FMA and OS YMM support.
#include "resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "convert.h"

namespace rmoe {
namespace resplit {

void dequant_row_wq_avx2(const uint8_t* q, size_t nb, float* out) {
  // Lanes = the 8 bytes of a block; lane 6 keeps only its 2-trit nibble, lane 7 none.
  const __m256i keep = _mm256_setr_epi32(255, 255, 255, 255, 255, 255, 0xF0, 0);
  const __m256i m255 = _mm256_set1_epi32(255), one = _mm256_set1_epi32(1);
  for (size_t b = 0; b < nb; ++b, q += 8, out += 32) {
    const uint32_t code = (q[6] & 0xFu) | ((uint32_t)q[7] << 4);
    const __m256 dq = _mm256_set1_ps(f16_to_f32((uint16_t)(code << 3)));
    __m256i u = _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)q)), keep);
    float w30 = 0.f, w31 = 0.f;
    for (int i = 0; i < 5; ++i) {
      u = _mm256_add_epi32(u, _mm256_slli_epi32(u, 1));  // u *= 3
      const __m256i d = _mm256_sub_epi32(_mm256_srli_epi32(u, 8), one);
      u = _mm256_and_si256(u, m255);
      const __m256 v = _mm256_mul_ps(dq, _mm256_cvtepi32_ps(d));
      _mm256_storeu_ps(out + 6 * i, v);  // lanes 6,7 are overwritten by the next digit
      if (i < 2) {
        const float l6 = _mm_cvtss_f32(_mm_shuffle_ps(_mm256_extractf128_ps(v, 1), _mm256_extractf128_ps(v, 1), 2));
        (i == 0 ? w30 : w31) = l6;
      }
    }
    out[30] = w30;
    out[31] = w31;
  }
}

void dequant_row_wr_avx2(const uint8_t* q, size_t nb, float* out) { dequant_row_wr_scalar(q, nb, out); }  // table decode

void dequant_row_d4_avx2(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  const float M = f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
  q += 4;
  const __m128i m4 = _mm_set1_epi8(0xF);
  for (size_t b = 0; b < nb; ++b, q += 18, out += 32) {
    const __m256 d = _mm256_set1_ps(D * (float)q[16]), dm = _mm256_set1_ps(M * (float)q[17]);
    const __m128i raw = _mm_loadu_si128((const __m128i*)q);
    const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
      _mm256_storeu_ps(out + 8 * p, _mm256_sub_ps(_mm256_mul_ps(d, v), dm));
    }
  }
}


}  // namespace resplit
}  // namespace rmoe

#else  // non-x86: never selected by the dispatcher
namespace rmoe {
namespace resplit {
void dequant_row_wq_avx2(const uint8_t* q, size_t nb, float* o) { dequant_row_wq_scalar(q, nb, o); }
void dequant_row_wr_avx2(const uint8_t* q, size_t nb, float* o) { dequant_row_wr_scalar(q, nb, o); }
void dequant_row_d4_avx2(const uint8_t* q, size_t nb, float* o) { dequant_row_d4_scalar(q, nb, o); }
}  // namespace resplit
}  // namespace rmoe
#endif
