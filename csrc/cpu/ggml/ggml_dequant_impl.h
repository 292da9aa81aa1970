// Body of the per-ISA GGUF dequantizers (ggml_dequant_avx2.cpp, ggml_dequant_avx512.cpp),
// bit-exact with the scalar reference. The including file first includes its unpackers
// and defines: RMOE_DQ_NS (their namespace), RMOE_DQ_VEC (the float vector type),
// RMOE_DQ_STORE (its unaligned store), RMOE_DQ_LANES (floats per vector) and
// RMOE_DQ_FN (the entry point's name). Everything here has internal linkage.

namespace rmoe {
namespace ggml {

namespace {

struct Store {
  static constexpr bool exact = true;
  float* o;
  RMOE_INLINE void put(int off, RMOE_DQ_VEC v) { RMOE_DQ_STORE(o + off, v); }
};

template <class U>
void run(const uint8_t* s, float* d, size_t n) {
  Store st{d};
  for (size_t i = 0; i < n; ++i, st.o += U::block) U::unpack(s + i * U::bytes, st);
}

// Float types count elements, not blocks: whole vectors, then the tail one by one.
template <class U>
void run_elements(int type, const uint8_t* s, float* d, size_t n) {
  constexpr size_t L = RMOE_DQ_LANES;
  run<U>(s, d, n / L);
  const size_t done = n / L * L;
  if (done < n) dequant_blocks_scalar(type, s + done * (U::bytes / L), d + done, n - done);
}

}  // namespace

void RMOE_DQ_FN(int type, const uint8_t* src, float* dst, size_t nblk) {
  using namespace RMOE_DQ_NS;
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
