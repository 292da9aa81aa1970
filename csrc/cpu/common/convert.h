// Scalar element conversions shared by the CPU kernels.
#pragma once
#include <cmath>
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

// float32 -> float16 bits, round-half-even (as numpy's astype(float16) and F16C).
static inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504
  if (ax < 0x38800000u) {                       // below 2^-14: subnormal (exact scaling)
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | (uint16_t)std::nearbyint(a * 16777216.0f);
  }
  uint32_t h = ((((ax >> 23) - 127 + 15)) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | (uint16_t)h;
}

// float32 -> bfloat16 bits, round-half-even; NaN stays a (quiet) NaN (as ggml's
// GGML_FP32_TO_BF16).
static inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64);
  return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

// Row conversions (convert.cpp; f16 by the kernel table's path).
void f16_to_f32_row(const uint16_t* src, float* dst, size_t n);   // src [n] -> dst [n]
void f16_to_f32_row_scalar(const uint16_t* src, float* dst, size_t n);
void f16_to_f32_row_avx2(const uint16_t* src, float* dst, size_t n);  // convert_avx2.cpp
void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n);  // src [n] -> dst [n]

}  // namespace rmoe
