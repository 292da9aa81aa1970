// Resplit kernels: scalar reference row decoders, ISA dispatch, the batched
// expert GEMM/GEMV and the split-execution MoE layer. A row is decoded once
// into an L1-resident float buffer and then dotted with every token routed to
// that expert, so prefill reuses each decoded row across its tokens.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "convert.h"
#include "isa.h"
#include "resplit.h"
#include "threadpool.h"

namespace rmoe {
namespace resplit {

// ---------------------------------------------------------------- scalar reference
void dequant_row_wq_scalar(const uint8_t* q, size_t nb, float* out) {
  for (size_t b = 0; b < nb; ++b, q += 8, out += 32) {
    const uint32_t code = (q[6] & 0xFu) | ((uint32_t)q[7] << 4);
    const float dq = f16_to_f32((uint16_t)(code << 3));
    for (int j = 0; j < 6; ++j) {
      uint32_t u = q[j];
      for (int i = 0; i < 5; ++i) {
        u *= 3;
        out[6 * i + j] = dq * (float)((int)(u >> 8) - 1);
        u &= 255;
      }
    }
    uint32_t u = q[6] & 0xF0u;
    for (int i = 0; i < 2; ++i) {
      u *= 3;
      out[30 + i] = dq * (float)((int)(u >> 8) - 1);
      u &= 255;
    }
  }
}

void dequant_row_wr_scalar(const uint8_t* q, size_t nb, float* out) {
  static const float kLv[5] = {-2.25f, -1.0f, 0.0f, 1.0f, 2.25f};  // WR levels by digit
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  q += 2;
  for (size_t b = 0; b < nb; ++b, q += 21, out += 64) {
    const uint32_t hi = q[16] | ((uint32_t)q[17] << 8) | ((uint32_t)q[18] << 16);
    const uint32_t sc = q[19] | ((uint32_t)q[20] << 8);
    float dr[4];
    for (int s = 0; s < 4; ++s) dr[s] = D * kWrTable[(sc >> (4 * s)) & 0xF];
    for (int g = 0; g < 8; ++g) {
      uint32_t u = (q[2 * g] | ((uint32_t)q[2 * g + 1] << 8)) | (((hi >> (3 * g)) & 7u) << 16);
      for (int i = 0; i < 8; ++i) {
        u *= 5;
        out[8 * i + g] = dr[i >> 1] * kLv[u >> 19];
        u &= (1u << 19) - 1;
      }
    }
  }
}

void dequant_row_d4_scalar(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  const float M = f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
  q += 4;
  for (size_t b = 0; b < nb; ++b, q += 18, out += 32) {
    const float d = D * (float)q[16], dm = M * (float)q[17];
    for (int j = 0; j < 16; ++j) {
      out[j] = d * (float)(q[j] & 0xF) - dm;
      out[j + 16] = d * (float)(q[j] >> 4) - dm;
    }
  }
}

float dot_scalar(const float* a, const float* b, size_t n) {
  float acc = 0.f;
  for (size_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// ---------------------------------------------------------------- dispatch
namespace {
size_t block_of(Fmt f) { return f == Fmt::WR ? 64 : 32; }
}  // namespace

DequantRowFn dequant_row_fn(Fmt fmt) {
  static const Isa isa = active_isa();
#if RMOE_X86
  if (isa == Isa::Avx512) {
    return fmt == Fmt::WQ ? dequant_row_wq_avx512 : fmt == Fmt::WR ? dequant_row_wr_avx512 : dequant_row_d4_avx512;
  }
  if (isa == Isa::Avx2) {
    return fmt == Fmt::WQ ? dequant_row_wq_avx2 : fmt == Fmt::WR ? dequant_row_wr_avx2 : dequant_row_d4_avx2;
  }
#endif
  return fmt == Fmt::WQ ? dequant_row_wq_scalar : fmt == Fmt::WR ? dequant_row_wr_scalar : dequant_row_d4_scalar;
}

DotFn dot_fn() {
  static const Isa isa = active_isa();
#if RMOE_X86
  if (isa == Isa::Avx512) return dot_avx512;
  if (isa == Isa::Avx2) return dot_avx2;
#endif
  return dot_scalar;
}

void dequantize(Fmt fmt, const uint8_t* q, size_t rows, size_t n, float* out) {
  const size_t rb = row_bytes(fmt, n), bl = block_of(fmt), nb = (n + bl - 1) / bl;
  const DequantRowFn fn = dequant_row_fn(fmt);
  parallel_for(rows, [&](size_t b, size_t e, int) {
    std::vector<float> buf(nb * bl);
    for (size_t r = b; r < e; ++r) {
      fn(q + r * rb, nb, buf.data());
      std::memcpy(out + r * n, buf.data(), n * sizeof(float));
    }
  }, 16);
}

// ---------------------------------------------------------------- expert GEMM
void expert_gemm(Fmt fmt, const uint8_t* W, size_t E, size_t out_dim, size_t in_dim, const int32_t* ids,
                 const int64_t* xoff, const int64_t* ntok, size_t S, const float* x, float* y, bool accumulate) {
  (void)E;
  const size_t rb = row_bytes(fmt, in_dim), bl = block_of(fmt), nb = (in_dim + bl - 1) / bl;
  const DequantRowFn deq = dequant_row_fn(fmt);
  const DotFn dot = dot_fn();
  // One work item per (slot, output row): contiguous chunks keep a thread on one expert.
  parallel_for(S * out_dim, [&](size_t begin, size_t end, int) {
    thread_local std::vector<float> buf;
    if (buf.size() < nb * bl) buf.resize(nb * bl);
    for (size_t it = begin; it < end; ++it) {
      const size_t s = it / out_dim, o = it % out_dim;
      const int64_t nt = ntok[s];
      if (nt <= 0) continue;
      deq(W + ((size_t)ids[s] * out_dim + o) * rb, nb, buf.data());
      const float* xs = x + (size_t)xoff[s] * in_dim;
      float* ys = y + (size_t)xoff[s] * out_dim + o;
      for (int64_t t = 0; t < nt; ++t) {
        const float v = dot(buf.data(), xs + (size_t)t * in_dim, in_dim);
        ys[(size_t)t * out_dim] = accumulate ? ys[(size_t)t * out_dim] + v : v;
      }
    }
  }, 8);
}

// ---------------------------------------------------------------- MoE layer
void moe_forward(const MoeWeights& w, const float* x, size_t T, size_t k, const int32_t* ids, const float* weights,
                 const int32_t* ncrit, float* out) {
  const size_t E = w.E, H = w.H, F = w.F;
  // Groups: (expert, critical?) -> routed (token, slot) pairs, in token order.
  std::vector<std::vector<int64_t>> members(2 * E);
  for (size_t t = 0; t < T; ++t)
    for (size_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const bool crit = (int32_t)j < ncrit[t];
      members[2 * (size_t)e + (crit ? 1 : 0)].push_back((int64_t)(t * k + j));
    }
  std::vector<int32_t> gid, cid, nid;           // expert per group: all, critical, non-critical
  std::vector<int64_t> goff, gcnt, coff, ccnt, noff, ncnt;
  std::vector<int64_t> rows;                    // flat (t*k+j) per gathered row
  for (size_t g = 0; g < 2 * E; ++g) {
    if (members[g].empty()) continue;
    const int32_t e = (int32_t)(g / 2);
    const int64_t off = (int64_t)rows.size(), cnt = (int64_t)members[g].size();
    gid.push_back(e); goff.push_back(off); gcnt.push_back(cnt);
    if (g & 1) { cid.push_back(e); coff.push_back(off); ccnt.push_back(cnt); }
    else { nid.push_back(e); noff.push_back(off); ncnt.push_back(cnt); }
    rows.insert(rows.end(), members[g].begin(), members[g].end());
  }
  const size_t N = rows.size();
  std::vector<float> X(N * H), G(N * F), U(N * F), Y(N * H);
  parallel_for(N, [&](size_t b, size_t e, int) {
    for (size_t r = b; r < e; ++r) std::memcpy(&X[r * H], x + (size_t)(rows[r] / (int64_t)k) * H, H * sizeof(float));
  }, 64);
  expert_gemm(Fmt::WQ, w.gate_q, E, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), X.data(), G.data(), false);
  expert_gemm(Fmt::WQ, w.up_q, E, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), X.data(), U.data(), false);
  if (!cid.empty()) {
    expert_gemm(Fmt::WR, w.gate_r, E, F, H, cid.data(), coff.data(), ccnt.data(), cid.size(), X.data(), G.data(), true);
    expert_gemm(Fmt::WR, w.up_r, E, F, H, cid.data(), coff.data(), ccnt.data(), cid.size(), X.data(), U.data(), true);
  }
  parallel_for(N * F, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) {
      const float g = G[i];
      G[i] = g / (1.0f + std::exp(-g)) * U[i];
    }
  }, 4096);
  if (!cid.empty())
    expert_gemm(Fmt::D4, w.down4, E, H, F, cid.data(), coff.data(), ccnt.data(), cid.size(), G.data(), Y.data(), false);
  if (!nid.empty())
    expert_gemm(Fmt::WQ, w.down_q, E, H, F, nid.data(), noff.data(), ncnt.data(), nid.size(), G.data(), Y.data(), false);
  // Weighted sum into out, split over columns so the row order (and result) is fixed.
  parallel_for(H, [&](size_t c0, size_t c1, int) {
    for (size_t t = 0; t < T; ++t)
      for (size_t c = c0; c < c1; ++c) out[t * H + c] = 0.f;
    for (size_t r = 0; r < N; ++r) {
      const size_t t = (size_t)(rows[r] / (int64_t)k);
      const float wt = weights[rows[r]];
      for (size_t c = c0; c < c1; ++c) out[t * H + c] += wt * Y[r * H + c];
    }
  }, 256);
}

}  // namespace resplit
}  // namespace rmoe
