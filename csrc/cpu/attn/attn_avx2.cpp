// attn_cached's pieces with AVX2 + FMA + F16C (called only where isa.cpp allows AVX2):
// scores of 8 (row, key) pairs at once folded by hadd trees, a row's maximum, e^x
// (simd.h's exp8_ps), and the weighted sum of values with several rows' outputs held in
// registers. Both read f16 and f32 cache rows in place (f16 converted as it is loaded);
// q8_0 rows go through an f32 tile first.
#include "attn/attn.h"

#if RMOE_X86
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "attn/attn_rows.h"
#include "common/simd.h"

namespace rmoe {

namespace {

#define RMOE_UNROLL _Pragma("GCC unroll 16")

// Where the keys and values come from: an f32 tile (rows `stride` floats apart), or the
// cache's own f32 or f16 rows (stride bytes apart), converted as they are loaded.
struct F32Rows {
  const float* p;
  size_t stride;  // floats
  RMOE_INLINE __m256 load8(size_t t, size_t d) const { return _mm256_loadu_ps(p + t * stride + d); }
  RMOE_INLINE float load1(size_t t, size_t d) const { return p[t * stride + d]; }
};
struct F16Rows {
  const uint8_t* p;
  size_t stride;  // bytes
  RMOE_INLINE __m256 load8(size_t t, size_t d) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + t * stride + 2 * d)));
  }
  RMOE_INLINE float load1(size_t t, size_t d) const {
    const uint8_t* b = p + t * stride + 2 * d;
    return h2f((uint32_t)(b[0] | b[1] << 8));
  }
};

}  // namespace

void kv_rows_f32_avx2(const KvRows& c, size_t g, size_t j0, size_t n, float* tile) {
  rows_to_tile(
      c, g, j0, n, tile,
      [](const uint8_t* r, size_t d, float* out) {
        size_t i = 0;
        for (; i + 8 <= d; i += 8)
          _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * i))));
        for (; i < d; ++i) out[i] = h2f((uint32_t)(r[2 * i] | r[2 * i + 1] << 8));
      },
      [](const uint8_t* r, float* out) {
        const __m256 s = _mm256_set1_ps(h2f((uint32_t)(r[0] | r[1] << 8)));
        RMOE_UNROLL
        for (int i = 0; i < 4; ++i) {
          const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 2 + 8 * i));
          _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
        }
      });
}

namespace {

// Lane i of the result = the sum of v[i]'s 8 lanes (two rounds of hadd, then the halves).
RMOE_INLINE __m256 fold8(const __m256 (&v)[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Scores of R rows against K keys (R * K = 8): accumulator r * K + k holds q_r . key_k.
template <int R, int K, class Rows>
void scores_rows(const float* q, size_t qstride, const Rows& keys, size_t n, size_t dim, float scale, float* s,
                 size_t sstride) {
  static_assert(R * K == 8, "one register per (row, key) pair, 8 of them");
  const size_t d8 = dim / 8 * 8;
  size_t t = 0;
  for (; t + K <= n; t += K) {
    __m256 acc[8];
    RMOE_UNROLL
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t d = 0; d < d8; d += 8) {
      __m256 kv[K];
      RMOE_UNROLL
      for (int k = 0; k < K; ++k) kv[k] = keys.load8(t + k, d);
      RMOE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_loadu_ps(q + r * qstride + d);
        RMOE_UNROLL
        for (int k = 0; k < K; ++k) acc[r * K + k] = _mm256_fmadd_ps(x, kv[k], acc[r * K + k]);
      }
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, fold8(acc));
    RMOE_UNROLL
    for (int r = 0; r < R; ++r)
      RMOE_UNROLL
      for (int k = 0; k < K; ++k) {
        float v = out[r * K + k];
        for (size_t d = d8; d < dim; ++d) v += q[r * qstride + d] * keys.load1(t + k, d);
        s[r * sstride + t + k] = v * scale;
      }
  }
  for (; t < n; ++t)
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256 a = _mm256_setzero_ps();
      for (size_t d = 0; d < d8; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * qstride + d), keys.load8(t, d), a);
      float v = hsum8(a);
      for (size_t d = d8; d < dim; ++d) v += q[r * qstride + d] * keys.load1(t, d);
      s[r * sstride + t] = v * scale;
    }
}

template <class Rows>
void scores_all(const float* q, size_t nq, size_t qstride, const Rows& keys, size_t n, size_t dim, float scale,
                float* s, size_t sstride) {
  in_blocks<4>(nq, [&](auto r, size_t h) {  // 4 rows x 2 keys, 2 x 4, 1 x 8
    scores_rows<decltype(r)::value, 8 / decltype(r)::value>(q + h * qstride, qstride, keys, n, dim, scale,
                                                              s + h * sstride, sstride);
  });
}

}  // namespace

void kv_scores_avx2(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                    float* s, size_t sstride) {
  scores_all(q, nq, qstride, F32Rows{tile, dim}, n, dim, scale, s, sstride);
}

void kv_scores_rows_avx2(const float* q, size_t nq, size_t qstride, const KvRows& k, size_t g, size_t j0, size_t n,
                         float scale, float* s, size_t sstride) {
  on_cache_rows<F16Rows, F32Rows>(
      k, g, j0, [&](const auto& keys) { scores_all(q, nq, qstride, keys, n, k.dim, scale, s, sstride); });
}

float kv_max_avx2(const float* p, size_t n) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(p + t));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float m = _mm_cvtss_f32(m4);
  for (; t < n; ++t) m = p[t] > m ? p[t] : m;
  return m;
}

float kv_exp_avx2(float* p, size_t n, float m) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 m8 = _mm256_set1_ps(m);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8_ps(_mm256_sub_ps(_mm256_loadu_ps(p + t), m8));
    _mm256_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum8(acc);
  for (; t < n; ++t) sum += (p[t] = std::exp(p[t] - m));
  return sum;
}

namespace {

// R rows' outputs o[r][d0 .. d0 + 8 * DV) in registers over the tile's keys (d0 + 8 * DV <= dim).
template <int R, int DV, class Rows>
void accum_block(const float* p, size_t pstride, const Rows& vals, size_t n, size_t d0, const float* c,
                 float* const* o) {
  __m256 acc[R][DV];
  RMOE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m256 c8 = _mm256_set1_ps(c[r]);
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) acc[r][i] = _mm256_mul_ps(c8, _mm256_loadu_ps(o[r] + d0 + 8 * i));
  }
  for (size_t t = 0; t < n; ++t) {
    __m256 v[DV];
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) v[i] = vals.load8(t, d0 + 8 * i);
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * pstride + t);
      RMOE_UNROLL
      for (int i = 0; i < DV; ++i) acc[r][i] = _mm256_fmadd_ps(w, v[i], acc[r][i]);
    }
  }
  RMOE_UNROLL
  for (int r = 0; r < R; ++r)
    RMOE_UNROLL
    for (int i = 0; i < DV; ++i) _mm256_storeu_ps(o[r] + d0 + 8 * i, acc[r][i]);
}

// R rows: 8 * DV outputs at a time, then 8, then the last ones one by one.
template <int R, int DV, class Rows>
void accum_rows(const float* p, size_t pstride, const Rows& vals, size_t n, size_t dim, const float* c,
                float* const* o) {
  size_t d0 = 0;
  for (; d0 + 8 * DV <= dim; d0 += 8 * DV) accum_block<R, DV>(p, pstride, vals, n, d0, c, o);
  for (; d0 + 8 <= dim; d0 += 8) accum_block<R, 1>(p, pstride, vals, n, d0, c, o);
  for (; d0 < dim; ++d0)
    RMOE_UNROLL
    for (int r = 0; r < R; ++r) {
      float acc = c[r] * o[r][d0];
      for (size_t t = 0; t < n; ++t) acc += p[r * pstride + t] * vals.load1(t, d0);
      o[r][d0] = acc;
    }
}

template <class Rows>
void accum_all(const float* p, size_t pstride, size_t rows, const Rows& vals, size_t n, size_t dim, const float* c,
               float* const* o) {
  // every value load feeds 3 (or 2) rows' FMAs: 12 (8) accumulators of the 16 registers
  size_t r = 0;
  for (; r + 3 <= rows; r += 3) accum_rows<3, 4>(p + r * pstride, pstride, vals, n, dim, c + r, o + r);
  if (r + 2 <= rows)
    accum_rows<2, 4>(p + r * pstride, pstride, vals, n, dim, c + r, o + r);
  else if (r < rows)
    accum_rows<1, 8>(p + r * pstride, pstride, vals, n, dim, c + r, o + r);
}

}  // namespace

// The entry points the kernel table names; attn_avx512.cpp has their twins on purpose
// (the same calls on its own row types).
void kv_accum_avx2(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                   size_t dim, const float* c, float* const* o) {
  accum_all(p, pstride, rows, F32Rows{tile, tstride}, n, dim, c, o);
}

void kv_accum_rows_avx2(const float* p, size_t pstride, size_t rows, const KvRows& v, size_t g, size_t j0, size_t n,
                        const float* c, float* const* o) {
  on_cache_rows<F16Rows, F32Rows>(
      v, g, j0, [&](const auto& vals) { accum_all(p, pstride, rows, vals, n, v.dim, c, o); });
}

}  // namespace rmoe

#endif
