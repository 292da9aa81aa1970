// AVX-512 int8-activation GEMV (ggml_q8.h), with VNNI (vpdpbusd / vpdpwssd)
// or without (maddubs + madd), and the activation quantizer.
//
// Q4_K / Q5_K take 64 packed weights per zmm and apply the sub-block scales as
// 16-bit multipliers: maddubs gives int16 pair sums p (codes x q), then
// vpdpwssd / vpmaddwd adds p * scale into int32 lanes. Each 128-bit lane holds
// 16 bytes = half a 32-value sub-block, so a lane's scale is one broadcast
// value. The integer sums of a super-block go to float once:
// acc += (d * dx) * sumi - (dmin * dx) * summ. Q6_K and the 32-weight types
// use the ymm kernels of ggml_q8_simd.h (with vpdpwssd / vpdpbusd here).
#include <cfloat>
#include <cmath>

#include "ggml/ggml_kernels.h"
#include "ggml/ggml_q8.h"

#if RMOE_X86
#include "ggml/ggml_q8_simd.h"

namespace rmoe {
namespace ggml {

namespace {

RMOE_INLINE __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }
RMOE_INLINE __m512i bcast256(const void* p) { return _mm512_broadcast_i64x4(q8_ld256(p)); }

// int16 pair sums of u8 x s8, times 16-bit scales, added into int32 lanes.
template <bool VNNI>
RMOE_INLINE __m512i dot_scaled(__m512i acc, __m512i u, __m512i s, __m512i sc) {
  const __m512i p = _mm512_maddubs_epi16(u, s);
  if constexpr (VNNI) return _mm512_dpwssd_epi32(acc, p, sc);
  else return _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc));
}

RMOE_INLINE __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// a | (b & c), one instruction
RMOE_INLINE __m512i or_and(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi64(a, b, c, 0xF8); }

// pshufb control: every 16-bit lane of 128-bit lanes 0,1 <- byte a zero-extended, lanes 2,3 <- byte b.
constexpr long long pick16(int a) { return (long long)(0x8000800080008000ull | (0x0001000100010001ull * (unsigned)a)); }
RMOE_INLINE __m512i pick_ctl(int a, int b) {
  return _mm512_set_epi64(pick16(b), pick16(b), pick16(b), pick16(b), pick16(a), pick16(a), pick16(a), pick16(a));
}

// Q4_K / Q5_K, 64 packed bytes qs[64h ..] (h = 0, 1):
//   low nibbles:  bytes 0..31 sub-block 4h,   32..63 sub-block 4h+2
//   high nibbles: bytes 0..31 sub-block 4h+1, 32..63 sub-block 4h+3
// Activations come in the Q8_K_SWAP order, so x[64v .. 64v+63] matches zmm v.
// Q5_K's bit 4 of sub-block b is bit b of qh[l]: a 64-bit rotate by (4 - b)
// brings it to bit 4 of the same byte, per 256-bit half.
template <bool Q5, bool VNNI>
struct KQ45 {
  static constexpr int block = 256, bytes = Q5 ? 176 : 144;
  template <int T>
  static RMOE_INLINE void row(const uint8_t* b, const XBlk* xb, __m256* acc, float* ms) {
    const float d = q8_h2f(b), dmin = q8_h2f(b + 2);
    uint32_t u[4];
    k4_unpack_scales(b + 4, u);
    const __m128i sm = q8_ld128(u);  // bytes 0..7 sc, 8..15 mn
    const __m512i smz = _mm512_broadcast_i32x4(sm);
    const __m512i sc[4] = {_mm512_shuffle_epi8(smz, pick_ctl(0, 2)), _mm512_shuffle_epi8(smz, pick_ctl(1, 3)),
                           _mm512_shuffle_epi8(smz, pick_ctl(4, 6)), _mm512_shuffle_epi8(smz, pick_ctl(5, 7))};
    // mn pairs for the 16-value sums: int16 lane 2b, 2b+1 <- mn[b]
    const __m256i mnp = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(sm),
        _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128, 12, -128, 12,
                         -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128));
    const uint8_t* qs = b + (Q5 ? 48 : 16);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i q0 = ld512(qs), q1 = ld512(qs + 64);
    __m512i w[4] = {_mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                    _mm512_and_si512(q1, m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
    if constexpr (Q5) {
      const __m512i qh = bcast256(b + 16), b4 = _mm512_set1_epi8(0x10);
      w[0] = or_and(w[0], _mm512_rolv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), b4);      // bits 0, 2
      w[1] = or_and(w[1], _mm512_rolv_epi64(qh, _mm512_set_epi64(1, 1, 1, 1, 3, 3, 3, 3)), b4);      // bits 1, 3
      w[2] = or_and(w[2], _mm512_rolv_epi64(qh, _mm512_set_epi64(62, 62, 62, 62, 0, 0, 0, 0)), b4);  // bits 4, 6
      w[3] = or_and(w[3], _mm512_rolv_epi64(qh, _mm512_set_epi64(61, 61, 61, 61, 63, 63, 63, 63)), b4);  // 5, 7
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* x = xb[t].q;
      __m512i s = dot_scaled<VNNI>(_mm512_setzero_si512(), w[0], ld512(x), sc[0]);
      s = dot_scaled<VNNI>(s, w[1], ld512(x + 64), sc[1]);
      s = dot_scaled<VNNI>(s, w[2], ld512(x + 128), sc[2]);
      s = dot_scaled<VNNI>(s, w[3], ld512(x + 192), sc[3]);
      const __m256i m = _mm256_madd_epi16(q8_ld256(xb[t].bs), mnp);  // mn[b] * (sum of sub-block b)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold(s)), _mm256_set1_ps(d * xb[t].dx), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * xb[t].dx), acc[t]);
    }
  }
};

// T=1: 8 rows at once.
constexpr int R1 = 8;

// The type switch of gemv_q8_avx2, on purpose: each width names its own kernels.
template <bool VNNI>
bool gemv(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq, size_t nt,
          float* y, size_t ldy) {
  const int layout = q8_layout_avx512(type);
  if (layout == Q8_NONE) return false;
  const Q8View x{xq, ldq, k, q8_group(layout)};
  switch (type) {
    case Q4_0: return q8_gemv<K32<Q4_0, VNNI, true>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q4_1: return q8_gemv<K32<Q4_1, VNNI, true>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_0: return q8_gemv<K32<Q5_0, VNNI, true>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_1: return q8_gemv<K32<Q5_1, VNNI, true>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q8_0: return q8_gemv<K8_0<VNNI>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q4_K: return q8_gemv<KQ45<false, VNNI>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q5_K: return q8_gemv<KQ45<true, VNNI>, R1>(w, rb, k, nr, x, nt, y, ldy);
    case Q6_K: return q8_gemv<KQ6y<VNNI>, R1>(w, rb, k, nr, x, nt, y, ldy);
    default: return false;
  }
}

}  // namespace

// The scalar table's shape on purpose (q8_layout_scalar): Q4_K and Q5_K take the
// swapped layout here.
int q8_layout_avx512(int type) {
  switch (type) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return Q8_32;
    case Q4_K: case Q5_K: return Q8_K_SWAP;
    case Q6_K: return Q8_K;
    default: return Q8_NONE;
  }
}

// Same arithmetic as quantize_q8_scalar: max |x| per group, one f32 division
// for 127 / amax, x * that rounded to nearest even (cvtps2dq), saturated to int8;
// the walk and the scales in q8_quantize_rows.
void quantize_q8_avx512(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld) {
  const size_t G = q8_group(layout);
  q8_quantize_rows(
      layout, x, k, T, dst, ld,
      [G](const float* xg, float* amax, bool* bad) {
        const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
        __m512 am = _mm512_setzero_ps();
        __mmask16 nf = 0;
        for (size_t j = 0; j < G; j += 16) {
          const __m512 a = _mm512_and_ps(_mm512_loadu_ps(xg + j), absmask);
          nf |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ);
          am = _mm512_max_ps(am, a);
        }
        *amax = _mm512_reduce_max_ps(am);
        *bad = nf != 0;
      },
      [G, layout](const float* xg, size_t e0, float id, bool, const Q8Row& row) {
        const __m512 vid = _mm512_set1_ps(id);
        for (size_t j = 0; j < G; j += 16) {
          const size_t e = e0 + j;
          const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + j), vid));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row.qs + (layout == Q8_K_SWAP ? q8_swap_pos(e) : e)),
                           _mm512_cvtsepi32_epi8(q));
          row.bsum[e / 16] = (int16_t)_mm512_reduce_add_epi32(q);
        }
      });
}

bool gemv_q8_avx512(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                    size_t nt, float* y, size_t ldy) {
  return gemv<false>(type, w, rb, k, nr, xq, ldq, nt, y, ldy);
}

bool gemv_q8_avx512vnni(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq,
                        size_t ldq, size_t nt, float* y, size_t ldy) {
  return gemv<true>(type, w, rb, k, nr, xq, ldq, nt, y, ldy);
}

}  // namespace ggml
}  // namespace rmoe

#endif
