// Quantizers of the resplit formats: a float32 port of the numpy oracle with
// the same operation order, so the bytes match exactly. This file gets no ISA
// flags: no FMA contraction can change a rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/convert.h"
#include "kernel_table.h"
#include "resplit/resplit.h"
#include "resplit/resplit_search.h"
#include "common/threadpool.h"

namespace rmoe {
namespace resplit {

const float kWrTable[16] = {
    0x1.000000p+0f, 0x1.ae89fap-1f, 0x1.6a09e6p-1f, 0x1.306fe0p-1f, 0x1.000000p-1f, 0x1.ae89fap-2f,
    0x1.6a09e6p-2f, 0x1.306fe0p-2f, 0x1.000000p-2f, 0x1.ae89fap-3f, 0x1.6a09e6p-3f, 0x1.306fe0p-3f,
    0x1.000000p-3f, 0x1.ae89fap-4f, 0x1.6a09e6p-4f, 0x1.306fe0p-4f};

namespace {

// WQ scale candidates of the joint search (oracle FRACS, REFINE): coarse fractions of
// max|w|, then the best one -0.05 and +0.05. Sub-scales: coarse codes, then around the best.
float wq_frac(int i, double df) { return (float)(0.3 + 0.1 * i + df); }
constexpr int kWqFracs = 7;
constexpr float kWrLevels[5] = {-2.25f, -1.0f, 0.0f, 1.0f, 2.25f};
constexpr float kWrDiv = 8.0f;


uint32_t scale12_encode(float d) {
  const uint32_t h = f32_to_f16_bits(clampf(d, 0.f, 60000.f));
  return std::min<uint32_t>((h + 4) >> 3, 0xF7F);
}
float scale12_decode(uint32_t code) { return f16_to_f32((uint16_t)(code << 3)); }

// Bitonic network, descending: branch-free (a comparison sort mispredicts on
// random weights); any correct sort gives the oracle's np.sort values.
void sort32_desc(float* a) {
  for (int k = 2; k <= 32; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1)
      for (int i = 0; i < 32; ++i) {
        const int l = i ^ j;
        if (l <= i) continue;
        const float hi = std::max(a[i], a[l]), lo = std::min(a[i], a[l]);
        const bool desc = (i & k) == 0;
        a[i] = desc ? hi : lo;
        a[l] = desc ? lo : hi;
      }
}

}  // namespace

float wq_alone_scale_scalar(const float* x) {
  float a[32];
  for (int j = 0; j < 32; ++j) a[j] = std::fabs(x[j]);
  sort32_desc(a);
  float cs = 0.f, best = -1.f, best_d = 0.f;
  for (int j = 0; j < 32; ++j) {
    cs = cs + a[j];
    const float kf = (float)(j + 1);
    const float score = cs * cs / kf;
    if (score > best) { best = score; best_d = cs / kf; }
  }
  return best_d;
}

void wq_alone_scales_scalar(const float* x, size_t nb, float* out) {
  for (size_t b = 0; b < nb; ++b) out[b] = wq_alone_scale_scalar(x + 32 * b);
}

namespace {

// Divisions are written as products with a reciprocal (also in the oracle): the
// joint search evaluates ~250 candidates per weight.
void tern(const float* x, float dq, float* t) {
  if (!(dq > 0.f)) { for (int j = 0; j < 32; ++j) t[j] = 0.f; return; }
  const float inv = 1.0f / dq;
  for (int j = 0; j < 32; ++j) t[j] = clampf(rnd(x[j] * inv), -1.f, 1.f);
}

void pack_wq(const float* t, uint32_t code, uint8_t* out) {
  for (int j = 0; j < 6; ++j) {
    int64_t c = 0;
    for (int i = 0; i < 5; ++i) c = c * 3 + (int64_t)(t[6 * i + j] + 1.f);
    out[j] = (uint8_t)((c * 256 + 242) / 243);
  }
  const int64_t c2 = (int64_t)(t[30] + 1.f) * 3 + (int64_t)(t[31] + 1.f);
  const int64_t v4 = (c2 * 16 + 8) / 9;
  out[6] = (uint8_t)((v4 << 4) | (code & 0xF));
  out[7] = (uint8_t)(code >> 4);
}

// WR level digit (0..4) of z: the scalar twin of the SIMD compare chain.
int wr_digit(float z) {
  const float a = std::fabs(z);
  const int idx = (int)!(a < 0.5f) + (int)!(a < 1.625f);  // branch-free; NaN is past both
  return z < 0.f ? 2 - idx : 2 + idx;
}

// The two ternary cells tried per weight: nearest, and the neighbour toward x.
inline void two_cells(float x, float dq, float iq, float* t0, float* t1) {
  *t0 = clampf(rnd(x * iq), -1.f, 1.f);
  *t1 = clampf(*t0 + (x - dq * *t0 < 0.f ? -1.f : 1.f), -1.f, 1.f);
}

}  // namespace

void half_encode_scalar(const float* xs, float dq, float dr, float* t, int* dig) {
  const float inv = dr > 0.f ? 1.0f / dr : 0.f, iq = dq > 0.f ? 1.0f / dq : 0.f;
  for (int j = 0; j < 16; ++j) {
    float tc[2], best = 0.f;
    two_cells(xs[j], dq, iq, &tc[0], &tc[1]);
    for (int c = 0; c < 2; ++c) {
      const float e = xs[j] - dq * tc[c];
      const int d = wr_digit(e * inv);
      const float diff = e - dr * kWrLevels[d];
      const float sc = diff * diff + kMu * (e * e);
      if (c == 0 || sc < best) { best = sc; t[j] = tc[c]; dig[j] = d; }
    }
  }
}

namespace {

// Both halves' coarse codes in one call, then their refine codes.
float block_best(const float* x, float dq, float D, int* kbest) {
  int ks[8];
  float sc[8], hb[2] = {INFINITY, INFINITY};
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) ks[4 * h + j] = kKCoarse[j];
  block_scores_scalar(x, dq, D, ks, sc);
  for (int h = 0; h < 2; ++h) {
    kbest[h] = 0;
    for (int j = 0; j < 4; ++j)
      if (sc[4 * h + j] < hb[h]) { hb[h] = sc[4 * h + j]; kbest[h] = kKCoarse[j]; }
    int j = 0;
    for (int off : {-2, -1, 1, 2}) ks[4 * h + j++] = std::min(15, std::max(0, kbest[h] + off));
  }
  block_scores_scalar(x, dq, D, ks, sc);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      if (sc[4 * h + j] < hb[h]) { hb[h] = sc[4 * h + j]; kbest[h] = ks[4 * h + j]; }
  return hb[0] + hb[1];
}

}  // namespace

float block_best_scalar(const float* x, float dq, const WrScales& ws, int* kbest) {
  return block_best(x, dq, ws.D, kbest);
}

void half_scores_scalar(const float* xs, float dq, float D, const int* ks, int nk, float* scores) {
  float e[2][16], m[2][16];
  const float iq = dq > 0.f ? 1.0f / dq : 0.f;
  for (int j = 0; j < 16; ++j) {
    float tc[2];
    two_cells(xs[j], dq, iq, &tc[0], &tc[1]);
    for (int c = 0; c < 2; ++c) {
      e[c][j] = xs[j] - dq * tc[c];
      m[c][j] = kMu * (e[c][j] * e[c][j]);
    }
  }
  for (int n = 0; n < nk; ++n) {
    const float dr = D * kWrTable[ks[n]], inv = dr > 0.f ? 1.0f / dr : 0.f;
    float best[16];
    for (int c = 0; c < 2; ++c)
      for (int j = 0; j < 16; ++j) {
        const float diff = e[c][j] - dr * kWrLevels[wr_digit(e[c][j] * inv)];
        const float sc = diff * diff + m[c][j];
        if (c == 0 || sc < best[j]) best[j] = sc;
      }
    float s8[8], s4[4];
    for (int i = 0; i < 8; ++i) s8[i] = best[i] + best[i + 8];
    for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
    scores[n] = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  }
}

void block_scores_scalar(const float* x, float dq, float D, const int* ks, float* scores) {
  half_scores_scalar(x, dq, D, ks, 4, scores);
  half_scores_scalar(x + 16, dq, D, ks + 4, 4, scores + 4);
}

namespace {

void quantize_wq_row(const float* w, size_t n, uint8_t* out, std::vector<float>& buf) {
  const size_t nb = (n + 31) / 32;
  buf.assign(nb * 33, 0.f);  // the row padded to whole blocks, then each block's scale
  std::memcpy(buf.data(), w, n * sizeof(float));
  float* alone = buf.data() + nb * 32;
  kernels().quant.wq_alone(buf.data(), nb, alone);
  float t[32];
  for (size_t b = 0; b < nb; ++b) {
    const uint32_t code = scale12_encode(alone[b]);
    tern(buf.data() + 32 * b, scale12_decode(code), t);
    pack_wq(t, code, out + 8 * b);
  }
}

void quantize_wq_wr_row(const float* w, size_t n, uint8_t* wq, uint8_t* wr, std::vector<float>& buf) {
  const size_t nb64 = (n + 63) / 64, n64 = nb64 * 64, nbq = (n + 31) / 32;
  buf.assign(n64 + 2 * nb64, 0.f);
  std::memcpy(buf.data(), w, n * sizeof(float));
  const float amax = max_abs(buf.data(), n64);
  const float D = f16r(amax / kWrDiv);
  const uint16_t Dbits = f32_to_f16_bits(D);
  wr[0] = (uint8_t)(Dbits & 0xFF);
  wr[1] = (uint8_t)(Dbits >> 8);
  const SearchKernels& fns = kernels().quant;
  const WrScales ws = wr_scales(D);
  // every block's WQ-alone scale first (the AVX2 path runs eight blocks at once)
  float* alone = buf.data() + n64;
  fns.wq_alone(buf.data(), 2 * nb64, alone);
  float t[32];
  std::vector<int> dig(nb64 * 64), kk(nb64 * 4);
  for (size_t b64 = 0; b64 < nb64; ++b64) {
    for (int half = 0; half < 2; ++half) {
      const size_t b = 2 * b64 + half;
      const float* x = buf.data() + 32 * b;
      const float am = max_abs(x, 32);
      float best = INFINITY;
      uint32_t best_code = 0;
      int best_k[2] = {0, 0};
      auto try_scale = [&](float d) {
        const uint32_t code = scale12_encode(d);
        const float dq = scale12_decode(code);
        int k[2];
        const float total = fns.block_best(x, dq, ws, k);
        if (total < best) { best = total; best_code = code; best_k[0] = k[0]; best_k[1] = k[1]; }
        return total;
      };
      try_scale(alone[b]);
      float cb = INFINITY;
      int ci = 0;
      for (int i = 0; i < kWqFracs; ++i) {
        const float total = try_scale(am * wq_frac(i, 0.0));
        if (total < cb) { cb = total; ci = i; }
      }
      try_scale(am * wq_frac(ci, -0.05));
      try_scale(am * wq_frac(ci, 0.05));
      const float dq = scale12_decode(best_code);
      for (int s = 0; s < 2; ++s)
        fns.half_encode(x + 16 * s, dq, ws.dr[best_k[s]], t + 16 * s, &dig[64 * b64 + 32 * half + 16 * s]);
      kk[4 * b64 + 2 * half] = best_k[0];
      kk[4 * b64 + 2 * half + 1] = best_k[1];
      if (b < nbq) pack_wq(t, best_code, wq + 8 * b);  // WR pads to 64, WQ to 32
    }
  }
  // WR bytes: groups of up to 3 blocks, code j = sum_p d(block p, j) * 5^p in 2m+1 bits,
  // code j at bits w*j.. of the group's 64 codes (w 64-bit words, little-endian)
  uint8_t* g = wr + 2;
  for (size_t b0 = 0; b0 < nb64; b0 += 3) {
    const size_t m = std::min<size_t>(3, nb64 - b0), w = wr_code_bits(m);
    uint64_t bits[8] = {};
    for (size_t j = 0; j < 64; ++j) {
      uint64_t c = 0;
      for (size_t p = m; p-- > 0;) c = c * 5 + (uint64_t)dig[64 * (b0 + p) + j];
      const size_t at = w * j, word = at / 64, sh = at % 64;
      bits[word] |= c << sh;
      if (sh + w > 64) bits[word + 1] |= c >> (64 - sh);
    }
    for (size_t i = 0; i < w; ++i)
      for (size_t b = 0; b < 8; ++b) g[8 * i + b] = (uint8_t)(bits[i] >> (8 * b));
    for (size_t p = 0; p < m; ++p) {
      const int* k = &kk[4 * (b0 + p)];
      const uint32_t sc = k[0] | (k[1] << 4) | (k[2] << 8) | (k[3] << 12);
      g[8 * w + 2 * p] = (uint8_t)(sc & 0xFF);
      g[8 * w + 2 * p + 1] = (uint8_t)(sc >> 8);
    }
    g += wr_group_bytes(m);
  }
}

}  // namespace

size_t row_bytes(Fmt fmt, size_t n) {
  switch (fmt) {
    case Fmt::WQ: return (n + 31) / 32 * 8;
    case Fmt::WR: {
      const size_t nb = (n + 63) / 64;
      return 2 + nb / 3 * wr_group_bytes(3) + (nb % 3 ? wr_group_bytes(nb % 3) : 0);
    }
    default: return 4 + (n + 31) / 32 * 18;
  }
}

void quantize_wq(const float* w, size_t rows, size_t n, uint8_t* out) {
  const size_t rb = row_bytes(Fmt::WQ, n);
  parallel_for(rows, [&](size_t b, size_t e, int) {
    std::vector<float> buf;
    for (size_t r = b; r < e; ++r) quantize_wq_row(w + r * n, n, out + r * rb, buf);
  });
}

void quantize_wq_wr(const float* w, size_t rows, size_t n, uint8_t* wq, uint8_t* wr) {
  const size_t rq = row_bytes(Fmt::WQ, n), rr = row_bytes(Fmt::WR, n);
  parallel_for(rows, [&](size_t b, size_t e, int) {
    std::vector<float> buf;
    for (size_t r = b; r < e; ++r) quantize_wq_wr_row(w + r * n, n, wq + r * rq, wr + r * rr, buf);
  });
}

}  // namespace resplit
}  // namespace rmoe
