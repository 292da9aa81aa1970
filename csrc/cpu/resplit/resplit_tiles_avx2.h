// The AVX2 fused decode x activation tiles of the resplit formats (WQ, D4, WR: up to 4
// tokens share each decoded register), for AVX2 (VNNI = false: maddubs + madd) and
// AVX2 + AVX-VNNI (VNNI = true: vpdpbusd, the same exact integer sums). Included only
// by *_avx2.cpp and *_avxvnni.cpp files, whose build flags allow them.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "resplit/resplit.h"
#include "common/simd.h"

namespace rmoe {
namespace resplit {
namespace {

// acc + the sum of 4 u8 x s8 products per int32 lane (maddubs cannot saturate here:
// each caller bounds its pairs).
template <bool VNNI>
RMOE_INLINE __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  if constexpr (VNNI) return _mm256_dpbusd_avx_epi32(acc, u, s);
  else return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// WQ on int8 activations (prep_wq_q8): 4 blocks per register, one byte lane per
// weight byte. The state is kept as v = u ^ 0x80 (u - 128 as a signed byte): the
// next state 3u mod 256 is then 3v mod 256 too, and the digit (u > 85) + (u > 170)
// is (v > -43) + (v > 42), two signed compares. Digits (0..2) times int8 x by
// maddubs (pairs <= 2*2*127); a token's 5 digit products sum in int16 (<= 2540)
// before one madd widens them (with VNNI: vpdpbusd into int32).
struct WqDigits {
  __m256i c1 = _mm256_set1_epi8(-43), c2 = _mm256_set1_epi8(42);
  // Hidden from the compiler, which would otherwise rewrite v > -43 as min(v, -42) == -42.
  WqDigits() { __asm__("" : "+x"(c1), "+x"(c2)); }
  // The digit of states v, then v <- the next states.
  RMOE_INLINE __m256i next(__m256i& v) const {
    const __m256i d = _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), _mm256_cmpgt_epi8(v, c1)),
                                      _mm256_cmpgt_epi8(v, c2));
    v = _mm256_add_epi8(v, _mm256_add_epi8(v, v));
    return d;
  }
};

template <int NT, bool VNNI>
void wq_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const __m256i keep = _mm256_set1_epi64x(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  const WqDigits digits;
  const __m256i ones16 = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi32(0xF), hi8 = _mm256_set1_epi32(0x7F80);
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
    __m256i v = _mm256_xor_si256(_mm256_and_si256(raw, keep), bias);
    const float* g = xp + (b / 8) * 112;
    const size_t half = (b % 8) / 4;  // blocks 0-3 or 4-7 of the 8-block group
    __m256i acc[NT];  // int16 pair sums (VNNI: int32 sums)
    for (int i = 0; i < 5; ++i) {
      const __m256i d = digits.next(v);
      for (int t = 0; t < NT; ++t) {
        const __m256i x = _mm256_loadu_si256((const __m256i*)(g + t * xs + 16 * i + 8 * half));
        if constexpr (VNNI) {
          acc[t] = _mm256_dpbusd_avx_epi32(i == 0 ? _mm256_setzero_si256() : acc[t], d, x);
        } else {
          const __m256i p = _mm256_maddubs_epi16(d, x);
          acc[t] = i == 0 ? p : _mm256_add_epi16(acc[t], p);
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs + 8 * half;
      const __m256i a = VNNI ? acc[t] : _mm256_madd_epi16(acc[t], ones16);
      const __m256 s = _mm256_fmsub_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(gt + 80), _mm256_loadu_ps(gt + 96));
      tot[t] = _mm256_fmadd_ps(dq, s, tot[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = hsum8(tot[t]);
}

// D4 on int8 activations (prep_d4_q8): 2 blocks per register, low nibbles
// (weights 0-15) and high nibbles (16-31) times int8 x; w = d*q - m per block.
template <int NT, bool VNNI>
void d4_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const float D = h2f(q[0] | (q[1] << 8)), M = h2f(q[2] | (q[3] << 8));
  q += 4;
  const __m256i m4 = _mm256_set1_epi8(0xF);
  __m256 tot[NT], totm[NT];
  for (int t = 0; t < NT; ++t) tot[t] = totm[t] = _mm256_setzero_ps();
  const size_t ahead = 8 * (4 + 18 * nb);  // the same blocks 8 rows on (the next row group of a GEMV)
  for (size_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    const uint8_t* qb = q + 18 * b;
    if (NT == 1 && b % 4 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(qb + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(qb + 64 + ahead), _MM_HINT_T0);
    }
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
      const __m256i acc = dot4<VNNI>(dot4<VNNI>(_mm256_setzero_si256(), lo, xl), hi, xh);
      tot[t] = _mm256_fmadd_ps(dv, _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(gt + 32 + 8 * half)), tot[t]);
      totm[t] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(gt + 48 + 8 * half), totm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = hsum8(tot[t]) - hsum8(totm[t]);
}

// WR on int8 activations (prep_wr_q8). Per group: the 64 codes, spread to one byte
// each (spread32 / spread32_scalar), split into base-5 digits with 16-bit high multiplies
// (digits3), levels 4L+9 by pshufb, then u8 x s8 pair sums (at most 2 * 18 * 127, no
// saturation) to int32 lanes of 4 weights: lanes 0-3 and 4-7 of a half are its two
// 16-weight sub-blocks, one scale each.

// Where code i (0-7) of an 8-code chunk of W-bit codes lies, for a chunk at byte `base`
// of a 128-bit lane: the bytes into one 16-bit lane (pshufb control) and 2^(16 - bit
// offset), whose high multiply brings the code to bit 0 (offset 0: the byte goes to the
// high half and 2^8 brings it down).
template <int W>
struct SpreadTab {
  alignas(16) int8_t ctl[2][16] = {};  // chunk at byte 0 / at byte W of the lane
  alignas(16) uint16_t mul[8] = {};
  constexpr SpreadTab() {
    for (int i = 0; i < 8; ++i) {
      const int byte = (W * i) >> 3, off = (W * i) % 8;
      for (int c = 0; c < 2; ++c) {
        ctl[c][2 * i] = (int8_t)(off ? W * c + byte : -128);
        ctl[c][2 * i + 1] = (int8_t)(W * c + byte + (off ? 1 : 0));
      }
      mul[i] = (uint16_t)(off ? 1 << (16 - off) : 1 << 8);
    }
  }
};
template <int W>
inline constexpr SpreadTab<W> kSpread{};

template <int W>
inline __m128i chunk(const uint8_t* p) {  // the bytes of 8 codes: 4 for W = 3, else 8 (all inside the group)
  if constexpr (W == 3) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm_cvtsi32_si128(v);
  } else {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  }
}

// 32 codes of W bits (chunks of 8 at p, p + W, p + 2W, p + 3W) -> 32 bytes in order.
// Lane 0 holds chunks 0, 1 and lane 1 chunks 2, 3: 16-byte loads inside a full group,
// chunk loads in the shorter last group (no byte past the row is read).
template <int W>
inline __m256i spread32(const uint8_t* p) {
  __m256i v;
  if constexpr (W == 7) {
    v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + 2 * W), reinterpret_cast<const __m128i*>(p));
  } else {  // chunk c + 1 shifted in after chunk c (the bytes both loads hold agree)
    auto two = [&](const uint8_t* c) { return _mm_or_si128(chunk<W>(c), _mm_slli_si128(chunk<W>(c + W), W)); };
    v = _mm256_set_m128i(two(p + 2 * W), two(p));
  }
  const __m256i mul = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kSpread<W>.mul)));
  const __m256i mask = _mm256_set1_epi16((1 << W) - 1);
  auto codes16 = [&](int c) {  // 16-bit lanes: the 8 codes of chunk c | chunk c + 2
    const __m128i ctl = _mm_load_si128(reinterpret_cast<const __m128i*>(kSpread<W>.ctl[c]));
    return _mm256_and_si256(_mm256_mulhi_epu16(_mm256_shuffle_epi8(v, _mm256_broadcastsi128_si256(ctl)), mul), mask);
  };
  // packus takes 128-bit lanes pairwise: chunks (0 | 2) and (1 | 3) give bytes 0-7, 8-15 | 16-23, 24-31
  return _mm256_packus_epi16(codes16(0), codes16(1));
}

constexpr uint64_t lo(int bits) { return (1ull << bits) - 1; }
constexpr uint64_t rep(uint64_t m, int period) {  // m repeated every `period` bits
  return m == 0 ? 0 : m | rep(m << period, period);
}

template <int W>
inline uint64_t spread8(const uint8_t* p) {  // 8 codes of W bits -> 8 bytes
  // One load of the bytes chunk<W> reads (a W-byte copy goes through the stack and
  // stalls store forwarding); past the codes lie the group's sub-scale bytes.
  uint64_t v = 0;
  std::memcpy(&v, p, W == 3 ? 4 : 8);
  // halves of 4W bits -> 32-bit lanes, then 2W -> 16-bit, then W -> bytes
  v = (v & lo(4 * W)) | ((v << (32 - 4 * W)) & (lo(4 * W) << 32));
  v = (v & rep(lo(2 * W), 32)) | ((v << (16 - 2 * W)) & rep(lo(2 * W) << 16, 32));
  return (v & rep(lo(W), 16)) | ((v << (8 - W)) & rep(lo(W) << 8, 16));
}

// The same with scalar shifts and masks on 64-bit words (one per 8 codes).
template <int W>
inline __m256i spread32_scalar(const uint8_t* p) {
  return _mm256_setr_epi64x((long long)spread8<W>(p), (long long)spread8<W>(p + W), (long long)spread8<W>(p + 2 * W),
                            (long long)spread8<W>(p + 3 * W));
}

// Codes (bytes < 125) -> base-5 digits d[0..2]. floor(c/5) and floor(c/25) by 16-bit high
// multiplies, even bytes in place; odd bytes are taken as c * 256, whose product has the
// quotient in its high byte. Times 5 by a 16-bit multiply (5q < 256: no carry between bytes).
RMOE_INLINE void digits3(__m256i c, __m256i d[3]) {
  const __m256i k5 = _mm256_set1_epi16(13108), k25 = _mm256_set1_epi16(2622), five = _mm256_set1_epi16(5);
  const __m256i lo8 = _mm256_set1_epi16(0xFF), hi8 = _mm256_set1_epi16((short)0xFF00);
  const __m256i lo = _mm256_and_si256(c, lo8), hi = _mm256_and_si256(c, hi8);
  const __m256i q1 = _mm256_or_si256(_mm256_mulhi_epu16(lo, k5), _mm256_and_si256(_mm256_mulhi_epu16(hi, k5), hi8));
  const __m256i q2 = _mm256_or_si256(_mm256_mulhi_epu16(lo, k25), _mm256_and_si256(_mm256_mulhi_epu16(hi, k25), hi8));
  d[0] = _mm256_sub_epi8(c, _mm256_mullo_epi16(q1, five));
  d[1] = _mm256_sub_epi8(q1, _mm256_mullo_epi16(q2, five));
  d[2] = q2;
}

// The levels 4L+9 of a group's M blocks: lv[h][p] = block p, codes 32h..32h+31. SCALAR:
// spread the codes with scalar shifts (spread32_scalar), which run beside the vector work
// where that work fills the vector ports.
template <int M, bool SCALAR>
RMOE_INLINE void wr_levels(const uint8_t* q, __m256i lv[2][3]) {
  constexpr int W = 2 * M + 1;
  const __m256i ltab = _mm256_setr_epi8(0, 5, 9, 13, 18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 5, 9, 13, 18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int h = 0; h < 2; ++h) {
    const __m256i c = SCALAR ? spread32_scalar<W>(q + 4 * W * h) : spread32<W>(q + 4 * W * h);
    __m256i dig[3];
    digits3(c, dig);
    for (int p = 0; p < M; ++p) lv[h][p] = _mm256_shuffle_epi8(ltab, dig[p]);
  }
}

template <int NT, int M, bool VNNI>
inline __attribute__((always_inline)) void wr_group(const uint8_t* q, float D4, const float* xp, size_t xs,
                                                    __m256* tot) {
  constexpr int W = 2 * M + 1;
  __m256i lv[2][3];  // [half: codes 0-31 / 32-63][block]
  // one token: the vector ports have room for the spread; tiles of tokens keep them busy
  wr_levels<M, NT != 1>(q, lv);
  for (int p = 0; p < M; ++p) {
    const uint32_t word = q[8 * W + 2 * p] | ((uint32_t)q[8 * W + 2 * p + 1] << 8);
    float s[4];
    for (int k = 0; k < 4; ++k) s[k] = D4 * kWrTable[(word >> (4 * k)) & 0xF];
    for (int h = 0; h < 2; ++h) {
      const __m256 sc = _mm256_setr_m128(_mm_set1_ps(s[2 * h]), _mm_set1_ps(s[2 * h + 1]));
      const float* xb = xp + 48 * p;
      for (int t = 0; t < NT; ++t) {
        const float* xt = xb + t * xs;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt) + h);
        const __m256i acc = dot4<VNNI>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + 32 + 8 * h)), lv[h][p], xq);
        tot[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sc, _mm256_loadu_ps(xt + 16 + 8 * h)), tot[t]);
      }
    }
  }
}

template <int NT, bool VNNI>
void wr_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const float D4 = 0.25f * h2f(q[0] | (q[1] << 8));  // levels are stored as 4L+9
  q += 2;
  __m256 tot[NT];
  for (int t = 0; t < NT; ++t) tot[t] = _mm256_setzero_ps();
  size_t b0 = 0;
  for (; b0 + 3 <= nb; b0 += 3, q += wr_group_bytes(3)) wr_group<NT, 3, VNNI>(q, D4, xp + 48 * b0, xs, tot);
  if (nb - b0 == 2) wr_group<NT, 2, VNNI>(q, D4, xp + 48 * b0, xs, tot);
  if (nb - b0 == 1) wr_group<NT, 1, VNNI>(q, D4, xp + 48 * b0, xs, tot);
  for (int t = 0; t < NT; ++t) y[t * ys] = hsum8(tot[t]);
}

// T tokens of one row: tiles of 4, then 3, 2 or 1.
#define RMOE_TILED(name, tile, vnni)                                                                  \
  void name(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) { \
    size_t t = 0;                                                                                     \
    for (; t + 4 <= T; t += 4) tile<4, vnni>(q, nb, xp + t * xs, xs, y + t * ys, ys);                 \
    switch (T - t) {                                                                                  \
      case 3: tile<3, vnni>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                           \
      case 2: tile<2, vnni>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                           \
      case 1: tile<1, vnni>(q, nb, xp + t * xs, xs, y + t * ys, ys); break;                           \
      default: break;                                                                                 \
    }                                                                                                 \
  }

}  // namespace
}  // namespace resplit
}  // namespace rmoe
