// The CPU path's kernels, chosen once: kernel_table.cpp reads active_isa() and
// cpu_features() (common/isa.h) and fills this table; every call site reads it, and no
// other code branches on the ISA. A kernel is only ever in the table where isa.cpp found
// its instructions, so a path the CPU lacks cannot run. Adding an ISA path: write its
// kernels beside the generic ones (ggml/, resplit/, attn/) and give it a row here.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attn/attn.h"
#include "common/isa.h"
#include "ggml/ggml_kernels.h"
#include "resplit/resplit.h"
#include "resplit/resplit_search.h"

namespace rmoe {

struct KernelTable {
  Isa isa;
  void (*f16_to_f32_row)(const uint16_t* src, float* dst, size_t n);
  ggml::Kernels ggml;                  // GGUF-type dequantizers and GEMVs
  resplit::Kernels resplit;            // the WQ / WR / D4 expert kernels
  resplit::SearchKernels quant;        // the WQ / WR / D4 quantizers' searches
  TileOps attn;                        // decode and prefill attention tiles
};

const KernelTable& kernels();

}  // namespace rmoe
