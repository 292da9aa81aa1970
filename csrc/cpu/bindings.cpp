// The one binding file of the CPU module. Kernels take raw pointers; this file
// checks shapes and dtypes, releases the GIL and hands over pointers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attn.h"
#include "convert.h"
#include "decode.h"
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
  d["avx_vnni"] = f.avxvnni;
  d["wr_int8"] = rmoe::resplit::wr_int8_acts();  // WR kernels run on int8 activations
  d["wq_z"] = rmoe::resplit::wq_z_acts();  // non-critical decode rows run WQ on 6-bit z activations
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

// The six expert tensors of a residual-split layer, checked against each other and H;
// the residual ones (None allowed when no slot is critical) are kept alive here.
struct MoeArgs {
  rmoe::resplit::MoeWeights mw{};
  U8Array gr, ur, d4;
  MoeArgs(const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q, const py::object& gate_r,
          const py::object& up_r, const py::object& down4, size_t H, bool any_crit, const std::string& fn) {
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
    if (any_crit) {
      if (gate_r.is_none() || up_r.is_none() || down4.is_none())
        throw py::value_error(fn + ": critical slots need gate_r, up_r and down4");
      gr = gate_r.cast<U8Array>();
      ur = up_r.cast<U8Array>();
      d4 = down4.cast<U8Array>();
      chk(gr, Fmt::WR, F, H, "gate_r");
      chk(ur, Fmt::WR, F, H, "up_r");
      chk(d4, Fmt::D4, H, F, "down4");
    }
    mw = {E, H, F, gate_q.data(), up_q.data(), down_q.data(), any_crit ? gr.data() : nullptr,
          any_crit ? ur.data() : nullptr, any_crit ? d4.data() : nullptr};
  }
};

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
                                  const py::object& gate_r, const py::object& up_r, const py::object& down4) {
    if (x.ndim() != 2 || ids.ndim() != 2 || weights.ndim() != 2 || ncrit.ndim() != 1 || ids.shape(0) != x.shape(0) ||
        weights.shape(0) != x.shape(0) || weights.shape(1) != ids.shape(1) || ncrit.shape(0) != x.shape(0))
      throw py::value_error("resplit_moe_forward: x [T,H], ids [T,k], weights [T,k], ncrit [T]");
    const size_t T = x.shape(0), H = x.shape(1), k = ids.shape(1);
    bool any_crit = false;
    for (size_t t = 0; t < T; ++t) {
      if (ncrit.data()[t] < 0 || (size_t)ncrit.data()[t] > k) throw py::value_error("resplit_moe_forward: ncrit out of [0, k]");
      any_crit |= ncrit.data()[t] > 0;
    }
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, H, any_crit, "resplit_moe_forward");
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
     "split-execution MoE layer on the CPU -> out [T, H]");
}

}  // namespace

// ---- decode attention and the fused decode block halves (csrc/cpu/attn.h, decode.h) ----
namespace {

// A layer's KV cache rows, used in place (never a converted copy): a writable C-contiguous
// [heads, n_ctx, dim] array of float32 or float16, or of uint8 holding q8_0 blocks
// ([heads, n_ctx, dim / 32 * 34]). Each head's rows are one stream, as decode reads them.
struct KvArg {
  rmoe::KvRows rows;
  size_t heads, n_ctx;
};

KvArg kv_rows(const py::array& a, const char* what) {
  const auto bad = [&] {
    return py::value_error(std::string("attention: ") + what +
                           " must be a writable C-contiguous [heads, n_ctx, dim] array of float32, float16 or q8_0 "
                           "blocks (uint8)");
  };
  if (!(a.flags() & py::array::c_style) || !a.writeable() || a.ndim() != 3 || a.shape(2) == 0) throw bad();
  rmoe::KvType t;
  size_t dim = (size_t)a.shape(2);
  if (py::isinstance<py::array_t<float>>(a)) {
    t = rmoe::KvType::F32;
  } else if (a.dtype().kind() == 'f' && a.itemsize() == 2) {
    t = rmoe::KvType::F16;
  } else if (py::isinstance<py::array_t<uint8_t>>(a) && dim % 34 == 0) {
    t = rmoe::KvType::Q8_0;
    dim = dim / 34 * 32;
  } else {
    throw bad();
  }
  return {{t, static_cast<uint8_t*>(const_cast<void*>(a.data())), (size_t)a.strides(1), (size_t)a.strides(0), dim},
          (size_t)a.shape(0), (size_t)a.shape(1)};
}

// An optional float32 vector of n values (None: null); keep holds the array alive.
const float* opt_f32(const py::object& o, size_t n, const char* what, F32Array& keep) {
  if (o.is_none()) return nullptr;
  keep = o.cast<F32Array>();
  if ((size_t)keep.size() != n) throw py::value_error(std::string("attention: ") + what + " has the wrong size");
  return keep.data();
}

// Heads, RoPE, norms and the caches of one decode step, checked (q, k, v sizes by the caller).
struct AttnArgs {
  rmoe::AttnDecode a{};
  rmoe::KvRows kc{}, vc{};
  size_t pos = 0, n_ctx = 0;
  F32Array cos, sin, qn, kn;
  AttnArgs(const py::array& kca, const py::array& vca, size_t pos_, size_t n_head, const F32Array& cos_,
           const F32Array& sin_, size_t rope_dim, bool neox, const py::object& q_norm, const py::object& k_norm,
           float eps, float scale)
      : pos(pos_), cos(cos_), sin(sin_) {
    const KvArg K = kv_rows(kca, "k cache"), V = kv_rows(vca, "v cache");
    kc = K.rows;
    vc = V.rows;
    n_ctx = std::min(K.n_ctx, V.n_ctx);
    const size_t nkv = K.heads, hd = kc.dim, hdv = vc.dim;
    if (n_head == 0 || nkv == 0 || n_head % nkv || V.heads != nkv || pos >= K.n_ctx || pos >= V.n_ctx || rope_dim % 2 || rope_dim > hd || (size_t)cos.size() < rope_dim / 2 ||
        (size_t)sin.size() < rope_dim / 2)
      throw py::value_error("attention: shapes do not agree");
    a = {n_head, nkv, hd, hdv, rope_dim, neox, cos.data(), sin.data(), opt_f32(q_norm, hd, "q_norm", qn),
         opt_f32(k_norm, hd, "k_norm", kn), eps, scale};
  }
};

// (raw rows [rows, rb] uint8, GGUF type) with k weights a row.
rmoe::GgmlMat ggml_mat(const py::tuple& t, size_t k, const char* what) {
  if (t.size() != 2 || !py::isinstance<py::array_t<uint8_t>>(t[0]) ||
      !(t[0].cast<py::array>().flags() & py::array::c_style))
    throw py::value_error(std::string(what) + ": expected (uint8 C-contiguous rows, GGUF type)");
  const auto w = t[0].cast<U8Array>();  // the caller's array itself (no converted copy): the tuple keeps it alive
  const int type = t[1].cast<int>();
  if (w.ndim() != 2 || rmoe::ggml::row_bytes(type, k) != (size_t)w.shape(1) || w.shape(1) == 0)
    throw py::value_error(std::string(what) + ": rows are not " + std::to_string(k) + " weights of this type");
  return {type, w.data(), (size_t)w.shape(0), (size_t)w.shape(1), k};
}

// The attention half's projections and optional biases, checked against the heads and H.
struct AttnProj {
  rmoe::GgmlMat q, k, v, o;
  F32Array qb, kb, vb;  // keep the biases alive
  const float *bq, *bk, *bv;
  AttnProj(const rmoe::AttnDecode& a, size_t H, const py::tuple& wq, const py::tuple& wk, const py::tuple& wv,
           const py::tuple& wo, const py::object& bq_, const py::object& bk_, const py::object& bv_, const char* fn)
      : q(ggml_mat(wq, H, "wq")), k(ggml_mat(wk, H, "wk")), v(ggml_mat(wv, H, "wv")),
        o(ggml_mat(wo, a.n_head * a.head_dim_v, "wo")) {
    if (q.rows != a.n_head * a.head_dim || k.rows != a.n_head_kv * a.head_dim ||
        v.rows != a.n_head_kv * a.head_dim_v || o.rows != H)
      throw py::value_error(std::string(fn) + ": projection shapes do not agree with the heads");
    bq = opt_f32(bq_, q.rows, "q bias", qb);
    bk = opt_f32(bk_, k.rows, "k bias", kb);
    bv = opt_f32(bv_, v.rows, "v bias", vb);
  }
};

void def_attn(py::module_& m) {
#define RMOE_ATTN_ARGS                                                                                             \
  py::arg("kc"), py::arg("vc"), py::arg("pos"), py::arg("n_head"), py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), \
      py::arg("neox"), py::arg("q_norm"), py::arg("k_norm"), py::arg("eps"), py::arg("scale")
  m.def("attn_decode", [](F32Array q, F32Array k, const F32Array& v, const py::array& kc, const py::array& vc, size_t pos,
                          size_t n_head, const F32Array& cos, const F32Array& sin, size_t rope_dim, bool neox,
                          const py::object& q_norm, const py::object& k_norm, float eps, float scale) {
    const AttnArgs A(kc, vc, pos, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, eps, scale);
    if ((size_t)q.size() != n_head * A.a.head_dim || (size_t)k.size() != A.a.n_head_kv * A.a.head_dim ||
        (size_t)v.size() != A.a.n_head_kv * A.a.head_dim_v)
      throw py::value_error("attention: shapes do not agree");
    F32Array out((py::ssize_t)(n_head * A.a.head_dim_v));
    float* qp = q.mutable_data();
    float* kp = k.mutable_data();
    const float* vp = v.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::attn_decode(A.a, qp, kp, vp, A.kc, A.vc, A.pos, op);
    }
    return out;
  }, py::arg("q"), py::arg("k"), py::arg("v"), RMOE_ATTN_ARGS,
     "one decode token of GQA attention: q/k head norms, RoPE, K/V into the cache at pos, attention -> [n_head*hdv]");

  m.def("kv_store", [](const py::array& cache, size_t pos, const F32Array& x) {
    const KvArg c = kv_rows(cache, "cache");
    if (pos >= c.n_ctx || (size_t)x.size() != c.heads * c.rows.dim) throw py::value_error("attention: shapes do not agree");
    rmoe::kv_store(c.rows, pos, c.heads, x.data());
  }, py::arg("cache"), py::arg("pos"), py::arg("x"), "x [heads * dim] into the cache rows at pos, in the cache's type");

  m.def("attn_cached", [](const F32Array& q, const py::array& kc, const py::object& vc, size_t pos0, size_t n_head,
                          float scale, size_t v_dim) {
    const KvArg KA = kv_rows(kc, "k cache");
    KvArg VA = KA;  // None: the values are the first v_dim of the key rows (MLA's latent)
    if (!vc.is_none()) VA = kv_rows(vc.cast<py::array>(), "v cache");
    const rmoe::KvRows& K = KA.rows;
    rmoe::KvRows& V = VA.rows;
    if (vc.is_none() && (v_dim == 0 || v_dim > K.dim || (K.type == rmoe::KvType::Q8_0 && v_dim % 32)))
      throw py::value_error("attention: v_dim must be within the key rows");
    if (vc.is_none()) V.dim = v_dim;
    const size_t G = KA.heads, per = n_head * K.dim;
    const size_t n_q = per ? (size_t)q.size() / per : 0, S = pos0 + n_q;
    if (n_head == 0 || n_head % G || VA.heads != G || n_q == 0 || n_q * per != (size_t)q.size() || S > KA.n_ctx ||
        S > VA.n_ctx)
      throw py::value_error("attention: shapes do not agree");
    F32Array out((py::ssize_t)(n_q * n_head * V.dim));
    const float* qp = q.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::attn_cached(qp, n_q, n_head, G, K, V, pos0, scale, op);
    }
    return out;
  }, py::arg("q"), py::arg("kc"), py::arg("vc"), py::arg("pos0"), py::arg("n_head"), py::arg("scale"),
     py::arg("v_dim") = 0,
     "causal softmax(scale q.K^T) V of queries q [T, n_head, dim] at positions pos0.. over the cache rows (vc None: V "
     "is the first v_dim of each key row) -> [T * n_head * v_dim]");

  m.def("decode_attn_block", [](const F32Array& x, const F32Array& norm_w, float norm_eps, const py::tuple& wq,
                                const py::tuple& wk, const py::tuple& wv, const py::tuple& wo, const py::object& bq,
                                const py::object& bk, const py::object& bv, const py::array& kc, const py::array& vc,
                                size_t pos, size_t n_head, const F32Array& cos, const F32Array& sin, size_t rope_dim,
                                bool neox, const py::object& q_norm, const py::object& k_norm, float eps, float scale) {
    const AttnArgs A(kc, vc, pos, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, eps, scale);
    const size_t H = (size_t)x.size();
    if ((size_t)norm_w.size() != H) throw py::value_error("decode_attn_block: norm weight size");
    const AttnProj P(A.a, H, wq, wk, wv, wo, bq, bk, bv, "decode_attn_block");
    F32Array out((py::ssize_t)H);
    const float* xp = x.data();
    const float* nw = norm_w.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::decode_attn_block(xp, H, nw, norm_eps, P.q, P.k, P.v, P.o, P.bq, P.bk, P.bv, A.a, A.kc, A.vc, A.pos, op);
    }
    return out;
  }, py::arg("x"), py::arg("norm_w"), py::arg("norm_eps"), py::arg("wq"), py::arg("wk"), py::arg("wv"), py::arg("wo"),
     py::arg("bq"), py::arg("bk"), py::arg("bv"), RMOE_ATTN_ARGS,
     "x + Wo.attention(rms_norm(x)) for one decode token; K/V into the caches at pos -> [H]");
#undef RMOE_ATTN_ARGS

  m.def("rms_norm", [](const F32Array& x, const F32Array& w, float eps) {
    if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(x.ndim() - 1) || w.shape(0) == 0)
      throw py::value_error("rms_norm: x [..., n], w [n]");
    F32Array out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
    const size_t n = (size_t)w.shape(0), rows = (size_t)x.size() / n;
    const float* xp = x.data();
    const float* wp = w.data();
    float* op = out.mutable_data();
    py::gil_scoped_release nogil;
    for (size_t r = 0; r < rows; ++r) rmoe::rms_norm_row(xp + r * n, n, wp, eps, op + r * n);
    return out;
  }, py::arg("x"), py::arg("w"), py::arg("eps"), "x * rsqrt(mean(x^2) + eps) * w over the last axis (as ggml)");

  m.def("route", [](const F32Array& logits, size_t k, bool sigmoid, bool norm_topk, float scale) {
    if (logits.ndim() != 2 || k == 0 || k > (size_t)logits.shape(1)) throw py::value_error("route: logits [T, E], 0 < k <= E");
    const size_t T = logits.shape(0), E = logits.shape(1);
    I32Array ids({(py::ssize_t)T, (py::ssize_t)k});
    F32Array w({(py::ssize_t)T, (py::ssize_t)k});
    const rmoe::RouteSpec rs{E, k, sigmoid, norm_topk, scale};
    rmoe::route_rows(logits.data(), T, rs, ids.mutable_data(), w.mutable_data());
    return py::make_tuple(ids, w);
  }, py::arg("logits"), py::arg("k"), py::arg("sigmoid"), py::arg("norm_topk"), py::arg("scale"),
     "router probabilities -> (ids, weights) [T, k], by probability descending (ties: lower id first)");

  m.def("decode_moe_block", [](const F32Array& h, const F32Array& norm_w, float eps, const py::tuple& router, size_t k,
                               bool sigmoid, bool norm_topk, float scale, int fixed, double ab, double theta, int r_min,
                               int r_max, const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q,
                               const py::object& gate_r, const py::object& up_r, const py::object& down4) {
    const size_t H = (size_t)h.size();
    if ((size_t)norm_w.size() != H) throw py::value_error("decode_moe_block: norm weight size");
    const bool may_crit = fixed > 0 || (fixed < 0 && r_max > 0);
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, H, may_crit, "decode_moe_block");
    const auto R = ggml_mat(router, H, "router");
    if (R.rows != M.mw.E || k == 0 || k > M.mw.E) throw py::value_error("decode_moe_block: router rows must be the experts, 0 < k <= E");
    if (fixed < 0 && (r_min < 0 || r_min > r_max)) throw py::value_error("decode_moe_block: need 0 <= r_min <= r_max");
    const rmoe::RouteSpec rs{M.mw.E, k, sigmoid, norm_topk, scale};
    const rmoe::CritPolicy pol{fixed, ab, theta, r_min, r_max};
    F32Array out((py::ssize_t)H), w((py::ssize_t)k);
    I32Array ids((py::ssize_t)k);
    const float* hp = h.data();
    const float* nw = norm_w.data();
    float* op = out.mutable_data();
    int32_t* ip = ids.mutable_data();
    float* wp = w.mutable_data();
    int r;
    {
      py::gil_scoped_release nogil;
      r = rmoe::decode_moe_block(hp, H, nw, eps, R, rs, pol, M.mw, op, ip, wp);
    }
    return py::make_tuple(out, ids, w, r);
  }, py::arg("h"), py::arg("norm_w"), py::arg("eps"), py::arg("router"), py::arg("k"), py::arg("sigmoid"),
     py::arg("norm_topk"), py::arg("scale"), py::arg("fixed"), py::arg("ab"), py::arg("theta"), py::arg("r_min"),
     py::arg("r_max"), py::arg("gate_q"), py::arg("up_q"), py::arg("down_q"), py::arg("gate_r") = py::none(),
     py::arg("up_r") = py::none(), py::arg("down4") = py::none(),
     "h + routed residual-split experts of rms_norm(h) for one decode token -> (out [H], ids [k], w [k], r)");
}

// Consecutive decode blocks whose halves both fuse, run for one token by decode_layers
// with no Python between them. Everything a block reads (weights, norms, the RoPE
// tables, its KV cache rows) is checked once, when added, and kept alive here.
class DecodeChain {
 public:
  void add(const F32Array& attn_norm, const F32Array& ffn_norm, float eps, const py::tuple& wq, const py::tuple& wk,
           const py::tuple& wv, const py::tuple& wo, const py::object& bq, const py::object& bk, const py::object& bv,
           const py::array& kc, const py::array& vc, size_t n_head, const F32Array& cos, const F32Array& sin,
           size_t rope_dim, bool neox, const py::object& q_norm, const py::object& k_norm, float qk_eps, float scale,
           const py::tuple& router, size_t k, bool sigmoid, bool norm_topk, float rscale, const U8Array& gate_q,
           const U8Array& up_q, const U8Array& down_q, const py::object& gate_r, const py::object& up_r,
           const py::object& down4) {
    const size_t H = (size_t)attn_norm.size();
    if (H == 0 || (!layers_.empty() && H != H_) || (size_t)ffn_norm.size() != H)
      throw py::value_error("decode chain: every block's norms must have the model's width");
    if (cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != (py::ssize_t)(rope_dim / 2) ||
        sin.shape(0) != cos.shape(0) || sin.shape(1) != cos.shape(1))
      throw py::value_error("decode chain: RoPE tables must be [positions, rope_dim / 2]");
    const AttnArgs A(kc, vc, 0, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, qk_eps, scale);
    const AttnProj P(A.a, H, wq, wk, wv, wo, bq, bk, bv, "decode chain");
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, H, !gate_r.is_none(), "decode chain");
    const auto R = ggml_mat(router, H, "router");
    if (R.rows != M.mw.E || k == 0 || k > M.mw.E)
      throw py::value_error("decode chain: router rows must be the experts, 0 < k <= E");
    for (const py::object& o : {py::object(attn_norm), py::object(ffn_norm), py::object(wq), py::object(wk),
                                py::object(wv), py::object(wo), py::object(P.qb), py::object(P.kb), py::object(P.vb),
                                py::object(kc), py::object(vc), py::object(A.cos), py::object(A.sin),
                                py::object(A.qn), py::object(A.kn), py::object(router), py::object(gate_q),
                                py::object(up_q), py::object(down_q), py::object(M.gr), py::object(M.ur),
                                py::object(M.d4)})
      keep_.push_back(o);
    layers_.push_back({eps, attn_norm.data(), P.q, P.k, P.v, P.o, P.bq, P.bk, P.bv, A.a, A.cos.data(), A.sin.data(),
                       (size_t)cos.shape(0), A.kc, A.vc, A.n_ctx, ffn_norm.data(), R,
                       rmoe::RouteSpec{M.mw.E, k, sigmoid, norm_topk, rscale}, M.mw});
    has_residual_.push_back(M.mw.gate_r != nullptr);
    H_ = H;
    sum_k_ += k;
  }

  // (out [H], ids [sum k], w [sum k], r [blocks]) for x [H] at pos. fixed >= 0: r = min(fixed, k);
  // else UMIA with ab[i] for block i.
  py::tuple run(const F32Array& x, size_t pos, int fixed, const py::array_t<double, py::array::c_style>& ab,
                double theta, int r_min, int r_max) const {
    const size_t n = layers_.size();
    if (n == 0) throw py::value_error("decode chain: no blocks");
    if ((size_t)x.size() != H_) throw py::value_error("decode chain: x must have the model's width");
    if (fixed < 0 && ((size_t)ab.size() != n || r_min < 0 || r_min > r_max))
      throw py::value_error("decode chain: UMIA needs ab per block and 0 <= r_min <= r_max");
    const bool may_crit = fixed > 0 || (fixed < 0 && r_max > 0);
    std::vector<rmoe::CritPolicy> pol(n);
    for (size_t i = 0; i < n; ++i) {
      const rmoe::DecodeLayer& L = layers_[i];
      if (pos >= L.n_ctx || pos >= L.n_pos) throw py::value_error("decode chain: position past the cache");
      if (may_crit && !has_residual_[i]) throw py::value_error("decode chain: critical slots need the residuals");
      pol[i] = {fixed, fixed < 0 ? ab.data()[i] : 0.0, theta, r_min, std::min(r_max, (int)L.rs.k)};
    }
    F32Array out((py::ssize_t)H_), w((py::ssize_t)sum_k_);
    I32Array ids((py::ssize_t)sum_k_), r((py::ssize_t)n);
    std::copy(x.data(), x.data() + H_, out.mutable_data());
    float* op = out.mutable_data();
    int32_t* ip = ids.mutable_data();
    float* wp = w.mutable_data();
    std::vector<int> rv(n);
    {
      py::gil_scoped_release nogil;
      rmoe::decode_layers(layers_.data(), n, H_, pos, pol.data(), op, ip, wp, rv.data());
    }
    std::copy(rv.begin(), rv.end(), r.mutable_data());
    return py::make_tuple(out, ids, w, r);
  }

  size_t size() const { return layers_.size(); }

 private:
  std::vector<rmoe::DecodeLayer> layers_;
  std::vector<bool> has_residual_;
  std::vector<py::object> keep_;
  size_t H_ = 0, sum_k_ = 0;
};

void def_chain(py::module_& m) {
  py::class_<DecodeChain>(m, "DecodeChain", "consecutive fused decode blocks run by one call per token")
      .def(py::init<>())
      .def("add", &DecodeChain::add, py::arg("attn_norm"), py::arg("ffn_norm"), py::arg("eps"), py::arg("wq"),
           py::arg("wk"), py::arg("wv"), py::arg("wo"), py::arg("bq"), py::arg("bk"), py::arg("bv"), py::arg("kc"),
           py::arg("vc"), py::arg("n_head"), py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), py::arg("neox"),
           py::arg("q_norm"), py::arg("k_norm"), py::arg("qk_eps"), py::arg("scale"), py::arg("router"),
           py::arg("k"), py::arg("sigmoid"), py::arg("norm_topk"), py::arg("rscale"), py::arg("gate_q"),
           py::arg("up_q"), py::arg("down_q"), py::arg("gate_r") = py::none(), py::arg("up_r") = py::none(),
           py::arg("down4") = py::none(),
           "one more block: its attention half (as decode_attn_block, RoPE tables [positions, rope_dim / 2]) and "
           "its routed-expert half (as decode_moe_block)")
      .def("run", &DecodeChain::run, py::arg("x"), py::arg("pos"), py::arg("fixed"), py::arg("ab"),
           py::arg("theta"), py::arg("r_min"), py::arg("r_max"),
           "x [H] through the blocks at pos -> (out [H], ids [sum k], w [sum k], r [blocks])")
      .def("__len__", &DecodeChain::size);
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
  def_chain(m);
}
