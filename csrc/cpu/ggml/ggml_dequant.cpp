// Dequantization of GGUF's own types: the scalar reference, and the kernel table's
// path for callers (the ISA files: ggml_dequant_avx2.cpp, ggml_dequant_avx512.cpp).
#include <algorithm>

#include "ggml/ggml_blocks.h"
#include "ggml/ggml_kernels.h"
#include "common/threadpool.h"
#include "kernel_table.h"

namespace rmoe {
namespace ggml {

bool supported(int type) { return type_info(type).block > 0; }

size_t row_bytes(int type, size_t k) {
  const TypeInfo ti = type_info(type);
  if (ti.block == 0 || k % (size_t)ti.block) return 0;
  return k / (size_t)ti.block * (size_t)ti.bytes;
}

void dequant_blocks_scalar(int type, const uint8_t* src, float* dst, size_t nblk) {
  switch (type) {
    case F32:
      std::memcpy(dst, src, nblk * 4);
      return;
    case F16:
      for (size_t i = 0; i < nblk; ++i) dst[i] = half_to_float(ld16(src + 2 * i));
      return;
    case BF16:
      for (size_t i = 0; i < nblk; ++i) { const uint32_t bits = (uint32_t)ld16(src + 2 * i) << 16; std::memcpy(dst + i, &bits, 4); }
      return;
    default: {
      const TypeInfo ti = type_info(type);
      for (size_t i = 0; i < nblk; ++i) dequant_block_scalar(type, src + i * ti.bytes, dst + i * ti.block);
    }
  }
}

void dequant_blocks(int type, const uint8_t* src, float* dst, size_t nblk) {
  kernels().ggml.dequant_blocks(type, src, dst, nblk);
}

void dequantize_row(int type, const uint8_t* src, float* dst, size_t k) {
  dequant_blocks(type, src, dst, k / (size_t)type_info(type).block);
}

void dequantize(int type, const uint8_t* src, float* dst, size_t n) {
  const TypeInfo ti = type_info(type);
  const size_t nblk = n / (size_t)ti.block;
  // ~64 KiB of output per chunk keeps small tensors on one thread.
  const size_t min_chunk = std::max<size_t>(1, 16384 / (size_t)ti.block);
  parallel_for(
      nblk,
      [&](size_t b0, size_t b1, int) {
        dequant_blocks(type, src + b0 * ti.bytes, dst + b0 * ti.block, b1 - b0);
      },
      min_chunk);
}

}  // namespace ggml
}  // namespace rmoe
