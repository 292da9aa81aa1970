// The kernels under dev/emu.h as a shared library with one entry point that
// takes cuLaunchKernel's argument array, so engine/gpu/cuda_kernels.py (argument
// packing, grid sizes, tensor layouts) runs unchanged on a machine without a GPU.
#include <string>

#include "emu.h"

#include "../ggml_gemv.cu"
#include "../resplit_wq.cu"

template <class T>
static T arg(void** a, int i) { return *reinterpret_cast<T*>(a[i]); }

typedef void (*GateUpFn)(const u8*, const u8*, i64, int, const int*, const int*, const uint4*, const float2*, int, int,
                         int, float*, float*);
typedef void (*GemvFn)(const u8*, i64, int, const int*, const int*, const uint4*, const float2*, int, int, const float*,
                       float*);

typedef void (*GgmlGemvFn)(const u8*, int, int, int, const u8*, const float2*, int, float*, int, int);
#define GG_EMU_ROW(fmt, F)                                                                        \
  {"ggml_gemv_" #fmt "_t1", ggml_gemv_##fmt##_t1}, {"ggml_gemv_" #fmt "_t2", ggml_gemv_##fmt##_t2}, \
      {"ggml_gemv_" #fmt "_t4", ggml_gemv_##fmt##_t4}, {"ggml_gemv_" #fmt "_t8", ggml_gemv_##fmt##_t8},
static const struct {
  const char* name;
  GgmlGemvFn fn;
} ggml_gemvs[] = {GG_FORMATS(GG_EMU_ROW)};

static GgmlGemvFn ggml_gemv_named(const std::string& n) {
  for (const auto& e : ggml_gemvs)
    if (n == e.name) return e.fn;
  return nullptr;
}

extern "C" int emu_call(const char* name, unsigned gx, unsigned gy, unsigned block, void** a) {
  const std::string n(name);
  const EmuDim g{gx, gy, 1};
  GateUpFn gu = n == "wq_gemv_gate_up" ? wq_gemv_gate_up : n == "wq_gemv_gate_up_r1" ? wq_gemv_gate_up_r1
              : n == "wq_gemv_gate_up_r4" ? wq_gemv_gate_up_r4 : nullptr;
  GemvFn gv = n == "wq_gemv" ? wq_gemv : n == "wq_gemv_r2" ? wq_gemv_r2 : n == "wq_gemv_r8" ? wq_gemv_r8 : nullptr;
  if (n == "wq_prep") {
    emu_launch(g, block, wq_prep, arg<const float*>(a, 0), arg<int>(a, 1), arg<int>(a, 2), arg<int>(a, 3),
               arg<uint4*>(a, 4), arg<float2*>(a, 5));
  } else if (gu) {
    emu_launch(g, block, gu, arg<const u8*>(a, 0), arg<const u8*>(a, 1), arg<i64>(a, 2), arg<int>(a, 3),
               arg<const int*>(a, 4), arg<const int*>(a, 5), arg<const uint4*>(a, 6), arg<const float2*>(a, 7),
               arg<int>(a, 8), arg<int>(a, 9), arg<int>(a, 10), arg<float*>(a, 11), arg<float*>(a, 12));
  } else if (gv) {
    emu_launch(g, block, gv, arg<const u8*>(a, 0), arg<i64>(a, 1), arg<int>(a, 2), arg<const int*>(a, 3),
               arg<const int*>(a, 4), arg<const uint4*>(a, 5), arg<const float2*>(a, 6), arg<int>(a, 7), arg<int>(a, 8),
               arg<const float*>(a, 9), arg<float*>(a, 10));
  } else if (n == "wq_dequant_bf16") {
    emu_launch(g, block, wq_dequant_bf16, arg<const u8*>(a, 0), arg<i64>(a, 1), arg<int>(a, 2), arg<const int*>(a, 3),
               arg<int>(a, 4), arg<int>(a, 5), arg<u16*>(a, 6));
  } else if (n == "ggml_quant_x") {
    emu_launch(g, block, ggml_quant_x, arg<const float*>(a, 0), arg<int>(a, 1), arg<u32*>(a, 2), arg<float2*>(a, 3));
  } else if (GgmlGemvFn gg = ggml_gemv_named(n)) {
    emu_launch(g, block, gg, arg<const u8*>(a, 0), arg<int>(a, 1), arg<int>(a, 2), arg<int>(a, 3),
               arg<const u8*>(a, 4), arg<const float2*>(a, 5), arg<int>(a, 6), arg<float*>(a, 7), arg<int>(a, 8),
               arg<int>(a, 9));
  } else if (n == "ggml_dequant_bf16") {
    emu_launch(g, block, ggml_dequant_bf16, arg<int>(a, 0), arg<const u8*>(a, 1), arg<int>(a, 2), arg<int>(a, 3),
               arg<int>(a, 4), arg<u16*>(a, 5));
  } else {
    return 1;
  }
  return emu_fault.exchange(false) ? 2 : 0;
}
