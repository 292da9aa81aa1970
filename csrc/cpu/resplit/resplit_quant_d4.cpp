// D4 quantizer (CPU copy of down_proj): per 32 weights an asymmetric 4-bit fit
// (d4_fit_*, resplit_search.h), then 8-bit scale and min codes under per-row
// float16 units. Float32 port of the oracle's quantize_d4, byte for byte.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "resplit/resplit.h"
#include "resplit/resplit_search.h"
#include "common/threadpool.h"
#include "kernel_table.h"

namespace rmoe {
namespace resplit {

namespace {

float tree32(const float* v) {
  float s16[16], s8[8], s4[4];
  for (int i = 0; i < 16; ++i) s16[i] = v[i] + v[i + 16];
  for (int i = 0; i < 8; ++i) s8[i] = s16[i] + s16[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

}  // namespace

void d4_fit_scalar(const float* x, float* s_out, float* m_out) {
  const auto [mn, span1, ok] = d4_range(x);
  float best_err = INFINITY, best_s = 0.f, best_m = -mn;
  const float sx = tree32(x);
  float L[32], v[32];
  for (int step = 0; step <= kD4Steps; ++step) {
    const float iscale = (14.0f + 0.1f * (float)step) / span1;
    for (int j = 0; j < 32; ++j) L[j] = clampf(rnd((x[j] - mn) * iscale), 0.f, 15.f);
    const float sl = tree32(L);
    for (int j = 0; j < 32; ++j) v[j] = L[j] * L[j];
    const float sl2 = tree32(v);
    for (int j = 0; j < 32; ++j) v[j] = x[j] * L[j];
    const float sxl = tree32(v);
    const float det = 32.0f * sl2 - sl * sl;
    float s = (32.0f * sxl - sx * sl) / det;
    float m = (sl2 * sx - sl * sxl) / det;
    if (m > 0.f) { s = sxl / sl2; m = 0.f; }
    for (int j = 0; j < 32; ++j) {
      const float diff = s * L[j] + m - x[j];
      v[j] = diff * diff;
    }
    const float err = tree32(v);
    if (ok && det > 0.f && err < best_err) { best_err = err; best_s = s; best_m = -m; }
  }
  *s_out = ok ? best_s : 0.f;
  *m_out = std::max(best_m, 0.f);
}

namespace {

void quantize_d4_row(const float* w, size_t n, uint8_t* out, std::vector<float>& buf) {
  const size_t nb = (n + 31) / 32;
  buf.assign(nb * 32 + 2 * nb, 0.f);
  float* xs = buf.data();
  float* s = xs + nb * 32;
  float* m = s + nb;
  std::memcpy(xs, w, n * sizeof(float));
  float smax = 0.f, mmax = 0.f;
  const SearchKernels& fns = kernels().quant;
  size_t b = 0;
  if (fns.d4_fit8)  // eight blocks at once, lanes = blocks
    for (; b + 8 <= nb; b += 8) fns.d4_fit8(xs + 32 * b, &s[b], &m[b]);
  for (; b < nb; ++b) fns.d4_fit(xs + 32 * b, &s[b], &m[b]);
  for (b = 0; b < nb; ++b) {
    smax = std::max(smax, s[b]);
    mmax = std::max(mmax, m[b]);
  }
  const float D = f16r(smax / 255.0f), M = f16r(mmax / 255.0f);
  const uint16_t Db = f32_to_f16_bits(D), Mb = f32_to_f16_bits(M);
  out[0] = (uint8_t)(Db & 0xFF); out[1] = (uint8_t)(Db >> 8);
  out[2] = (uint8_t)(Mb & 0xFF); out[3] = (uint8_t)(Mb >> 8);
  for (size_t b = 0; b < nb; ++b) {
    const float sc = D > 0.f ? std::min(rnd(s[b] / D), 255.f) : 0.f;
    const float mc = M > 0.f ? std::min(rnd(m[b] / M), 255.f) : 0.f;
    const float d = D * sc, dm = M * mc;
    uint8_t L[32];
    for (int j = 0; j < 32; ++j)
      L[j] = d > 0.f ? (uint8_t)clampf(rnd((xs[32 * b + j] + dm) / d), 0.f, 15.f) : 0;
    uint8_t* blk = out + 4 + 18 * b;
    for (int j = 0; j < 16; ++j) blk[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    blk[16] = (uint8_t)sc;
    blk[17] = (uint8_t)mc;
  }
}

}  // namespace

void quantize_d4(const float* w, size_t rows, size_t n, uint8_t* out) {
  const size_t rb = row_bytes(Fmt::D4, n);
  parallel_for(rows, [&](size_t b, size_t e, int) {
    std::vector<float> buf;
    for (size_t r = b; r < e; ++r) quantize_d4_row(w + r * n, n, out + r * rb, buf);
  });
}

}  // namespace resplit
}  // namespace rmoe
