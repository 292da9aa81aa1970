// AVX2+FMA fused decode x activation kernels of the resplit formats. Called
// only when isa.cpp reports AVX2, FMA, F16C and OS YMM state. Up to 4 tokens
// share each decoded register (prefill); 1 token is the decode GEMV.
#include "resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include <cstring>

namespace rmoe {
namespace resplit {

namespace {

inline float h2f(uint32_t h) { return _cvtsh_ss((unsigned short)h); }

inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// WQ on int8 activations (prep_wq_q8): 4 blocks per register, one byte lane per
// weight byte. Digit of state u: (u >= 86) + (u >= 171), next state 3u mod 256;
// digits (0..2) times int8 x by maddubs (pairs <= 2*2*127, no saturation).
template <int NT>
void wq_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const __m256i keep = _mm256_set1_epi64x(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m256i c86 = _mm256_set1_epi8(86), c171 = _mm256_set1_epi8((char)171), ones16 = _mm256_set1_epi16(1);
  const __m256i lo4 = _mm256_set1_epi32(0xF), hi8 = _mm256_set1_epi32(0x7F80);
  __m256 tot[NT];
  for (int t = 0; t < NT; ++t) tot[t] = _mm256_setzero_ps();
  alignas(32) uint8_t tail[32];
  for (size_t b = 0; b < nb; b += 4, q += 32) {
    const uint8_t* src = q;
    if (nb - b < 4) {  // last partial step: never read past the row
      std::memset(tail, 0, 32);
      std::memcpy(tail, q, 8 * (nb - b));
      src = tail;
    }
    const __m256i raw = _mm256_loadu_si256((const __m256i*)src);
    const __m256i t16 = _mm256_srli_epi32(raw, 16);  // odd lanes: bytes 6, 7 of a block
    __m256i h = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(t16, lo4), 3),
                                _mm256_and_si256(_mm256_srli_epi32(t16, 1), hi8));
    h = _mm256_shuffle_epi32(h, 0xF5);
    const __m256 dq = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    __m256i u = _mm256_and_si256(raw, keep);
    const float* g = xp + (b / 8) * 112;
    const size_t half = (b % 8) / 4;  // blocks 0-3 or 4-7 of the 8-block group
    __m256i acc[NT][2];  // two chains per token: digits alternate between them
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
    for (int i = 0; i < 5; ++i) {
      const __m256i m1 = _mm256_cmpeq_epi8(_mm256_max_epu8(u, c86), u);
      const __m256i m2 = _mm256_cmpeq_epi8(_mm256_max_epu8(u, c171), u);
      const __m256i d = _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), m1), m2);
      u = _mm256_add_epi8(u, _mm256_add_epi8(u, u));
      for (int t = 0; t < NT; ++t) {
        const __m256i xq = _mm256_loadu_si256((const __m256i*)(g + t * xs + 16 * i + 8 * half));
        acc[t][i & 1] = _mm256_add_epi32(acc[t][i & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(d, xq), ones16));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs + 8 * half;
      const __m256i a = _mm256_add_epi32(acc[t][0], acc[t][1]);
      const __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(gt + 80), _mm256_loadu_ps(gt + 96));
      tot[t] = _mm256_fmadd_ps(dq, v, tot[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = hsum(tot[t]);
}

template <int NT>
void wr_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const float D = h2f(q[0] | (q[1] << 8));
  q += 2;
  const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i seven = _mm256_set1_epi32(7), mask = _mm256_set1_epi32((1 << 19) - 1);
  const __m256 lv = _mm256_setr_ps(-2.25f, -1.0f, 0.0f, 1.0f, 2.25f, 0.f, 0.f, 0.f);
  // Per row: the 5 levels times each of the 16 sub-scales (one permute then gives weights).
  alignas(32) float tab[16][8];
  for (int k = 0; k < 16; ++k) _mm256_store_ps(tab[k], _mm256_mul_ps(lv, _mm256_set1_ps(D * kWrTable[k])));
  constexpr int A = NT >= 2 ? 2 : 4;  // independent FMA chains per token
  __m256 tot[NT][A];
  for (int t = 0; t < NT; ++t)
    for (int a = 0; a < A; ++a) tot[t][a] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b, q += 21) {
    uint32_t hi, sc = q[19] | ((uint32_t)q[20] << 8);
    std::memcpy(&hi, q + 16, 4);  // bits 23:0; byte 19 is shifted out by srlv/and below
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)q));
    u = _mm256_or_si256(u, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)hi), sh), seven), 16));
    for (int s = 0; s < 4; ++s) {
      const __m256 ts = _mm256_load_ps(tab[(sc >> (4 * s)) & 0xF]);
      for (int h = 0; h < 2; ++h) {  // digit i = 2s+h of groups 0-7 = weights 8i..8i+7
        u = _mm256_add_epi32(u, _mm256_slli_epi32(u, 2));  // u *= 5
        const __m256 w = _mm256_permutevar8x32_ps(ts, _mm256_srli_epi32(u, 19));
        u = _mm256_and_si256(u, mask);
        for (int t = 0; t < NT; ++t) {
          __m256& a = tot[t][(2 * s + h) % A];
          a = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp + t * xs + 64 * b + 16 * s + 8 * h), a);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    __m256 sum = tot[t][0];
    for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, tot[t][a]);
    y[t * ys] = hsum(sum);
  }
}

// D4 on int8 activations (prep_d4_q8): 2 blocks per register, low nibbles
// (weights 0-15) and high nibbles (16-31) times int8 x; w = d*q - m per block.
template <int NT>
void d4_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const float D = h2f(q[0] | (q[1] << 8)), M = h2f(q[2] | (q[3] << 8));
  q += 4;
  const __m256i m4 = _mm256_set1_epi8(0xF), ones16 = _mm256_set1_epi16(1);
  __m256 tot[NT], totm[NT];
  for (int t = 0; t < NT; ++t) tot[t] = totm[t] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    const uint8_t* qb = q + 18 * b;
    const __m128i v0 = _mm_loadu_si128((const __m128i*)qb);
    const __m128i v1 = two ? _mm_loadu_si128((const __m128i*)(qb + 18)) : _mm_setzero_si128();
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(v0), v1, 1);
    const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    const float d0 = D * (float)qb[16], m0 = M * (float)qb[17];
    const float d1 = two ? D * (float)qb[34] : 0.f, m1 = two ? M * (float)qb[35] : 0.f;
    const __m256 dv = _mm256_set_ps(d1, d1, d1, d1, d0, d0, d0, d0), mv = _mm256_set_ps(m1, m1, m1, m1, m0, m0, m0, m0);
    const size_t half = (b % 4) / 2;
    const float* g = xp + (b / 4) * 64;
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs;
      const __m256i xl = _mm256_loadu_si256((const __m256i*)(gt + 8 * half));
      const __m256i xh = _mm256_loadu_si256((const __m256i*)(gt + 16 + 8 * half));
      const __m256i acc = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones16),
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones16));
      tot[t] = _mm256_fmadd_ps(dv, _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(gt + 32 + 8 * half)), tot[t]);
      totm[t] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(gt + 48 + 8 * half), totm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = hsum(tot[t]) - hsum(totm[t]);
}

#define RMOE_TILED(name, tile)                                                                        \
  void name(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) { \
    size_t t = 0;                                                                                     \
    for (; t + 4 <= T; t += 4) tile<4>(q, nb, xp + t * xs, xs, y + t * ys, ys);                       \
    switch (T - t) {                                                                                  \
      case 3: tile<3>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                                 \
      case 2: tile<2>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                                 \
      case 1: tile<1>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                                 \
      default: break;                                                                                 \
    }                                                                                                 \
  }

}  // namespace

RMOE_TILED(row_dot_wq_avx2, wq_tile)
RMOE_TILED(row_dot_wr_avx2, wr_tile)
RMOE_TILED(row_dot_d4_avx2, d4_tile)

}  // namespace resplit
}  // namespace rmoe

#else  // non-x86: never selected by the dispatcher
namespace rmoe {
namespace resplit {
void row_dot_wq_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_wq_scalar(q, nb, xp, xs, T, y, ys);
}
void row_dot_wr_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_wr_scalar(q, nb, xp, xs, T, y, ys);
}
void row_dot_d4_avx2(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  row_dot_d4_scalar(q, nb, xp, xs, T, y, ys);
}
}  // namespace resplit
}  // namespace rmoe
#endif
