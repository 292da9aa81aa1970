// Resplit kernels: activation preparation, the scalar fused references, the kernel
// table's kernels for callers and the batched expert GEMV/GEMM (the MoE layer:
// resplit_moe.cpp).
// Each row is decoded once per tile of up to 4 tokens routed to its expert, so
// prefill reuses the decode across tokens and decode reads each weight once.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/convert.h"
#include "ggml/ggml_kernels.h"
#include "resplit/resplit.h"
#include "common/threadpool.h"
#include "kernel_table.h"

namespace rmoe {
namespace resplit {

// ---------------------------------------------------------------- activations
namespace {
// Round-half-even without libm (|x| <= 127 here).
inline float rne(float x) { return (x + 12582912.0f) - 12582912.0f; }
}  // namespace

// Per 32 values: sx = max|x|/L, xq = rint(x * L/max|x|) (0 if all zero); returns sum(xq).
// A NaN or an infinity among them makes sx NaN and xq 0, so every product with the block
// is NaN, on every path and on the GPU (as the GGUF int8 activations' bad groups).
int q8_block_scalar(const float* x, size_t n, int8_t* q, float* sx, float levels) {
  float xb[32] = {0};
  for (size_t j = 0; j < 32 && j < n; ++j) xb[j] = x[j];
  float amax = 0.f;
  bool bad = false;
  for (int j = 0; j < 32; ++j) {
    amax = std::max(amax, std::fabs(xb[j]));
    bad |= !(std::fabs(xb[j]) <= FLT_MAX);
  }
  if (bad) return q8_bad_block(q, sx);
  *sx = amax / levels;
  const float inv = amax > 0.f ? levels / amax : 0.f;
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = (int8_t)rne(xb[j] * inv);
    sum += q[j];
  }
  return sum;
}

namespace {
bool int8_acts() { return kernels().resplit.int8_acts; }

// q8_block_scalar on the ISA path in use (identical bytes).
int q8_block(const float* x, size_t n, int8_t* q, float* sx) { return kernels().resplit.q8_block(x, n, q, sx, 127.f); }

// put(b, q, sx, sum) for each 32-block b of x, q8_block'd.
template <class Put>
void q8_blocks(const float* x, size_t n, Put&& put) {
  for (size_t b = 0; b < (n + 31) / 32; ++b) {
    int8_t q[32];
    float sx;
    const int sum = q8_block(x + 32 * b, n - 32 * b, q, &sx);
    put(b, q, sx, sum);
  }
}

// D4 int8 activations, per group of 4 blocks (64 floats): int8 lo[4 blocks][16] (weights
// 0-15), int8 hi[4][16] (weights 16-31), float sx[16] (lanes 4b..4b+3 = sx_b), float
// c[16] (lane 4b = sx_b * sum(xq_b)).
void prep_d4_q8(const float* x, size_t n, float* out) {
  const size_t nb = (n + 31) / 32;
  std::memset(out, 0, (nb + 3) / 4 * 64 * sizeof(float));
  q8_blocks(x, n, [&](size_t b, const int8_t* q, float sx, int sum) {
    float* g = out + (b / 4) * 64;
    int8_t* xq = reinterpret_cast<int8_t*>(g) + (b % 4) * 16;
    std::memcpy(xq, q, 16);
    std::memcpy(xq + 64, q + 16, 16);
    for (int l = 0; l < 4; ++l) g[32 + 4 * (b % 4) + l] = sx;
    g[48 + 4 * (b % 4)] = sx * (float)sum;
  });
}

// (prep_d4_q8 and prep_wq_q8 share their shape on purpose: each writes its kernel's layout.)
// WQ int8 activations, per group of 8 blocks (112 floats): int8 xq[5][8 blocks][8 lanes]
// (same lane order as the f32 layout, lane 7 = 0), float sx[16] (lanes 2b, 2b+1 = sx_b),
// float c[16] (lane 2b = sx_b * sum(xq_b)). Block b: sx = max|x|/127, xq = rint(x * 127/max|x|).
void prep_wq_q8(const float* x, size_t n, float* out) {
  const size_t nb = (n + 31) / 32;
  std::memset(out, 0, (nb + 7) / 8 * 112 * sizeof(float));
  q8_blocks(x, n, [&](size_t b, const int8_t* q, float sx, int sum) {
    float* g = out + (b / 8) * 112;
    int8_t* xq = reinterpret_cast<int8_t*>(g) + (b % 8) * 8;
    for (int i = 0; i < 5; ++i) {
      for (int j = 0; j < 6; ++j) xq[64 * i + j] = q[6 * i + j];
      xq[64 * i + 6] = i < 2 ? q[30 + i] : 0;
    }
    g[80 + 2 * (b % 8)] = g[80 + 2 * (b % 8) + 1] = sx;
    g[96 + 2 * (b % 8)] = sx * (float)sum;
  });
}
// WR int8 activations (wr_int8_acts()), per 64-block 48 floats: int8 xq[64], float sx[16]
// (lanes 0-7: sx of weights 0-31, 8-15: of 32-63), int32 c[16] = -9 * sum xq[4l..4l+3].
void prep_wr_q8(const float* x, size_t n, float* out) {
  const size_t nb = (n + 63) / 64;
  for (size_t b = 0; b < nb; ++b) {
    float* g = out + 48 * b;
    int8_t* xq = reinterpret_cast<int8_t*>(g);
    for (int h = 0; h < 2; ++h) {
      float sx;
      const size_t at = 64 * b + 32 * h;
      q8_block(x + std::min(at, n), at < n ? n - at : 0, xq + 32 * h, &sx);
      for (int l = 0; l < 8; ++l) g[16 + 8 * h + l] = sx;
    }
    for (int l = 0; l < 16; ++l) {
      const int32_t c = -9 * (xq[4 * l] + xq[4 * l + 1] + xq[4 * l + 2] + xq[4 * l + 3]);
      std::memcpy(g + 32 + l, &c, 4);
    }
  }
}
}  // namespace

bool wr_int8_acts() { return int8_acts(); }

bool wq_z_acts() { return kernels().resplit.rows_dot_wq_z != nullptr; }

float wq_z_levels() { return kernels().resplit.wq_z_levels; }

size_t prep_floats_wq_z(size_t n) { return ((n + 31) / 32 + 7) / 8 * 128; }

void prep_wq_z(const float* x, size_t n, float* out) {
  const size_t nb = (n + 31) / 32;
  std::memset(out, 0, prep_floats_wq_z(n) * sizeof(float));
  const auto q8 = kernels().resplit.q8_block;
  const float levels = wq_z_levels();
  for (size_t b = 0; b < nb; ++b) {
    int8_t q[32];
    float sx;
    const int sum = q8(x + 32 * b, n - 32 * b, q, &sx, levels);
    float* g = out + (b / 8) * 128;
    int8_t* z = reinterpret_cast<int8_t*>(g) + (b % 8) * 8;
    for (int j = 0; j < 7; ++j) {  // lane j: x of digit i (lane 7 and lane 6 from digit 2 on are 0)
      int prev = 0;
      for (int i = 0; i < 6; ++i) {
        const int xi = i == 5 ? 0 : j < 6 ? q[6 * i + j] : i < 2 ? q[30 + i] : 0;
        z[64 * i + j] = (int8_t)(3 * xi - prev);
        prev = xi;
      }
    }
    g[96 + 2 * (b % 8)] = g[96 + 2 * (b % 8) + 1] = sx;
    g[112 + 2 * (b % 8)] = sx * (float)sum;
  }
}

size_t prep_floats(Fmt fmt, size_t n) {
  switch (fmt) {
    case Fmt::WQ: return int8_acts() ? ((n + 31) / 32 + 7) / 8 * 112 : ((n + 31) / 32 + 1) / 2 * 80;
    case Fmt::WR: return wr_int8_acts() ? (n + 63) / 64 * 48 : (n + 63) / 64 * 64;
    default: return int8_acts() ? ((n + 31) / 32 + 3) / 4 * 64 : (n + 31) / 32 * 33;
  }
}

void prep_x(Fmt fmt, const float* x, size_t n, float* out) {
  if (fmt == Fmt::WQ && int8_acts()) return prep_wq_q8(x, n, out);
  if (fmt == Fmt::D4 && int8_acts()) return prep_d4_q8(x, n, out);
  if (fmt == Fmt::WR && wr_int8_acts()) return prep_wr_q8(x, n, out);
  const size_t pf = prep_floats(fmt, n);
  std::memset(out, 0, pf * sizeof(float));
  if (fmt == Fmt::WR) {
    std::memcpy(out, x, n * sizeof(float));
  } else if (fmt == Fmt::D4) {
    const size_t nb = (n + 31) / 32;
    std::memcpy(out, x, n * sizeof(float));
    for (size_t b = 0; b < nb; ++b) {
      float s = 0.f;
      for (size_t j = 0; j < 32; ++j) s += out[32 * b + j];
      out[nb * 32 + b] = s;
    }
  } else {
    const size_t nb = (n + 31) / 32;
    for (size_t b = 0; b < nb; ++b) {
      float* o = out + (b / 2) * 80 + (b & 1) * 8;
      float xb[32] = {0};
      for (size_t j = 0; j < 32 && 32 * b + j < n; ++j) xb[j] = x[32 * b + j];
      float s = 0.f;
      for (int j = 0; j < 32; ++j) s += xb[j];
      for (int i = 0; i < 5; ++i) {
        for (int j = 0; j < 6; ++j) o[16 * i + j] = xb[6 * i + j];
        o[16 * i + 6] = i < 2 ? xb[30 + i] : 0.f;
      }
      o[7] = -s;
    }
  }
}

// ---------------------------------------------------------------- scalar fused references
void row_dot_wq_scalar(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  for (size_t t = 0; t < T; ++t) {
    const float* x = xp + t * xs;
    float tot = 0.f;
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* blk = q + 8 * b;
      const float* xb = x + (b / 2) * 80 + (b & 1) * 8;
      const float dq = f16_to_f32((uint16_t)((((blk[6] & 0xFu) | ((uint32_t)blk[7] << 4))) << 3));
      float acc = 0.f;
      for (int j = 0; j < 8; ++j) {
        uint32_t u = j < 6 ? blk[j] : (j == 6 ? (blk[6] & 0xF0u) : 86u);  // 86: digit 0 = 1
        for (int i = 0; i < 5; ++i) {
          u *= 3;
          acc += (float)(u >> 8) * xb[16 * i + j];
          u &= 255;
        }
      }
      tot += dq * acc;
    }
    y[t * ys] = tot;
  }
}

void row_dot_wr_scalar(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  std::vector<float> w(nb * 64);
  dequant_row_wr_scalar(q, nb, w.data());
  for (size_t t = 0; t < T; ++t) {
    float acc = 0.f;
    for (size_t i = 0; i < nb * 64; ++i) acc += w[i] * xp[t * xs + i];
    y[t * ys] = acc;
  }
}

void row_dot_d4_scalar(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  const float M = f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
  for (size_t t = 0; t < T; ++t) {
    const float* x = xp + t * xs;
    float tot = 0.f;
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* blk = q + 4 + 18 * b;
      float acc = 0.f;
      for (int j = 0; j < 16; ++j)
        acc += (float)(blk[j] & 0xF) * x[32 * b + j] + (float)(blk[j] >> 4) * x[32 * b + j + 16];
      tot += (D * (float)blk[16]) * acc - (M * (float)blk[17]) * x[nb * 32 + b];
    }
    y[t * ys] = tot;
  }
}

RowDotFn row_dot_fn(Fmt fmt) { return kernels().resplit.row_dot[(int)fmt]; }

RowsDotFn rows_dot_fn(Fmt fmt) { return kernels().resplit.rows_dot[(int)fmt]; }

void silu_mul(const float* g, const float* u, size_t n, float* h) { kernels().resplit.silu_mul(g, u, n, h); }

void silu_mul_scalar(const float* g, const float* u, size_t n, float* h) {
  for (size_t i = 0; i < n; ++i) h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// ---------------------------------------------------------------- expert GEMM
namespace {
constexpr size_t kRowGroup = 8;  // output rows per work item
// Tokens per call on a row (the kernels tile them further): WQ's activations are small
// enough for 16 to stay cache-resident across a row group, the others' take 8.
constexpr size_t kTokTile = 16;
}

void run_jobs(const GemmJob* jobs, size_t nj) {
  struct Plan {  // a job's constants, worked out once rather than per work item
    size_t groups, nb, rb, pf, tt;
    RowsDotFn rows;  // takes one token (z: every token of the slot, one at a time)
    RowDotFn one;
  };
  std::vector<Plan> plan(nj);
  std::vector<size_t> start(nj + 1, 0);  // work items: (job, slot, group of kRowGroup output rows)
  for (size_t j = 0; j < nj; ++j) {
    const GemmJob& g = jobs[j];
    Plan& p = plan[j];
    p.groups = (g.out_dim + kRowGroup - 1) / kRowGroup;
    p.nb = (g.in_dim + (g.fmt == Fmt::WR ? 64 : 32) - 1) / (g.fmt == Fmt::WR ? 64 : 32);
    p.rb = g.src_type >= 0 ? g.src_rb : row_bytes(g.fmt, g.in_dim);
    p.pf = g.src_type >= 0 ? ggml::q8_act_row_bytes(ggml::q8_act_layout(g.src_type, g.in_dim), g.in_dim) / 4
           : g.z           ? prep_floats_wq_z(g.in_dim)
                           : prep_floats(g.fmt, g.in_dim);
    p.one = row_dot_fn(g.fmt);
    p.rows = g.z ? kernels().resplit.rows_dot_wq_z : rows_dot_fn(g.fmt);
    p.tt = g.z ? 1 : g.fmt == Fmt::WQ ? kTokTile : kTokTile / 2;
    start[j + 1] = start[j] + g.S * p.groups;
  }
  parallel_for(start[nj], [&](size_t begin, size_t end, int) {
    float tmp[kTokTile * kRowGroup];
    size_t j = 0;
    for (size_t it = begin; it < end; ++it) {
      while (it >= start[j + 1]) ++j;
      const GemmJob& g = jobs[j];
      const Plan& p = plan[j];
      const size_t local = it - start[j], s = local / p.groups, o0 = (local - s * p.groups) * kRowGroup;
      const size_t no = std::min(kRowGroup, g.out_dim - o0);
      const size_t nt = (size_t)std::max<int64_t>(g.ntok[s], 0);
      if (nt == 0) continue;
      const uint8_t* w = g.W + ((size_t)g.ids[s] * g.out_dim + o0) * p.rb;
      const float* xs = g.xp + (size_t)g.xoff[s] * p.pf;
      float* ys = g.y + (size_t)g.xoff[s] * g.out_dim + o0;
      if (g.src_type >= 0) {  // the source file's rows: the GGUF int8 GEMV, 8 tokens a call
        const uint8_t* xq = reinterpret_cast<const uint8_t*>(xs);
        for (size_t t0 = 0; t0 < nt; t0 += 8)
          ggml::q8_act_gemv(g.src_type, w, p.rb, g.in_dim, no, xq + t0 * p.pf * 4, p.pf * 4,
                            std::min<size_t>(8, nt - t0), ys + t0 * g.out_dim, g.out_dim);
        continue;
      }
      const RowsDotFn rows = g.z || nt == 1 ? p.rows : nullptr;
      if (rows && nt == 1) {  // decode: straight into y
        if (!g.accumulate) {
          rows(w, p.rb, no, p.nb, xs, ys);
          continue;
        }
        rows(w, p.rb, no, p.nb, xs, tmp);
        for (size_t o = 0; o < no; ++o) ys[o] += tmp[o];
        continue;
      }
      const size_t tt = rows ? 1 : p.tt;
      for (size_t t0 = 0; t0 < nt; t0 += tt) {  // tmp holds [rows][tokens]
        const size_t tn = std::min(tt, nt - t0);
        if (rows) rows(w, p.rb, no, p.nb, xs + t0 * p.pf, tmp);
        else
          for (size_t o = 0; o < no; ++o) p.one(w + o * p.rb, p.nb, xs + t0 * p.pf, p.pf, tn, tmp + o * tn, 1);
        for (size_t o = 0; o < no; ++o)
          for (size_t t = 0; t < tn; ++t) {
            float& dst = ys[(t0 + t) * g.out_dim + o];
            dst = g.accumulate ? dst + tmp[o * tn + t] : tmp[o * tn + t];
          }
      }
    }
  }, 2);
}

void expert_gemm(Fmt fmt, const uint8_t* W, size_t E, size_t out_dim, size_t in_dim, const int32_t* ids,
                 const int64_t* xoff, const int64_t* ntok, size_t S, const float* x, float* y, bool accumulate,
                 bool z) {
  (void)E;
  z = z && fmt == Fmt::WQ && wq_z_acts();
  const size_t pf = z ? prep_floats_wq_z(in_dim) : prep_floats(fmt, in_dim);
  size_t nrows = 0;
  for (size_t s = 0; s < S; ++s) nrows = std::max(nrows, (size_t)(xoff[s] + std::max<int64_t>(ntok[s], 0)));
  std::vector<float> xp(nrows * pf);
  parallel_for(nrows, [&](size_t b, size_t e, int) {
    for (size_t r = b; r < e; ++r) {
      if (z) prep_wq_z(x + r * in_dim, in_dim, xp.data() + r * pf);
      else prep_x(fmt, x + r * in_dim, in_dim, xp.data() + r * pf);
    }
  }, 8);
  const GemmJob job{fmt, W, out_dim, in_dim, ids, xoff, ntok, S, xp.data(), y, accumulate, z};
  run_jobs(&job, 1);
}

}  // namespace resplit
}  // namespace rmoe
