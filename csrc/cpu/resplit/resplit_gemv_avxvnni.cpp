// AVX2 + AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake and later, Zen 5): the WQ decode
// GEMV (one token, rows in pairs), as wq_rows_vnni of resplit_gemv_avx512.cpp does with
// zmm: non-critical rows on z activations (prep_wq_z), critical rows on int8 activations
// (prep_wq_q8); and the tiles of resplit_tiles_avx2.h with vpdpbusd. Called only where
// cpu_features().avxvnni.
#include "common/isa.h"
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "resplit/resplit_tiles_avx2.h"
#include "resplit/resplit_wq_states.h"
#include "common/simd.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rmoe {
namespace resplit {

namespace {

RMOE_WQ_STATE_OPS(Ymm, __m256i, _mm256, _mm256_setzero_si256, _mm256_dpbusd_avx_epi32)  // VEX vpdpbusd

// NP rows at once, 4 blocks (32 bytes) per step, by wq_state_sums (resplit_wq_states.h).
// The rows share the activation, sx and c loads; a row's two int32 lanes of a block
// meet its one scale.
template <int NP, bool Z>
void wq_rows(const uint8_t* q, size_t rb, size_t nb, const float* xp, float* y) {
  constexpr int S = Z ? 6 : 5;        // activation registers per 4 blocks
  constexpr size_t G = Z ? 128 : 112;  // floats per 8 blocks: S * 16, then sx[16], c[16]
  const __m256i keep = _mm256_set1_epi64x(0x00F0FFFFFFFFFFFFll);  // trit bytes, byte 6 high nibble
  const __m256i lo4 = _mm256_set1_epi32(0xF), hi8 = _mm256_set1_epi32(0x7F80);
  const __m256 inv256 = _mm256_set1_ps(1.0f / 256.0f);
  __m256 tot[NP];
  for (int p = 0; p < NP; ++p) tot[p] = _mm256_setzero_ps();
  alignas(32) uint8_t tail[NP][32];
  for (size_t b = 0; b < nb; b += 4) {
    const float* g = xp + (b / 8) * G + 8 * ((b % 8) / 4);  // this half of the 8-block group
    __m256i xq[S];
    for (int i = 0; i < S; ++i) xq[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16 * i));
    const __m256 sx = _mm256_mul_ps(_mm256_loadu_ps(g + 16 * S), inv256), c = _mm256_loadu_ps(g + 16 * S + 16);
    for (int p = 0; p < NP; ++p) {
      const uint8_t* src = q + p * rb + 8 * b;
      if (b % 8 == 0) _mm_prefetch(reinterpret_cast<const char*>(src + 8 * rb), _MM_HINT_T0);  // 8 rows on
      if (nb - b < 4) {  // last partial step: never read past the row
        std::memset(tail[p], 0, 32);
        std::memcpy(tail[p], src, 8 * (nb - b));
        src = tail[p];
      }
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i a = wq_state_sums<Ymm, Z>(_mm256_and_si256(raw, keep), xq);
      // block scales: odd int32 lanes hold bytes 4-7; f16 bits = (b6 & 15) << 3 | b7 << 7
      const __m256i t16 = _mm256_srli_epi32(raw, 16);
      __m256i h = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(t16, lo4), 3),
                                  _mm256_and_si256(_mm256_srli_epi32(t16, 1), hi8));
      h = _mm256_shuffle_epi32(h, 0xF5);  // odd lane -> both lanes of its block
      const __m256 dq = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
      tot[p] = _mm256_fmadd_ps(dq, _mm256_fmsub_ps(_mm256_cvtepi32_ps(a), sx, c), tot[p]);
    }
  }
  for (int p = 0; p < NP; ++p) y[p] = hsum8(tot[p]);
}

template <bool Z>
void rows(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  if (active_isa() != Isa::Avx2 || !cpu_features().avxvnni) {  // a kernel-table slip must not reach vpdpbusd
    std::fputs("rapidmoe: internal error: an AVX-VNNI kernel was selected without AVX-VNNI\n", stderr);
    std::abort();
  }
  size_t r = 0;
  for (; r + 2 <= nr; r += 2) wq_rows<2, Z>(q + r * rb, rb, nb, xp, y + r);
  if (r < nr) wq_rows<1, Z>(q + r * rb, rb, nb, xp, y + r);
}

}  // namespace

void rows_dot_wq_avxvnni(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  rows<false>(q, rb, nr, nb, xp, y);
}
RMOE_TILED(row_dot_wq_avxvnni, wq_tile, true)
RMOE_TILED(row_dot_d4_avxvnni, d4_tile, true)
RMOE_TILED(row_dot_wr_avxvnni, wr_tile, true)
void rows_dot_wq_z_avxvnni(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  rows<true>(q, rb, nr, nb, xp, y);
}

}  // namespace resplit
}  // namespace rmoe

#endif
