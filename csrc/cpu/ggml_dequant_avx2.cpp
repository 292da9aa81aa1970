// AVX2 dequantization of GGUF types, bit-exact with the scalar reference:
// codes are widened to 8 int32 lanes, converted, scaled (product rounded
// before any add, as the reference does). Only called after isa.cpp checks.
#include "ggml_blocks.h"
#include "ggml_kernels.h"

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {
namespace ggml {

namespace {

#define RMOE_NOFUSE(v) __asm__("" : "+x"(v))

inline float h2f(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
// 8 bytes -> 8 int32 lanes (zero / sign extended)
inline __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i s8x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i iota8() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
inline __m256i c32(int v) { return _mm256_set1_epi32(v); }

// a * q (int lanes), then + m
inline __m256 am(__m256 a, __m256i q, __m256 m) {
  __m256 p = _mm256_mul_ps(a, _mm256_cvtepi32_ps(q));
  RMOE_NOFUSE(p);
  return _mm256_add_ps(p, m);
}
inline __m256 a_(__m256 a, __m256i q) { return _mm256_mul_ps(a, _mm256_cvtepi32_ps(q)); }

void q4_0(const uint8_t* b, float* o) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(b + 2 + i);
    _mm256_storeu_ps(o + i, a_(d, _mm256_sub_epi32(_mm256_and_si256(raw, c32(15)), c32(8))));
    _mm256_storeu_ps(o + 16 + i, a_(d, _mm256_sub_epi32(_mm256_srli_epi32(raw, 4), c32(8))));
  }
}

void q4_1(const uint8_t* b, float* o) {
  const __m256 d = _mm256_set1_ps(h2f(b)), m = _mm256_set1_ps(h2f(b + 2));
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(b + 4 + i);
    _mm256_storeu_ps(o + i, am(d, _mm256_and_si256(raw, c32(15)), m));
    _mm256_storeu_ps(o + 16 + i, am(d, _mm256_srli_epi32(raw, 4), m));
  }
}

// bit (first + lane) of qh, moved to bit 4
inline __m256i qh_bits(uint32_t qh, int first) {
  const __m256i sh = _mm256_add_epi32(iota8(), c32(first));
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)qh), sh), c32(1)), 4);
}

void q5_x(const uint8_t* b, float* o, bool with_min) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  const __m256 m = _mm256_set1_ps(with_min ? h2f(b + 2) : 0.0f);
  const uint8_t* p = b + (with_min ? 4 : 2);
  const uint32_t qh = ld32(p);
  for (int i = 0; i < 16; i += 8) {
    const __m256i raw = u8x8(p + 4 + i);
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, c32(15)), qh_bits(qh, i));
    const __m256i hi = _mm256_or_si256(_mm256_srli_epi32(raw, 4), qh_bits(qh, 16 + i));
    if (with_min) {
      _mm256_storeu_ps(o + i, am(d, lo, m));
      _mm256_storeu_ps(o + 16 + i, am(d, hi, m));
    } else {
      _mm256_storeu_ps(o + i, a_(d, _mm256_sub_epi32(lo, c32(16))));
      _mm256_storeu_ps(o + 16 + i, a_(d, _mm256_sub_epi32(hi, c32(16))));
    }
  }
}
void q5_0(const uint8_t* b, float* o) { q5_x(b, o, false); }
void q5_1(const uint8_t* b, float* o) { q5_x(b, o, true); }

void q8_0(const uint8_t* b, float* o) {
  const __m256 d = _mm256_set1_ps(h2f(b));
  for (int i = 0; i < 32; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8(b + 2 + i)), d));
}

void q2_k(const uint8_t* b, float* o) {
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
        _mm256_storeu_ps(o + e, am(_mm256_set1_ps(dl), q, _mm256_set1_ps(-ml)));
      }
    }
}

void q3_k(const uint8_t* b, float* o) {
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
        _mm256_storeu_ps(o + e, a_(_mm256_set1_ps(dl), q));
      }
    }
  }
}

void q45_k(const uint8_t* b, float* o, bool five) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int sb = 0; sb < 8; ++sb) {
    int s6, m6;
    k4_scale_min(sc, sb, &s6, &m6);
    const __m256 ds = _mm256_set1_ps(d * (float)s6), dm = _mm256_set1_ps(-rounded(dmin * (float)m6));
    const int j = sb >> 1, u = sb & 1;
    for (int l8 = 0; l8 < 32; l8 += 8) {
      __m256i q = _mm256_and_si256(_mm256_srli_epi32(u8x8(qs + 32 * j + l8), 4 * u), c32(15));
      if (five) q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8(qh + l8), sb), c32(1)), 4));
      _mm256_storeu_ps(o + 32 * sb + l8, am(ds, q, dm));
    }
  }
}
void q4_k(const uint8_t* b, float* o) { q45_k(b, o, false); }
void q5_k(const uint8_t* b, float* o) { q45_k(b, o, true); }

void q6_k(const uint8_t* b, float* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h2f(b + 208);
  for (int h = 0; h < 2; ++h)
    for (int l8 = 0; l8 < 32; l8 += 8) {
      const __m256i hb = u8x8(qh + 32 * h + l8);
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + l8;
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(u8x8(ql + 64 * h + 32 * (s & 1) + l8), 4 * (s >> 1)), c32(15));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(hb, 2 * s), c32(3));
        const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), c32(32));
        const float dl = d * (float)sc[e >> 4];
        _mm256_storeu_ps(o + e, a_(_mm256_set1_ps(dl), q));
      }
    }
}

void f16_run(const uint8_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(ld16(s + 2 * i));
}

void bf16_run(const uint8_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
  for (; i < n; ++i) {
    const uint32_t bits = (uint32_t)ld16(s + 2 * i) << 16;
    std::memcpy(d + i, &bits, 4);
  }
}

template <void (*F)(const uint8_t*, float*), int BYTES, int BLOCK>
void run(const uint8_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) F(s + i * BYTES, d + i * BLOCK);
}

}  // namespace

void dequant_blocks_avx2(int type, const uint8_t* src, float* dst, size_t nblk) {
  switch (type) {
    case F32: std::memcpy(dst, src, nblk * 4); return;
    case F16: return f16_run(src, dst, nblk);
    case BF16: return bf16_run(src, dst, nblk);
    case Q4_0: return run<q4_0, 18, 32>(src, dst, nblk);
    case Q4_1: return run<q4_1, 20, 32>(src, dst, nblk);
    case Q5_0: return run<q5_0, 22, 32>(src, dst, nblk);
    case Q5_1: return run<q5_1, 24, 32>(src, dst, nblk);
    case Q8_0: return run<q8_0, 34, 32>(src, dst, nblk);
    case Q2_K: return run<q2_k, 84, 256>(src, dst, nblk);
    case Q3_K: return run<q3_k, 110, 256>(src, dst, nblk);
    case Q4_K: return run<q4_k, 144, 256>(src, dst, nblk);
    case Q5_K: return run<q5_k, 176, 256>(src, dst, nblk);
    case Q6_K: return run<q6_k, 210, 256>(src, dst, nblk);
    default: return;
  }
}

}  // namespace ggml
}  // namespace rmoe

#else
namespace rmoe {
namespace ggml {
void dequant_blocks_avx2(int type, const uint8_t* src, float* dst, size_t nblk) {
  dequant_blocks_scalar(type, src, dst, nblk);
}
}  // namespace ggml
}  // namespace rmoe
#endif
