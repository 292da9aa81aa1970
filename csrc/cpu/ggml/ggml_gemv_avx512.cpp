// AVX-512 kernels of the GGUF matmul: ggml_gemv_simd.h on zmm. The fused GEMV takes
// T <= 8 activation rows (four at a time), 8 weight rows at a time for one token (8 FMA
// chains and 8 row streams the prefetcher keeps fed: measured best for every type, 2 to
// 16 KiB rows) and 4 for more.
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx512.h"

namespace rmoe {
namespace ggml {
namespace {

// Twin of F32x8 and the entry points in ggml_gemv_avx2.cpp, on purpose (see there).
// One zmm register of floats (32 zmm: R * 4 accumulators + R weights fit).
struct F32x16 {
  using F = __m512;
  using Tail = __mmask16;
  static constexpr size_t lanes = 16;
  static constexpr int tile_t = 4, fused_max_t = 8, fused_group = 4, rows_one_token = 8;
  static RMOE_INLINE F zero() { return _mm512_setzero_ps(); }
  static RMOE_INLINE F load(const float* p) { return _mm512_loadu_ps(p); }
  static RMOE_INLINE Tail tail(size_t n) { return (__mmask16)((1u << n) - 1); }
  static RMOE_INLINE F load(const float* p, Tail m) { return _mm512_maskz_loadu_ps(m, p); }
  static RMOE_INLINE F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static RMOE_INLINE float sum(F v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace
}  // namespace ggml
}  // namespace rmoe

#include "ggml/ggml_gemv_simd.h"

namespace rmoe {
namespace ggml {

bool gemv_fused_avx512(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const float* x, size_t nt,
                       float* y, size_t ldy) {
  using namespace avx512;
  switch (type) {
#define RMOE_CASE(T, U) case T: return fused_type<F32x16, U>(w, rb, k, nr, x, k, nt, y, ldy);
    RMOE_GGML_FOR_TYPES(RMOE_CASE)
#undef RMOE_CASE
    default: return false;
  }
}

void gemm_tile_avx512(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy) {
  gemm_tile<F32x16>(w, ldw, nr, x, ldx, nt, k, y, ldy);
}

}  // namespace ggml
}  // namespace rmoe

#endif
