#include "convert.h"

#include "isa.h"

namespace rmoe {

#if RMOE_X86
void f16_to_f32_row_avx2(const uint16_t* src, float* dst, size_t n);  // convert_avx2.cpp
#endif

void f16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
#if RMOE_X86
  if (active_isa() >= Isa::Avx2) return f16_to_f32_row_avx2(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace rmoe
