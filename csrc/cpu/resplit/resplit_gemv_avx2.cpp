// AVX2+FMA fused decode x activation kernels of the resplit formats (the tiles of
// resplit_tiles_avx2.h without VNNI, and the decode GEMV over several rows at once) and
// the activation quantizer. Called only when isa.cpp reports AVX2, FMA, F16C and OS YMM
// state.
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "resplit/resplit_tiles_avx2.h"

#include <cfloat>
#include <cmath>
#include <cstring>

namespace rmoe {
namespace resplit {

// 32 activations (n < 32: zero padded) -> int8 as q8_block: sx = max|x|/L,
// q = rint(x * L/max|x|) with L = levels (127; 31 for z activations); returns sum(q).
// A NaN or an infinity among them: sx NaN and q 0, as q8_block_scalar.
int q8_block_avx2(const float* x, size_t n, int8_t* q, float* sx, float levels) {
  alignas(32) float f[32] = {0};
  std::memcpy(f, x, (n < 32 ? n : 32) * sizeof(float));
  __m256 v[4];
  const float amax = load_absmax32(f, v);  // inf with an infinity; NaNs ignored, so look for them
  __m256 nan = _mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q);
  for (int i = 1; i < 4; ++i) nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
  if (_mm256_movemask_ps(nan) || !(amax <= FLT_MAX)) return q8_bad_block(q, sx);
  *sx = amax / levels;
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? levels / amax : 0.f);
  __m256i qv[4], s = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    qv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    s = _mm256_add_epi32(s, qv[i]);
  }
  // int32 -> int8 (|q| <= 127: no saturation); the packs interleave 128-bit lanes, the permute undoes it
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qv[0], qv[1]), _mm256_packs_epi32(qv[2], qv[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

RMOE_TILED(row_dot_wq_avx2, wq_tile, false)
RMOE_TILED(row_dot_d4_avx2, d4_tile, false)
RMOE_TILED(row_dot_wr_avx2, wr_tile, false)

namespace {

// WR decode GEMV (one token), rows in pairs (rows_dot_wr_avx2). Per block half h, each
// row's products widen to int32 lanes of 4 weights, and the pair meets by blends and one
// in-lane swap (horizontal adds cost several shuffles here): lanes [A, B, A, B | A, B,
// A, B] (rows A, B) of 8 weights, sub-block 2h in the low half, 2h+1 in the high. One
// vector builds the pair's sub-scales: k_s = bits 4s+3:4s of each row's word, 2^(-k/4)
// from the first 8 entries of the table, 2^-2 below for k >= 8 (exponent - 2: exact).
// Each row's D scales its sum at the end.
template <int M>
RMOE_INLINE __m256 wr_pair_group(const uint8_t* ga, const uint8_t* gb, const float* xb, __m256 tot) {
  constexpr int W = 2 * M + 1;
  const __m256i ones16 = _mm256_set1_epi16(1), eight = _mm256_set1_epi32(8);
  const __m256i shifts = _mm256_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12);
  const __m256i half[2] = {_mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3), _mm256_setr_epi32(4, 5, 4, 5, 6, 7, 6, 7)};
  const __m256 t8 = _mm256_loadu_ps(kWrTable);
  __m256i la[2][3], lb[2][3];
  wr_levels<M, false>(ga, la);
  wr_levels<M, false>(gb, lb);
  for (int p = 0; p < M; ++p) {
    const float* x = xb + 48 * p;
    uint16_t wa, wb;
    std::memcpy(&wa, ga + 8 * W + 2 * p, 2);
    std::memcpy(&wb, gb + 8 * W + 2 * p, 2);
    // lanes [A s0, B s0, A s1, B s1, A s2, B s2, A s3, B s3]
    const __m256i k = _mm256_srlv_epi32(_mm256_set1_epi64x((long long)(wa | ((uint64_t)wb << 32))), shifts);
    const __m256i e = _mm256_slli_epi32(_mm256_and_si256(k, eight), 21);
    const __m256 sc = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(t8, k)), e));
    for (int h = 0; h < 2; ++h) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x) + h);
      const __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(la[h][p], xq), ones16);
      const __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(lb[h][p], xq), ones16);
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 + 8 * h));  // -9 * sum x per 4
      const __m256i pair = _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xAA),
                                            _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0xAA), 0xB1));
      const __m256i ab = _mm256_add_epi32(pair, _mm256_add_epi32(c, _mm256_shuffle_epi32(c, 0xB1)));
      const __m256 sch = _mm256_permutevar8x32_ps(sc, half[h]);  // sub-blocks 2h, 2h + 1 in the lanes of ab
      tot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ab), _mm256_mul_ps(sch, _mm256_loadu_ps(x + 16 + 8 * h)), tot);
    }
  }
  return tot;
}

// Rows a and b (b = a for a last odd row): y[0], y[1].
void wr_pair(const uint8_t* qa, const uint8_t* qb, size_t nb, const float* xp, float* y, size_t ahead) {
  __m256 tot = _mm256_setzero_ps();
  size_t off = 2, b0 = 0;
  for (; b0 + 3 <= nb; b0 += 3, off += wr_group_bytes(3)) {
    _mm_prefetch(reinterpret_cast<const char*>(qa + off + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(qb + off + ahead), _MM_HINT_T0);
    tot = wr_pair_group<3>(qa + off, qb + off, xp + 48 * b0, tot);
  }
  if (nb - b0 == 2) tot = wr_pair_group<2>(qa + off, qb + off, xp + 48 * b0, tot);
  if (nb - b0 == 1) tot = wr_pair_group<1>(qa + off, qb + off, xp + 48 * b0, tot);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(tot), _mm256_extractf128_ps(tot, 1));  // [A, B, A, B]
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  y[0] = 0.25f * h2f(qa[0] | (qa[1] << 8)) * _mm_cvtss_f32(s);
  y[1] = 0.25f * h2f(qb[0] | (qb[1] << 8)) * _mm_cvtss_f32(_mm_movehdup_ps(s));
}

// D4 decode GEMV (one token), rows in pairs (rows_dot_d4_avx2), 2 blocks a step. A row's
// low and high nibble products (maddubs pairs <= 2 * 15 * 127) add in int16 and widen to
// int32 lanes of 4 + 4 weights; the pair meets by blends and one in-lane swap: lanes
// [A, B, A, B | A, B, A, B] (rows A, B), block b in the low half, b + 1 in the high. The
// pair's sc and mn bytes come as one vector of the same lanes; each row's D and M scale
// its two sums at the end.
void d4_pair(const uint8_t* qa, const uint8_t* qb, size_t nb, const float* xp, float* y, size_t ahead) {
  const __m256i m4 = _mm256_set1_epi8(0xF), ones16 = _mm256_set1_epi16(1), lo8 = _mm256_set1_epi32(0xFF);
  __m256 tot = _mm256_setzero_ps(), totm = _mm256_setzero_ps();
  const uint8_t* const row[2] = {qa + 4, qb + 4};
  for (size_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    const float* g = xp + (b / 4) * 64 + 8 * ((b % 4) / 2);  // this half of the 4-block group
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16));
    __m256i p[2];
    uint64_t w[2] = {0, 0};  // per block of the step: sc | mn << 8 of row A, then of row B at bit 32
    for (int k = 0; k < 2; ++k) {
      const uint8_t* qr = row[k] + 18 * b;
      _mm_prefetch(reinterpret_cast<const char*>(qr + ahead), _MM_HINT_T0);
      const __m128i v1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(qr + 18)) : _mm_setzero_si128();
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qr));
      const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(v0), v1, 1);
      const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      p[k] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)), ones16);
      w[0] |= (uint64_t)(qr[16] | qr[17] << 8) << (32 * k);
      if (two) w[1] |= (uint64_t)(qr[34] | qr[35] << 8) << (32 * k);
    }
    const __m256i ab = _mm256_add_epi32(_mm256_blend_epi32(p[0], p[1], 0xAA),
                                        _mm256_shuffle_epi32(_mm256_blend_epi32(p[1], p[0], 0xAA), 0xB1));
    const __m256i sm = _mm256_set_epi64x((long long)w[1], (long long)w[1], (long long)w[0], (long long)w[0]);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(sm, lo8)), mn = _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 8));
    tot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ab), _mm256_mul_ps(sc, _mm256_loadu_ps(g + 32)), tot);  // sx per block
    totm = _mm256_fmadd_ps(mn, _mm256_moveldup_ps(_mm256_loadu_ps(g + 48)), totm);  // lane 4b: sx_b * sum(x_b)
  }
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(tot), _mm256_extractf128_ps(tot, 1));  // [A, B, A, B]
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  const __m128 m = _mm_add_ps(_mm256_castps256_ps128(totm), _mm256_extractf128_ps(totm, 1));  // [A, B, 0, 0]
  s = _mm_movelh_ps(s, m);  // [sum A, sum B, min A, min B]
  y[0] = h2f(qa[0] | (qa[1] << 8)) * s[0] - h2f(qa[2] | (qa[3] << 8)) * s[2];
  y[1] = h2f(qb[0] | (qb[1] << 8)) * s[1] - h2f(qb[2] | (qb[3] << 8)) * s[3];
}

// WQ decode GEMV (one token), 4 rows at once (rows_dot_wq_avx2, rows_dot_wq_z_avx2):
// the rows share each activation register. Int8 activations (Z = false): a row's 5
// digits times x sum in int16 (maddubs) and widen by one madd to two int32 lanes per
// block. Z activations (Z = true): the row's 6 digit states u_j times z_j
// (resplit_wq_states.h), each pair sum widened by its own madd (they would overflow
// int16 together). Rows 2j and 2j+1 then meet by blends and one in-lane swap
// (horizontal adds cost several shuffles here): lanes [r0 b0, r1 b0, r0 b1, r1 b1 |
// r0 b2, r1 b2, r0 b3, r1 b3], where one float conversion, activation scale and
// accumulate serve both rows. The 4 rows' block scales are gathered by pshufb into the
// same lanes. Rows past nr repeat the last row (their sums unused).
template <bool Z>
void wq_rows4(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  constexpr int S = Z ? 6 : 5;         // activation registers per 4 blocks
  constexpr size_t G = Z ? 128 : 112;  // floats per 8 blocks: S * 16, then sx[16], c[16]
  const __m256i keep = _mm256_set1_epi64x(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m256i bias = _mm256_set1_epi8((char)0x80), ones16 = _mm256_set1_epi16(1);
  const __m256i lo4 = _mm256_set1_epi16(0xF), hi8 = _mm256_set1_epi16(0x7F80);
  const WqDigits digits;
  const uint8_t* row[4];
  __m256i gather[4];  // bytes 6, 7 of the lane's block b (0, 1) of row k -> 16-bit lane 2b + (k & 1) + 4 (k >> 1)
  for (int k = 0; k < 4; ++k) {
    row[k] = q + (k < (int)nr ? k : nr - 1) * rb;
    alignas(16) int8_t g[16];
    std::memset(g, -128, 16);
    for (int b = 0; b < 2; ++b) {
      const int w = 2 * b + (k & 1) + 4 * (k >> 1);
      g[2 * w] = (int8_t)(8 * b + 6);
      g[2 * w + 1] = (int8_t)(8 * b + 7);
    }
    gather[k] = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(g)));
  }
  __m256 tot[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  // One step: blocks b..b+3 of each row at src[k] (zero padded past the row).
  auto step = [&](size_t b, const uint8_t* const* src) __attribute__((always_inline)) {
    const float* g = xp + (b / 8) * G + 8 * ((b % 8) / 4);  // this half of the 8-block group
    __m256i v[4], acc[4], w = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[k]));
      w = _mm256_or_si256(w, _mm256_shuffle_epi8(raw, gather[k]));
      v[k] = Z ? _mm256_and_si256(raw, keep) : _mm256_xor_si256(_mm256_and_si256(raw, keep), bias);
    }
    for (int i = 0; i < S; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16 * i));
      for (int k = 0; k < 4; ++k) {
        if constexpr (Z) {  // state u_i (u_0: the bytes), int32 sums
          if (i) v[k] = _mm256_add_epi8(v[k], _mm256_add_epi8(v[k], v[k]));
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(v[k], x), ones16);
          acc[k] = i == 0 ? p : _mm256_add_epi32(acc[k], p);
        } else {
          const __m256i p = _mm256_maddubs_epi16(digits.next(v[k]), x);
          acc[k] = i == 0 ? p : _mm256_add_epi16(acc[k], p);
        }
      }
    }
    // f16 scale bits (b6 & 15) << 3 | b7 << 7 of w = b6 | b7 << 8; then qword j of each
    // lane holds rows 2j, 2j+1: vpermq puts rows 0, 1 in the low half, rows 2, 3 in the high
    w = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, lo4), 3), _mm256_and_si256(_mm256_srli_epi16(w, 1), hi8));
    w = _mm256_permute4x64_epi64(w, 0xD8);
    __m256 sx = _mm256_loadu_ps(g + 16 * S);                           // lanes 2b, 2b+1: sx of block b
    if (Z) sx = _mm256_mul_ps(sx, _mm256_set1_ps(1.0f / 256.0f));       // the state sums are 256 x the digit sums
    const __m256 c = _mm256_moveldup_ps(_mm256_loadu_ps(g + 16 * S + 16));  // lane 2b: sx_b * sum(x_b)
    for (int j = 0; j < 2; ++j) {
      const __m256i a0 = Z ? acc[2 * j] : _mm256_madd_epi16(acc[2 * j], ones16);
      const __m256i a1 = Z ? acc[2 * j + 1] : _mm256_madd_epi16(acc[2 * j + 1], ones16);
      const __m256i s = _mm256_add_epi32(_mm256_blend_epi32(a0, a1, 0xAA),
                                         _mm256_shuffle_epi32(_mm256_blend_epi32(a1, a0, 0xAA), 0xB1));
      const __m256 dq = _mm256_cvtph_ps(j ? _mm256_extracti128_si256(w, 1) : _mm256_castsi256_si128(w));
      tot[j] = _mm256_fmadd_ps(dq, _mm256_fmsub_ps(_mm256_cvtepi32_ps(s), sx, c), tot[j]);
    }
  };
  size_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const uint8_t* src[4];
    for (int k = 0; k < 4; ++k) {
      src[k] = row[k] + 8 * b;
      if (b % 8 == 0) _mm_prefetch(reinterpret_cast<const char*>(src[k] + 8 * rb), _MM_HINT_T0);  // 8 rows on
    }
    step(b, src);
  }
  if (b < nb) {  // last partial step: never read past the row
    alignas(32) uint8_t tail[4][32] = {};
    const uint8_t* src[4];
    for (int k = 0; k < 4; ++k) {
      std::memcpy(tail[k], row[k] + 8 * b, 8 * (nb - b));
      src[k] = tail[k];
    }
    step(b, src);
  }
  // tot[j]: [row 2j, 2j+1, 2j, 2j+1 | ...]
  const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(tot[0], tot[1], 0x20),
                                 _mm256_permute2f128_ps(tot[0], tot[1], 0x31));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  const float rows4[4] = {out[0] + out[2], out[1] + out[3], out[4] + out[6], out[5] + out[7]};
  for (size_t k = 0; k < nr && k < 4; ++k) y[k] = rows4[k];
}

}  // namespace

void rows_dot_wq_avx2(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  for (size_t r = 0; r < nr; r += 4) wq_rows4<false>(q + r * rb, rb, nr - r, nb, xp, y + r);
}

// Non-critical WQ rows on 5-bit z activations without VNNI: |z| <= 64 keeps a maddubs
// pair sum (<= 2 * 255 * 64) from saturating.
void rows_dot_wq_z_avx2(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  for (size_t r = 0; r < nr; r += 4) wq_rows4<true>(q + r * rb, rb, nr - r, nb, xp, y + r);
}

namespace {
// Rows two at a time through a pair kernel; an odd last row runs paired with itself.
template <class Pair>
void rows_in_pairs(Pair pair, const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  const size_t ahead = 8 * rb;  // the same blocks 8 rows on (the next row group)
  size_t r = 0;
  for (; r + 2 <= nr; r += 2) pair(q + r * rb, q + (r + 1) * rb, nb, xp, y + r, ahead);
  if (r < nr) {
    float two[2];
    pair(q + r * rb, q + r * rb, nb, xp, two, ahead);
    y[r] = two[0];
  }
}
}  // namespace

void rows_dot_d4_avx2(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  rows_in_pairs(d4_pair, q, rb, nr, nb, xp, y);
}

void rows_dot_wr_avx2(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  rows_in_pairs(wr_pair, q, rb, nr, nb, xp, y);
}

// h = silu(g) * u = g / (1 + e^-g) * u, e^x by simd.h's exp8_ps (as silu_mul_avx512's).
void silu_mul_avx2(const float* g, const float* u, size_t n, float* h) {
  const __m256 one = _mm256_set1_ps(1.f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp8_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace resplit
}  // namespace rmoe

#endif
