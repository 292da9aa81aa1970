// Int8-activation GEMV pieces shared by ggml_q8_avx2.cpp and
// ggml_q8_avx512.cpp: the row/activation tiling with prefetch, and the
// 32-weight block types on 256-bit vectors (one block = one ymm of codes).
// Include only from those files (internal linkage, see ggml_blocks.h).
//
// Integer dot products, u8 weights x s8 activations:
//   VNNI:  vpdpbusd acc += sum of 4 u8*s8 products per int32 lane (exact);
//   else:  vpmaddubsw (pairs -> int16, saturating) then vpmaddwd by 1 (-> int32).
// maddubs cannot saturate here: codes are <= 63 (or |w| <= 128 for Q8_0) and
// |x| <= 127, so a pair is at most 2 * 128 * 127 = 32512.
#pragma once
#include <immintrin.h>

#include <cmath>

#include "ggml/ggml_blocks.h"
#include "common/simd.h"
#include "ggml/ggml_q8.h"


namespace rmoe {
namespace ggml {
namespace {

RMOE_INLINE float q8_h2f(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
RMOE_INLINE __m256i q8_ld256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
RMOE_INLINE __m128i q8_ld128(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// init + sum of u8 x s8 products, 4 per int32 lane.
template <bool VNNI>
RMOE_INLINE __m256i dot_us(__m256i init, __m256i u, __m256i s) {
  if constexpr (VNNI) {
    return _mm256_dpbusd_epi32(init, u, s);
  } else {
    return _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
}

// Activation side of one weight block, per activation row.
struct XBlk {
  const int8_t* q;     // the block's int8 values
  const int16_t* bs;   // its 16-value sums
  float dx;            // its scale (per block for 32-blocks, per super-block for K)
  float s;             // 32-blocks: the min term (ggml_q8.h); K: unused
};

// ---- 32-weight blocks: the block's 32 codes as u8 in one ymm ----

// 16 bytes of nibble pairs -> 32 codes: low nibbles are elements 0..15, high 16..31.
RMOE_INLINE __m256i nibbles32(const uint8_t* p) {
  const __m128i q = q8_ld128(p), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Bit j of qh -> 0x10 in byte j (Q5_0 / Q5_1 bit 4 of code j).
template <bool AVX512>
RMOE_INLINE __m256i bit4_of(uint32_t qh) {
  if constexpr (AVX512) {
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
  } else {
    // byte j <- byte j/8 of qh; keep it if bit j%8 is set
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                            0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
  }
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1: codes c in [0, 16) or [0, 32),
//   w = d * (c - off)  (off 8 / 16)       sum w*x = d*dx * (sum c*q - off * xsum)
//   w = d * c + m                         sum w*x = d*dx * sum c*q + m * s
// The integer offset rides in the dot product's initial value. The m * s terms
// are summed apart, in block order, and added after the lanes' sum (ms), as
// llama.cpp's q4_1 / q5_1 dot products do: same order, same bits.
template <int TYPE, bool VNNI, bool AVX512>
struct K32 {
  static constexpr int block = 32;
  static constexpr int bytes = TYPE == Q4_0 ? 18 : TYPE == Q4_1 ? 20 : TYPE == Q5_0 ? 22 : 24;
  static constexpr bool has_m = TYPE == Q4_1 || TYPE == Q5_1;
  static constexpr bool q5 = TYPE == Q5_0 || TYPE == Q5_1;
  static constexpr int off = has_m ? 0 : q5 ? 16 : 8;
  template <int T>
  static RMOE_INLINE void row(const uint8_t* b, const XBlk* xb, __m256* acc, float* ms) {
    const float d = q8_h2f(b);
    const uint8_t* qs = b + (has_m ? 4 : 2) + (q5 ? 4 : 0);
    __m256i c = nibbles32(qs);
    if constexpr (q5) c = _mm256_or_si256(c, bit4_of<AVX512>(ld32(b + (has_m ? 4 : 2))));
    for (int t = 0; t < T; ++t) {
      const int xsum = xb[t].bs[0] + xb[t].bs[1];
      const __m256i init = _mm256_setr_epi32(-off * xsum, 0, 0, 0, 0, 0, 0, 0);
      const __m256i s = dot_us<VNNI>(init, c, q8_ld256(xb[t].q));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * xb[t].dx), acc[t]);
      if constexpr (has_m) ms[t] = std::fma(q8_h2f(b + 2), xb[t].s, ms[t]);
    }
  }
};

// Q8_0: signed weights: |w| (unsigned; 128 for -128) times q carrying w's sign
// (|q| <= 127, so negating it never wraps and maddubs pairs stay in int16).
// Not w ^ 0x80 = w + 128 with 128 * xsum taken off: exact in int32 too, but its
// lanes would be large and cancel only in the float sum.
template <bool VNNI>
struct K8_0 {
  static constexpr int block = 32, bytes = 34;
  template <int T>
  static RMOE_INLINE void row(const uint8_t* b, const XBlk* xb, __m256* acc, float* ms) {
    const float d = q8_h2f(b);
    const __m256i w = q8_ld256(b + 2);
    const __m256i u = _mm256_abs_epi8(w);
    for (int t = 0; t < T; ++t) {
      const __m256i s = dot_us<VNNI>(_mm256_setzero_si256(), u, _mm256_sign_epi8(q8_ld256(xb[t].q), w));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * xb[t].dx), acc[t]);
    }
  }
};

// acc + (u8 x s8 pair sums) * 16-bit scales, into int32 lanes.
template <bool VNNI>
RMOE_INLINE __m256i madd_scaled(__m256i acc, __m256i u, const int8_t* x, __m256i sc) {
  const __m256i p = _mm256_maddubs_epi16(u, q8_ld256(x));
  if constexpr (VNNI) return _mm256_dpwssd_epi32(acc, p, sc);
  else return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
}

// Q6_K: elements 128h + 32s + l, code = nibble of ql[64h + 32(s&1) + l]
// (low for s < 2) | bits 2s, 2s+1 of qh[32h + l] at bits 4, 5; codes are q + 32:
//   sum sc*(c - 32)*x = sum sc*c*x - 32 * sum sc*bsum.
// Two 16-value groups per ymm (one per 128-bit lane). Also the AVX-512 path's
// Q6_K: measured faster there than 64 weights per zmm, whose per-lane scales
// take a vpermw each.
template <bool VNNI>
struct KQ6y {
  static constexpr int block = 256, bytes = 210;
  template <int T>
  static RMOE_INLINE void row(const uint8_t* b, const XBlk* xb, __m256* acc, float* ms) {
    const float d = q8_h2f(b + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(q8_ld128(b + 192));
    const __m256i m4 = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    __m256i s[T];
    for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i sch = _mm256_permute2x128_si256(sc16, sc16, h ? 0x11 : 0x00);  // sc[8h .. 8h+7], both lanes
      const __m256i ql0 = q8_ld256(b + 64 * h), ql1 = q8_ld256(b + 64 * h + 32), qh = q8_ld256(b + 128 + 32 * h);
      const __m256i w[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top)),
          _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), top))};
      for (int sb = 0; sb < 4; ++sb) {
        // lane 0 <- int16 element 2sb of sch, lane 1 <- element 2sb+1
        const __m256i sc = _mm256_shuffle_epi8(
            sch, _mm256_set_m128i(_mm_set1_epi16((short)(((4 * sb + 3) << 8) | (4 * sb + 2))),
                                  _mm_set1_epi16((short)(((4 * sb + 1) << 8) | (4 * sb)))));
        for (int t = 0; t < T; ++t) s[t] = madd_scaled<VNNI>(s[t], w[sb], xb[t].q + 128 * h + 32 * sb, sc);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m256i m = _mm256_madd_epi16(sc16, q8_ld256(xb[t].bs));
      const __m256i si = _mm256_sub_epi32(s[t], _mm256_slli_epi32(m, 5));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(d * xb[t].dx), acc[t]);
    }
  }
};

// ---- tiling: R weight rows x T activation rows ----

// Weight rows are streamed once: fetch them into L2 this far ahead of the block in use.
// (Into L1 and 1 KB ahead, the GEMV from DRAM ran at a third of the read bandwidth on
// Zen 4, bound by the L1's few outstanding misses; the L2 holds many more.)
constexpr int Q8_PREFETCH = 4096;

template <class K, int R, int T>
void q8_tile(const uint8_t* w, size_t rb, size_t nb, const Q8View& x, float* y, size_t ldy) {
  __m256 acc[R][T];
  float ms[R][T];  // the terms summed apart (K32 with a min), else 0
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), ms[r][t] = 0.0f;
  const int8_t* xq[T];
  const float* xd[T];
  const float* xm[T];
  const int16_t* xs[T];
  for (int t = 0; t < T; ++t) xq[t] = x.qs(t), xd[t] = x.d(t), xm[t] = x.s(t), xs[t] = x.bsum(t);
  for (size_t i = 0; i < nb; ++i) {
    // PREFETCH bytes ahead in the row, or past its end: the same place in the
    // row the next group of R rows will read (never faults, even past the matrix).
    size_t ahead = i * K::bytes + Q8_PREFETCH;
    if (ahead >= rb) ahead += (R - 1) * rb;
    XBlk xb[T];
    for (int t = 0; t < T; ++t)
      xb[t] = {xq[t] + i * K::block, xs[t] + i * (K::block / 16), xd[t][i], K::block == 32 ? xm[t][i] : 0.0f};
    for (int r = 0; r < R; ++r) {
      for (int p = 0; p < K::bytes; p += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * rb + ahead) + p, _MM_HINT_T1);
      K::template row<T>(w + r * rb + i * K::bytes, xb, acc[r], ms[r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = hsum8(acc[r][t]) + ms[r][t];
}

// T=1: R1 rows at once (independent chains, R1 row streams); else 4.
template <class K, int T, int R1>
void q8_rows(const uint8_t* w, size_t rb, size_t nb, size_t nr, const Q8View& x, float* y, size_t ldy) {
  constexpr int R = T == 1 ? R1 : 4;
  size_t r = 0;
  for (; r + R <= nr; r += R) q8_tile<K, R, T>(w + r * rb, rb, nb, x, y + r, ldy);
  for (; r < nr; ++r) q8_tile<K, 1, T>(w + r * rb, rb, nb, x, y + r, ldy);
}

template <class K, int R1>
bool q8_gemv(const uint8_t* w, size_t rb, size_t k, size_t nr, const Q8View& x, size_t nt, float* y,
             size_t ldy) {
  if (k % K::block || nt > 8) return false;
  const size_t nb = k / K::block;
  size_t t = 0;
  for (; t + 4 <= nt; t += 4) {
    const Q8View xt{x.base + t * x.ld, x.ld, x.k, x.group};
    q8_rows<K, 4, R1>(w, rb, nb, nr, xt, y + t * ldy, ldy);
  }
  for (; t + 2 <= nt; t += 2) {
    const Q8View xt{x.base + t * x.ld, x.ld, x.k, x.group};
    q8_rows<K, 2, R1>(w, rb, nb, nr, xt, y + t * ldy, ldy);
  }
  if (t < nt) {
    const Q8View xt{x.base + t * x.ld, x.ld, x.k, x.group};
    q8_rows<K, 1, R1>(w, rb, nb, nr, xt, y + t * ldy, ldy);
  }
  return true;
}

}  // namespace
}  // namespace ggml
}  // namespace rmoe
