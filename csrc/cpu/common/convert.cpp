#include "common/convert.h"

#include "kernel_table.h"

namespace rmoe {

void f16_to_f32_row(const uint16_t* src, float* dst, size_t n) { kernels().f16_to_f32_row(src, dst, n); }

void f16_to_f32_row_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace rmoe
