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

template <bool Z>
void rows(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  if (active_isa() != Isa::Avx2 || !cpu_features().avxvnni) {  // a kernel-table slip must not reach vpdpbusd
    std::fputs("rapidmoe: internal error: an AVX-VNNI kernel was selected without AVX-VNNI\n", stderr);
    std::abort();
  }
  size_t r = 0;
  for (; r + 2 <= nr; r += 2) wq_rows_ymm<Ymm, 2, Z>(q + r * rb, rb, nb, xp, y + r);
  if (r < nr) wq_rows_ymm<Ymm, 1, Z>(q + r * rb, rb, nb, xp, y + r);
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
