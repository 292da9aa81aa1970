#include "attn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "convert.h"
#include "isa.h"
#include "threadpool.h"

namespace rmoe {

namespace {

constexpr size_t kTile = 32;  // keys converted to f32 and scored at once

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

void rope_head(float* x, const AttnDecode& a) {
  const size_t h = a.rope_dim / 2;
  for (size_t i = 0; i < h; ++i) {
    const size_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + h : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * a.cos[i] - x1 * a.sin[i];
    x[i1] = x0 * a.sin[i] + x1 * a.cos[i];
  }
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

// The portable pieces of attn_cached (the AVX2 ones are in attn_avx2.cpp).
void rows_f32(const KvRows& c, size_t g, size_t j0, size_t n, float* tile) {
  const size_t d = c.dim;
  for (size_t t = 0; t < n; ++t, tile += d) {
    const uint8_t* r = row_at(c, j0 + t, g);
    if (c.type == KvType::F32) {
      std::memcpy(tile, r, d * sizeof(float));
    } else if (c.type == KvType::F16) {
      for (size_t i = 0; i < d; ++i) tile[i] = f16_to_f32((uint16_t)(r[2 * i] | r[2 * i + 1] << 8));
    } else {
      for (size_t b = 0; b < d / 32; ++b, r += 34) {
        const float s = f16_to_f32((uint16_t)(r[0] | r[1] << 8));
        for (size_t i = 0; i < 32; ++i) tile[32 * b + i] = s * (float)(int8_t)r[2 + i];
      }
    }
  }
}

void scores(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale, float* s,
            size_t sstride) {
  for (size_t h = 0; h < nq; ++h)
    for (size_t t = 0; t < n; ++t) s[h * sstride + t] = dot(q + h * qstride, tile + t * dim, dim) * scale;
}

float exp_sub(float* p, size_t n, float m) {
  float sum = 0.f;
  for (size_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - m));
  return sum;
}

void accum(const float* p, const float* tile, size_t tstride, size_t n, size_t dim, float c, float* o) {
  for (size_t d = 0; d < dim; ++d) o[d] *= c;
  for (size_t t = 0; t < n; ++t)
    for (size_t d = 0; d < dim; ++d) o[d] += p[t] * tile[t * tstride + d];
}

}  // namespace

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

void attn_cached(const float* q, size_t n_head, size_t n_groups, const KvRows& K, const KvRows& V, size_t S,
                 float scale, float* out) {
  const size_t rep = n_head / n_groups, hd = K.dim, hdv = V.dim;
  // V read from the rows already converted for K (MLA: the values are the first V.dim of the key rows)
  const bool shared = V.base == K.base && V.type == K.type && V.pos_stride == K.pos_stride &&
                      V.head_stride == K.head_stride && V.dim <= K.dim;
  static const bool avx2 = active_isa() != Isa::Scalar;
  const size_t T = (size_t)num_threads();
  // Key blocks: every thread busy once the context is long (a group's heads stay together).
  const bool worth = S * n_head * (hd + hdv) >= (size_t(1) << 17);
  size_t nb = worth ? std::min((S + 127) / 128, (2 * T + n_groups - 1) / n_groups) : 1;
  nb = std::max<size_t>(nb, 1);
  const size_t blk = (S + nb - 1) / nb;
  nb = (S + blk - 1) / blk;
  const size_t per = rep * (2 + hdv);  // a task's running max, sum and output of each head
  std::vector<float> part(n_groups * nb * per);
  parallel_for(n_groups * nb, [&](size_t t0, size_t t1, int) {
    std::vector<float> kt(kTile * hd), vt(shared ? 0 : kTile * hdv), s(rep * kTile);
    for (size_t task = t0; task < t1; ++task) {
      const size_t g = task / nb, j0 = (task % nb) * blk, j1 = std::min(S, j0 + blk);
      float* m = part.data() + task * per;
      float* l = m + rep;
      float* o = l + rep;
      std::fill(m, m + rep, -INFINITY);
      std::fill(l, o + rep * hdv, 0.f);
      const float* qg = q + g * rep * hd;
      for (size_t j = j0; j < j1; j += kTile) {
        const size_t n = std::min(kTile, j1 - j);
        (avx2 ? kv_rows_f32_avx2 : rows_f32)(K, g, j, n, kt.data());
        (avx2 ? kv_scores_avx2 : scores)(qg, rep, hd, kt.data(), n, hd, scale, s.data(), kTile);
        const float* vrows = kt.data();
        if (!shared) {
          (avx2 ? kv_rows_f32_avx2 : rows_f32)(V, g, j, n, vt.data());
          vrows = vt.data();
        }
        for (size_t h = 0; h < rep; ++h) {
          float* sh = s.data() + h * kTile;
          const float mt = *std::max_element(sh, sh + n), mn = std::max(m[h], mt);
          if (mn == -INFINITY) continue;  // nothing seen yet
          const float c = m[h] == -INFINITY ? 0.f : std::exp(m[h] - mn);
          l[h] = l[h] * c + (avx2 ? kv_exp_avx2 : exp_sub)(sh, n, mn);
          m[h] = mn;
          (avx2 ? kv_accum_avx2 : accum)(sh, vrows, shared ? hd : hdv, n, hdv, c, o + h * hdv);
        }
      }
    }
  }, worth ? 1 : n_groups * nb);
  // merge each head's blocks
  for (size_t g = 0; g < n_groups; ++g)
    for (size_t h = 0; h < rep; ++h) {
      float mx = -INFINITY;
      for (size_t b = 0; b < nb; ++b) mx = std::max(mx, part[(g * nb + b) * per + h]);
      float den = 0.f;
      float* oh = out + (g * rep + h) * hdv;
      std::fill(oh, oh + hdv, 0.f);
      for (size_t b = 0; b < nb; ++b) {
        const float* m = part.data() + (g * nb + b) * per;
        const float w = nb == 1 ? 1.f : std::exp(m[h] - mx);
        den += w * m[rep + h];
        const float* ob = m + 2 * rep + h * hdv;
        for (size_t d = 0; d < hdv; ++d) oh[d] += w * ob[d];
      }
      const float r = 1.0f / den;
      for (size_t d = 0; d < hdv; ++d) oh[d] *= r;
    }
}

void attn_decode(const AttnDecode& a, float* q, float* k, const float* v, const KvRows& kc, const KvRows& vc,
                 size_t pos, float* out) {
  const size_t hd = a.head_dim, nkv = a.n_head_kv;
  for (size_t h = 0; h < a.n_head; ++h) {
    if (a.q_norm) rms_head(q + h * hd, hd, a.q_norm, a.eps);
    rope_head(q + h * hd, a);
  }
  for (size_t h = 0; h < nkv; ++h) {
    if (a.k_norm) rms_head(k + h * hd, hd, a.k_norm, a.eps);
    rope_head(k + h * hd, a);
  }
  kv_store(kc, pos, nkv, k);
  kv_store(vc, pos, nkv, v);
  attn_cached(q, a.n_head, nkv, kc, vc, pos + 1, a.scale, out);
}

}  // namespace rmoe
