#include "attn/attn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attn/attn_rows.h"
#include "common/convert.h"
#include "common/threadpool.h"
#include "kernel_table.h"

namespace rmoe {

namespace {

constexpr size_t kTile = 32;          // keys converted to f32 and scored at once
constexpr size_t kPrefetch = 2 * kTile;  // rows asked for this far ahead of the tile in use

// float -> IEEE half, rounding to nearest even (as F16C and torch do); overflow to inf.
uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  // nan
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 (or inf): inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24 (exact product)
    float v;
    std::memcpy(&v, &ax, 4);
    return (uint16_t)(sign | (uint32_t)std::nearbyint(v * 16777216.0f));
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3ffu);
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // a carry moves into the exponent, as it should
  return (uint16_t)(sign | h);
}

// x * rsqrt(mean(x^2) + eps) * w over one head.
void rms_head(float* x, size_t n, const float* w, float eps) {
  float ss = 0.f;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / (float)n + eps);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * r * w[i];
}

// Eight partial sums: the compiler vectorizes them without reassociating a single sum.
inline float dot(const float* a, const float* b, size_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

const uint8_t* row_at(const KvRows& c, size_t j, size_t g) { return c.base + j * c.pos_stride + g * c.head_stride; }

// Asks for rows j0..j1 of group g ahead of their use: at long contexts the cache streams
// from DRAM, and a tile's compute is too short to hide its own misses.
void prefetch_rows(const KvRows& c, size_t g, size_t j0, size_t j1) {
  const size_t rb = kv_row_bytes(c.type, c.dim);
  for (size_t j = j0; j < j1; ++j) {
    const uint8_t* r = row_at(c, j, g);
    for (size_t b = 0; b < rb; b += 64) __builtin_prefetch(r + b);
  }
}

}  // namespace

// The portable pieces of attn_cached (the ISA ones are in attn_avx2.cpp, attn_avx512.cpp).
void kv_rows_f32_scalar(const KvRows& c, size_t g, size_t j0, size_t n, float* tile) {
  rows_to_tile(
      c, g, j0, n, tile,
      [](const uint8_t* r, size_t d, float* out) {
        for (size_t i = 0; i < d; ++i) out[i] = f16_to_f32((uint16_t)(r[2 * i] | r[2 * i + 1] << 8));
      },
      [](const uint8_t* r, float* out) {
        const float s = f16_to_f32((uint16_t)(r[0] | r[1] << 8));
        for (size_t i = 0; i < 32; ++i) out[i] = s * (float)(int8_t)r[2 + i];
      });
}

void kv_scores_scalar(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                      float* s, size_t sstride) {
  for (size_t h = 0; h < nq; ++h)
    for (size_t t = 0; t < n; ++t) s[h * sstride + t] = dot(q + h * qstride, tile + t * dim, dim) * scale;
}

float kv_max_scalar(const float* p, size_t n) { return n ? *std::max_element(p, p + n) : -INFINITY; }

float kv_exp_scalar(float* p, size_t n, float m) {
  float sum = 0.f;
  for (size_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - m));
  return sum;
}

void kv_accum_scalar(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                     size_t dim, const float* c, float* const* o) {
  for (size_t r = 0; r < rows; ++r, p += pstride) {
    float* orow = o[r];
    for (size_t d = 0; d < dim; ++d) orow[d] *= c[r];
    for (size_t t = 0; t < n; ++t)
      for (size_t d = 0; d < dim; ++d) orow[d] += p[t] * tile[t * tstride + d];
  }
}

size_t kv_row_bytes(KvType t, size_t dim) {
  return t == KvType::F32 ? dim * 4 : t == KvType::F16 ? dim * 2 : dim / 32 * 34;
}

void kv_store(const KvRows& c, size_t pos, size_t n_heads, const float* x) {
  const size_t d = c.dim;
  for (size_t g = 0; g < n_heads; ++g, x += d) {
    uint8_t* r = c.base + pos * c.pos_stride + g * c.head_stride;
    if (c.type == KvType::F32) {
      std::memcpy(r, x, d * sizeof(float));
    } else if (c.type == KvType::F16) {
      for (size_t i = 0; i < d; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        r[2 * i] = (uint8_t)h;
        r[2 * i + 1] = (uint8_t)(h >> 8);
      }
    } else {
      for (size_t b = 0; b < d / 32; ++b, r += 34) {
        const float* xb = x + 32 * b;
        float amax = 0.f;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float s = amax / 127.f, inv = s != 0.f ? 1.0f / s : 0.f;
        const uint16_t h = f32_to_f16(s);
        r[0] = (uint8_t)h;
        r[1] = (uint8_t)(h >> 8);
        for (size_t i = 0; i < 32; ++i) r[2 + i] = (uint8_t)(int8_t)std::nearbyint(xb[i] * inv);
      }
    }
  }
}

namespace {

// The work of one task of attn_cached: query rows (t, h) of queries t0..t0+tn-1 and the heads
// of group g, over keys [j0, j1) (each row's own causal end within it). m, l: each row's running
// maximum and sum; o[r]: its output (unnormalized, accumulated in place).
struct AttnTask {
  const float* q;
  size_t n_head, rep, pos0;
  const KvRows *K, *V;
  bool shared;  // V is the leading part of the K rows: read from the K tile
  float scale;
};

void run_rows(const AttnTask& A, size_t g, size_t t0, size_t tn, size_t j0, size_t j1, float* m, float* l,
              float* const* o, std::vector<float>& qb, std::vector<float>& kt, std::vector<float>& vt,
              std::vector<float>& s, std::vector<float>& cr) {
  const TileOps& op = kernels().attn;
  // f16 / f32 rows are read in place where the ISA can; q8_0 (and the portable path) via a tile
  const bool direct = op.scores_rows && A.K->type != KvType::Q8_0 && A.V->type != KvType::Q8_0;
  const size_t rep = A.rep, hd = A.K->dim, hdv = A.V->dim, rows = tn * rep;
  for (size_t t = 0; t < tn; ++t)  // rows t * rep + h, contiguous for the score kernel
    std::memcpy(qb.data() + t * rep * hd, A.q + ((t0 + t) * A.n_head + g * rep) * hd, rep * hd * sizeof(float));
  std::fill(m, m + rows, -INFINITY);
  std::fill(l, l + rows, 0.f);
  const size_t end = std::min(j1, A.pos0 + t0 + tn);  // the last query's causal end
  for (size_t j = j0; j < end; j += kTile) {
    const size_t n = std::min(kTile, end - j);
    // rows whose query sees none of this tile come first (earlier queries): skip them
    const size_t t_first = j > A.pos0 + t0 ? j - A.pos0 - t0 : 0, r0 = t_first * rep;
    if (j + kPrefetch < end) {
      const size_t pe = std::min(end, j + kPrefetch + kTile);
      prefetch_rows(*A.K, g, j + kPrefetch, pe);
      if (!A.shared) prefetch_rows(*A.V, g, j + kPrefetch, pe);
    }
    const float* vrows = kt.data();
    if (direct) {
      op.scores_rows(qb.data() + r0 * hd, rows - r0, hd, *A.K, g, j, n, A.scale, s.data() + r0 * kTile, kTile);
    } else {
      op.rows_f32(*A.K, g, j, n, kt.data());
      op.scores(qb.data() + r0 * hd, rows - r0, hd, kt.data(), n, hd, A.scale, s.data() + r0 * kTile, kTile);
      if (!A.shared) {
        op.rows_f32(*A.V, g, j, n, vt.data());
        vrows = vt.data();
      }
    }
    for (size_t r = r0; r < rows; ++r) {
      const size_t lim = A.pos0 + t0 + r / rep + 1, cnt = std::min(n, lim - j);  // keys of the tile this row sees
      float* sr = s.data() + r * kTile;
      const float mt = op.max(sr, cnt), mn = std::max(m[r], mt);
      float c = 1.f;  // a row that saw nothing finite yet keeps its (zero) output: weights 0
      if (mn == -INFINITY) {
        std::fill(sr, sr + n, 0.f);
      } else {
        c = m[r] == -INFINITY ? 0.f : std::exp(m[r] - mn);
        l[r] = l[r] * c + op.exp(sr, cnt, mn);
        m[r] = mn;
        std::fill(sr + cnt, sr + n, 0.f);  // keys past the row's causal end weigh 0: rows go through together
      }
      cr[r] = c;
    }
    if (direct)
      op.accum_rows(s.data() + r0 * kTile, kTile, rows - r0, *A.V, g, j, n, cr.data() + r0, o + r0);
    else
      op.accum(s.data() + r0 * kTile, kTile, rows - r0, vrows, A.shared ? hd : hdv, n, hdv, cr.data() + r0, o + r0);
  }
}

}  // namespace

void attn_cached(const float* q, size_t n_q, size_t n_head, size_t n_groups, const KvRows& K, const KvRows& V,
                 size_t pos0, float scale, float* out) {
  const size_t rep = n_head / n_groups, hd = K.dim, hdv = V.dim, S = pos0 + n_q;
  const AttnTask A{q, n_head, rep, pos0, &K, &V,
                   V.base == K.base && V.type == K.type && V.pos_stride == K.pos_stride &&
                       V.head_stride == K.head_stride && V.dim <= K.dim,
                   scale};
  // Tasks: (group, block of queries, block of keys). Query blocks of ~128 rows share each
  // K/V tile; keys are split only when there are too few query blocks to busy every thread.
  const size_t QB = std::max<size_t>(1, std::min(n_q, 128 / std::max<size_t>(rep, 1)));
  const size_t nqb = (n_q + QB - 1) / QB, T = (size_t)num_threads();
  const bool worth = S * n_q * n_head * (hd + hdv) >= (size_t(1) << 17);
  size_t nb = 1;
  if (worth && n_groups * nqb < 2 * T)
    nb = std::max<size_t>(1, std::min((S + 127) / 128, (2 * T + n_groups * nqb - 1) / (n_groups * nqb)));
  const size_t blk = (S + nb - 1) / nb;
  nb = (S + blk - 1) / blk;
  const size_t rows_max = QB * rep;
  // with key blocks, each keeps its own max, sum and output per row, merged below
  std::vector<float> part(nb > 1 ? n_groups * nqb * nb * rows_max * (2 + hdv) : 0);
  const size_t n_tasks = n_groups * nqb * nb;
  parallel_for(n_tasks, [&](size_t i0, size_t i1, int) {
    std::vector<float> qb(rows_max * hd), kt(kTile * hd), vt(A.shared ? 0 : kTile * hdv), s(rows_max * kTile);
    std::vector<float> ml(nb > 1 ? 0 : 2 * rows_max), cr(rows_max);
    std::vector<float*> o(rows_max);
    for (size_t i = i0; i < i1; ++i) {
      // later query blocks see more keys: alternate ends so contiguous chunks balance
      const size_t u = i / nb, b = i % nb, g = u % n_groups, w = u / n_groups;
      const size_t qi = w % 2 == 0 ? w / 2 : nqb - 1 - w / 2;
      const size_t t0 = qi * QB, tn = std::min(QB, n_q - t0), rows = tn * rep;
      float *m, *l;
      if (nb > 1) {
        m = part.data() + ((g * nqb + qi) * nb + b) * rows_max * (2 + hdv);
        l = m + rows_max;
        for (size_t r = 0; r < rows; ++r) o[r] = l + rows_max + r * hdv;
      } else {
        m = ml.data();
        l = m + rows_max;
        for (size_t r = 0; r < rows; ++r) o[r] = out + ((t0 + r / rep) * n_head + g * rep + r % rep) * hdv;
      }
      for (size_t r = 0; r < rows; ++r) std::fill(o[r], o[r] + hdv, 0.f);
      run_rows(A, g, t0, tn, b * blk, std::min(S, (b + 1) * blk), m, l, o.data(), qb, kt, vt, s, cr);
      if (nb == 1)
        for (size_t r = 0; r < rows; ++r) {
          const float inv = 1.0f / l[r];
          for (size_t d = 0; d < hdv; ++d) o[r][d] *= inv;
        }
    }
  }, worth ? 1 : n_tasks);
  if (nb == 1) return;
  for (size_t g = 0; g < n_groups; ++g)
    for (size_t qi = 0; qi < nqb; ++qi) {
      const size_t t0 = qi * QB, rows = std::min(QB, n_q - t0) * rep;
      for (size_t r = 0; r < rows; ++r) {
        const float* p0 = part.data() + (g * nqb + qi) * nb * rows_max * (2 + hdv);
        const size_t stride = rows_max * (2 + hdv);
        float mx = -INFINITY;
        for (size_t b = 0; b < nb; ++b) mx = std::max(mx, p0[b * stride + r]);
        float den = 0.f;
        float* oh = out + ((t0 + r / rep) * n_head + g * rep + r % rep) * hdv;
        std::fill(oh, oh + hdv, 0.f);
        for (size_t b = 0; b < nb; ++b) {
          const float* pb = p0 + b * stride;
          if (pb[r] == -INFINITY) continue;  // a key block past this query's end
          const float w = std::exp(pb[r] - mx);
          den += w * pb[rows_max + r];
          const float* ob = pb + 2 * rows_max + r * hdv;
          for (size_t d = 0; d < hdv; ++d) oh[d] += w * ob[d];
        }
        const float inv = 1.0f / den;
        for (size_t d = 0; d < hdv; ++d) oh[d] *= inv;
      }
    }
}

void rope_head(float* x, const AttnDecode& a) {
  const size_t h = a.rope_dim / 2;
  for (size_t i = 0; i < h; ++i) {
    const size_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * a.cos[i] - x1 * a.sin[i];
    x[i1] = x0 * a.sin[i] + x1 * a.cos[i];
  }
}

// As ggml_rms_norm then ggml_mul: float squares summed in double (in 8 partial sums,
// which the compiler vectorizes), a float scale.
void rms_norm_row(const float* x, size_t n, const float* w, float eps, float* out) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += (double)(x[i + j] * x[i + j]);
  double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) ss += (double)(x[i] * x[i]);
  const float r = 1.0f / std::sqrt((float)(ss / (double)n) + eps);
  for (i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void attn_decode(const AttnDecode& a, float* q, float* k, const float* v, const KvRows& kc, const KvRows& vc,
                 size_t pos, float* out) {
  const size_t hd = a.head_dim, nkv = a.n_head_kv;
  if (a.qk_full) {  // as the Python step: rms_norm (rms_norm_row) over the whole projection
    if (a.q_norm) rms_norm_row(q, a.n_head * hd, a.q_norm, a.eps, q);
    if (a.k_norm) rms_norm_row(k, nkv * hd, a.k_norm, a.eps, k);
  }
  for (size_t h = 0; h < a.n_head; ++h) {
    if (a.q_norm && !a.qk_full) rms_head(q + h * hd, hd, a.q_norm, a.eps);
    rope_head(q + h * hd, a);
  }
  for (size_t h = 0; h < nkv; ++h) {
    if (a.k_norm && !a.qk_full) rms_head(k + h * hd, hd, a.k_norm, a.eps);
    rope_head(k + h * hd, a);
  }
  kv_store(kc, pos, nkv, k);
  kv_store(vc, pos, nkv, v);
  attn_cached(q, 1, a.n_head, nkv, kc, vc, pos, a.scale, out);
}

}  // namespace rmoe
