// Prefill GEMM of routed expert groups with many tokens (AVX-512 VNNI; called only
// where i8_gemm_available()). The per-row kernels decode every weight once per tile
// of tokens and scale every 32-weight product in float: prefill is bound by that
// scaling. Here a tile of 32 rows of one expert is dequantized once (WQ + WR summed
// for a critical gate/up: one product instead of two), requantized to int8 per 32
// weights (s = max|w|/127, q = rint(w/s): the activations' rule, oracle
// q8_activations) and laid out with 16 rows per register, so that a block's float
// scaling is paid once per 8 VNNI products of 16 rows:
//
//   tile block b (32 weights), row group g (rows 16g..16g+15):
//     w[b][g][j]: 64 bytes, weights 4j..4j+3 of the block for each row (row r at bytes 4r..4r+3)
//     s[b][g]:    16 floats, the rows' scales;   nc[b][g]: 16 int32, -128 * sum of the row's q
//
// Activations are the same int8 per 32 as decode, stored biased (x_q + 128, unsigned
// for vpdpbusd); nc removes the bias. y[t][r] = sum_b s_w[r,b] * s_x[t,b] * sum_j q_w q_x.
#include "isa.h"
#include "resplit.h"
#include "threadpool.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if RMOE_X86
#include <immintrin.h>

namespace rmoe {
namespace resplit {

bool i8_gemm_available() {
  static const bool v = active_isa() == Isa::Avx512 && cpu_features().avx512vnni;
  return v;
}

namespace {

constexpr size_t kRows = 32;  // rows per tile: two registers of 16

struct Tile {
  std::vector<int8_t> w;     // [nb][2][8][64]
  std::vector<float> s;      // [nb][2][16]
  std::vector<int32_t> nc;   // [nb][2][16]
  std::vector<float> fa, fb; // one dequantized row of each source
};

// 32 floats -> int8 q (as the activations' rule), the scale and -128 * sum(q).
inline void requant_block(const float* f, int8_t* q, float* s, int32_t* nc) {
  const __m512 a = _mm512_loadu_ps(f), b = _mm512_loadu_ps(f + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  *s = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.0f / amax : 0.f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *nc = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

inline size_t block_of(Fmt f) { return f == Fmt::WR ? 64 : 32; }

// Rows o0.. of expert e (rows past out_dim are zero) into the tile.
void repack(const I8Job& J, int32_t e, size_t o0, Tile& T) {
  const size_t n = J.in_dim, nb = (n + 31) / 32;
  const size_t la = (n + block_of(J.fa) - 1) / block_of(J.fa), rba = row_bytes(J.fa, n);
  const size_t lb = J.Wb ? (n + block_of(J.fb) - 1) / block_of(J.fb) : 0, rbb = J.Wb ? row_bytes(J.fb, n) : 0;
  if (o0 + kRows > J.out_dim) {  // rows past the end stay zero
    T.w.assign(nb * 2 * 8 * 64, 0);
    T.s.assign(nb * 2 * 16, 0.f);
    T.nc.assign(nb * 2 * 16, 0);
  } else {  // every byte is written below
    T.w.resize(nb * 2 * 8 * 64);
    T.s.resize(nb * 2 * 16);
    T.nc.resize(nb * 2 * 16);
  }
  T.fa.resize(std::max(la * block_of(J.fa), nb * 32));
  T.fb.resize(lb * block_of(J.fb));
  const DequantRowFn da = dequant_row_fn(J.fa), db = J.Wb ? dequant_row_fn(J.fb) : nullptr;
  for (size_t r = 0; r < kRows && o0 + r < J.out_dim; ++r) {
    const size_t o = (size_t)e * J.out_dim + o0 + r, g = r / 16, rr = r % 16;
    float* f = T.fa.data();
    da(J.Wa + o * rba, la, f);
    if (db) {
      db(J.Wb + o * rbb, lb, T.fb.data());
      for (size_t i = 0; i < n; ++i) f[i] += T.fb[i];
    }
    std::fill(f + n, f + nb * 32, 0.f);
    for (size_t b = 0; b < nb; ++b) {
      alignas(64) int8_t q[32];
      const size_t m = (b * 2 + g) * 16 + rr;
      requant_block(f + 32 * b, q, &T.s[m], &T.nc[m]);
      int8_t* wb = T.w.data() + (b * 2 + g) * 512 + 4 * rr;
      for (int j = 0; j < 8; ++j) std::memcpy(wb + 64 * j, q + 4 * j, 4);
    }
  }
}

// NT tokens against the tile's 32 rows; y[t] receives rows 0..nr-1.
template <int NT>
void tile_gemm(const Tile& T, size_t nb, const uint8_t* const* xu, const float* const* sx, float* const* y, size_t nr) {
  __m512 f0[NT], f1[NT];
  for (int t = 0; t < NT; ++t) f0[t] = f1[t] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const int8_t* wb = T.w.data() + b * 1024;
    const __m512i n0 = _mm512_loadu_si512(T.nc.data() + b * 32), n1 = _mm512_loadu_si512(T.nc.data() + b * 32 + 16);
    __m512i a0[NT], a1[NT];
    for (int t = 0; t < NT; ++t) { a0[t] = n0; a1[t] = n1; }
    for (int j = 0; j < 8; ++j) {
      const __m512i w0 = _mm512_loadu_si512(wb + 64 * j), w1 = _mm512_loadu_si512(wb + 512 + 64 * j);
      for (int t = 0; t < NT; ++t) {
        int32_t xv;
        std::memcpy(&xv, xu[t] + 32 * b + 4 * j, 4);
        const __m512i xb = _mm512_set1_epi32(xv);
        a0[t] = _mm512_dpbusd_epi32(a0[t], xb, w0);
        a1[t] = _mm512_dpbusd_epi32(a1[t], xb, w1);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(T.s.data() + b * 32), s1 = _mm512_loadu_ps(T.s.data() + b * 32 + 16);
    for (int t = 0; t < NT; ++t) {
      const __m512 xs = _mm512_set1_ps(sx[t][b]);
      f0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[t]), _mm512_mul_ps(s0, xs), f0[t]);
      f1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[t]), _mm512_mul_ps(s1, xs), f1[t]);
    }
  }
  const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
  const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFF : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
  for (int t = 0; t < NT; ++t) {
    _mm512_mask_storeu_ps(y[t], m0, f0[t]);
    _mm512_mask_storeu_ps(y[t] + 16, m1, f1[t]);
  }
}

}  // namespace

void prep_i8(const float* x, size_t n, uint8_t* xu, float* sx) {
  const size_t nb = (n + 31) / 32;
  for (size_t b = 0; b < nb; ++b) {
    const size_t left = n - 32 * b;
    const __mmask16 ma = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
    const __mmask16 mb = (__mmask16)(left >= 32 ? 0xFFFF : left > 16 ? (1u << (left - 16)) - 1 : 0);
    const __m512 a = _mm512_maskz_loadu_ps(ma, x + 32 * b), c = _mm512_maskz_loadu_ps(mb, x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
    sx[b] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.0f / amax : 0.f);
    const __m512i bias = _mm512_set1_epi32(128);
    const __m512i qa = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), bias);
    const __m512i qc = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(c, inv)), bias);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + 32 * b), _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + 32 * b + 16), _mm512_cvtepi32_epi8(qc));
  }
}

void run_i8_jobs(const I8Job* jobs, size_t nj) {
  std::vector<size_t> start(nj + 1, 0);  // work items: (job, slot, tile of kRows output rows)
  for (size_t j = 0; j < nj; ++j) start[j + 1] = start[j] + jobs[j].S * ((jobs[j].out_dim + kRows - 1) / kRows);
  parallel_for(start[nj], [&](size_t begin, size_t end, int) {
    thread_local Tile tile;
    size_t j = 0;
    for (size_t it = begin; it < end; ++it) {
      while (it >= start[j + 1]) ++j;
      const I8Job& J = jobs[j];
      const size_t tiles = (J.out_dim + kRows - 1) / kRows;
      const size_t s = (it - start[j]) / tiles, o0 = ((it - start[j]) % tiles) * kRows;
      const size_t nt = (size_t)std::max<int64_t>(J.ntok[s], 0), nr = std::min(kRows, J.out_dim - o0);
      if (nt == 0) continue;
      repack(J, J.ids[s], o0, tile);
      const size_t nb = (J.in_dim + 31) / 32, xb = nb * 32;
      constexpr int kTok = 6;
      for (size_t t0 = 0; t0 < nt; t0 += kTok) {
        const uint8_t* xu[kTok];
        const float* sx[kTok];
        float* y[kTok];
        const size_t tn = std::min<size_t>(kTok, nt - t0);
        for (size_t t = 0; t < tn; ++t) {
          const size_t row = (size_t)J.xoff[s] + t0 + t, xr = J.xrow ? (size_t)J.xrow[row] : row;
          xu[t] = J.xu + xr * xb;
          sx[t] = J.sx + xr * nb;
          y[t] = J.y + row * J.out_dim + o0;
        }
        switch (tn) {
          case 6: tile_gemm<6>(tile, nb, xu, sx, y, nr); break;
          case 5: tile_gemm<5>(tile, nb, xu, sx, y, nr); break;
          case 4: tile_gemm<4>(tile, nb, xu, sx, y, nr); break;
          case 3: tile_gemm<3>(tile, nb, xu, sx, y, nr); break;
          case 2: tile_gemm<2>(tile, nb, xu, sx, y, nr); break;
          default: tile_gemm<1>(tile, nb, xu, sx, y, nr); break;
        }
      }
    }
  }, 1);
}

}  // namespace resplit
}  // namespace rmoe

#else  // non-x86: never selected (i8_gemm_available() is false)
namespace rmoe {
namespace resplit {
bool i8_gemm_available() { return false; }
void prep_i8(const float*, size_t, uint8_t*, float*) {}
void run_i8_jobs(const I8Job*, size_t) {}
}  // namespace resplit
}  // namespace rmoe
#endif
