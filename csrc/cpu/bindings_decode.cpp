// Bindings of decode attention and the fused decode blocks (csrc/cpu/attn/attn.h,
// decode.h): the attention kernels over a KV cache used in place, each fused
// block half, and DecodeChain, which runs a token through many blocks in one call.
#include <algorithm>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "bindings.h"
#include "decode.h"
#include "ggml/ggml_kernels.h"

namespace rmoe {
namespace bind {

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
           float eps, float scale, bool qk_full = false)
      : pos(pos_), cos(cos_), sin(sin_) {
    const KvArg K = kv_rows(kca, "k cache"), V = kv_rows(vca, "v cache");
    kc = K.rows;
    vc = V.rows;
    n_ctx = std::min(K.n_ctx, V.n_ctx);
    const size_t nkv = K.heads, hd = kc.dim, hdv = vc.dim;
    if (n_head == 0 || nkv == 0 || n_head % nkv || V.heads != nkv || pos >= K.n_ctx || pos >= V.n_ctx || rope_dim % 2 || rope_dim > hd || (size_t)cos.size() < rope_dim / 2 ||
        (size_t)sin.size() < rope_dim / 2)
      throw py::value_error("attention: shapes do not agree");
    a = {n_head, nkv, hd, hdv, rope_dim, neox, cos.data(), sin.data(),
         opt_f32(q_norm, qk_full ? n_head * hd : hd, "q_norm", qn),
         opt_f32(k_norm, qk_full ? nkv * hd : hd, "k_norm", kn), eps, scale, qk_full};
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

// A router's selection: k of E experts, with the optional selection bias (None or float32
// [E]) and expert groups (n_groups > 1: E / n_groups experts each, n_group_used of them
// compete), checked; bias holds what rs.bias points to.
struct RouteArgs {
  rmoe::RouteSpec rs;
  F32Array bias;
  RouteArgs(size_t E, size_t k, bool sigmoid, bool norm_topk, float scale, const py::object& bias_, size_t n_groups,
            size_t n_group_used, const char* fn)
      : rs{E, k, sigmoid, norm_topk, scale} {
    if (k == 0 || k > E) throw py::value_error(std::string(fn) + ": router rows must be the experts, 0 < k <= E");
    if (n_groups > 1 && (E % n_groups || n_group_used == 0 || n_group_used > n_groups))
      throw py::value_error(std::string(fn) + ": expert groups must split the experts, 0 < groups used <= groups");
    rs.n_groups = n_groups;
    rs.n_group_used = n_group_used;
    if (!bias_.is_none()) {
      bias = bias_.cast<F32Array>();
      if ((size_t)bias.size() != E) throw py::value_error(std::string(fn) + ": the selection bias must have E values");
      rs.bias = bias.data();
    }
  }
};

// A layer's shared expert (all None: none): gate/up [F, H] and down [H, F] as ggml_mat
// pairs, and gate_inp None or float32 [H]; keep holds what the pointers read.
struct SharedArgs {
  rmoe::SharedFFN sh{};
  std::vector<py::object> keep;
  SharedArgs(const py::object& gate, const py::object& up, const py::object& down, const py::object& gate_inp,
             size_t H, const char* fn) {
    if (gate.is_none() && up.is_none() && down.is_none() && gate_inp.is_none()) return;
    if (gate.is_none() || up.is_none() || down.is_none())
      throw py::value_error(std::string(fn) + ": a shared expert needs gate, up and down");
    sh.gate = ggml_mat(gate.cast<py::tuple>(), H, "shared gate");
    sh.up = ggml_mat(up.cast<py::tuple>(), H, "shared up");
    sh.down = ggml_mat(down.cast<py::tuple>(), sh.gate.rows, "shared down");
    if (sh.up.rows != sh.gate.rows || sh.down.rows != H)
      throw py::value_error(std::string(fn) + ": shared expert shapes do not agree");
    keep = {gate, up, down};
    if (!gate_inp.is_none()) {
      const auto gi = gate_inp.cast<F32Array>();
      if ((size_t)gi.size() != H) throw py::value_error(std::string(fn) + ": shared gate_inp must have H values");
      sh.gate_inp = gi.data();
      keep.push_back(gi);
    }
  }
};

}  // namespace

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
                                bool neox, const py::object& q_norm, const py::object& k_norm, float eps, float scale,
                                bool qk_full) {
    const AttnArgs A(kc, vc, pos, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, eps, scale, qk_full);
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
     py::arg("bq"), py::arg("bk"), py::arg("bv"), RMOE_ATTN_ARGS, py::arg("qk_full") = false,
     "x + Wo.attention(rms_norm(x)) for one decode token; K/V into the caches at pos -> [H] (qk_full: the q/k norms "
     "span the whole projections)");
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

  m.def("route", [](const F32Array& logits, size_t k, bool sigmoid, bool norm_topk, float scale, const py::object& bias,
                    size_t n_groups, size_t n_group_used) {
    if (logits.ndim() != 2 || k == 0 || k > (size_t)logits.shape(1)) throw py::value_error("route: logits [T, E], 0 < k <= E");
    const size_t T = logits.shape(0), E = logits.shape(1);
    const RouteArgs A(E, k, sigmoid, norm_topk, scale, bias, n_groups, n_group_used, "route");
    I32Array ids({(py::ssize_t)T, (py::ssize_t)k});
    F32Array w({(py::ssize_t)T, (py::ssize_t)k});
    rmoe::route_rows(logits.data(), T, A.rs, ids.mutable_data(), w.mutable_data());
    return py::make_tuple(ids, w);
  }, py::arg("logits"), py::arg("k"), py::arg("sigmoid"), py::arg("norm_topk"), py::arg("scale"),
     py::arg("bias") = py::none(), py::arg("n_groups") = 0, py::arg("n_group_used") = 0,
     "router probabilities -> (ids, weights) [T, k], by selection score (probability + bias, within the kept "
     "groups) descending (ties: lower id first)");

  m.def("decode_moe_block", [](const F32Array& h, const F32Array& norm_w, float eps, const py::tuple& router, size_t k,
                               bool sigmoid, bool norm_topk, float scale, int fixed, double ab, double theta, int r_min,
                               int r_max, const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q,
                               const py::object& gate_r, const py::object& up_r, const py::object& down4,
                               const py::object& shared_gate, const py::object& shared_up,
                               const py::object& shared_down, const py::object& shared_gate_inp,
                               const py::object& bias, size_t n_groups, size_t n_group_used) {
    const size_t H = (size_t)h.size();
    if ((size_t)norm_w.size() != H) throw py::value_error("decode_moe_block: norm weight size");
    const bool may_crit = fixed > 0 || (fixed < 0 && r_max > 0);
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, H, may_crit, "decode_moe_block");
    const SharedArgs S(shared_gate, shared_up, shared_down, shared_gate_inp, H, "decode_moe_block");
    const auto R = ggml_mat(router, H, "router");
    if (R.rows != M.mw.E) throw py::value_error("decode_moe_block: router rows must be the experts, 0 < k <= E");
    if (fixed < 0 && (r_min < 0 || r_min > r_max)) throw py::value_error("decode_moe_block: need 0 <= r_min <= r_max");
    const RouteArgs RA(M.mw.E, k, sigmoid, norm_topk, scale, bias, n_groups, n_group_used, "decode_moe_block");
    const rmoe::RouteSpec& rs = RA.rs;
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
      r = rmoe::decode_moe_block(hp, H, nw, eps, R, rs, pol, M.mw, S.sh, op, ip, wp);
    }
    return py::make_tuple(out, ids, w, r);
  }, py::arg("h"), py::arg("norm_w"), py::arg("eps"), py::arg("router"), py::arg("k"), py::arg("sigmoid"),
     py::arg("norm_topk"), py::arg("scale"), py::arg("fixed"), py::arg("ab"), py::arg("theta"), py::arg("r_min"),
     py::arg("r_max"), py::arg("gate_q"), py::arg("up_q"), py::arg("down_q"), py::arg("gate_r") = py::none(),
     py::arg("up_r") = py::none(), py::arg("down4") = py::none(), py::arg("shared_gate") = py::none(),
     py::arg("shared_up") = py::none(), py::arg("shared_down") = py::none(), py::arg("shared_gate_inp") = py::none(),
     py::arg("bias") = py::none(), py::arg("n_groups") = 0, py::arg("n_group_used") = 0,
     "h + routed residual-split experts (and a shared expert, if given) of rms_norm(h) for one decode token -> "
     "(out [H], ids [k], w [k], r)");
}

namespace {

// Consecutive decode blocks whose halves both fuse, run for one token by decode_layers
// with no Python between them. Everything a block reads (weights, norms, the RoPE
// tables, its KV cache rows) is checked once, when added, and kept alive here.
class DecodeChain {
 public:
  void add(const F32Array& attn_norm, const F32Array& ffn_norm, float eps, const py::tuple& wq, const py::tuple& wk,
           const py::tuple& wv, const py::tuple& wo, const py::object& bq, const py::object& bk, const py::object& bv,
           const py::array& kc, const py::array& vc, size_t n_head, const F32Array& cos, const F32Array& sin,
           size_t rope_dim, bool neox, const py::object& q_norm, const py::object& k_norm, float qk_eps, float scale,
           bool qk_full, const py::tuple& router, size_t k, bool sigmoid, bool norm_topk, float rscale,
           const U8Array& gate_q, const U8Array& up_q, const U8Array& down_q, const py::object& gate_r, const py::object& up_r,
           const py::object& down4, const py::object& shared_gate, const py::object& shared_up,
           const py::object& shared_down, const py::object& shared_gate_inp, const py::object& bias, size_t n_groups,
           size_t n_group_used) {
    const size_t H = (size_t)attn_norm.size();
    if (H == 0 || (!layers_.empty() && H != H_) || (size_t)ffn_norm.size() != H)
      throw py::value_error("decode chain: every block's norms must have the model's width");
    if (cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != (py::ssize_t)(rope_dim / 2) ||
        sin.shape(0) != cos.shape(0) || sin.shape(1) != cos.shape(1))
      throw py::value_error("decode chain: RoPE tables must be [positions, rope_dim / 2]");
    const AttnArgs A(kc, vc, 0, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, qk_eps, scale, qk_full);
    const AttnProj P(A.a, H, wq, wk, wv, wo, bq, bk, bv, "decode chain");
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, H, !gate_r.is_none(), "decode chain");
    const SharedArgs S(shared_gate, shared_up, shared_down, shared_gate_inp, H, "decode chain");
    const auto R = ggml_mat(router, H, "router");
    if (R.rows != M.mw.E) throw py::value_error("decode chain: router rows must be the experts, 0 < k <= E");
    const RouteArgs RA(M.mw.E, k, sigmoid, norm_topk, rscale, bias, n_groups, n_group_used, "decode chain");
    for (const py::object& o : {py::object(attn_norm), py::object(ffn_norm), py::object(wq), py::object(wk),
                                py::object(wv), py::object(wo), py::object(P.qb), py::object(P.kb), py::object(P.vb),
                                py::object(kc), py::object(vc), py::object(A.cos), py::object(A.sin),
                                py::object(A.qn), py::object(A.kn), py::object(router), py::object(gate_q),
                                py::object(up_q), py::object(down_q), py::object(M.gr), py::object(M.ur),
                                py::object(M.d4)})
      keep_.push_back(o);
    keep_.insert(keep_.end(), S.keep.begin(), S.keep.end());
    keep_.push_back(RA.bias);
    layers_.push_back({eps, attn_norm.data(), P.q, P.k, P.v, P.o, P.bq, P.bk, P.bv, A.a, A.cos.data(), A.sin.data(),
                       (size_t)cos.shape(0), A.kc, A.vc, A.n_ctx, ffn_norm.data(), R,
                       RA.rs, M.mw, S.sh});
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

}  // namespace

void def_chain(py::module_& m) {
  py::class_<DecodeChain>(m, "DecodeChain", "consecutive fused decode blocks run by one call per token")
      .def(py::init<>())
      .def("add", &DecodeChain::add, py::arg("attn_norm"), py::arg("ffn_norm"), py::arg("eps"), py::arg("wq"),
           py::arg("wk"), py::arg("wv"), py::arg("wo"), py::arg("bq"), py::arg("bk"), py::arg("bv"), py::arg("kc"),
           py::arg("vc"), py::arg("n_head"), py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), py::arg("neox"),
           py::arg("q_norm"), py::arg("k_norm"), py::arg("qk_eps"), py::arg("scale"), py::arg("qk_full"),
           py::arg("router"), py::arg("k"), py::arg("sigmoid"), py::arg("norm_topk"), py::arg("rscale"), py::arg("gate_q"),
           py::arg("up_q"), py::arg("down_q"), py::arg("gate_r") = py::none(), py::arg("up_r") = py::none(),
           py::arg("down4") = py::none(), py::arg("shared_gate") = py::none(), py::arg("shared_up") = py::none(),
           py::arg("shared_down") = py::none(), py::arg("shared_gate_inp") = py::none(), py::arg("bias") = py::none(),
           py::arg("n_groups") = 0, py::arg("n_group_used") = 0,
           "one more block: its attention half (as decode_attn_block, RoPE tables [positions, rope_dim / 2]) and "
           "its expert half (as decode_moe_block)")
      .def("run", &DecodeChain::run, py::arg("x"), py::arg("pos"), py::arg("fixed"), py::arg("ab"),
           py::arg("theta"), py::arg("r_min"), py::arg("r_max"),
           "x [H] through the blocks at pos -> (out [H], ids [sum k], w [sum k], r [blocks])")
      .def("__len__", &DecodeChain::size);
}

}  // namespace bind
}  // namespace rmoe
