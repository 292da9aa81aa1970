// Int8 activations for the GGUF GEMV at small T (decode): each activation row
// is quantized once per matmul call, then every weight block is multiplied
// with integer dot products (u8 x s8 -> int32) and scaled once per block.
//
// Activation row of k values, as stored (`group` G = 32 or 256):
//   [qs: k x int8][d: k/G x f32][s: k/32 x f32, G = 32 only][bsum: k/16 x int16]
//   padded to 64 bytes.
//   x[e] ~= d[e / G] * q[e],  q = rint(x * (127 / amax)) in [-127, 127],
//   amax = max |x| over the group, 127 / amax one f32 division.
//   bsum[j] = sum of the 16 q of elements 16j .. 16j+15 (natural order): the
//   weight offsets (Q4_0's -8, Q6_K's -32, K-quant mins) are applied to these
//   sums instead of to each product.
// The groups and scales are llama.cpp's activation blocks, so that the same
// weights give the same numbers:
//   G = 32 (q8_0 / q8_1) for the 32-weight types, one scale per weight block:
//   d = fp16(amax / 127), and s = fp16((amax / 127) * sum of the group's 32 q)
//   (f32 product, then rounded), the term the weight's min m multiplies
//   (Q4_1 / Q5_1: sum w*x = d_w*d * sum c*q + m*s). Both are stored as the f32
//   values of those halves.
//   G = 256 (q8_K) for the K-quants: d = 1 / (127 / amax) in f32, not rounded: llama.cpp's
//   quantize_row_q8_K keeps 1/iscale, which can be an ulp off amax / 127. One scale per
//   super-block lets the sub-block sums stay integer across it.
// |q| <= 127 (never -128) so that sign tricks and maddubs cannot overflow.
// A group holding inf or NaN gets q = 0, d = s = NaN: its dot products are NaN.
//
// Q8_K_SWAP is the G = 256 layout with the 32-value groups 1 and 2 of every
// 128 stored swapped: [e0..31][e64..95][e32..63][e96..127]. The AVX-512 Q4_K /
// Q5_K kernels load 64 packed bytes = low nibbles of sub-blocks 0 and 2, high
// nibbles of 1 and 3; with this order their activations are one plain load.
//
// Everything here has internal linkage (see ggml_blocks.h).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ggml/ggml_blocks.h"

namespace rmoe {
namespace ggml {

enum Q8Layout : int { Q8_NONE = -1, Q8_32 = 0, Q8_K = 1, Q8_K_SWAP = 2 };

namespace {

inline size_t q8_group(int layout) { return layout == Q8_32 ? 32 : 256; }

// Bytes of one quantized row (a multiple of 64).
inline size_t q8_row_bytes(int layout, size_t k) {
  const size_t n = k + 4 * (k / q8_group(layout)) + (layout == Q8_32 ? 4 * (k / 32) : 0) + 2 * (k / 16);
  return (n + 63) & ~(size_t)63;
}

// Read-only view of nt quantized rows, ld bytes apart.
struct Q8View {
  const uint8_t* base;
  size_t ld, k, group;
  const int8_t* qs(size_t t) const { return reinterpret_cast<const int8_t*>(base + t * ld); }
  const float* d(size_t t) const { return reinterpret_cast<const float*>(base + t * ld + k); }
  // the min terms s (G = 32 only)
  const float* s(size_t t) const { return reinterpret_cast<const float*>(base + t * ld + k + 4 * (k / group)); }
  const int16_t* bsum(size_t t) const {
    return reinterpret_cast<const int16_t*>(base + t * ld + k + 4 * (k / group) + (group == 32 ? 4 * (k / 32) : 0));
  }
};

// Pointers into one stored row being written (the quantizers).
struct Q8Row {
  int8_t* qs;
  float* d;
  float* s;  // nullptr unless G = 32
  int16_t* bsum;
};
inline Q8Row q8_row(int layout, uint8_t* row, size_t k) {
  const size_t G = q8_group(layout);
  float* d = reinterpret_cast<float*>(row + k);
  float* s = layout == Q8_32 ? d + k / G : nullptr;
  int16_t* bs = reinterpret_cast<int16_t*>(row + k + 4 * (k / G) + (layout == Q8_32 ? 4 * (k / 32) : 0));
  return {reinterpret_cast<int8_t*>(row), d, s, bs};
}

// The float nearest x among IEEE halves (ties to even; beyond the largest
// half, inf; NaN stays NaN): what an f32 -> fp16 -> f32 round trip gives.
inline float f16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return x;  // NaN
  if (a >= 0x477ff000u) {          // >= 65520: rounds past 65504
    u = sign | 0x7f800000u;
  } else if (a < 0x38800000u) {    // below 2^-14: the half subnormals, steps of 2^-24
    float f;
    std::memcpy(&f, &a, 4);
    f = std::nearbyint(f * 16777216.0f) * 5.9604644775390625e-08f;  // exact scalings; ties to even
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else {                         // normal: keep 10 mantissa bits, ties to even
    u = sign | ((a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Stored position of element e in a Q8_K_SWAP row.
inline size_t q8_swap_pos(size_t e) {
  const size_t g = (e >> 5) & 3;
  return (e & ~(size_t)127) | ((g == 1 ? 2 : g == 2 ? 1 : g) << 5) | (e & 31);
}

// Stores group g's scale(s) once its q and bsum are written (amax NaN for a bad group,
// id = 127 / amax or 0).
inline void q8_set_scales(int layout, const Q8Row& row, size_t g, float amax, float id) {
  if (layout == Q8_32) {
    const float d = amax / 127.0f;
    row.d[g] = f16_round(d);
    row.s[g] = f16_round(d * (float)(row.bsum[2 * g] + row.bsum[2 * g + 1]));
  } else {
    row.d[g] = id > 0.0f ? 1.0f / id : amax / 127.0f;  // id 0: d is 0 (or NaN for a bad group)
  }
}

// The quantizers' common walk over every group of every row. Per group the ISA part
// finds max |x| and whether any value is not finite (probe(xg, &amax, &bad)), then writes
// the group's int8 values and 16-value sums (store(xg, e0, id, bad, row): x * id rounded
// to nearest even, e0 the group's first element; id = 127 / amax, 0 for a bad group);
// the scales are set here. Same arithmetic on every path.
template <class Probe, class Store>
void q8_quantize_rows(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld, Probe probe,
                      Store store) {
  const size_t G = q8_group(layout);
  for (size_t t = 0; t < T; ++t) {
    const Q8Row row = q8_row(layout, dst + t * ld, k);
    for (size_t g = 0; g < k / G; ++g) {
      const float* xg = x + t * k + g * G;
      float amax;
      bool bad;
      probe(xg, &amax, &bad);
      const float id = amax > 0.0f && !bad ? 127.0f / amax : 0.0f;
      store(xg, g * G, id, bad, row);
      q8_set_scales(layout, row, g, bad ? NAN : amax, id);
    }
  }
}

// Q4_K / Q5_K 12 scale bytes -> bytes 0..7 = sc[0..7], 8..15 = mn[0..7] (the
// 6-bit packing diagrammed in ggml_blocks.h, undone four bytes at a time).
inline void k4_unpack_scales(const uint8_t* s, uint32_t out[4]) {
  const uint32_t u0 = ld32(s), u1 = ld32(s + 4), u2 = ld32(s + 8);
  out[0] = u0 & 0x3f3f3f3fu;                                             // sc[0..3]
  out[1] = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);        // sc[4..7]
  out[2] = u1 & 0x3f3f3f3fu;                                             // mn[0..3]
  out[3] = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4); // mn[4..7]
}

}  // namespace
}  // namespace ggml
}  // namespace rmoe
