// AVX-512 unpacking of GGUF blocks into 16-float vectors, shared by the
// dequantizer (which stores them) and the fused GEMV (which multiplies them
// into accumulators): k.put(offset_in_block, v) receives each vector. Values
// are bit-exact with the scalar reference. Include only from *_avx512.cpp.
// 4- and 5-bit types go through a per-sub-block table of its 16/32 possible
// values (vpermps / vpermi2ps), exact because each value depends only on the code.
#pragma once
#include <immintrin.h>

#include "ggml/ggml_blocks.h"
#include "common/simd.h"


namespace rmoe {
namespace ggml {
namespace avx512 {
namespace {

// The reference rounds the product before adding: no FMA contraction here.
#define RMOE_NOFUSE(v) __asm__("" : "+v"(v))

// The reference rounds the product before adding: no FMA contraction here.

RMOE_INLINE float h2f(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
RMOE_INLINE __m128i ld128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
RMOE_INLINE __m512 lane(__m512 v, int i) { return _mm512_permutexvar_ps(_mm512_set1_epi32(i), v); }
RMOE_INLINE __m512i iota16() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// table[j] = a * (j + off) + m, rounded like the reference (product, then sum)
// for the dequantizer; the GEMV (EXACT false) may fuse it into one FMA.
template <bool EXACT>
RMOE_INLINE __m512 table_am(float a, int off, float m) {
  const __m512 j = _mm512_cvtepi32_ps(_mm512_add_epi32(iota16(), _mm512_set1_epi32(off)));
  if (!EXACT) return _mm512_fmadd_ps(_mm512_set1_ps(a), j, _mm512_set1_ps(m));
  __m512 p = _mm512_mul_ps(_mm512_set1_ps(a), j);
  RMOE_NOFUSE(p);
  return _mm512_add_ps(p, _mm512_set1_ps(m));
}
RMOE_INLINE __m512 table_a(float a, int off) {
  return _mm512_mul_ps(_mm512_set1_ps(a), _mm512_cvtepi32_ps(_mm512_add_epi32(iota16(), _mm512_set1_epi32(off))));
}

template <class K>
RMOE_INLINE void q4_0(const uint8_t* b, K& o) {
  const __m512 t = table_a(h2f(b), -8);
  const __m512i i = _mm512_cvtepu8_epi32(ld128(b + 2));  // vpermps reads index bits 0..3 only
  o.put(0, _mm512_permutexvar_ps(i, t));
  o.put(16, _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), t));
}

template <class K>
RMOE_INLINE void q4_1(const uint8_t* b, K& o) {
  const __m512 t = table_am<K::exact>(h2f(b), 0, h2f(b + 2));
  const __m512i i = _mm512_cvtepu8_epi32(ld128(b + 4));
  o.put(0, _mm512_permutexvar_ps(i, t));
  o.put(16, _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), t));
}

// 5-bit codes: low nibble from qs, bit 4 from a 16-bit mask; 32-entry table t0|t1.
template <class K>
RMOE_INLINE void q5_store(__m512i raw, __mmask16 hi_lo, __mmask16 hi_hi, __m512 t0, __m512 t1, K& o) {
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i lo = _mm512_and_si512(raw, _mm512_set1_epi32(15));
  lo = _mm512_mask_or_epi32(lo, hi_lo, lo, sixteen);
  __m512i hi = _mm512_srli_epi32(raw, 4);
  hi = _mm512_mask_or_epi32(hi, hi_hi, hi, sixteen);
  o.put(0, _mm512_permutex2var_ps(t0, lo, t1));
  o.put(16, _mm512_permutex2var_ps(t0, hi, t1));
}

template <class K>
RMOE_INLINE void q5_0(const uint8_t* b, K& o) {
  const float d = h2f(b);
  const uint32_t qh = ld32(b + 2);
  q5_store(_mm512_cvtepu8_epi32(ld128(b + 6)), (__mmask16)(qh & 0xffff), (__mmask16)(qh >> 16),
           table_a(d, -16), table_a(d, 0), o);
}

template <class K>
RMOE_INLINE void q5_1(const uint8_t* b, K& o) {
  const float d = h2f(b), m = h2f(b + 2);
  const uint32_t qh = ld32(b + 4);
  q5_store(_mm512_cvtepu8_epi32(ld128(b + 8)), (__mmask16)(qh & 0xffff), (__mmask16)(qh >> 16),
           table_am<K::exact>(d, 0, m), table_am<K::exact>(d, 16, m), o);
}

template <class K>
RMOE_INLINE void q8_0(const uint8_t* b, K& o) {
  const __m512 d = _mm512_set1_ps(h2f(b));
  o.put(0, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b + 2))), d));
  o.put(16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b + 18))), d));
}

// Q2_K: 16 lanes of d * (sc & 15) and of dmin * (sc >> 4); each sub-block of
// 16 then reads a 4-entry table (repeated, so vpermps may see index bits 2..3
// of the neighbouring codes).
template <class K>
RMOE_INLINE void q2_k(const uint8_t* b, K& o) {
  const __m512i sc = _mm512_cvtepu8_epi32(ld128(b));
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(h2f(b + 80)), _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15))));
  const __m512 ml = _mm512_mul_ps(_mm512_set1_ps(h2f(b + 82)), _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)));
  const __m512 j4 = _mm512_cvtepi32_ps(_mm512_and_si512(iota16(), _mm512_set1_epi32(3)));
  const uint8_t* qs = b + 16;
  for (int h = 0; h < 2; ++h)
    for (int lh = 0; lh < 2; ++lh) {
      const __m512i raw = _mm512_cvtepu8_epi32(ld128(qs + 32 * h + 16 * lh));
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + 16 * lh;
        const __m512 a = lane(dl, e >> 4), m = lane(ml, e >> 4);
        __m512 t;
        if (K::exact) {
          __m512 p = _mm512_mul_ps(a, j4);
          RMOE_NOFUSE(p);
          t = _mm512_sub_ps(p, m);
        } else {
          t = _mm512_fmsub_ps(a, j4, m);
        }
        o.put(e, _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 2 * s), t));
      }
    }
}

// Q3_K: the 16 signed scales at once; a 3-bit code c = low2 | hbit << 2 gives
// q = c - 4, so each sub-block reads an 8-entry table (repeated twice).
template <class K>
RMOE_INLINE void q3_k(const uint8_t* b, K& o) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  uint64_t lo8;
  std::memcpy(&lo8, b + 96, 8);
  const uint32_t w2 = ld32(b + 104);
  const __m128i lo = _mm_set_epi64x((long long)((lo8 >> 4) & 0x0f0f0f0f0f0f0f0full), (long long)(lo8 & 0x0f0f0f0f0f0f0f0full));
  const __m128i hi = _mm_setr_epi32((int)(w2 & 0x03030303u), (int)((w2 >> 2) & 0x03030303u),
                                    (int)((w2 >> 4) & 0x03030303u), (int)((w2 >> 6) & 0x03030303u));
  const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(h2f(b + 108)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
  const __m512 j8 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(iota16(), _mm512_set1_epi32(7)), _mm512_set1_epi32(4)));
  for (int lh = 0; lh < 2; ++lh) {
    const __m128i hbits = ld128(hm + 16 * lh);
    for (int h = 0; h < 2; ++h) {
      const __m512i raw = _mm512_cvtepu8_epi32(ld128(qs + 32 * h + 16 * lh));
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + 16 * lh;
        const __mmask16 set = _mm_test_epi8_mask(hbits, _mm_set1_epi8((char)(1 << (4 * h + s))));
        __m512i c = _mm512_and_si512(_mm512_srli_epi32(raw, 2 * s), _mm512_set1_epi32(3));
        c = _mm512_mask_or_epi32(c, set, c, _mm512_set1_epi32(4));
        o.put(e, _mm512_permutexvar_ps(c, _mm512_mul_ps(lane(dl, e >> 4), j8)));
      }
    }
  }
}

// Q4_K/Q5_K: the 8 scales and 8 mins of a super-block at once.
// Lanes 0..7: d * sc[b]; lanes 8..15: dmin * mn[b] (exact products, as the reference).
RMOE_INLINE __m512 k4_scales(const uint8_t* s, float d, float dmin) {
  const uint32_t w0 = ld32(s), w1 = ld32(s + 4), w2 = ld32(s + 8);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi)));
  return _mm512_mul_ps(f, _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d), _mm512_set1_ps(dmin)));
}

// table[j] = ds * (j + off) - dm, product rounded first unless EXACT is false
template <bool EXACT>
RMOE_INLINE __m512 table_k(__m512 ds, int off, __m512 dm) {
  const __m512 j = _mm512_cvtepi32_ps(_mm512_add_epi32(iota16(), _mm512_set1_epi32(off)));
  if (!EXACT) return _mm512_fmsub_ps(ds, j, dm);
  __m512 p = _mm512_mul_ps(ds, j);
  RMOE_NOFUSE(p);
  return _mm512_sub_ps(p, dm);
}

template <class K>
RMOE_INLINE void q4_k(const uint8_t* b, K& o) {
  const __m512 sm = k4_scales(b + 4, h2f(b), h2f(b + 2));
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 4; ++j) {
    const __m512 tl = table_k<K::exact>(lane(sm, 2 * j), 0, lane(sm, 8 + 2 * j));
    const __m512 th = table_k<K::exact>(lane(sm, 2 * j + 1), 0, lane(sm, 9 + 2 * j));
    const __m512i a = _mm512_cvtepu8_epi32(ld128(qs + 32 * j));
    const __m512i c = _mm512_cvtepu8_epi32(ld128(qs + 32 * j + 16));
    const int oj = 64 * j;
    o.put(oj, _mm512_permutexvar_ps(a, tl));  // vpermps reads index bits 0..3 only
    o.put(oj + 16, _mm512_permutexvar_ps(c, tl));
    o.put(oj + 32, _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), th));
    o.put(oj + 48, _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), th));
  }
}

template <class K>
RMOE_INLINE void q5_k(const uint8_t* b, K& o) {
  const __m512 sm = k4_scales(b + 4, h2f(b), h2f(b + 2));
  const __m128i qh0 = ld128(b + 16), qh1 = ld128(b + 32);
  const uint8_t* qs = b + 48;
  const __m512i sixteen = _mm512_set1_epi32(16), mask = _mm512_set1_epi32(15);
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_cvtepu8_epi32(ld128(qs + 32 * j));
    const __m512i c = _mm512_cvtepu8_epi32(ld128(qs + 32 * j + 16));
    for (int u = 0; u < 2; ++u) {
      const int sb = 2 * j + u;
      const __m512 ds = lane(sm, sb), dm = lane(sm, 8 + sb);
      const __m512 t0 = table_k<K::exact>(ds, 0, dm), t1 = table_k<K::exact>(ds, 16, dm);
      const __m128i bit = _mm_set1_epi8((char)(1 << sb));
      __m512i ia = _mm512_and_si512(u ? _mm512_srli_epi32(a, 4) : a, mask);
      __m512i ic = _mm512_and_si512(u ? _mm512_srli_epi32(c, 4) : c, mask);
      ia = _mm512_mask_or_epi32(ia, _mm_test_epi8_mask(qh0, bit), ia, sixteen);
      ic = _mm512_mask_or_epi32(ic, _mm_test_epi8_mask(qh1, bit), ic, sixteen);
      o.put(32 * sb, _mm512_permutex2var_ps(t0, ia, t1));
      o.put(32 * sb + 16, _mm512_permutex2var_ps(t0, ic, t1));
    }
  }
}

// Q6_K: 32 codes at a time with byte ops, then widened 16 at a time.
template <class K>
RMOE_INLINE void q6_k(const uint8_t* b, K& o) {
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(h2f(b + 208)),
                                  _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b + 192))));  // d * sc[16]
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    for (int s = 0; s < 4; ++s) {
      const __m256i lsrc = (s & 1) ? l1 : l0;
      const __m256i lo = _mm256_and_si256(s >> 1 ? _mm256_srli_epi16(lsrc, 4) : lsrc, m4);
      __m256i hi;  // bits 2s, 2s+1 of qh -> bits 4, 5
      switch (s) {
        case 0: hi = _mm256_slli_epi16(hb, 4); break;
        case 1: hi = _mm256_slli_epi16(hb, 2); break;
        case 2: hi = hb; break;
        default: hi = _mm256_srli_epi16(hb, 2); break;
      }
      const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hi, m2)), off);
      const int e = 128 * h + 32 * s;
      o.put(e, _mm512_mul_ps(lane(dl, e >> 4), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)))));
      o.put(e + 16, _mm512_mul_ps(lane(dl, (e >> 4) + 1),
                                  _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)))));
    }
  }
}


// (Twins of ggml_unpack_avx2.h's float unpackers on purpose: see there.)
// 16 weights of a float type as one "block".
constexpr int lanes = 16;
template <class K>
RMOE_INLINE void f32v(const uint8_t* b, K& o) { o.put(0, _mm512_loadu_ps(reinterpret_cast<const float*>(b))); }
template <class K>
RMOE_INLINE void f16v(const uint8_t* b, K& o) {
  o.put(0, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))));
}
template <class K>
RMOE_INLINE void bf16v(const uint8_t* b, K& o) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  o.put(0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
}

#include "ggml/ggml_unpack_types.inc"

#undef RMOE_NOFUSE

}  // namespace
}  // namespace avx512
}  // namespace ggml
}  // namespace rmoe
