// The one binding file of the CPU module. Kernels take raw pointers; this file
// checks shapes and dtypes, releases the GIL and hands over pointers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "attn.h"
#include "convert.h"
#include "ggml_kernels.h"
#include "isa.h"
#include "membench.h"
#include "resplit.h"
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
  d["avx512_vbmi"] = f.avx512vbmi;
  d["wr_int8"] = rmoe::resplit::wr_int8_acts();  // WR kernels run on int8 activations
  // MoE groups of at least this many tokens take the requantized int8 GEMM (0: no such path here)
  d["i8_gemm_min_tokens"] = rmoe::resplit::i8_gemm_available() ? rmoe::resplit::kI8MinTokens : 0;
  d["avx512_bf16"] = f.avx512bf16;
  d["amx_tile_cpuid"] = f.amx_tile;
  return d;
}

}  // namespace

// ---- resplit expert formats (csrc/cpu/resplit.h) ----
namespace {

rmoe::resplit::Fmt resplit_fmt(const std::string& s) {
  if (s == "wq") return rmoe::resplit::Fmt::WQ;
  if (s == "wr") return rmoe::resplit::Fmt::WR;
  if (s == "d4") return rmoe::resplit::Fmt::D4;
  throw py::value_error("resplit format must be 'wq', 'wr' or 'd4', not '" + s + "'");
}

using U8Array = py::array_t<uint8_t, py::array::c_style>;
using I32Array = py::array_t<int32_t, py::array::c_style>;

std::vector<py::ssize_t> with_last(const py::buffer_info& b, py::ssize_t last) {
  std::vector<py::ssize_t> s(b.shape.begin(), b.shape.end());
  s.back() = last;
  return s;
}

// Checks W [E, rows, row_bytes(fmt, n)] and returns (E, rows).
std::pair<size_t, size_t> resplit_check(const U8Array& w, rmoe::resplit::Fmt f, size_t n, const char* what) {
  if (w.ndim() != 3 || (size_t)w.shape(2) != rmoe::resplit::row_bytes(f, n))
    throw py::value_error(std::string(what) + ": expected [E, rows, row_bytes] uint8 for rows of " + std::to_string(n));
  return {(size_t)w.shape(0), (size_t)w.shape(1)};
}

void def_resplit(py::module_& m) {
  m.def("resplit_row_bytes", [](const std::string& fmt, size_t n) { return rmoe::resplit::row_bytes(resplit_fmt(fmt), n); });
  m.def("resplit_format_version", [] { return rmoe::resplit::kFormatVersion; });
  m.def("resplit_quantize", [](const std::string& fmt, const F32Array& w) {
    const auto f = resplit_fmt(fmt);
    if (f == rmoe::resplit::Fmt::WR) throw py::value_error("wr is made together with wq: use resplit_quantize_wq_wr");
    if (w.ndim() < 1 || w.shape(w.ndim() - 1) == 0) throw py::value_error("resplit_quantize: w [..., n] with n > 0");
    const auto info = w.request();
    const size_t n = w.shape(w.ndim() - 1), rows = w.size() / n;
    U8Array out(with_last(info, (py::ssize_t)rmoe::resplit::row_bytes(f, n)));
    const float* wp = w.data();
    uint8_t* op = out.mutable_data();
    py::gil_scoped_release nogil;
    if (f == rmoe::resplit::Fmt::WQ) rmoe::resplit::quantize_wq(wp, rows, n, op);
    else rmoe::resplit::quantize_d4(wp, rows, n, op);
    return out;
  }, py::arg("fmt"), py::arg("w"), "w [..., n] float32 -> [..., row_bytes] uint8 ('wq' alone or 'd4')");
  m.def("resplit_quantize_wq_wr", [](const F32Array& w) {
    if (w.ndim() < 1 || w.shape(w.ndim() - 1) == 0) throw py::value_error("resplit_quantize_wq_wr: w [..., n] with n > 0");
    const auto info = w.request();
    const size_t n = w.shape(w.ndim() - 1), rows = w.size() / n;
    U8Array q(with_last(info, (py::ssize_t)rmoe::resplit::row_bytes(rmoe::resplit::Fmt::WQ, n)));
    U8Array r(with_last(info, (py::ssize_t)rmoe::resplit::row_bytes(rmoe::resplit::Fmt::WR, n)));
    const float* wp = w.data();
    uint8_t *qp = q.mutable_data(), *rp = r.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::resplit::quantize_wq_wr(wp, rows, n, qp, rp);
    }
    return py::make_tuple(q, r);
  }, py::arg("w"), "gate/up w [..., n] float32 -> (wq, wr) uint8 rows, chosen jointly");
  m.def("resplit_dequantize", [](const std::string& fmt, const U8Array& q, size_t n) {
    const auto f = resplit_fmt(fmt);
    if (q.ndim() < 1 || (size_t)q.shape(q.ndim() - 1) != rmoe::resplit::row_bytes(f, n))
      throw py::value_error("resplit_dequantize: q [..., row_bytes(fmt, n)]");
    const auto info = q.request();
    const size_t rows = q.size() / q.shape(q.ndim() - 1);
    F32Array out(with_last(info, (py::ssize_t)n));
    const uint8_t* qp = q.data();
    float* op = out.mutable_data();
    py::gil_scoped_release nogil;
    rmoe::resplit::dequantize(f, qp, rows, n, op);
    return out;
  }, py::arg("fmt"), py::arg("q"), py::arg("n"), "[..., row_bytes] uint8 -> [..., n] float32");
  m.def("resplit_expert_matmul", [](const std::string& fmt, const U8Array& w, size_t in_dim, const I32Array& ids,
                                    const py::array_t<int64_t, py::array::c_style>& counts, const F32Array& x) {
    const auto f = resplit_fmt(fmt);
    const auto [E, rows] = resplit_check(w, f, in_dim, "resplit_expert_matmul");
    if (ids.ndim() != 1 || counts.ndim() != 1 || ids.shape(0) != counts.shape(0) || x.ndim() != 2 ||
        (size_t)x.shape(1) != in_dim)
      throw py::value_error("resplit_expert_matmul: ids [S], counts [S], x [N, in_dim]");
    const size_t S = ids.shape(0);
    std::vector<int64_t> off(S);
    int64_t total = 0;
    for (size_t s = 0; s < S; ++s) {
      if (ids.data()[s] < 0 || (size_t)ids.data()[s] >= E) throw py::value_error("resplit_expert_matmul: expert id out of range");
      if (counts.data()[s] < 0) throw py::value_error("resplit_expert_matmul: negative count");
      off[s] = total;
      total += counts.data()[s];
    }
    if (total != x.shape(0)) throw py::value_error("resplit_expert_matmul: sum(counts) != x rows");
    F32Array y({(py::ssize_t)total, (py::ssize_t)rows});
    const uint8_t* wp = w.data();
    const int32_t* ip = ids.data();
    const int64_t* cp = counts.data();
    const float* xp = x.data();
    float* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    rmoe::resplit::expert_gemm(f, wp, E, rows, in_dim, ip, off.data(), cp, S, xp, yp, false);
    return y;
  }, py::arg("fmt"), py::arg("w"), py::arg("in_dim"), py::arg("ids"), py::arg("counts"), py::arg("x"),
     "y [N, rows]: rows of x grouped by slot (counts[s] rows use expert ids[s])");
  m.def("resplit_moe_forward", [](const F32Array& x, const I32Array& ids, const F32Array& weights, const I32Array& ncrit,
                                  const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q,
                                  const py::object& gate_r, const py::object& up_r, const py::object& down4) {
    if (x.ndim() != 2 || ids.ndim() != 2 || weights.ndim() != 2 || ncrit.ndim() != 1 || ids.shape(0) != x.shape(0) ||
        weights.shape(0) != x.shape(0) || weights.shape(1) != ids.shape(1) || ncrit.shape(0) != x.shape(0))
      throw py::value_error("resplit_moe_forward: x [T,H], ids [T,k], weights [T,k], ncrit [T]");
    const size_t T = x.shape(0), H = x.shape(1), k = ids.shape(1);
    if (gate_q.ndim() != 3) throw py::value_error("resplit_moe_forward: gate_q [E, F, row_bytes]");
    const size_t E = gate_q.shape(0), F = gate_q.shape(1);
    using rmoe::resplit::Fmt;
    auto chk = [&](const U8Array& a, Fmt f, size_t rows, size_t n, const char* what) {
      const auto [e, r] = resplit_check(a, f, n, what);
      if (e != E || r != rows) throw py::value_error(std::string(what) + ": shape does not match gate_q");
    };
    chk(gate_q, Fmt::WQ, F, H, "gate_q");
    chk(up_q, Fmt::WQ, F, H, "up_q");
    chk(down_q, Fmt::WQ, H, F, "down_q");
    bool any_crit = false;
    for (size_t t = 0; t < T; ++t) {
      if (ncrit.data()[t] < 0 || (size_t)ncrit.data()[t] > k) throw py::value_error("resplit_moe_forward: ncrit out of [0, k]");
      any_crit |= ncrit.data()[t] > 0;
    }
    for (size_t i = 0; i < T * k; ++i)
      if (ids.data()[i] < 0 || (size_t)ids.data()[i] >= E) throw py::value_error("resplit_moe_forward: expert id out of range");
    U8Array gr, ur, d4;
    if (any_crit) {
      if (gate_r.is_none() || up_r.is_none() || down4.is_none())
        throw py::value_error("resplit_moe_forward: critical slots need gate_r, up_r and down4");
      gr = gate_r.cast<U8Array>();
      ur = up_r.cast<U8Array>();
      d4 = down4.cast<U8Array>();
      chk(gr, Fmt::WR, F, H, "gate_r");
      chk(ur, Fmt::WR, F, H, "up_r");
      chk(d4, Fmt::D4, H, F, "down4");
    }
    rmoe::resplit::MoeWeights mw{E, H, F, gate_q.data(), up_q.data(), down_q.data(),
                                 any_crit ? gr.data() : nullptr, any_crit ? ur.data() : nullptr,
                                 any_crit ? d4.data() : nullptr};
    F32Array out({(py::ssize_t)T, (py::ssize_t)H});
    const float* xp = x.data();
    const int32_t* ip = ids.data();
    const float* wp = weights.data();
    const int32_t* cp = ncrit.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::resplit::moe_forward(mw, xp, T, k, ip, wp, cp, op);
    }
    return out;
  }, py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("ncrit"), py::arg("gate_q"), py::arg("up_q"),
     py::arg("down_q"), py::arg("gate_r") = py::none(), py::arg("up_r") = py::none(), py::arg("down4") = py::none(),
     "split-execution MoE layer on the CPU -> out [T, H]");
}

}  // namespace

// ---- decode attention (csrc/cpu/attn.h) ----
namespace {

// A float32 C-contiguous writable array, used in place (never a converted copy).
float* inplace_f32(const py::array& a, size_t ndim, const char* what) {
  if (!py::isinstance<py::array_t<float>>(a) || !(a.flags() & py::array::c_style) || !a.writeable() ||
      (size_t)a.ndim() != ndim)
    throw py::value_error(std::string("attn_decode: ") + what + " must be a writable C-contiguous float32 array of " +
                          std::to_string(ndim) + " dims");
  return static_cast<float*>(const_cast<void*>(a.data()));
}

// An optional float32 vector of n values (None: null); keep holds the array alive.
const float* opt_f32(const py::object& o, size_t n, const char* what, F32Array& keep) {
  if (o.is_none()) return nullptr;
  keep = o.cast<F32Array>();
  if ((size_t)keep.size() != n) throw py::value_error(std::string("attn_decode: ") + what + " has the wrong size");
  return keep.data();
}

void def_attn(py::module_& m) {
  m.def("attn_decode", [](F32Array q, F32Array k, const F32Array& v, const py::array& kc, const py::array& vc, size_t pos,
                          size_t n_head, const F32Array& cos, const F32Array& sin, size_t rope_dim, bool neox,
                          const py::object& q_norm, const py::object& k_norm, float eps, float scale) {
    float* kcp = inplace_f32(kc, 3, "k cache");
    float* vcp = inplace_f32(vc, 3, "v cache");
    const size_t nkv = (size_t)kc.shape(1), hd = (size_t)kc.shape(2), hdv = (size_t)vc.shape(2);
    if (n_head == 0 || nkv == 0 || n_head % nkv || (size_t)vc.shape(1) != nkv || pos >= (size_t)kc.shape(0) ||
        pos >= (size_t)vc.shape(0) || (size_t)q.size() != n_head * hd || (size_t)k.size() != nkv * hd ||
        (size_t)v.size() != nkv * hdv || rope_dim % 2 || rope_dim > hd || (size_t)cos.size() < rope_dim / 2 ||
        (size_t)sin.size() < rope_dim / 2)
      throw py::value_error("attn_decode: shapes do not agree");
    F32Array qn, kn;
    rmoe::AttnDecode a{n_head, nkv, hd, hdv, rope_dim, neox, cos.data(), sin.data(),
                       opt_f32(q_norm, hd, "q_norm", qn), opt_f32(k_norm, hd, "k_norm", kn), eps, scale};
    F32Array out((py::ssize_t)(n_head * hdv));
    float* qp = q.mutable_data();
    float* kp = k.mutable_data();
    const float* vp = v.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::attn_decode(a, qp, kp, vp, kcp, vcp, pos, op);
    }
    return out;
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kc"), py::arg("vc"), py::arg("pos"), py::arg("n_head"),
     py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), py::arg("neox"), py::arg("q_norm"), py::arg("k_norm"),
     py::arg("eps"), py::arg("scale"),
     "one decode token of GQA attention: q/k head norms, RoPE, K/V into the cache at pos, attention -> [n_head*hdv]");
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
}
