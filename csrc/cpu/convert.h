// Scalar element conversions shared by the CPU kernels.
#pragma once
#include <cstdint>
#include <cstring>
#include <cstddef>

namespace rmoe {

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, nan).
// static: each translation unit keeps its own copy, so the linker can never pick
// one compiled with AVX2/AVX-512 flags for a scalar caller.
static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Row conversions with ISA dispatch (convert.cpp).
void f16_to_f32_row(const uint16_t* src, float* dst, size_t n);   // src [n] -> dst [n]
void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n);  // src [n] -> dst [n]

}  // namespace rmoe
