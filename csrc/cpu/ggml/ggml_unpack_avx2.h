// AVX2 unpacking of GGUF blocks into 8-float vectors, shared by the
// dequantizer (which stores them) and the fused GEMV (which multiplies them
// into accumulators): k.put(offset_in_block, v) receives each vector. Values
// are bit-exact with the scalar reference: codes are widened to int32 lanes,
// converted and scaled, the product rounded before any add. Include only
// from *_avx2.cpp.
#pragma once
#include <immintrin.h>

#include "ggml/ggml_blocks.h"
#include "common/simd.h"


namespace rmoe {
namespace ggml {
namespace avx2 {
namespace {

#define RMOE_NOFUSE(v) __asm__("" : "+x"(v))


RMOE_INLINE float h2f(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
// 8 bytes -> 8 int32 lanes (zero / sign extended)
RMOE_INLINE __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
RMOE_INLINE __m256i s8x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
RMOE_INLINE __m256i iota8() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
RMOE_INLINE __m256i c32(int v) { return _mm256_set1_epi32(v); }

// a * q (int lanes), then + m. The dequantizer (K::exact) rounds the product
// first, as the reference does; the GEMV may fuse it into one FMA.
template <bool EXACT>
RMOE_INLINE __m256 am(__m256 a, __m256i q, __m256 m) {
  if (!EXACT) return _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(q), m);
  __m256 p = _mm256_mul_ps(a, _mm256_cvtepi32_ps(q));
  RMOE_NOFUSE(p);
  return _mm256_add_ps(p, m);
}
RMOE_INLINE __m256 a_(__m256 a, __m256i q) { return _mm256_mul_ps(a, _mm256_cvtepi32_ps(q)); }

template <class K>
RMOE_INLINE void q4_0(const uint8_t* b, K& o) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(b + 2 + i);
    o.put(i, a_(d, _mm256_sub_epi32(_mm256_and_si256(raw, c32(15)), c32(8))));
    o.put(16 + i, a_(d, _mm256_sub_epi32(_mm256_srli_epi32(raw, 4), c32(8))));
  }
}

template <class K>
RMOE_INLINE void q4_1(const uint8_t* b, K& o) {
  const __m256 d = _mm256_set1_ps(h2f(b)), m = _mm256_set1_ps(h2f(b + 2));
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(b + 4 + i);
    o.put(i, am<K::exact>(d, _mm256_and_si256(raw, c32(15)), m));
    o.put(16 + i, am<K::exact>(d, _mm256_srli_epi32(raw, 4), m));
  }
}

// bit (first + lane) of qh, moved to bit 4
RMOE_INLINE __m256i qh_bits(uint32_t qh, int first) {
  const __m256i sh = _mm256_add_epi32(iota8(), c32(first));
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)qh), sh), c32(1)), 4);
}

template <class K>
RMOE_INLINE void q5_x(const uint8_t* b, K& o, bool with_min) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  const __m256 m = _mm256_set1_ps(with_min ? h2f(b + 2) : 0.0f);
  const uint8_t* p = b + (with_min ? 4 : 2);
  const uint32_t qh = ld32(p);
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(p + 4 + i);
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, c32(15)), qh_bits(qh, i));
    const __m256i hi = _mm256_or_si256(_mm256_srli_epi32(raw, 4), qh_bits(qh, 16 + i));
    if (with_min) {
      o.put(i, am<K::exact>(d, lo, m));
      o.put(16 + i, am<K::exact>(d, hi, m));
    } else {
      o.put(i, a_(d, _mm256_sub_epi32(lo, c32(16))));
      o.put(16 + i, a_(d, _mm256_sub_epi32(hi, c32(16))));
    }
  }
}
template <class K>
RMOE_INLINE void q5_0(const uint8_t* b, K& o) { q5_x(b, o, false); }
template <class K>
RMOE_INLINE void q5_1(const uint8_t* b, K& o) { q5_x(b, o, true); }

template <class K>
RMOE_INLINE void q8_0(const uint8_t* b, K& o) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  for (int i = 0; i < 32; i += 8) o.put(i, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8(b + 2 + i)), d));
}

template <class K>
RMOE_INLINE void q2_k(const uint8_t* b, K& o) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
  for (int h = 0; h < 2; ++h)
    for (int l8 = 0; l8 < 32; l8 += 8) {
      const __m256i raw = u8x8(qs + 32 * h + l8);
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + l8;
        const float dl = d * (float)(sc[e >> 4] & 15), ml = rounded(dmin * (float)(sc[e >> 4] >> 4));
        const __m256i q = _mm256_and_si256(_mm256_srli_epi32(raw, 2 * s), c32(3));
        o.put(e, am<K::exact>(_mm256_set1_ps(dl), q, _mm256_set1_ps(-ml)));
      }
    }
}

template <class K>
RMOE_INLINE void q3_k(const uint8_t* b, K& o) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = h2f(b + 108);
  for (int l8 = 0; l8 < 32; l8 += 8) {
    const __m256i hb = u8x8(hm + l8);
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = u8x8(qs + 32 * h + l8);
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + l8;
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(raw, 2 * s), c32(3));
        const __m256i hbit = _mm256_and_si256(_mm256_srli_epi32(hb, 4 * h + s), c32(1));
        // code - 4, plus 4 back where the high bit is set
        const __m256i q = _mm256_add_epi32(_mm256_sub_epi32(lo, c32(4)), _mm256_slli_epi32(hbit, 2));
        const float dl = d * (float)k3_scale(sc, e >> 4);
        o.put(e, a_(_mm256_set1_ps(dl), q));
      }
    }
  }
}

template <class K>
RMOE_INLINE void q45_k(const uint8_t* b, K& o, bool five) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  // all 8 scales and mins at once (the 6-bit packing is drawn in ggml_blocks.h)
  const uint32_t w0 = ld32(b + 4), w1 = ld32(b + 8), w2 = ld32(b + 12);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  const __m256 dsv = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32((int)sc_lo, (int)sc_hi, 0, 0))));
  const __m256 dmv = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32((int)mn_lo, (int)mn_hi, 0, 0))));
  const __m256 neg_dmv = _mm256_xor_ps(dmv, _mm256_set1_ps(-0.0f));
  for (int sb = 0; sb < 8; ++sb) {
    const __m256 ds = _mm256_permutevar8x32_ps(dsv, c32(sb)), dm = _mm256_permutevar8x32_ps(neg_dmv, c32(sb));
    const int j = sb >> 1, u = sb & 1;
    for (int l8 = 0; l8 < 32; l8 += 8) {
      __m256i q = _mm256_and_si256(_mm256_srli_epi32(u8x8(qs + 32 * j + l8), 4 * u), c32(15));
      if (five) q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8(qh + l8), sb), c32(1)), 4));
      o.put(32 * sb + l8, am<K::exact>(ds, q, dm));
    }
  }
}

template <class K>
RMOE_INLINE void q4_k(const uint8_t* b, K& o) { q45_k(b, o, false); }
template <class K>
RMOE_INLINE void q5_k(const uint8_t* b, K& o) { q45_k(b, o, true); }

// Q6_K: 32 codes at a time with byte ops, then widened 8 at a time.
template <class K>
RMOE_INLINE void q6_k(const uint8_t* b, K& o) {
  const __m256 dlo = _mm256_mul_ps(_mm256_set1_ps(h2f(b + 208)), _mm256_cvtepi32_ps(s8x8(b + 192)));      // d * sc[0..7]
  const __m256 dhi = _mm256_mul_ps(_mm256_set1_ps(h2f(b + 208)), _mm256_cvtepi32_ps(s8x8(b + 200)));      // d * sc[8..15]
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256 dl = h ? dhi : dlo;
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
      const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hi, m2)), off);  // 32 codes - 32
      const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
      const __m256 s0 = _mm256_permutevar8x32_ps(dl, c32(2 * s)), s1 = _mm256_permutevar8x32_ps(dl, c32(2 * s + 1));
      const int e = 128 * h + 32 * s;
      o.put(e, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0))));
      o.put(e + 8, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q0, q0)))));
      o.put(e + 16, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1))));
      o.put(e + 24, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q1, q1)))));
    }
  }
}

// (The float unpackers are twins of ggml_unpack_avx512.h's on purpose: each is its
// width's load and convert intrinsics, nothing else.)
// 8 weights of a float type as one "block".
constexpr int lanes = 8;
template <class K>
RMOE_INLINE void f32v(const uint8_t* b, K& o) { o.put(0, _mm256_loadu_ps(reinterpret_cast<const float*>(b))); }
template <class K>
RMOE_INLINE void f16v(const uint8_t* b, K& o) {
  o.put(0, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
}
template <class K>
RMOE_INLINE void bf16v(const uint8_t* b, K& o) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  o.put(0, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
}

#include "ggml/ggml_unpack_types.inc"

#undef RMOE_NOFUSE

}  // namespace
}  // namespace avx2
}  // namespace ggml
}  // namespace rmoe
