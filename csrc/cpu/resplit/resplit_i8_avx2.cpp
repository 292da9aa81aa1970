// The int8 prefill GEMM's tile kernels with AVX2 (driver: resplit_i8.cpp; used where
// AVX-512 VNNI is not). Weights and activations are the same int8 values as the VNNI
// kernel's, held as 16-bit integers so that vpmaddwd sums pairs exactly (no
// saturation). A tile is 16 rows, two registers of 8:
//
//   block b (32 weights), row group g (rows 8g..8g+7), weight pair j (0..15):
//     w[b][g][j]: 32 bytes, int16 weights 2j, 2j+1 of the block for each row (row r at
//     int16 2r, 2r+1);   s[b][16]: the rows' scales   (nc is unused: zero)
//
// Activations: int16 x_q per value (zero padded to 32s) and the scales.
#include "common/isa.h"
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include <cstring>

#include "common/simd.h"

namespace rmoe {
namespace resplit {

namespace {

constexpr size_t kRows = 16, kMaxTok = 3;

// (pack_row has resplit_i8_avx512.cpp's shape on purpose: the tiles differ, int16 pairs
// of 8 rows here, int8 quads of 16 rows there.)
// One row's 32-weight blocks (f padded to whole blocks) -> int16 at tile row r: the
// rounding of q8_block_avx2 (s = max|w|/127, q = rint(w/s)), without its copy of the
// block; each weight pair is one 32-bit store.
void pack_row(const float* f, size_t nb, size_t r, uint8_t* w, float* s, int32_t* nc) {
  const size_t g = r / 8, rr = r % 8;
  for (size_t b = 0; b < nb; ++b, f += 32) {
    __m256 v[4];
    const float amax = load_absmax32(f, v);
    s[b * kRows + r] = amax / 127.f;
    nc[b * kRows + r] = 0;
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i qv[4];
    for (int i = 0; i < 4; ++i) qv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    // int32 -> int16 pairs; packs interleaves 128-bit lanes: 32-bit pair lanes
    // [0, 1, 4, 5 | 2, 3, 6, 7] of weights 0-15, then the same of 16-31
    alignas(32) int32_t pr[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(pr), _mm256_packs_epi32(qv[0], qv[1]));
    _mm256_store_si256(reinterpret_cast<__m256i*>(pr + 8), _mm256_packs_epi32(qv[2], qv[3]));
    static constexpr int kPair[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};  // pair j at pr[kPair[j]]
    uint8_t* wb = w + (b * 2 + g) * 512 + 4 * rr;
    for (int j = 0; j < 16; ++j) std::memcpy(wb + 32 * j, &pr[kPair[j]], 4);
  }
}

template <int NT>
void tile_gemm(const uint8_t* w, const float* s, size_t nb, const uint8_t* const* xq, const float* const* sx,
               float* const* y, size_t nr) {
  __m256 f0[NT], f1[NT];
  for (int t = 0; t < NT; ++t) f0[t] = f1[t] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * kI8TileBlockBytes;
    __m256i a0[NT], a1[NT];
    for (int t = 0; t < NT; ++t) a0[t] = a1[t] = _mm256_setzero_si256();
    for (int j = 0; j < 16; ++j) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 512 + 32 * j));
      for (int t = 0; t < NT; ++t) {
        int32_t xv;  // activations 2j, 2j+1 of the block (int16 each)
        std::memcpy(&xv, xq[t] + 2 * (32 * b + 2 * j), 4);
        const __m256i xb = _mm256_set1_epi32(xv);
        a0[t] = _mm256_add_epi32(a0[t], _mm256_madd_epi16(w0, xb));
        a1[t] = _mm256_add_epi32(a1[t], _mm256_madd_epi16(w1, xb));
      }
    }
    const __m256 s0 = _mm256_loadu_ps(s + b * kRows), s1 = _mm256_loadu_ps(s + b * kRows + 8);
    for (int t = 0; t < NT; ++t) {
      const __m256 xs = _mm256_set1_ps(sx[t][b]);
      f0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[t]), _mm256_mul_ps(s0, xs), f0[t]);
      f1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1[t]), _mm256_mul_ps(s1, xs), f1[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    alignas(32) float o[16];
    _mm256_store_ps(o, f0[t]);
    _mm256_store_ps(o + 8, f1[t]);
    std::memcpy(y[t], o, nr * sizeof(float));
  }
}

void gemm(const uint8_t* w, const float* s, const int32_t*, size_t nb, const uint8_t* const* xq,
          const float* const* sx, float* const* y, size_t nt, size_t nr) {
  switch (nt) {
    case 3: return tile_gemm<3>(w, s, nb, xq, sx, y, nr);
    case 2: return tile_gemm<2>(w, s, nb, xq, sx, y, nr);
    default: return tile_gemm<1>(w, s, nb, xq, sx, y, nr);
  }
}

void prep(const float* x, size_t n, uint8_t* xq, float* sx) {
  int16_t* out = reinterpret_cast<int16_t*>(xq);
  for (size_t b = 0; b * 32 < n; ++b) {
    int8_t q[32];
    q8_block_avx2(x + 32 * b, n - 32 * b, q, &sx[b]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * b),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * b + 16),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
  }
}

const I8Isa kIsa{kRows, kMaxTok, 2, false, pack_row, gemm, prep};

}  // namespace

const I8Isa* i8_isa_avx2() { return &kIsa; }

}  // namespace resplit
}  // namespace rmoe

#endif
