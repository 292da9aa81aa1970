// What the CPU module's binding files (bindings*.cpp) share: the array types they
// accept and the argument checks more than one of them needs. Kernels take raw
// pointers; the binding files check shapes and dtypes, release the GIL and hand
// over pointers. bindings.cpp holds the module and calls the others' def_* below.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "resplit/resplit.h"

namespace py = pybind11;

namespace rmoe {
namespace bind {

using U8Array = py::array_t<uint8_t, py::array::c_style>;
using U16Array = py::array_t<uint16_t, py::array::c_style>;
using I32Array = py::array_t<int32_t, py::array::c_style>;
using F32Array = py::array_t<float, py::array::c_style>;

// The six expert tensors of a residual-split layer, checked against each other and H;
// the residual ones (None allowed when no slot is critical, or when source is given) are
// kept alive here. source: None, or the source file's experts the critical ones run from,
// ((gate rows [E*F, rb], GGUF type), (up, as gate), (down rows [E*H, rb], type)), each type
// one with an int8 GEMV; kept alive in src.
struct MoeArgs {
  rmoe::resplit::MoeWeights mw{};
  U8Array gr, ur, d4;
  py::object src;
  MoeArgs(const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q, const py::object& gate_r,
          const py::object& up_r, const py::object& down4, const py::object& source, size_t H, bool any_crit,
          const std::string& fn);
};

void def_resplit(py::module_& m);  // bindings_resplit.cpp: the WQ/WR/D4 formats, the MoE layer
void def_attn(py::module_& m);     // bindings_decode.cpp: decode attention, the fused block halves
void def_chain(py::module_& m);    // bindings_chain.cpp: DecodeChain

}  // namespace bind
}  // namespace rmoe
