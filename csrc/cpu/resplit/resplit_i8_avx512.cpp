// The int8 prefill GEMM's tile kernels with AVX-512 VNNI (driver: resplit_i8.cpp;
// used only where it finds VNNI). A tile is 32 rows, two registers of 16:
//
//   block b (32 weights), row group g (rows 16g..16g+15):
//     w[b][g][j]: 64 bytes, weights 4j..4j+3 of the block for each row (row r at bytes 4r..4r+3)
//     s[b][32]:   the rows' scales;   nc[b][32]: -128 * sum of each row's q
//
// Activations are the decode kernels' int8 per 32 values, stored biased (x_q + 128,
// unsigned for vpdpbusd); nc removes the bias. y[t][r] = sum_b s_w[r,b] s_x[t,b] sum q_w q_x.
#include "common/isa.h"
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include <cstring>

namespace rmoe {
namespace resplit {

namespace {

constexpr size_t kRows = 32, kMaxTok = 6;

// (The shape of resplit_i8_avx2.cpp's pack_row on purpose: its tile is int16 pairs of 8 rows.)
// One row's 32-weight blocks -> int8 (s = max|w|/127, q = rint(w/s)) at tile row r.
void pack_row(const float* f, size_t nb, size_t r, uint8_t* w, float* s, int32_t* nc) {
  const size_t g = r / 16, rr = r % 16;
  for (size_t b = 0; b < nb; ++b, f += 32) {
    alignas(16) int8_t q[32];
    nc[b * kRows + r] = -128 * q8_block_avx512(f, 32, q, &s[b * kRows + r]);
    uint8_t* wb = w + (b * 2 + g) * 512 + 4 * rr;
    for (int j = 0; j < 8; ++j) std::memcpy(wb + 64 * j, q + 4 * j, 4);
  }
}

template <int NT>
void tile_gemm(const uint8_t* w, const float* s, const int32_t* nc, size_t nb, const uint8_t* const* xu,
               const float* const* sx, float* const* y, size_t nr) {
  __m512 f0[NT], f1[NT];
  for (int t = 0; t < NT; ++t) f0[t] = f1[t] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * kI8TileBlockBytes;
    const __m512i n0 = _mm512_loadu_si512(nc + b * 32), n1 = _mm512_loadu_si512(nc + b * 32 + 16);
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
    const __m512 s0 = _mm512_loadu_ps(s + b * 32), s1 = _mm512_loadu_ps(s + b * 32 + 16);
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

void gemm(const uint8_t* w, const float* s, const int32_t* nc, size_t nb, const uint8_t* const* xq,
          const float* const* sx, float* const* y, size_t nt, size_t nr) {
  switch (nt) {
    case 6: return tile_gemm<6>(w, s, nc, nb, xq, sx, y, nr);
    case 5: return tile_gemm<5>(w, s, nc, nb, xq, sx, y, nr);
    case 4: return tile_gemm<4>(w, s, nc, nb, xq, sx, y, nr);
    case 3: return tile_gemm<3>(w, s, nc, nb, xq, sx, y, nr);
    case 2: return tile_gemm<2>(w, s, nc, nb, xq, sx, y, nr);
    default: return tile_gemm<1>(w, s, nc, nb, xq, sx, y, nr);
  }
}

// x -> x_q + 128 per 32 values (zero padded), and the scales.
void prep(const float* x, size_t n, uint8_t* xu, float* sx) {
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  for (size_t b = 0; b * 32 < n; ++b) {
    alignas(32) int8_t q[32];
    q8_block_avx512(x + 32 * b, n - 32 * b, q, &sx[b]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xu + 32 * b),
                        _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(q)), bias));
  }
}

const I8Isa kIsa{kRows, kMaxTok, 1, true, pack_row, gemm, prep};

}  // namespace

const I8Isa* i8_isa_avx512() { return &kIsa; }

}  // namespace resplit
}  // namespace rmoe

#endif
