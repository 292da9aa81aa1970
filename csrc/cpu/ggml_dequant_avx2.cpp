// AVX2 dequantization of GGUF types, bit-exact with the scalar reference
// (the unpackers live in ggml_unpack_avx2.h). Only called after isa.cpp checks.
#include "ggml_kernels.h"

#if RMOE_X86
#include "ggml_unpack_avx2.h"

namespace rmoe {
namespace ggml {

namespace {

struct Store {
  static constexpr bool exact = true;
  float* o;
  RMOE_INLINE void put(int off, __m256 v) { _mm256_storeu_ps(o + off, v); }
};

template <class U>
void run(const uint8_t* s, float* d, size_t n) {
  Store st{d};
  for (size_t i = 0; i < n; ++i, st.o += U::block) U::unpack(s + i * U::bytes, st);
}

// Float types count elements, not blocks: whole 8s, then the tail one by one.
template <class U>
void run_elements(int type, const uint8_t* s, float* d, size_t n) {
  run<U>(s, d, n / 8);
  const size_t done = n / 8 * 8;
  if (done < n) dequant_blocks_scalar(type, s + done * (U::bytes / 8), d + done, n - done);
}

}  // namespace

void dequant_blocks_avx2(int type, const uint8_t* src, float* dst, size_t nblk) {
  using namespace avx2;
  switch (type) {
    case F32: return run_elements<UF32>(type, src, dst, nblk);
    case F16: return run_elements<UF16>(type, src, dst, nblk);
    case BF16: return run_elements<UBF16>(type, src, dst, nblk);
#define RMOE_CASE(T, U) case T: return run<U>(src, dst, nblk);
    RMOE_CASE(Q4_0, UQ4_0) RMOE_CASE(Q4_1, UQ4_1) RMOE_CASE(Q5_0, UQ5_0) RMOE_CASE(Q5_1, UQ5_1)
    RMOE_CASE(Q8_0, UQ8_0) RMOE_CASE(Q2_K, UQ2_K) RMOE_CASE(Q3_K, UQ3_K) RMOE_CASE(Q4_K, UQ4_K)
    RMOE_CASE(Q5_K, UQ5_K) RMOE_CASE(Q6_K, UQ6_K)
#undef RMOE_CASE
    default: return;
  }
}

}  // namespace ggml
}  // namespace rmoe

#else
namespace rmoe {
namespace ggml {
void dequant_blocks_avx2(int type, const uint8_t* src, float* dst, size_t nblk) {
  dequant_blocks_scalar(type, src, dst, nblk);
}
}  // namespace ggml
}  // namespace rmoe
#endif
