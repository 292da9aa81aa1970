// AVX-512 dequantization of GGUF types, bit-exact with the scalar reference.
// Only called after isa.cpp has checked the CPU and OS. 4- and 5-bit types go
// through a per-sub-block table of its 16/32 possible values (vpermps /
// vpermi2ps), which is exact because each value depends only on the code.
#include "ggml_blocks.h"
#include "ggml_kernels.h"

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {
namespace ggml {

namespace {

// The reference rounds the product before adding: no FMA contraction here.
#define RMOE_NOFUSE(v) __asm__("" : "+v"(v))

inline float h2f(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
inline __m128i ld128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m512i iota16() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// table[j] = a * (j + off) + m, rounded like the reference (product, then sum).
inline __m512 table_am(float a, int off, float m) {
  __m512 p = _mm512_mul_ps(_mm512_set1_ps(a), _mm512_cvtepi32_ps(_mm512_add_epi32(iota16(), _mm512_set1_epi32(off))));
  RMOE_NOFUSE(p);
  return _mm512_add_ps(p, _mm512_set1_ps(m));
}
inline __m512 table_a(float a, int off) {
  return _mm512_mul_ps(_mm512_set1_ps(a), _mm512_cvtepi32_ps(_mm512_add_epi32(iota16(), _mm512_set1_epi32(off))));
}

void q4_0(const uint8_t* b, float* o) {
  const __m512 t = table_a(h2f(b), -8);
  const __m512i i = _mm512_cvtepu8_epi32(ld128(b + 2));  // vpermps reads index bits 0..3 only
  _mm512_storeu_ps(o, _mm512_permutexvar_ps(i, t));
  _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), t));
}

void q4_1(const uint8_t* b, float* o) {
  const __m512 t = table_am(h2f(b), 0, h2f(b + 2));
  const __m512i i = _mm512_cvtepu8_epi32(ld128(b + 4));
  _mm512_storeu_ps(o, _mm512_permutexvar_ps(i, t));
  _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), t));
}

// 5-bit codes: low nibble from qs, bit 4 from a 16-bit mask; 32-entry table t0|t1.
inline void q5_store(__m512i raw, __mmask16 hi_lo, __mmask16 hi_hi, __m512 t0, __m512 t1, float* o) {
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i lo = _mm512_and_si512(raw, _mm512_set1_epi32(15));
  lo = _mm512_mask_or_epi32(lo, hi_lo, lo, sixteen);
  __m512i hi = _mm512_srli_epi32(raw, 4);
  hi = _mm512_mask_or_epi32(hi, hi_hi, hi, sixteen);
  _mm512_storeu_ps(o, _mm512_permutex2var_ps(t0, lo, t1));
  _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(t0, hi, t1));
}

void q5_0(const uint8_t* b, float* o) {
  const float d = h2f(b);
  const uint32_t qh = ld32(b + 2);
  q5_store(_mm512_cvtepu8_epi32(ld128(b + 6)), (__mmask16)(qh & 0xffff), (__mmask16)(qh >> 16),
           table_a(d, -16), table_a(d, 0), o);
}

void q5_1(const uint8_t* b, float* o) {
  const float d = h2f(b), m = h2f(b + 2);
  const uint32_t qh = ld32(b + 4);
  q5_store(_mm512_cvtepu8_epi32(ld128(b + 8)), (__mmask16)(qh & 0xffff), (__mmask16)(qh >> 16),
           table_am(d, 0, m), table_am(d, 16, m), o);
}

void q8_0(const uint8_t* b, float* o) {
  const __m512 d = _mm512_set1_ps(h2f(b));
  _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b + 2))), d));
  _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b + 18))), d));
}

void q2_k(const uint8_t* b, float* o) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
  for (int h = 0; h < 2; ++h)
    for (int lh = 0; lh < 2; ++lh) {
      const __m512i raw = _mm512_cvtepu8_epi32(ld128(qs + 32 * h + 16 * lh));
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + 16 * lh;
        const float dl = d * (float)(sc[e >> 4] & 15), ml = rounded(dmin * (float)(sc[e >> 4] >> 4));
        const __m512 q = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(raw, 2 * s), _mm512_set1_epi32(3)));
        __m512 p = _mm512_mul_ps(_mm512_set1_ps(dl), q);
        RMOE_NOFUSE(p);
        _mm512_storeu_ps(o + e, _mm512_sub_ps(p, _mm512_set1_ps(ml)));
      }
    }
}

void q3_k(const uint8_t* b, float* o) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = h2f(b + 108);
  for (int lh = 0; lh < 2; ++lh) {
    const __m128i hbits = ld128(hm + 16 * lh);
    for (int h = 0; h < 2; ++h) {
      const __m512i raw = _mm512_cvtepu8_epi32(ld128(qs + 32 * h + 16 * lh));
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + 16 * lh;
        const __mmask16 set = _mm_test_epi8_mask(hbits, _mm_set1_epi8((char)(1 << (4 * h + s))));
        __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(raw, 2 * s), _mm512_set1_epi32(3)),
                                     _mm512_set1_epi32(4));
        q = _mm512_mask_add_epi32(q, set, q, _mm512_set1_epi32(4));  // the high bit set means no offset
        const float dl = d * (float)k3_scale(sc, e >> 4);
        _mm512_storeu_ps(o + e, _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q)));
      }
    }
  }
}

void q4_k(const uint8_t* b, float* o) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 4; ++j) {
    int s0, m0, s1, m1;
    k4_scale_min(sc, 2 * j, &s0, &m0);
    k4_scale_min(sc, 2 * j + 1, &s1, &m1);
    const __m512 tl = table_am(d * (float)s0, 0, -rounded(dmin * (float)m0));
    const __m512 th = table_am(d * (float)s1, 0, -rounded(dmin * (float)m1));
    const __m512i a = _mm512_cvtepu8_epi32(ld128(qs + 32 * j));
    const __m512i c = _mm512_cvtepu8_epi32(ld128(qs + 32 * j + 16));
    float* oj = o + 64 * j;
    _mm512_storeu_ps(oj, _mm512_permutexvar_ps(a, tl));
    _mm512_storeu_ps(oj + 16, _mm512_permutexvar_ps(c, tl));
    _mm512_storeu_ps(oj + 32, _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), th));
    _mm512_storeu_ps(oj + 48, _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), th));
  }
}

void q5_k(const uint8_t* b, float* o) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* sc = b + 4;
  const __m128i qh0 = ld128(b + 16), qh1 = ld128(b + 32);
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_cvtepu8_epi32(ld128(qs + 32 * j));
    const __m512i c = _mm512_cvtepu8_epi32(ld128(qs + 32 * j + 16));
    for (int u = 0; u < 2; ++u) {
      const int sb = 2 * j + u;
      int s6, m6;
      k4_scale_min(sc, sb, &s6, &m6);
      const float ds = d * (float)s6, dm = -rounded(dmin * (float)m6);
      const __m512 t0 = table_am(ds, 0, dm), t1 = table_am(ds, 16, dm);
      const __m128i bit = _mm_set1_epi8((char)(1 << sb));
      const __m512i sixteen = _mm512_set1_epi32(16), mask = _mm512_set1_epi32(15);
      __m512i ia = _mm512_and_si512(u ? _mm512_srli_epi32(a, 4) : a, mask);
      __m512i ic = _mm512_and_si512(u ? _mm512_srli_epi32(c, 4) : c, mask);
      ia = _mm512_mask_or_epi32(ia, _mm_test_epi8_mask(qh0, bit), ia, sixteen);
      ic = _mm512_mask_or_epi32(ic, _mm_test_epi8_mask(qh1, bit), ic, sixteen);
      _mm512_storeu_ps(o + 32 * sb, _mm512_permutex2var_ps(t0, ia, t1));
      _mm512_storeu_ps(o + 32 * sb + 16, _mm512_permutex2var_ps(t0, ic, t1));
    }
  }
}

void q6_k(const uint8_t* b, float* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h2f(b + 208);
  const __m128i m4 = _mm_set1_epi8(15), m2 = _mm_set1_epi8(0x30), off = _mm_set1_epi8(32);
  for (int h = 0; h < 2; ++h)
    for (int lh = 0; lh < 2; ++lh) {
      const __m128i hb = ld128(qh + 32 * h + 16 * lh);
      const __m128i l0 = ld128(ql + 64 * h + 16 * lh), l1 = ld128(ql + 64 * h + 32 + 16 * lh);
      for (int s = 0; s < 4; ++s) {
        const int e = 128 * h + 32 * s + 16 * lh;
        const __m128i lsrc = (s & 1) ? l1 : l0;
        const __m128i lo = _mm_and_si128(s >> 1 ? _mm_srli_epi16(lsrc, 4) : lsrc, m4);
        // bits 2s, 2s+1 of qh -> bits 4, 5
        __m128i hi;
        switch (s) {
          case 0: hi = _mm_slli_epi16(hb, 4); break;
          case 1: hi = _mm_slli_epi16(hb, 2); break;
          case 2: hi = hb; break;
          default: hi = _mm_srli_epi16(hb, 2); break;
        }
        const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_and_si128(hi, m2)), off);
        const float dl = d * (float)sc[e >> 4];
        _mm512_storeu_ps(o + e, _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
      }
    }
}

void f16_run(const uint8_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(ld16(s + 2 * i));
}

void bf16_run(const uint8_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i)));
    _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
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

void dequant_blocks_avx512(int type, const uint8_t* src, float* dst, size_t nblk) {
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
void dequant_blocks_avx512(int type, const uint8_t* src, float* dst, size_t nblk) {
  dequant_blocks_scalar(type, src, dst, nblk);
}
}  // namespace ggml
}  // namespace rmoe
#endif
