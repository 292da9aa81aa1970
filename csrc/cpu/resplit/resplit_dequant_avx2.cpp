// AVX2+FMA row decoders of the resplit formats. Called only
// when isa.cpp reports AVX2, FMA and OS YMM support.
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "common/convert.h"
#include "resplit/resplit_tiles_avx2.h"

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

namespace {
// One WR group of M blocks: the levels 4L+9 as the GEMV tiles decode them (wr_levels),
// then w = (D * 2^(-k_s/4)) * L, the scalar decoder's two products (the same floats).
template <int M>
void wr_group_floats(const uint8_t* q, float D, float* out) {
  constexpr int W = 2 * M + 1;
  __m256i lv[2][3];
  wr_levels<M, false>(q, lv);
  const __m256 nine = _mm256_set1_ps(9.f), quarter = _mm256_set1_ps(0.25f);
  for (int p = 0; p < M; ++p) {
    const uint32_t word = q[8 * W + 2 * p] | ((uint32_t)q[8 * W + 2 * p + 1] << 8);
    for (int s = 0; s < 4; ++s) {  // sub-block s: codes 16s..16s+15, bytes 16(s % 2).. of half s / 2
      const __m256 dr = _mm256_set1_ps(D * kWrTable[(word >> (4 * s)) & 0xF]);
      const __m128i b = s % 2 ? _mm256_extracti128_si256(lv[s / 2][p], 1) : _mm256_castsi256_si128(lv[s / 2][p]);
      for (int e = 0; e < 2; ++e) {
        const __m256 l = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e ? _mm_srli_si128(b, 8) : b));
        const __m256 level = _mm256_mul_ps(_mm256_sub_ps(l, nine), quarter);  // L, exactly
        _mm256_storeu_ps(out + 64 * p + 16 * s + 8 * e, _mm256_mul_ps(dr, level));
      }
    }
  }
}
}  // namespace

void dequant_row_wr_avx2(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  q += 2;
  size_t b0 = 0;
  for (; b0 + 3 <= nb; b0 += 3, q += wr_group_bytes(3)) wr_group_floats<3>(q, D, out + 64 * b0);
  if (nb - b0 == 2) wr_group_floats<2>(q, D, out + 64 * b0);
  if (nb - b0 == 1) wr_group_floats<1>(q, D, out + 64 * b0);
}

// D4's header read as in dequant_row_d4_avx512, on purpose; the blocks are the width's own.
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

#endif
