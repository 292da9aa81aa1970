// attn_cached's pieces with AVX2 + FMA + F16C (called only where isa.cpp allows AVX2):
// cache rows to f32 tiles, dot products of 8 lanes, e^x (simd.h's exp8_ps), and the
// weighted sum of values.
#include "attn.h"

#if RMOE_X86
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "simd.h"

namespace rmoe {

namespace {

inline float dot8(const float* a, const float* b, size_t n) {
  __m256 s = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
  float t = hsum8(s);
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

}  // namespace

void kv_rows_f32_avx2(const KvRows& c, size_t g, size_t j0, size_t n, float* tile) {
  const size_t d = c.dim;
  for (size_t t = 0; t < n; ++t, tile += d) {
    const uint8_t* r = c.base + (j0 + t) * c.pos_stride + g * c.head_stride;
    if (c.type == KvType::F32) {
      std::memcpy(tile, r, d * sizeof(float));
    } else if (c.type == KvType::F16) {
      size_t i = 0;
      for (; i + 8 <= d; i += 8)
        _mm256_storeu_ps(tile + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * i))));
      for (; i < d; ++i) tile[i] = h2f((uint32_t)(r[2 * i] | r[2 * i + 1] << 8));
    } else {
      for (size_t b = 0; b < d / 32; ++b, r += 34) {
        const __m256 s = _mm256_set1_ps(h2f((uint32_t)(r[0] | r[1] << 8)));
        for (int i = 0; i < 4; ++i) {
          const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 2 + 8 * i));
          _mm256_storeu_ps(tile + 32 * b + 8 * i, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
        }
      }
    }
  }
}

void kv_scores_avx2(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                    float* s, size_t sstride) {
  const size_t d8 = dim / 8 * 8;
  size_t h = 0;
  // two heads x four keys: each key load feeds two FMAs, each query load four
  for (; h + 2 <= nq; h += 2) {
    const float *q0 = q + h * qstride, *q1 = q0 + qstride;
    size_t t = 0;
    for (; t + 4 <= n; t += 4) {
      const float* k0 = tile + t * dim;
      __m256 a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
      for (size_t d = 0; d < d8; d += 8) {
        const __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);
        for (int i = 0; i < 4; ++i) {
          const __m256 kv = _mm256_loadu_ps(k0 + i * dim + d);
          a[i] = _mm256_fmadd_ps(x0, kv, a[i]);
          a[4 + i] = _mm256_fmadd_ps(x1, kv, a[4 + i]);
        }
      }
      for (int i = 0; i < 4; ++i) {
        float t0 = hsum8(a[i]), t1 = hsum8(a[4 + i]);
        for (size_t d = d8; d < dim; ++d) {
          t0 += q0[d] * k0[i * dim + d];
          t1 += q1[d] * k0[i * dim + d];
        }
        s[h * sstride + t + i] = t0 * scale;
        s[(h + 1) * sstride + t + i] = t1 * scale;
      }
    }
    for (; t < n; ++t) {
      s[h * sstride + t] = dot8(q0, tile + t * dim, dim) * scale;
      s[(h + 1) * sstride + t] = dot8(q1, tile + t * dim, dim) * scale;
    }
  }
  for (; h < nq; ++h)
    for (size_t t = 0; t < n; ++t) s[h * sstride + t] = dot8(q + h * qstride, tile + t * dim, dim) * scale;
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

// One row: 64 outputs in registers over the tile's keys, then 8, then single ones.
void accum_row(const float* p, const float* tile, size_t tstride, size_t n, size_t dim, float c, float* o) {
  const __m256 c8 = _mm256_set1_ps(c);
  size_t d0 = 0;
  for (; d0 + 64 <= dim; d0 += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_mul_ps(c8, _mm256_loadu_ps(o + d0 + 8 * i));
    for (size_t t = 0; t < n; ++t) {
      const __m256 w8 = _mm256_set1_ps(p[t]);
      const float* vt = tile + t * tstride + d0;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(w8, _mm256_loadu_ps(vt + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
  }
  for (; d0 + 8 <= dim; d0 += 8) {
    __m256 acc = _mm256_mul_ps(c8, _mm256_loadu_ps(o + d0));
    for (size_t t = 0; t < n; ++t) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(tile + t * tstride + d0), acc);
    _mm256_storeu_ps(o + d0, acc);
  }
  for (; d0 < dim; ++d0) {
    float acc = c * o[d0];
    for (size_t t = 0; t < n; ++t) acc += p[t] * tile[t * tstride + d0];
    o[d0] = acc;
  }
}

// Three rows at once, 32 outputs each: every value load feeds three FMAs.
void accum_rows3(const float* p, size_t pstride, const float* tile, size_t tstride, size_t n, size_t dim,
                 const float* c, float* const* o) {
  size_t d0 = 0;
  for (; d0 + 32 <= dim; d0 += 32) {
    __m256 acc[3][4];
    for (int r = 0; r < 3; ++r) {
      const __m256 c8 = _mm256_set1_ps(c[r]);
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_mul_ps(c8, _mm256_loadu_ps(o[r] + d0 + 8 * i));
    }
    for (size_t t = 0; t < n; ++t) {
      const float* vt = tile + t * tstride + d0;
      const __m256 v0 = _mm256_loadu_ps(vt), v1 = _mm256_loadu_ps(vt + 8), v2 = _mm256_loadu_ps(vt + 16),
                   v3 = _mm256_loadu_ps(vt + 24);
      for (int r = 0; r < 3; ++r) {
        const __m256 w8 = _mm256_broadcast_ss(p + r * pstride + t);
        acc[r][0] = _mm256_fmadd_ps(w8, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w8, v1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(w8, v2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(w8, v3, acc[r][3]);
      }
    }
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(o[r] + d0 + 8 * i, acc[r][i]);
  }
  if (d0 < dim)  // the last outputs one row at a time
    for (int r = 0; r < 3; ++r) accum_row(p + r * pstride, tile + d0, tstride, n, dim - d0, c[r], o[r] + d0);
}

}  // namespace

void kv_accum_avx2(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                   size_t dim, const float* c, float* const* o) {
  size_t r = 0;
  for (; r + 3 <= rows; r += 3) accum_rows3(p + r * pstride, pstride, tile, tstride, n, dim, c + r, o + r);
  for (; r < rows; ++r) accum_row(p + r * pstride, tile, tstride, n, dim, c[r], o[r]);
}

}  // namespace rmoe

#else  // non-x86: never selected
namespace rmoe {
void kv_rows_f32_avx2(const KvRows&, size_t, size_t, size_t, float*) {}
void kv_scores_avx2(const float*, size_t, size_t, const float*, size_t, size_t, float, float*, size_t) {}
float kv_exp_avx2(float*, size_t, float) { return 0.f; }
void kv_accum_avx2(const float*, size_t, size_t, const float*, size_t, size_t, size_t, const float*, float* const*) {}
}  // namespace rmoe
#endif
