// attn_cached's pieces with AVX-512 (F, BW, VL, DQ; called only where isa.cpp allows
// AVX-512): scores of up to 16 (row, key) pairs at once with their 16 partial-sum
// registers folded into one by a shuffle tree (no horizontal sum per score), and the
// weighted sum of values with several rows' outputs held in registers. Both read f16 and
// f32 cache rows in place (f16 converted as it is loaded); q8_0 rows go through an f32
// tile first. Dimensions that are not a multiple of 16 end in masked loads.
#include "attn/attn.h"

#if RMOE_X86
#include <immintrin.h>

#include <cstring>

#include "attn/attn_rows.h"
#include "common/simd.h"

namespace rmoe {

namespace {

#define RMOE_UNROLL _Pragma("GCC unroll 16")

inline __mmask16 tail_mask(size_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

// Lane i of the result = the sum of v[i]'s 16 lanes (a transpose-and-add tree: 15 adds).
RMOE_INLINE __m512 fold16(const __m512 (&v)[16]) {
  __m512 s[8], t[4], w[2];
  RMOE_UNROLL
  for (int i = 0; i < 8; ++i)  // 128-bit block b of s[i]: [a0+a2, b0+b2, a1+a3, b1+b3] for a = v[2i], b = v[2i+1]
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  RMOE_UNROLL
  for (int i = 0; i < 4; ++i) {  // block b of t[i]: block b's sums of v[4i .. 4i+3], in order
    const __m512d c = _mm512_castps_pd(s[2 * i]), d = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
  }
  RMOE_UNROLL
  for (int i = 0; i < 2; ++i)  // blocks [t0 b0+b1, t0 b2+b3, t1 b0+b1, t1 b2+b3]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

// Where the keys and values come from: an f32 tile (rows f32 values apart), or the cache's
// own f32 or f16 rows (stride bytes apart), converted as they are loaded.
struct F32Rows {
  const float* p;
  size_t stride;  // floats
  RMOE_INLINE __m512 load(size_t t, size_t d, __mmask16 m) const {
    return _mm512_maskz_loadu_ps(m, p + t * stride + d);
  }
};
struct F16Rows {
  const uint8_t* p;
  size_t stride;  // bytes
  RMOE_INLINE __m512 load(size_t t, size_t d, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + t * stride + 2 * d));
  }
};

// Scores of R rows against K keys (R * K = 16): accumulator r * K + k holds q_r . key_k.
template <int R, int K, class Rows>
void scores_block(const float* q, size_t qstride, const Rows& keys, size_t t0, size_t dim, float scale, float* s,
                  size_t sstride) {
  static_assert(R * K == 16, "one register per (row, key) pair, 16 of them");
  __m512 acc[16];
  RMOE_UNROLL
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t d = 0; d < dim; d += 16) {
    const __mmask16 m = tail_mask(dim - d);
    __m512 kv[K];
    RMOE_UNROLL
    for (int k = 0; k < K; ++k) kv[k] = keys.load(t0 + k, d, m);
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(m, q + r * qstride + d);
      RMOE_UNROLL
      for (int k = 0; k < K; ++k) acc[r * K + k] = _mm512_fmadd_ps(x, kv[k], acc[r * K + k]);
    }
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_mul_ps(fold16(acc), _mm512_set1_ps(scale)));
  RMOE_UNROLL
  for (int r = 0; r < R; ++r)
    RMOE_UNROLL
    for (int k = 0; k < K; ++k) s[r * sstride + k] = out[r * K + k];
}

// Keys of the tile in steps of K for R rows; keys left over one at a time.
template <int R, int K, class Rows>
void scores_rows(const float* q, size_t qstride, const Rows& keys, size_t n, size_t dim, float scale, float* s,
                 size_t sstride) {
  size_t t = 0;
  for (; t + K <= n; t += K) scores_block<R, K>(q, qstride, keys, t, dim, scale, s + t, sstride);
  for (; t < n; ++t)
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      __m512 a = _mm512_setzero_ps();
      for (size_t d = 0; d < dim; d += 16) {
        const __mmask16 m = tail_mask(dim - d);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + r * qstride + d), keys.load(t, d, m), a);
      }
      s[r * sstride + t] = _mm512_reduce_add_ps(a) * scale;
    }
}

// R rows' outputs o[r][d0 .. d0 + 16 * DV) in registers over the tile's keys.
template <int R, int DV, class Rows>
void accum_block(const float* p, size_t pstride, const Rows& vals, size_t n, size_t d0, size_t dim, const float* c,
                 float* const* o) {
  __mmask16 m[DV];
  RMOE_UNROLL
  for (int i = 0; i < DV; ++i) m[i] = d0 + 16 * i < dim ? tail_mask(dim - d0 - 16 * i) : (__mmask16)0;
  __m512 acc[R][DV];
  RMOE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 c16 = _mm512_set1_ps(c[r]);
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) acc[r][i] = _mm512_mul_ps(c16, _mm512_maskz_loadu_ps(m[i], o[r] + d0 + 16 * i));
  }
  for (size_t t = 0; t < n; ++t) {
    __m512 v[DV];
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) v[i] = vals.load(t, d0 + 16 * i, m[i]);
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * pstride + t]);
      RMOE_UNROLL
      for (int i = 0; i < DV; ++i) acc[r][i] = _mm512_fmadd_ps(w, v[i], acc[r][i]);
    }
  }
  RMOE_UNROLL
  for (int r = 0; r < R; ++r)
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) _mm512_mask_storeu_ps(o[r] + d0 + 16 * i, m[i], acc[r][i]);
}

template <int R, int DV, class Rows>
void accum_rows(const float* p, size_t pstride, const Rows& vals, size_t n, size_t dim, const float* c,
                float* const* o) {
  for (size_t d0 = 0; d0 < dim; d0 += 16 * DV) accum_block<R, DV>(p, pstride, vals, n, d0, dim, c, o);
}

template <class Rows>
void scores_all(const float* q, size_t nq, size_t qstride, const Rows& keys, size_t n, size_t dim, float scale,
                float* s, size_t sstride) {
  in_blocks<8>(nq, [&](auto r, size_t h) {  // 8 rows x 2 keys, 4 x 4, 2 x 8, 1 x 16
    scores_rows<decltype(r)::value, 16 / decltype(r)::value>(q + h * qstride, qstride, keys, n, dim, scale,
                                                               s + h * sstride, sstride);
  });
}

template <class Rows>
void accum_all(const float* p, size_t pstride, size_t rows, const Rows& vals, size_t n, size_t dim, const float* c,
               float* const* o) {
  in_blocks<8>(rows, [&](auto r, size_t i) {  // 8 rows x 32 dims, 4 x 64, 2 x 128, 1 x 128
    constexpr int R = decltype(r)::value;
    accum_rows<R, R == 1 ? 8 : 16 / R>(p + i * pstride, pstride, vals, n, dim, c + i, o + i);
  });
}

}  // namespace

void kv_rows_f32_avx512(const KvRows& c, size_t g, size_t j0, size_t n, float* tile) {
  rows_to_tile(
      c, g, j0, n, tile,
      [](const uint8_t* r, size_t d, float* out) {
        for (size_t i = 0; i < d; i += 16) {
          const __mmask16 m = tail_mask(d - i);
          const __m256i h = _mm256_maskz_loadu_epi16(m, r + 2 * i);
          _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(h));
        }
      },
      [](const uint8_t* r, float* out) {  // q8_0: 32 values per block
        const __m512 s = _mm512_set1_ps(h2f((uint32_t)(r[0] | r[1] << 8)));
        RMOE_UNROLL
        for (int i = 0; i < 2; ++i) {
          const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 + 16 * i));
          _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8))));
        }
      });
}

// The entry points the kernel table names: twins of attn_avx2.cpp's on purpose.
void kv_scores_avx512(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                      float* s, size_t sstride) {
  scores_all(q, nq, qstride, F32Rows{tile, dim}, n, dim, scale, s, sstride);
}

void kv_accum_avx512(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                     size_t dim, const float* c, float* const* o) {
  accum_all(p, pstride, rows, F32Rows{tile, tstride}, n, dim, c, o);
}

void kv_scores_rows_avx512(const float* q, size_t nq, size_t qstride, const KvRows& k, size_t g, size_t j0, size_t n,
                           float scale, float* s, size_t sstride) {
  on_cache_rows<F16Rows, F32Rows>(
      k, g, j0, [&](const auto& keys) { scores_all(q, nq, qstride, keys, n, k.dim, scale, s, sstride); });
}

void kv_accum_rows_avx512(const float* p, size_t pstride, size_t rows, const KvRows& v, size_t g, size_t j0, size_t n,
                          const float* c, float* const* o) {
  on_cache_rows<F16Rows, F32Rows>(
      v, g, j0, [&](const auto& vals) { accum_all(p, pstride, rows, vals, n, v.dim, c, o); });
}

}  // namespace rmoe

#endif
