// AVX-512 fused decode x activation kernels of the resplit formats. Called only
// when isa.cpp reports AVX-512 F/BW/VL/DQ and OS ZMM state. In prefill up to 16
// (WQ) or 8 (D4) tokens share each decoded register; one token is the decode GEMV,
// where WQ takes up to eight rows at a time (wq_rows_vnni). WR and the VBMI variant of D4
// are in resplit_vbmi.cpp.
#include "common/isa.h"
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "resplit/resplit_wq_states.h"
#include "common/simd.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rmoe {
namespace resplit {

namespace {

// WQ on int8 activations (prep_wq_q8): 8 blocks per register, one byte lane per
// weight byte. Digit of state u: (u > 85) + (u > 170), next state 3u mod 256;
// the digits (0..2) times int8 x are summed by VNNI (or maddubs without it).
template <int NT, bool VNNI>
void wq_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const __m512i keep = _mm512_set1_epi64(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m512i c85 = _mm512_set1_epi8(85), c170 = _mm512_set1_epi8((char)170);
  const __m512i one = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
  const __m512i lo4 = _mm512_set1_epi32(0xF), hi8 = _mm512_set1_epi32(0x7F80);
  __m512 tot[NT];
  for (int t = 0; t < NT; ++t) tot[t] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; b += 8, q += 64) {
    const size_t nbl = nb - b < 8 ? nb - b : 8;
    const __mmask64 lm = nbl == 8 ? ~0ull : (1ull << (8 * nbl)) - 1;
    const __m512i raw = _mm512_maskz_loadu_epi8(lm, q);
    // Block scales: odd int32 lanes hold bytes 4-7; f16 bits = (b6 & 15) << 3 | b7 << 7.
    const __m512i t16 = _mm512_srli_epi32(raw, 16);
    __m512i h = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(t16, lo4), 3),
                                _mm512_and_si512(_mm512_srli_epi32(t16, 1), hi8));
    h = _mm512_shuffle_epi32(h, _MM_PERM_DDBB);  // odd lane -> both lanes of its block
    const __m512 dq = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    __m512i u = _mm512_and_si512(raw, keep);
    const float* g = xp + (b / 8) * 112;
    constexpr int C = NT >= 16 ? 1 : 2;  // chains per token (digits alternate); 16 tokens are enough chains
    __m512i acc[NT][C];
    for (int t = 0; t < NT; ++t)
      for (int c = 0; c < C; ++c) acc[t][c] = _mm512_setzero_si512();
    for (int i = 0; i < 5; ++i) {
      // d = (u > 85) + (u > 170) with saturating subtracts (no mask registers)
      const __m512i d = _mm512_add_epi8(_mm512_min_epu8(_mm512_subs_epu8(u, c85), one),
                                        _mm512_min_epu8(_mm512_subs_epu8(u, c170), one));
      u = _mm512_add_epi8(u, _mm512_add_epi8(u, u));
      for (int t = 0; t < NT; ++t) {
        const __m512i xq = _mm512_loadu_si512(g + t * xs + 16 * i);
        __m512i& a = acc[t][i % C];
        if (VNNI) a = _mm512_dpbusd_epi32(a, d, xq);
        else a = _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_maddubs_epi16(d, xq), ones16));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs;
      const __m512i a = C == 2 ? _mm512_add_epi32(acc[t][0], acc[t][C - 1]) : acc[t][0];
      const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(gt + 80), _mm512_loadu_ps(gt + 96));
      tot[t] = _mm512_fmadd_ps(dq, v, tot[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = _mm512_reduce_add_ps(tot[t]);
}
// WQ decode GEMV (one token) of 2*NP rows at once with VNNI, without extracting digits
// (wq_state_sums of resplit_wq_states.h; 6 products per byte on z activations, not 10).
RMOE_WQ_STATE_OPS(Zmm, __m512i, _mm512, _mm512_setzero_si512, _mm512_dpbusd_epi32)
// The rows share each activation load. A pair of rows shares one scale decode and one
// float conversion: each row's two int32 lanes of a block are summed into one lane of
// a register that holds the pair's 16 blocks (lane b: first row, 8 + b: second row).
template <int NP, bool Z>
void wq_rows_vnni(const uint8_t* q, size_t rb, size_t nb, const float* xp, float* y) {
  constexpr int S = Z ? 6 : 5;        // activation registers per 8 blocks
  constexpr size_t G = Z ? 128 : 112;  // floats per 8 blocks: S * 16, then sx[16], c[16]
  const __m512i keep = _mm512_set1_epi64(0x00F0FFFFFFFFFFFFll);
  const __m512i hi9 = _mm512_set1_epi16((short)0xFF80);  // ternlog selector: (A & hi9) | (B & ~hi9)
  // 16-bit lane 4b+3 (bytes 6, 7 of block b) of the first row, then of the second (+32)
  const __m512i scale_lanes = _mm512_setr_epi32(0x00070003, 0x000F000B, 0x00170013, 0x001F001B, 0x00270023,
                                                0x002F002B, 0x00370033, 0x003F003B, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i twice = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);  // lane 2b -> b, 8+b
  const __m512 inv256 = _mm512_set1_ps(1.0f / 256.0f);
  __m512 tot[NP];
  #pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) tot[p] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; b += 8) {
    const size_t nbl = nb - b < 8 ? nb - b : 8;
    const __mmask64 lm = nbl == 8 ? ~0ull : (1ull << (8 * nbl)) - 1;
    const float* g = xp + (b / 8) * G;
    __m512i xq[S];
    for (int i = 0; i < S; ++i) xq[i] = _mm512_loadu_si512(g + 16 * i);
    const __m512 sx = _mm512_permutexvar_ps(twice, _mm512_mul_ps(_mm512_loadu_ps(g + 16 * S), inv256));
    const __m512 c = _mm512_permutexvar_ps(twice, _mm512_loadu_ps(g + 16 * S + 16));
    #pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      __m512i raw[2], a[2];
      for (int k = 0; k < 2; ++k) {
        const uint8_t* qr = q + (2 * p + k) * rb + 8 * b;
        _mm_prefetch(reinterpret_cast<const char*>(qr + 8 * rb), _MM_HINT_T1);  // these blocks 8 rows on (the next row group)
        raw[k] = _mm512_maskz_loadu_epi8(lm, qr);
        a[k] = wq_state_sums<Zmm, Z>(_mm512_and_si512(raw[k], keep), xq);
      }
      // f16 scale bits (b7 << 7) | ((b6 & 15) << 3) = (lane >> 1) & 0xFF80 | (lane << 3) & 0x7F
      const __m512i sc = _mm512_permutex2var_epi16(raw[0], scale_lanes, raw[1]);
      const __m512i h = _mm512_ternarylogic_epi32(_mm512_srli_epi16(sc, 1), _mm512_slli_epi16(sc, 3), hi9, 0xE4);
      const __m512 dq = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
      const __m512i ab = _mm512_add_epi32(_mm512_permutex2var_epi32(a[0], even, a[1]),
                                          _mm512_permutex2var_epi32(a[0], odd, a[1]));  // 256 * sum d x per block
      tot[p] = _mm512_fmadd_ps(dq, _mm512_fmsub_ps(_mm512_cvtepi32_ps(ab), sx, c), tot[p]);
    }
  }
  #pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    y[2 * p] = _mm512_mask_reduce_add_ps(0x00FF, tot[p]);
    y[2 * p + 1] = _mm512_mask_reduce_add_ps(0xFF00, tot[p]);
  }
}

// Rows 8, 4, 2 at a time; a last odd row is paired with itself.
template <bool Z>
void wq_rows(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  size_t r = 0;
  for (; r + 8 <= nr; r += 8) wq_rows_vnni<4, Z>(q + r * rb, rb, nb, xp, y + r);
  if (r + 4 <= nr) { wq_rows_vnni<2, Z>(q + r * rb, rb, nb, xp, y + r); r += 4; }
  if (r + 2 <= nr) { wq_rows_vnni<1, Z>(q + r * rb, rb, nb, xp, y + r); r += 2; }
  if (r < nr) {
    float two[2];
    wq_rows_vnni<1, Z>(q + r * rb, 0, nb, xp, two);
    y[r] = two[0];
  }
}

// D4 on int8 activations (prep_d4_q8): 4 blocks per register, low nibbles
// (weights 0-15) and high nibbles (16-31) times int8 x; w = d*q - m per block.
template <int NT, bool VNNI>
void d4_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const float D = h2f(q[0] | (q[1] << 8)), M = h2f(q[2] | (q[3] << 8));
  q += 4;
  const __m512i m4 = _mm512_set1_epi8(0xF), ones16 = _mm512_set1_epi16(1);
  __m512 tot[NT], totm[NT];
  for (int t = 0; t < NT; ++t) tot[t] = totm[t] = _mm512_setzero_ps();
  const size_t ahead = 8 * (4 + 18 * nb);  // the same blocks 8 rows on (the next row group of a GEMV)
  for (size_t b = 0; b < nb; b += 4) {
    const size_t nbl = nb - b < 4 ? nb - b : 4;
    const uint8_t* qb = q + 18 * b;
    if (NT == 1) {
      _mm_prefetch(reinterpret_cast<const char*>(qb + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(qb + 64 + ahead), _MM_HINT_T1);
    }
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)qb));
    float d[4] = {D * (float)qb[16], 0.f, 0.f, 0.f}, m[4] = {M * (float)qb[17], 0.f, 0.f, 0.f};
    if (nbl > 1) { v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(qb + 18)), 1); d[1] = D * (float)qb[34]; m[1] = M * (float)qb[35]; }
    if (nbl > 2) { v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(qb + 36)), 2); d[2] = D * (float)qb[52]; m[2] = M * (float)qb[53]; }
    if (nbl > 3) { v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(qb + 54)), 3); d[3] = D * (float)qb[70]; m[3] = M * (float)qb[71]; }
    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    const __m512 dv = _mm512_set_ps(d[3], d[3], d[3], d[3], d[2], d[2], d[2], d[2], d[1], d[1], d[1], d[1], d[0], d[0], d[0], d[0]);
    const __m512 mv = _mm512_set_ps(m[3], m[3], m[3], m[3], m[2], m[2], m[2], m[2], m[1], m[1], m[1], m[1], m[0], m[0], m[0], m[0]);
    const float* g = xp + (b / 4) * 64;
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs;
      const __m512i xl = _mm512_loadu_si512(gt), xh = _mm512_loadu_si512(gt + 16);
      __m512i acc;
      if (VNNI) {
        acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
      } else {
        acc = _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(lo, xl), ones16),
                               _mm512_madd_epi16(_mm512_maddubs_epi16(hi, xh), ones16));
      }
      tot[t] = _mm512_fmadd_ps(dv, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(gt + 32)), tot[t]);
      totm[t] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(gt + 48), totm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = _mm512_reduce_add_ps(tot[t]) - _mm512_reduce_add_ps(totm[t]);
}

// Tiles of 8 tokens (32 registers hold their accumulators), then 4, 2, 1.
#define RMOE_TILED(name, tile, V)                                                                     \
  void name(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) { \
    size_t t = 0;                                                                                     \
    for (; t + 8 <= T; t += 8) tile<8, V>(q, nb, xp + t * xs, xs, y + t * ys, ys);                    \
    if (t + 4 <= T) { tile<4, V>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 4; }                   \
    if (t + 2 <= T) { tile<2, V>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 2; }                   \
    if (t < T) tile<1, V>(q, nb, xp + t * xs, xs, y + t * ys, ys);                                    \
  }

// WQ also takes 16 tokens per decoded row (one accumulator each): prefill decodes half as often.
void row_dot_wq_vnni(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  size_t t = 0;
  for (; t + 16 <= T; t += 16) wq_tile<16, true>(q, nb, xp + t * xs, xs, y + t * ys, ys);
  for (; t + 8 <= T; t += 8) wq_tile<8, true>(q, nb, xp + t * xs, xs, y + t * ys, ys);
  if (t + 4 <= T) { wq_tile<4, true>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 4; }
  if (t + 2 <= T) { wq_tile<2, true>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 2; }
  if (t < T) wq_tile<1, true>(q, nb, xp + t * xs, xs, y + t * ys, ys);
}
RMOE_TILED(row_dot_wq_bw, wq_tile, false)
RMOE_TILED(row_dot_d4_vnni, d4_tile, true)
RMOE_TILED(row_dot_d4_bw, d4_tile, false)

}  // namespace

// 32 activations (n < 32: zero padded) -> int8 as q8_block: sx = max|x|/L,
// q = rint(x * L/max|x|) with L = levels (127; 31 for z activations); returns sum(q).
int q8_block_avx512(const float* x, size_t n, int8_t* q, float* sx, float levels) {
  const __mmask16 ma = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1);
  const __mmask16 mb = (__mmask16)(n >= 32 ? 0xFFFF : n > 16 ? (1u << (n - 16)) - 1 : 0);
  const __m512 a = _mm512_maskz_loadu_ps(ma, x), b = _mm512_maskz_loadu_ps(mb, x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  // a NaN or an infinity among them: sx NaN and q 0, as q8_block_scalar
  if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q) || !(amax <= FLT_MAX))
    return q8_bad_block(q, sx);
  *sx = amax / levels;
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? levels / amax : 0.f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

// h = silu(g) * u = g / (1 + e^-g) * u. e^x as Cephes expf: x = n ln2 + r (ln2 split in
// two), a degree-6 polynomial in r, scaled by 2^n (vscalefps overflows to inf and
// underflows to 0 as expf does); within 2 ulp of std::exp.
void silu_mul_avx512(const float* g, const float* u, size_t n, float* h) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), c1 = _mm512_set1_ps(0.693359375f),
               c2 = _mm512_set1_ps(-2.12194440e-4f), one = _mm512_set1_ps(1.f);
  const __m512 p0 = _mm512_set1_ps(1.9875691500e-4f), p1 = _mm512_set1_ps(1.3981999507e-3f),
               p2 = _mm512_set1_ps(8.3334519073e-3f), p3 = _mm512_set1_ps(4.1665795894e-2f),
               p4 = _mm512_set1_ps(1.6666665459e-1f), p5 = _mm512_set1_ps(5.0000001201e-1f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = (__mmask16)(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 x = _mm512_max_ps(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv), _mm512_set1_ps(100.f)),
                                   _mm512_set1_ps(-100.f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(k, c2, _mm512_fnmadd_ps(k, c1, x));
    __m512 p = _mm512_fmadd_ps(p0, r, p1);
    p = _mm512_fmadd_ps(p, r, p2);
    p = _mm512_fmadd_ps(p, r, p3);
    p = _mm512_fmadd_ps(p, r, p4);
    p = _mm512_fmadd_ps(p, r, p5);
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, one));
    const __m512 e = _mm512_scalef_ps(p, k);  // e^-g
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), uv));
  }
}

// The kernel table's entries (kernel_table.cpp): vpdpbusd only where isa.cpp saw VNNI;
// AVX-512 without it takes maddubs + madd.
namespace {
// A slip in the kernel table must not reach vpdpbusd off the AVX-512 VNNI path (see require_vbmi).
void require_vnni() {
  if (active_isa() != Isa::Avx512 || !cpu_features().avx512vnni) {
    std::fputs("rapidmoe: internal error: a VNNI kernel was selected without AVX-512 VNNI\n", stderr);
    std::abort();
  }
}
}  // namespace

void row_dot_wq_avx512(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) { row_dot_wq_bw(q, nb, xp, xs, T, y, ys); }
void row_dot_wq_avx512vnni(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  require_vnni();
  row_dot_wq_vnni(q, nb, xp, xs, T, y, ys);
}
void row_dot_d4_avx512(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) { row_dot_d4_bw(q, nb, xp, xs, T, y, ys); }
void row_dot_d4_avx512vnni(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  require_vnni();
  row_dot_d4_vnni(q, nb, xp, xs, T, y, ys);
}
void rows_dot_wq_avx512vnni(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  require_vnni();
  wq_rows<false>(q, rb, nr, nb, xp, y);
}
void rows_dot_wq_z_avx512vnni(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  require_vnni();
  wq_rows<true>(q, rb, nr, nb, xp, y);
}

}  // namespace resplit
}  // namespace rmoe

#endif
