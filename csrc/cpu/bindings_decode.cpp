// Bindings of decode attention and the fused decode block halves (csrc/cpu/attn/attn.h,
// decode.h): the attention kernels over a KV cache used in place, and each fused block
// half (their argument checks: bindings_decode.h).
#include "bindings_decode.h"

namespace rmoe {
namespace bind {

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

  m.def("decode_mla_block", [](const F32Array& x, const F32Array& norm_w, float eps, const py::object& wq,
                               const py::object& wq_a, const py::object& q_a_norm, const py::object& wq_b,
                               const py::tuple& wkv_a, const F32Array& kv_a_norm, const py::tuple& k_b,
                               const py::tuple& v_b, const py::tuple& wo, const py::array& cache, size_t pos,
                               size_t n_head, const F32Array& cos, const F32Array& sin, size_t rope_dim, bool neox,
                               float scale, size_t nope, size_t hv) {
    const size_t H = (size_t)x.size();
    if ((size_t)norm_w.size() != H) throw py::value_error("decode_mla_block: norm weight size");
    const MlaArgs M(H, wq, wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, k_b, v_b, wo, cache, n_head, cos, sin, rope_dim, neox,
                    scale, nope, hv, "decode_mla_block");
    if (pos >= M.n_ctx) throw py::value_error("decode_mla_block: position past the cache");
    F32Array out((py::ssize_t)H);
    const float* xp = x.data();
    const float* nw = norm_w.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      rmoe::decode_mla_block(xp, H, nw, eps, M.p, M.a, M.rows, pos, op);
    }
    return out;
  }, py::arg("x"), py::arg("norm_w"), py::arg("eps"), py::arg("wq"), py::arg("wq_a"), py::arg("q_a_norm"),
     py::arg("wq_b"), py::arg("wkv_a"), py::arg("kv_a_norm"), py::arg("k_b"), py::arg("v_b"), py::arg("wo"),
     py::arg("cache"), py::arg("pos"), py::arg("n_head"), py::arg("cos"), py::arg("sin"), py::arg("rope_dim"),
     py::arg("neox"), py::arg("scale"), py::arg("nope"), py::arg("hv"),
     "x + Wo.mla(rms_norm(x)) for one decode token (DeepSeek's latent attention, absorbed); the row [latent | k_pe] "
     "into the cache at pos -> [H]");

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
                               const py::object& source, const py::object& shared_gate, const py::object& shared_up,
                               const py::object& shared_down, const py::object& shared_gate_inp,
                               const py::object& bias, size_t n_groups, size_t n_group_used) {
    const size_t H = (size_t)h.size();
    if ((size_t)norm_w.size() != H) throw py::value_error("decode_moe_block: norm weight size");
    const bool may_crit = fixed > 0 || (fixed < 0 && r_max > 0);
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, source, H, may_crit, "decode_moe_block");
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
     py::arg("up_r") = py::none(), py::arg("down4") = py::none(), py::arg("source") = py::none(),
     py::arg("shared_gate") = py::none(),
     py::arg("shared_up") = py::none(), py::arg("shared_down") = py::none(), py::arg("shared_gate_inp") = py::none(),
     py::arg("bias") = py::none(), py::arg("n_groups") = 0, py::arg("n_group_used") = 0,
     "h + routed residual-split experts (and a shared expert, if given) of rms_norm(h) for one decode token -> "
     "(out [H], ids [k], w [k], r)");
}

}  // namespace bind
}  // namespace rmoe
