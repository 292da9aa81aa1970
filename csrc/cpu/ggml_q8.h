// Int8 activations for the GGUF GEMV at small T (decode): each activation row
// is quantized once per matmul call, then every weight block is multiplied
// with integer dot products (u8 x s8 -> int32) and scaled once per block.
//
// Activation row of k values, as stored (`group` G = 32 or 256):
//   [qs: k x int8][d: k/G x f32][bsum: k/16 x int16]   padded to 64 bytes
//   x[e] ~= d[e / G] * q[e],  q = rint(x * (127 / amax)) in [-127, 127],
//   d = amax / 127, amax = max |x| over the group (rounded once each, f32).
//   bsum[j] = sum of the 16 q of elements 16j .. 16j+15 (natural order): the
//   weight offsets (Q4_0's -8, Q6_K's -32, K-quant mins) are applied to these
//   sums instead of to each product.
// G = 256 (q8_K, as llama.cpp) for the K-quants: one activation scale per
// super-block lets the sub-block sums stay integer across the whole block.
// G = 32 (q8_0) for the 32-weight types: one scale per weight block either way.
// |q| <= 127 (never -128) so that sign tricks and maddubs cannot overflow.
// A group holding inf or NaN gets q = 0, d = NaN: its dot products are NaN.
//
// Q8_K_SWAP is the G = 256 layout with the 32-value groups 1 and 2 of every
// 128 stored swapped: [e0..31][e64..95][e32..63][e96..127]. The AVX-512 Q4_K /
// Q5_K kernels load 64 packed bytes = low nibbles of sub-blocks 0 and 2, high
// nibbles of 1 and 3; with this order their activations are one plain load.
//
// Everything here has internal linkage (see ggml_blocks.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml_blocks.h"

namespace rmoe {
namespace ggml {

enum Q8Layout : int { Q8_NONE = -1, Q8_32 = 0, Q8_K = 1, Q8_K_SWAP = 2 };

namespace {

inline size_t q8_group(int layout) { return layout == Q8_32 ? 32 : 256; }

// Bytes of one quantized row (a multiple of 64).
inline size_t q8_row_bytes(int layout, size_t k) {
  const size_t n = k + 4 * (k / q8_group(layout)) + 2 * (k / 16);
  return (n + 63) & ~(size_t)63;
}

// Read-only view of nt quantized rows, ld bytes apart.
struct Q8View {
  const uint8_t* base;
  size_t ld, k, group;
  const int8_t* qs(size_t t) const { return reinterpret_cast<const int8_t*>(base + t * ld); }
  const float* d(size_t t) const { return reinterpret_cast<const float*>(base + t * ld + k); }
  const int16_t* bsum(size_t t) const {
    return reinterpret_cast<const int16_t*>(base + t * ld + k + 4 * (k / group));
  }
};

// Stored position of element e in a Q8_K_SWAP row.
inline size_t q8_swap_pos(size_t e) {
  const size_t g = (e >> 5) & 3;
  return (e & ~(size_t)127) | ((g == 1 ? 2 : g == 2 ? 1 : g) << 5) | (e & 31);
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
