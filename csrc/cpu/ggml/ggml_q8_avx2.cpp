// AVX2 int8-activation GEMV (ggml_q8.h): maddubs (u8 codes x s8 activations
// -> int16 pairs), then vpmaddwd by the sub-block scale (-> int32); the
// integer sums of a super-block go to float once. And the activation quantizer.
//
// K-quants take 32 weights per ymm: one 32-value sub-block of Q4_K / Q5_K
// (scale: one broadcast int16); Q6_K is KQ6y of ggml_q8_simd.h. Activations in
// natural order (Q8_K).
#include <cfloat>
#include <cmath>

#include "ggml/ggml_kernels.h"
#include "ggml/ggml_q8.h"

#if RMOE_X86
#include "ggml/ggml_q8_simd.h"

namespace rmoe {
namespace ggml {

namespace {

// Q4_K / Q5_K: qs[32j ..] low nibbles = sub-block 2j, high = 2j+1. Q5_K's bit 4
// of sub-block b is bit b of qh[l]: masked, then shifted to bit 4 in 16-bit lanes
// (a single bit never leaves its byte).
template <bool Q5>
struct KQ45 {
  static constexpr int block = 256, bytes = Q5 ? 176 : 144;
  static RMOE_INLINE __m256i bit4(__m256i qh, int b) {
    const __m256i m = _mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << b)));
    return b <= 4 ? _mm256_slli_epi16(m, 4 - b) : _mm256_srli_epi16(m, b - 4);
  }
  template <int T>
  static RMOE_INLINE void row(const uint8_t* b, const XBlk* xb, __m256* acc, float* ms) {
    const float d = q8_h2f(b), dmin = q8_h2f(b + 2);
    uint32_t u[4];
    k4_unpack_scales(b + 4, u);
    const __m256i sm = _mm256_broadcastsi128_si256(q8_ld128(u));  // bytes 0..7 sc, 8..15 mn
    const __m256i mnp = _mm256_shuffle_epi8(  // int16 lanes 2b, 2b+1 <- mn[b]
        sm, _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128, 12, -128,
                             12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128));
    const uint8_t* qs = b + (Q5 ? 48 : 16);
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i qh;
    if constexpr (Q5) qh = q8_ld256(b + 16);
    __m256i s[T];
    for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = q8_ld256(qs + 32 * j);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (Q5) {
        lo = _mm256_or_si256(lo, bit4(qh, 2 * j));
        hi = _mm256_or_si256(hi, bit4(qh, 2 * j + 1));
      }
      const __m256i sl = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * j))));
      const __m256i sh = _mm256_shuffle_epi8(sm, _mm256_set1_epi16((short)(0x8000 | (2 * j + 1))));
      for (int t = 0; t < T; ++t) {
        s[t] = madd_scaled<false>(s[t], lo, xb[t].q + 64 * j, sl);
        s[t] = madd_scaled<false>(s[t], hi, xb[t].q + 64 * j + 32, sh);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m256i m = _mm256_madd_epi16(q8_ld256(xb[t].bs), mnp);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_set1_ps(d * xb[t].dx), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * xb[t].dx), acc[t]);
    }
  }
};

// T=1: 4 rows at once (16 ymm registers).
constexpr int R1 = 4;

RMOE_INLINE int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

int q8_layout_avx2(int type) { return q8_layout_scalar(type); }

// Same arithmetic as quantize_q8_scalar: max |x| per group, one f32 division
// for 127 / amax, x * that rounded to nearest even (cvtps2dq), packed to int8;
// the walk and the scales in q8_quantize_rows.
void quantize_q8_avx2(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld) {
  const size_t G = q8_group(layout);
  q8_quantize_rows(
      layout, x, k, T, dst, ld,
      [G](const float* xg, float* amax, bool* bad) {
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 am = _mm256_setzero_ps(), nf = _mm256_setzero_ps();
        for (size_t j = 0; j < G; j += 8) {
          const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg + j), absmask);
          nf = _mm256_or_ps(nf, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));
          am = _mm256_max_ps(am, a);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        *amax = _mm_cvtss_f32(m);
        *bad = _mm256_movemask_ps(nf) != 0;
      },
      [G](const float* xg, size_t e0, float id, bool, const Q8Row& row) {
        const __m256 vid = _mm256_set1_ps(id);
        for (size_t j = 0; j < G; j += 32) {
          __m256i q[4];
          for (int v = 0; v < 4; ++v) q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + j + 8 * v), vid));
          // packs interleave 128-bit lanes: dwords come out as 0 2 4 6 1 3 5 7 of the 32 values
          const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
          const size_t e = e0 + j;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(row.qs + e),
                              _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
          row.bsum[e / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
          row.bsum[e / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
        }
      });
}

// The type switch of ggml_q8_avx512.cpp's gemv, on purpose: each width names its own kernels.
bool gemv_q8_avx2(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                  size_t nt, float* y, size_t ldy) {
  const int layout = q8_layout_avx2(type);
  if (layout == Q8_NONE) return false;
  const Q8View x{xq, ldq, k, q8_group(layout)};
  switch (type) {
    case Q4_0: return q8_gemv<K32<Q4_0, false, false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q4_1: return q8_gemv<K32<Q4_1, false, false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_0: return q8_gemv<K32<Q5_0, false, false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_1: return q8_gemv<K32<Q5_1, false, false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q8_0: return q8_gemv<K8_0<false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q4_K: return q8_gemv<KQ45<false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_K: return q8_gemv<KQ45<true>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q6_K: return q8_gemv<KQ6y<false>, R1>(w, rb, k, nr, x, nt, y, ldy);
    default: return false;
  }
}

}  // namespace ggml
}  // namespace rmoe

#endif
