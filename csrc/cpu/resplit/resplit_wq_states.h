// The WQ digit-state sums of the decode GEMVs, written once for any vector width and
// byte-product instruction: resplit_gemv_avx512.cpp runs them on zmm (AVX-512 VNNI),
// resplit_gemv_avxvnni.cpp on ymm (AVX-VNNI), resplit_gemv_avx2.cpp on ymm with maddubs
// (z activations only). Include only from those files (internal linkage; each compiles
// its own copy with its own flags).
//
// A WQ byte holds five base-3 digits as a state u: the digit is d = (3u - u') / 256
// with u' = 3u mod 256 the next state. So 256 sum_i d_i x_i is a sum of whole-byte
// products (u < 256 times int8: exact in int32), with no digit extracted:
//  - int8 activations (prep_wq_q8, Z = false): 3 sum_i u_i x_i - sum_i u_{i+1} x_i
//    over i = 0..4 (10 products);
//  - z activations (prep_wq_z, Z = true): sum_j u_j z_j over the states u_0..u_5 with
//    z_j = 3 x_j - x_{j-1} prepared: 6 products. With vpdpbusd x has 6 bits (|z| <= 124);
//    with maddubs, whose pair sums saturate at 16 bits, 5 (|z| <= 64: 2 * 255 * 64 fits).
#pragma once
#include <immintrin.h>

#include <cstring>

#include "common/simd.h"

namespace rmoe {
namespace resplit {
namespace {

// One vector width's integer ops for wq_state_sums: type I, zero(), add8, add32, sub32,
// and dp(acc, u8, s8) = acc + the sum of 4 byte products per int32 lane (vpdpbusd, or
// maddubs + madd where the products allow).
// pfx: the width's intrinsic prefix (_mm256, _mm512).
#define RMOE_WQ_STATE_OPS(Name, Vec, pfx, zero_fn, dp_fn)                    \
  struct Name {                                                              \
    using I = Vec;                                                           \
    static RMOE_INLINE I zero() { return zero_fn(); }                        \
    static RMOE_INLINE I add8(I a, I b) { return pfx##_add_epi8(a, b); }     \
    static RMOE_INLINE I add32(I a, I b) { return pfx##_add_epi32(a, b); }   \
    static RMOE_INLINE I sub32(I a, I b) { return pfx##_sub_epi32(a, b); }   \
    static RMOE_INLINE I dp(I acc, I u, I s) { return dp_fn(acc, u, s); }    \
  };

// V: a struct of RMOE_WQ_STATE_OPS.
// xq: the S = 5 (int8) or 6 (z) activation registers of these blocks.
// -> per int32 lane, 256 * sum of digit x activation over its 4 weight bytes.
template <class V, bool Z>
RMOE_INLINE typename V::I wq_state_sums(typename V::I u, const typename V::I* xq) {
  using I = typename V::I;
  if constexpr (Z) {
    I A = V::dp(V::zero(), u, xq[0]), B = V::zero();  // two chains
    for (int i = 1; i < 6; ++i) {
      u = V::add8(u, V::add8(u, u));
      if (i & 1) B = V::dp(B, u, xq[i]);
      else A = V::dp(A, u, xq[i]);
    }
    return V::add32(A, B);
  } else {
    I P = V::zero(), Q = V::zero();
    for (int i = 0; i < 5; ++i) {
      const I un = V::add8(u, V::add8(u, u));
      P = V::dp(P, u, xq[i]);
      Q = V::dp(Q, un, xq[i]);
      u = un;
    }
    return V::sub32(V::add32(P, V::add32(P, P)), Q);
  }
}

// The WQ decode GEMV on ymm: NP rows at once, 4 blocks (32 bytes) per step, by
// wq_state_sums with V's ops. The rows share the activation, sx and c loads; a row's
// two int32 lanes of a block meet its one scale.
template <class V, int NP, bool Z>
void wq_rows_ymm(const uint8_t* q, size_t rb, size_t nb, const float* xp, float* y) {
  constexpr int S = Z ? 6 : 5;        // activation registers per 4 blocks
  constexpr size_t G = Z ? 128 : 112;  // floats per 8 blocks: S * 16, then sx[16], c[16]
  const __m256i keep = _mm256_set1_epi64x(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m256i lo4 = _mm256_set1_epi32(0xF), hi8 = _mm256_set1_epi32(0x7F80);
  const __m256 inv256 = _mm256_set1_ps(1.0f / 256.0f);
  __m256 tot[NP];
  for (int p = 0; p < NP; ++p) tot[p] = _mm256_setzero_ps();
  alignas(32) uint8_t tail[NP][32];
  for (size_t b = 0; b < nb; b += 4) {
    const float* g = xp + (b / 8) * G + 8 * ((b % 8) / 4);  // this half of the 8-block group
    __m256i xq[S];
    for (int i = 0; i < S; ++i) xq[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16 * i));
    const __m256 sx = _mm256_mul_ps(_mm256_loadu_ps(g + 16 * S), inv256), c = _mm256_loadu_ps(g + 16 * S + 16);
    for (int p = 0; p < NP; ++p) {
      const uint8_t* src = q + p * rb + 8 * b;
      if (b % 8 == 0) _mm_prefetch(reinterpret_cast<const char*>(src + 8 * rb), _MM_HINT_T0);  // 8 rows on
      if (nb - b < 4) {  // last partial step: never read past the row
        std::memset(tail[p], 0, 32);
        std::memcpy(tail[p], src, 8 * (nb - b));
        src = tail[p];
      }
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i a = wq_state_sums<V, Z>(_mm256_and_si256(raw, keep), xq);
      // block scales: odd int32 lanes hold bytes 4-7; f16 bits = (b6 & 15) << 3 | b7 << 7
      const __m256i t16 = _mm256_srli_epi32(raw, 16);
      __m256i h = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(t16, lo4), 3),
                                  _mm256_and_si256(_mm256_srli_epi32(t16, 1), hi8));
      h = _mm256_shuffle_epi32(h, 0xF5);  // odd lane -> both lanes of its block
      const __m256 dq = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
      tot[p] = _mm256_fmadd_ps(dq, _mm256_fmsub_ps(_mm256_cvtepi32_ps(a), sx, c), tot[p]);
    }
  }
  for (int p = 0; p < NP; ++p) y[p] = hsum8(tot[p]);
}

}  // namespace
}  // namespace resplit
}  // namespace rmoe
