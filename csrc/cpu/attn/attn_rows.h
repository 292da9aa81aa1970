// Pieces of the attention kernels that do not depend on the vector width, shared by
// attn.cpp (the portable path), attn_avx2.cpp and attn_avx512.cpp. Internal linkage on
// purpose (as simd.h): each file compiles its own copy with its own flags, and every
// template here is instantiated with that file's own (anonymous) types.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attn/attn.h"

namespace rmoe {
namespace {

template <int N>
struct Int {
  static constexpr int value = N;
};

// fn(rows) with the file's loader of rows j0.. of group g of cache c: F16 for f16 rows,
// F32 for f32 rows (stride in bytes for F16, in floats for F32).
template <class F16, class F32, class Fn>
inline void on_cache_rows(const KvRows& c, size_t g, size_t j0, Fn&& fn) {
  const uint8_t* p = c.base + j0 * c.pos_stride + g * c.head_stride;
  if (c.type == KvType::F16) fn(F16{p, c.pos_stride});
  else fn(F32{reinterpret_cast<const float*>(p), c.pos_stride / 4});
}

// Rows j0 .. j0 + n of group g of cache c as f32 into tile (n rows of c.dim): f32 rows are
// copied, f16 rows converted by f16(row, dim, out), q8_0 rows block by block by
// q8(block of 34 bytes, out[32]).
template <class F16, class Q8>
inline void rows_to_tile(const KvRows& c, size_t g, size_t j0, size_t n, float* tile, F16&& f16, Q8&& q8) {
  const size_t d = c.dim;
  for (size_t t = 0; t < n; ++t, tile += d) {
    const uint8_t* r = c.base + (j0 + t) * c.pos_stride + g * c.head_stride;
    if (c.type == KvType::F32) std::memcpy(tile, r, d * sizeof(float));
    else if (c.type == KvType::F16) f16(r, d, tile);
    else
      for (size_t b = 0; b < d / 32; ++b) q8(r + 34 * b, tile + 32 * b);
  }
}

// Blocks of R items while they fit, then one each of R/2, R/4, .., 1 where they fit:
// fn(Int<size>{}, first item).
template <int R, class Fn>
inline void halving_tail(size_t n, size_t i, Fn& fn) {
  if constexpr (R >= 1) {
    if (i + R <= n) {
      fn(Int<R>{}, i);
      i += R;
    }
    halving_tail<R / 2>(n, i, fn);
  }
}
template <int R, class Fn>
inline void in_blocks(size_t n, Fn&& fn) {
  size_t i = 0;
  for (; i + R <= n; i += R) fn(Int<R>{}, i);
  halving_tail<R / 2>(n, i, fn);
}

}  // namespace
}  // namespace rmoe
