// The kernels under dev/emu.h as a shared library with one entry point that
// takes cuLaunchKernel's argument array, so engine/gpu/kernels.py (argument
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
  } else if (n == "ggml_gemv") {
    emu_launch(g, block, ggml_gemv, arg<int>(a, 0), arg<const u8*>(a, 1), arg<int>(a, 2), arg<int>(a, 3),
               arg<int>(a, 4), arg<const float*>(a, 5), arg<int>(a, 6), arg<float*>(a, 7));
  } else if (n == "ggml_dequant_bf16") {
    emu_launch(g, block, ggml_dequant_bf16, arg<int>(a, 0), arg<const u8*>(a, 1), arg<int>(a, 2), arg<int>(a, 3),
               arg<int>(a, 4), arg<u16*>(a, 5));
  } else {
    return 1;
  }
  return 0;
}
