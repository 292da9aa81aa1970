// Prefill GEMM of routed expert groups with many tokens: the driver (work items,
// buffers, dequantization) around one ISA's tile kernels (resplit.h, I8Isa).
//
// The per-row kernels decode every weight once per tile of tokens and scale every
// 32-weight product in float: prefill is bound by that scaling. Here a tile of rows of
// one expert is dequantized once (WQ + WR summed for a critical gate/up: one product
// instead of two), requantized to int8 per 32 weights (s = max|w|/127, q = rint(w/s),
// the activations' rule) and laid out several rows per register, so that a block's
// float scaling is paid once per several integer products of many rows. A critical
// expert run from the source file's tensors is dequantized from its GGUF type the same way.
#include <algorithm>
#include <vector>

#include "ggml/ggml_kernels.h"
#include "kernel_table.h"
#include "resplit/resplit.h"
#include "common/threadpool.h"

namespace rmoe {
namespace resplit {

namespace {

const I8Isa* active() { return kernels().resplit.i8; }

inline size_t block_of(Fmt f) { return f == Fmt::WR ? 64 : 32; }

struct Tile {
  std::vector<uint8_t> w;
  std::vector<float> s, fa, fb;
  std::vector<int32_t> nc;
};

// Rows o0.. of expert e (rows past out_dim are zero) into the tile.
void repack(const I8Isa& K, const I8Job& J, int32_t e, size_t o0, Tile& T) {
  const size_t n = J.in_dim, nb = (n + 31) / 32;
  const bool src = J.src_type >= 0;
  const size_t la = (n + block_of(J.fa) - 1) / block_of(J.fa), rba = src ? J.src_rb : row_bytes(J.fa, n);
  const size_t lb = J.Wb ? (n + block_of(J.fb) - 1) / block_of(J.fb) : 0, rbb = J.Wb ? row_bytes(J.fb, n) : 0;
  if (o0 + K.rows > J.out_dim) {  // rows past the end stay zero
    T.w.assign(nb * kI8TileBlockBytes, 0);
    T.s.assign(nb * K.rows, 0.f);
    T.nc.assign(nb * K.rows, 0);
  } else {  // every element is written below
    T.w.resize(nb * kI8TileBlockBytes);
    T.s.resize(nb * K.rows);
    T.nc.resize(nb * K.rows);
  }
  T.fa.resize(std::max(src ? n : la * block_of(J.fa), nb * 32));
  T.fb.resize(lb * block_of(J.fb));
  const DequantRowFn da = src ? nullptr : dequant_row_fn(J.fa), db = J.Wb ? dequant_row_fn(J.fb) : nullptr;
  for (size_t r = 0; r < K.rows && o0 + r < J.out_dim; ++r) {
    const size_t o = (size_t)e * J.out_dim + o0 + r;
    float* f = T.fa.data();
    if (src) ggml::dequantize_row(J.src_type, J.Wa + o * rba, f, n);
    else da(J.Wa + o * rba, la, f);
    if (db) {
      db(J.Wb + o * rbb, lb, T.fb.data());
      for (size_t i = 0; i < n; ++i) f[i] += T.fb[i];
    }
    std::fill(f + n, f + nb * 32, 0.f);
    K.pack_row(f, nb, r, T.w.data(), T.s.data(), T.nc.data());
  }
}

}  // namespace

bool i8_gemm_available() { return active() != nullptr; }

bool i8_gemm_for_source() { return active() != nullptr && active()->source_rows; }

size_t i8_act_bytes(size_t n) { return (n + 31) / 32 * 32 * (active() ? active()->act_bytes : 1); }

void prep_i8(const float* x, size_t n, uint8_t* xq, float* sx) { active()->prep(x, n, xq, sx); }

void run_i8_jobs(const I8Job* jobs, size_t nj) {
  const I8Isa& K = *active();
  std::vector<size_t> start(nj + 1, 0);  // work items: (job, slot, tile of K.rows output rows)
  for (size_t j = 0; j < nj; ++j) start[j + 1] = start[j] + jobs[j].S * ((jobs[j].out_dim + K.rows - 1) / K.rows);
  parallel_for(start[nj], [&](size_t begin, size_t end, int) {
    thread_local Tile tile;
    std::vector<const uint8_t*> xq(K.max_nt);
    std::vector<const float*> sx(K.max_nt);
    std::vector<float*> y(K.max_nt);
    size_t j = 0;
    for (size_t it = begin; it < end; ++it) {
      while (it >= start[j + 1]) ++j;
      const I8Job& J = jobs[j];
      const size_t tiles = (J.out_dim + K.rows - 1) / K.rows;
      const size_t s = (it - start[j]) / tiles, o0 = ((it - start[j]) % tiles) * K.rows;
      const size_t nt = (size_t)std::max<int64_t>(J.ntok[s], 0), nr = std::min(K.rows, J.out_dim - o0);
      if (nt == 0) continue;
      repack(K, J, J.ids[s], o0, tile);
      const size_t nb = (J.in_dim + 31) / 32, xb = i8_act_bytes(J.in_dim);
      for (size_t t0 = 0; t0 < nt; t0 += K.max_nt) {
        const size_t tn = std::min(K.max_nt, nt - t0);
        for (size_t t = 0; t < tn; ++t) {
          const size_t row = (size_t)J.xoff[s] + t0 + t, xr = J.xrow ? (size_t)J.xrow[row] : row;
          xq[t] = J.xq + xr * xb;
          sx[t] = J.sx + xr * nb;
          y[t] = J.y + row * J.out_dim + o0;
        }
        K.gemm(tile.w.data(), tile.s.data(), tile.nc.data(), nb, xq.data(), sx.data(), y.data(), tn, nr);
      }
    }
  }, 1);
}

}  // namespace resplit
}  // namespace rmoe
