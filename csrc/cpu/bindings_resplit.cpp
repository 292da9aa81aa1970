// Bindings of the residual-split formats (csrc/cpu/resplit/resplit.h): quantizers,
// dequantizers, the batched expert GEMM and the split-execution MoE layer.
#include <vector>

#include "bindings.h"
#include "ggml/ggml_kernels.h"

namespace rmoe {
namespace bind {

namespace {

rmoe::resplit::Fmt resplit_fmt(const std::string& s) {
  if (s == "wq") return rmoe::resplit::Fmt::WQ;
  if (s == "wr") return rmoe::resplit::Fmt::WR;
  if (s == "d4") return rmoe::resplit::Fmt::D4;
  throw py::value_error("resplit format must be 'wq', 'wr' or 'd4', not '" + s + "'");
}


std::vector<py::ssize_t> with_last(const py::buffer_info& b, py::ssize_t last) {
  std::vector<py::ssize_t> s(b.shape.begin(), b.shape.end());
  s.back() = last;
  return s;
}

// One of the source's expert stacks: (uint8 C-contiguous rows [E * rows, row bytes of k
// weights], GGUF type with an int8 GEMV).
rmoe::resplit::SrcExperts src_experts(const py::handle& o, size_t E, size_t rows, size_t k, const std::string& what) {
  const auto bad = [&](const char* why) { return py::value_error(what + ": " + why); };
  if (!py::isinstance<py::tuple>(o) || o.cast<py::tuple>().size() != 2) throw bad("expected (rows, GGUF type)");
  const py::tuple t = o.cast<py::tuple>();
  if (!py::isinstance<py::array_t<uint8_t>>(t[0]) || !(t[0].cast<py::array>().flags() & py::array::c_style))
    throw bad("rows must be a uint8 C-contiguous array");
  const auto w = t[0].cast<U8Array>();
  const int type = t[1].cast<int>();
  if (rmoe::ggml::q8_act_layout(type, k) < 0) throw bad("its GGUF type has no int8 GEMV here");
  if (w.ndim() != 2 || (size_t)w.shape(0) != E * rows || (size_t)w.shape(1) != rmoe::ggml::row_bytes(type, k))
    throw bad("expected [experts * rows, row bytes] matching the pack's experts");
  return {type, w.data(), (size_t)w.shape(1)};
}

// Checks W [E, rows, row_bytes(fmt, n)] and returns (E, rows).
std::pair<size_t, size_t> resplit_check(const U8Array& w, rmoe::resplit::Fmt f, size_t n, const char* what) {
  if (w.ndim() != 3 || (size_t)w.shape(2) != rmoe::resplit::row_bytes(f, n))
    throw py::value_error(std::string(what) + ": expected [E, rows, row_bytes] uint8 for rows of " + std::to_string(n));
  return {(size_t)w.shape(0), (size_t)w.shape(1)};
}

}  // namespace

MoeArgs::MoeArgs(const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q, const py::object& gate_r,
                 const py::object& up_r, const py::object& down4, const py::object& source, size_t H, bool any_crit,
                 const std::string& fn) {
  using rmoe::resplit::Fmt;
  if (gate_q.ndim() != 3) throw py::value_error(fn + ": gate_q [E, F, row_bytes]");
  const size_t E = gate_q.shape(0), F = gate_q.shape(1);
  auto chk = [&](const U8Array& a, Fmt f, size_t rows, size_t n, const char* what) {
    const auto [e, r] = resplit_check(a, f, n, what);
    if (e != E || r != rows) throw py::value_error(std::string(what) + ": shape does not match gate_q");
  };
  chk(gate_q, Fmt::WQ, F, H, "gate_q");
  chk(up_q, Fmt::WQ, F, H, "up_q");
  chk(down_q, Fmt::WQ, H, F, "down_q");
  if (!source.is_none()) {
    if (!py::isinstance<py::tuple>(source) || source.cast<py::tuple>().size() != 3)
      throw py::value_error(fn + ": source must be (gate, up, down)");
    const py::tuple s = source.cast<py::tuple>();
    mw.gate_s = src_experts(s[0], E, F, H, fn + ": source gate");
    mw.up_s = src_experts(s[1], E, F, H, fn + ": source up");
    mw.down_s = src_experts(s[2], E, H, F, fn + ": source down");
    src = source;
  } else if (any_crit) {
    if (gate_r.is_none() || up_r.is_none() || down4.is_none())
      throw py::value_error(fn + ": critical slots need gate_r, up_r and down4");
    gr = gate_r.cast<U8Array>();
    ur = up_r.cast<U8Array>();
    d4 = down4.cast<U8Array>();
    chk(gr, Fmt::WR, F, H, "gate_r");
    chk(ur, Fmt::WR, F, H, "up_r");
    chk(d4, Fmt::D4, H, F, "down4");
  }
  const bool res = any_crit && source.is_none();
  mw.E = E, mw.H = H, mw.F = F, mw.gate_q = gate_q.data(), mw.up_q = up_q.data(), mw.down_q = down_q.data();
  mw.gate_r = res ? gr.data() : nullptr, mw.up_r = res ? ur.data() : nullptr, mw.down4 = res ? d4.data() : nullptr;
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
                                    const py::array_t<int64_t, py::array::c_style>& counts, const F32Array& x, bool z) {
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
    rmoe::resplit::expert_gemm(f, wp, E, rows, in_dim, ip, off.data(), cp, S, xp, yp, false, z);
    return y;
  }, py::arg("fmt"), py::arg("w"), py::arg("in_dim"), py::arg("ids"), py::arg("counts"), py::arg("x"),
     py::arg("z") = false,
     "y [N, rows]: rows of x grouped by slot (counts[s] rows use expert ids[s]); z: WQ on z activations "
     "where they exist (as non-critical rows of the MoE layer)");
  m.def("resplit_moe_forward", [](const F32Array& x, const I32Array& ids, const F32Array& weights, const I32Array& ncrit,
                                  const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q,
                                  const py::object& gate_r, const py::object& up_r, const py::object& down4,
                                  const py::object& source) {
    if (x.ndim() != 2 || ids.ndim() != 2 || weights.ndim() != 2 || ncrit.ndim() != 1 || ids.shape(0) != x.shape(0) ||
        weights.shape(0) != x.shape(0) || weights.shape(1) != ids.shape(1) || ncrit.shape(0) != x.shape(0))
      throw py::value_error("resplit_moe_forward: x [T,H], ids [T,k], weights [T,k], ncrit [T]");
    const size_t T = x.shape(0), H = x.shape(1), k = ids.shape(1);
    bool any_crit = false;
    for (size_t t = 0; t < T; ++t) {
      if (ncrit.data()[t] < 0 || (size_t)ncrit.data()[t] > k) throw py::value_error("resplit_moe_forward: ncrit out of [0, k]");
      any_crit |= ncrit.data()[t] > 0;
    }
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, source, H, any_crit, "resplit_moe_forward");
    for (size_t i = 0; i < T * k; ++i)
      if (ids.data()[i] < 0 || (size_t)ids.data()[i] >= M.mw.E) throw py::value_error("resplit_moe_forward: expert id out of range");
    F32Array out({(py::ssize_t)T, (py::ssize_t)H});
    const float* xp = x.data();
    const int32_t* ip = ids.data();
    const float* wp = weights.data();
    const int32_t* cp = ncrit.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::resplit::moe_forward(M.mw, xp, T, k, ip, wp, cp, op);
    }
    return out;
  }, py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("ncrit"), py::arg("gate_q"), py::arg("up_q"),
     py::arg("down_q"), py::arg("gate_r") = py::none(), py::arg("up_r") = py::none(), py::arg("down4") = py::none(),
     py::arg("source") = py::none(),
     "split-execution MoE layer on the CPU -> out [T, H]; critical experts from source's tensors when given");
  m.def("resplit_residual_forward", [](const F32Array& x, const I32Array& tok, const I32Array& ids,
                                       const F32Array& weights, const F32Array& gq, const F32Array& uq,
                                       const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q,
                                       const U8Array& gate_r, const U8Array& up_r, const U8Array& down4) {
    if (x.ndim() != 2 || tok.ndim() != 1 || ids.ndim() != 1 || weights.ndim() != 1 || gq.ndim() != 2 ||
        uq.ndim() != 2 || ids.shape(0) != tok.shape(0) || weights.shape(0) != tok.shape(0) ||
        gq.shape(0) != tok.shape(0) || uq.shape(0) != tok.shape(0) || gq.shape(1) != uq.shape(1))
      throw py::value_error("resplit_residual_forward: x [T,H], tok, ids, weights [n], gq, uq [n,F]");
    const size_t T = x.shape(0), H = x.shape(1), n = tok.shape(0);
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, py::none(), H, true, "resplit_residual_forward");
    if ((size_t)gq.shape(1) != M.mw.F) throw py::value_error("resplit_residual_forward: gq, uq [n, F] with the experts' F");
    for (size_t i = 0; i < n; ++i) {
      if (ids.data()[i] < 0 || (size_t)ids.data()[i] >= M.mw.E)
        throw py::value_error("resplit_residual_forward: expert id out of range");
      if (tok.data()[i] < 0 || (size_t)tok.data()[i] >= T) throw py::value_error("resplit_residual_forward: token out of range");
    }
    F32Array out({(py::ssize_t)T, (py::ssize_t)H});
    const float *xp = x.data(), *wp = weights.data(), *gp = gq.data(), *up = uq.data();
    const int32_t *tp = tok.data(), *ip = ids.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::resplit::residual_forward(M.mw, xp, T, n, tp, ip, wp, gp, up, op);
    }
    return out;
  }, py::arg("x"), py::arg("tok"), py::arg("ids"), py::arg("weights"), py::arg("gq"), py::arg("uq"), py::arg("gate_q"),
     py::arg("up_q"), py::arg("down_q"), py::arg("gate_r"), py::arg("up_r"), py::arg("down4"),
     "critical slots whose x.WQ of gate/up came from elsewhere (the GPU) -> out [T, H], the slots' weighted "
     "sum of (silu(gq + x.WRg) * (uq + x.WRu)).D4");
}

}  // namespace bind
}  // namespace rmoe
