// The one binding file of the CPU module. Kernels take raw pointers; this file
// checks shapes and dtypes, releases the GIL and hands over pointers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "convert.h"
#include "isa.h"
#include "threadpool.h"

namespace py = pybind11;

namespace {

using U16Array = py::array_t<uint16_t, py::array::c_style>;
using F32Array = py::array_t<float, py::array::c_style>;

F32Array convert_rows(const U16Array& src, void (*fn)(const uint16_t*, float*, size_t)) {
  F32Array out(std::vector<py::ssize_t>(src.shape(), src.shape() + src.ndim()));
  const uint16_t* s = src.data();
  float* d = out.mutable_data();
  const size_t n = (size_t)src.size();
  {
    py::gil_scoped_release nogil;
    fn(s, d, n);
  }
  return out;
}

py::dict isa_info() {
  const auto& f = rmoe::cpu_features();
  py::dict d;
  d["active"] = rmoe::isa_name(rmoe::active_isa());
  d["avx2"] = f.avx2 && f.fma && f.f16c && f.os_avx;
  d["avx512"] = f.avx512f && f.avx512bw && f.avx512vl && f.os_avx512;
  d["avx512_vnni"] = f.avx512vnni;
  d["avx512_bf16"] = f.avx512bf16;
  d["amx_tile_cpuid"] = f.amx_tile;
  return d;
}

}  // namespace

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "rapidmoe CPU kernels";
  m.def("f16_to_f32", [](const U16Array& a) { return convert_rows(a, rmoe::f16_to_f32_row); },
        "IEEE half bits (uint16, any shape) -> float32 of the same shape");
  m.def("bf16_to_f32", [](const U16Array& a) { return convert_rows(a, rmoe::bf16_to_f32_row); },
        "bfloat16 bits (uint16, any shape) -> float32 of the same shape");
  m.def("isa_info", &isa_info, "CPU features and the kernel path in use");
  m.def("set_num_threads", &rmoe::set_num_threads, py::arg("n"), "kernel threads (<= 0: usable cores)");
  m.def("num_threads", &rmoe::num_threads);
}
