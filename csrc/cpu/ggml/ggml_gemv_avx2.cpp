// AVX2+FMA kernels of the GGUF matmul: ggml_gemv_simd.h on ymm. The fused GEMV takes
// T <= 4 activation rows (two at a time), 4 weight rows at a time.
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx2.h"

namespace rmoe {
namespace ggml {
namespace {

// Twin of F32x16 and the entry points in ggml_gemv_avx512.cpp, on purpose: a width's
// traits and its entry points are all that differ (the kernels are ggml_gemv_simd.h).
// One ymm register of floats (16 ymm: R * 3 accumulators + R weights fit).
struct F32x8 {
  using F = __m256;
  using Tail = __m256i;
  static constexpr size_t lanes = 8;
  static constexpr int tile_t = 3, fused_max_t = 4, fused_group = 2, rows_one_token = 4;
  static RMOE_INLINE F zero() { return _mm256_setzero_ps(); }
  static RMOE_INLINE F load(const float* p) { return _mm256_loadu_ps(p); }
  static RMOE_INLINE Tail tail(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static RMOE_INLINE F load(const float* p, Tail m) { return _mm256_maskload_ps(p, m); }
  static RMOE_INLINE F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static RMOE_INLINE float sum(F v) { return hsum8(v); }
};

}  // namespace
}  // namespace ggml
}  // namespace rmoe

#include "ggml/ggml_gemv_simd.h"

namespace rmoe {
namespace ggml {

bool gemv_fused_avx2(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                     float* y, size_t ldy) {
  using namespace avx2;
  switch (type) {
#define RMOE_CASE(T, U) case T: return fused_type<F32x8, U>(w, rb, k, nr, x, k, nt, y, ldy);
    RMOE_GGML_FOR_TYPES(RMOE_CASE)
#undef RMOE_CASE
    default: return false;
  }
}

void gemm_tile_avx2(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                    size_t k, float* y, size_t ldy) {
  gemm_tile<F32x8>(w, ldw, nr, x, ldx, nt, k, y, ldy);
}

}  // namespace ggml
}  // namespace rmoe

#endif
