// The CPU module (rapidmoe.engine._cpu). This file holds the module, the ISA and
// thread controls and the GGUF-type kernels; bindings_resplit.cpp and
// bindings_decode.cpp bind the rest (bindings.h: what they share).
#include "bindings.h"

#include <vector>

#include "common/convert.h"
#include "ggml/ggml_kernels.h"
#include "common/isa.h"
#include "common/membench.h"
#include "common/threadpool.h"
#include "kernel_table.h"

using namespace rmoe::bind;

namespace {

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
  d["active"] = rmoe::isa_name(rmoe::kernels().isa);
  d["avx2"] = f.avx2 && f.fma && f.f16c && f.os_avx;
  d["avx512"] = f.avx512f && f.avx512bw && f.avx512vl && f.os_avx512;
  d["avx512_vnni"] = f.avx512vnni;
  d["avx512_vbmi"] = f.avx512vbmi;
  d["avx_vnni"] = f.avxvnni;
  d["wr_int8"] = rmoe::resplit::wr_int8_acts();  // WR kernels run on int8 activations
  d["wq_z"] = rmoe::resplit::wq_z_acts();  // non-critical decode rows run WQ on z activations
  d["wq_z_levels"] = (int)rmoe::resplit::wq_z_levels();  // of L levels (sx = max|x|/L)
  // MoE groups of at least this many tokens take the requantized int8 GEMM (0: no such path here)
  d["i8_gemm_min_tokens"] = rmoe::resplit::i8_gemm_available() ? rmoe::resplit::kI8MinTokens : 0;
  // ... and so do groups of critical experts run from the source file (else the GGUF int8 GEMV)
  d["i8_gemm_source"] = rmoe::resplit::i8_gemm_for_source();
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
  m.def("read_bandwidth_gbs", [](const py::array_t<uint8_t, py::array::c_style>& buf, int passes) {
          const uint8_t* p = buf.data();
          const size_t n = (size_t)buf.size();
          py::gil_scoped_release nogil;
          return rmoe::read_bandwidth_gbs(p, n, passes);
        }, py::arg("buf"), py::arg("passes") = 3, "best read GB/s over a buffer (uint8 [n]) with the kernel threads");
  m.def("num_threads", &rmoe::num_threads);
  // GGUF tensor types kept in their source format (ggml_*.cpp).
  m.def("ggml_row_bytes", &rmoe::ggml::row_bytes, py::arg("type"), py::arg("k"),
        "bytes of one row of k weights of a GGUF type (0: unsupported type or k not whole blocks)");
  m.def("ggml_int8_gemv", [](int type, size_t k) { return rmoe::ggml::q8_act_layout(type, k) >= 0; },
        py::arg("type"), py::arg("k"),
        "whether rows of k weights of this GGUF type run the int8-activation GEMV here (as llama.cpp's)");
  m.def(
      "ggml_dequantize",
      [](const py::array_t<uint8_t, py::array::c_style>& raw, int type, int64_t n) {
        const size_t nb = n < 0 ? 0 : rmoe::ggml::row_bytes(type, (size_t)n);
        if (n < 0 || (n > 0 && nb == 0)) throw py::value_error("ggml_dequantize: unsupported type or count");
        if ((size_t)raw.size() < nb) throw py::value_error("ggml_dequantize: raw holds fewer bytes than n weights need");
        F32Array out(n);
        const uint8_t* s = raw.data();
        float* d = out.mutable_data();
        py::gil_scoped_release nogil;
        rmoe::ggml::dequantize(type, s, d, (size_t)n);
        return out;
      },
      py::arg("raw"), py::arg("type"), py::arg("n"), "raw bytes of n weights of a GGUF type -> float32 [n]");
  m.def(
      "ggml_matmul",
      [](const py::array_t<uint8_t, py::array::c_style>& w, int type, const F32Array& x) {
        if (w.ndim() != 2 || x.ndim() != 2) throw py::value_error("ggml_matmul: W [rows, row_bytes], x [T, k]");
        const size_t rows = w.shape(0), rb = w.shape(1), T = x.shape(0), k = x.shape(1);
        if (rmoe::ggml::row_bytes(type, k) != rb || rb == 0)
          throw py::value_error("ggml_matmul: W rows are not k weights of this type");
        F32Array y({(py::ssize_t)T, (py::ssize_t)rows});
        const uint8_t* wp = w.data();
        const float* xp = x.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release nogil;
        rmoe::ggml::matmul(type, wp, rows, rb, k, xp, T, yp);
        return y;
      },
      py::arg("w"), py::arg("type"), py::arg("x"), "y [T, rows] = x [T, k] @ W^T, W raw rows of a GGUF type");
  m.def(
      "ggml_expert_matmul",
      [](const py::array_t<uint8_t, py::array::c_style>& w, int type, const py::array_t<int32_t, py::array::c_style>& ids,
         const F32Array& x) {
        if (w.ndim() != 3 || x.ndim() != 2 || ids.ndim() != 1 || ids.shape(0) != x.shape(0))
          throw py::value_error("ggml_expert_matmul: W [E, rows, row_bytes], ids [n], x [n, k]");
        const size_t E = w.shape(0), rows = w.shape(1), rb = w.shape(2), n = x.shape(0), k = x.shape(1);
        if (rmoe::ggml::row_bytes(type, k) != rb || rb == 0)
          throw py::value_error("ggml_expert_matmul: W rows are not k weights of this type");
        const int32_t* ip = ids.data();
        for (size_t j = 0; j < n; ++j)
          if (ip[j] < 0 || (size_t)ip[j] >= E) throw py::value_error("ggml_expert_matmul: expert id out of range");
        F32Array y({(py::ssize_t)n, (py::ssize_t)rows});
        const uint8_t* wp = w.data();
        const float* xp = x.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release nogil;
        rmoe::ggml::expert_matmul(type, wp, E, rows, rb, k, ip, xp, n, yp);
        return y;
      },
      py::arg("w"), py::arg("type"), py::arg("ids"), py::arg("x"), "y[j] = W[ids[j]] @ x[j] over stacked experts");
  def_resplit(m);
  def_attn(m);
  def_chain(m);
}
