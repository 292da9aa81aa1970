// DecodeChain: a token through many fused decode blocks in one call (decode.h,
// decode_layers), its arguments checked as the single blocks' are (bindings_decode.h).
#include "bindings_decode.h"

namespace rmoe {
namespace bind {

namespace {

// The expert half's parameters of DecodeChain.add / add_mla, and passing them on.
#define RMOE_CHAIN_FFN_PARAMS                                                                                    \
  const py::tuple &router, size_t k, bool sigmoid, bool norm_topk, float rscale, const U8Array &gate_q,          \
      const U8Array &up_q, const U8Array &down_q, const py::object &gate_r, const py::object &up_r,              \
      const py::object &down4, const py::object &source, const py::object &shared_gate,                          \
      const py::object &shared_up, const py::object &shared_down, const py::object &shared_gate_inp,             \
      const py::object &bias, size_t n_groups, size_t n_group_used
#define RMOE_CHAIN_FFN_ARGS                                                                                      \
  router, k, sigmoid, norm_topk, rscale, gate_q, up_q, down_q, gate_r, up_r, down4, source, shared_gate,         \
      shared_up, shared_down, shared_gate_inp, bias, n_groups, n_group_used

// Consecutive decode blocks whose halves both fuse, run for one token by decode_layers
// with no Python between them. Everything a block reads (weights, norms, the RoPE
// tables, its KV cache rows) is checked once, when added, and kept alive here.
class DecodeChain {
 public:
  void add(const F32Array& attn_norm, const F32Array& ffn_norm, float eps, const py::tuple& wq, const py::tuple& wk,
           const py::tuple& wv, const py::tuple& wo, const py::object& bq, const py::object& bk, const py::object& bv,
           const py::array& kc, const py::array& vc, size_t n_head, const F32Array& cos, const F32Array& sin,
           size_t rope_dim, bool neox, const py::object& q_norm, const py::object& k_norm, float qk_eps, float scale,
           bool qk_full, RMOE_CHAIN_FFN_PARAMS) {
    const size_t H = width(attn_norm, ffn_norm, cos, sin, rope_dim);
    const AttnArgs A(kc, vc, 0, n_head, cos, sin, rope_dim, neox, q_norm, k_norm, qk_eps, scale, qk_full);
    const AttnProj P(A.a, H, wq, wk, wv, wo, bq, bk, bv, "decode chain");
    for (const py::object& o : {py::object(wq), py::object(wk), py::object(wv), py::object(wo), py::object(P.qb),
                                py::object(P.kb), py::object(P.vb), py::object(kc), py::object(vc), py::object(A.qn),
                                py::object(A.kn)})
      keep_.push_back(o);
    rmoe::DecodeLayer L{};
    L.wq = P.q, L.wk = P.k, L.wv = P.v, L.wo = P.o, L.bq = P.bq, L.bk = P.bk, L.bv = P.bv;
    L.a = A.a, L.kc = A.kc, L.vc = A.vc, L.n_ctx = A.n_ctx;
    add_ffn(L, attn_norm, ffn_norm, eps, A.cos, A.sin, RMOE_CHAIN_FFN_ARGS);
  }

  // A block whose attention half is DeepSeek's latent attention (as decode_mla_block).
  void add_mla(const F32Array& attn_norm, const F32Array& ffn_norm, float eps, const py::object& wq,
               const py::object& wq_a, const py::object& q_a_norm, const py::object& wq_b, const py::tuple& wkv_a,
               const F32Array& kv_a_norm, const py::tuple& k_b, const py::tuple& v_b, const py::tuple& wo,
               const py::array& cache, size_t n_head, const F32Array& cos, const F32Array& sin, size_t rope_dim,
               bool neox, float scale, size_t nope, size_t hv, RMOE_CHAIN_FFN_PARAMS) {
    const size_t H = width(attn_norm, ffn_norm, cos, sin, rope_dim);
    const MlaArgs M(H, wq, wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, k_b, v_b, wo, cache, n_head, cos, sin, rope_dim, neox,
                    scale, nope, hv, "decode chain");
    for (const py::object& o : {wq, wq_a, py::object(M.qan), wq_b, py::object(wkv_a), py::object(M.kvn),
                                py::object(k_b), py::object(v_b), py::object(wo), py::object(cache)})
      keep_.push_back(o);
    rmoe::DecodeLayer L{};
    L.is_mla = true, L.mla = M.p, L.a = M.a, L.kc = M.rows, L.n_ctx = M.n_ctx;
    add_ffn(L, attn_norm, ffn_norm, eps, M.cos, M.sin, RMOE_CHAIN_FFN_ARGS);
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
  // The model's width from a block's norms, and its RoPE tables checked ([positions, rope_dim / 2]).
  size_t width(const F32Array& attn_norm, const F32Array& ffn_norm, const F32Array& cos, const F32Array& sin,
               size_t rope_dim) const {
    const size_t H = (size_t)attn_norm.size();
    if (H == 0 || (!layers_.empty() && H != H_) || (size_t)ffn_norm.size() != H)
      throw py::value_error("decode chain: every block's norms must have the model's width");
    if (cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != (py::ssize_t)(rope_dim / 2) ||
        sin.shape(0) != cos.shape(0) || sin.shape(1) != cos.shape(1))
      throw py::value_error("decode chain: RoPE tables must be [positions, rope_dim / 2]");
    return H;
  }

  // The expert half (as decode_moe_block) of a block whose attention half L holds; the block joins the chain.
  void add_ffn(rmoe::DecodeLayer& L, const F32Array& attn_norm, const F32Array& ffn_norm, float eps,
               const F32Array& cos, const F32Array& sin, RMOE_CHAIN_FFN_PARAMS) {
    const size_t H = (size_t)attn_norm.size();
    const MoeArgs M(gate_q, up_q, down_q, gate_r, up_r, down4, source, H, !gate_r.is_none(), "decode chain");
    const SharedArgs S(shared_gate, shared_up, shared_down, shared_gate_inp, H, "decode chain");
    const auto R = ggml_mat(router, H, "router");
    if (R.rows != M.mw.E) throw py::value_error("decode chain: router rows must be the experts, 0 < k <= E");
    const RouteArgs RA(M.mw.E, k, sigmoid, norm_topk, rscale, bias, n_groups, n_group_used, "decode chain");
    for (const py::object& o : {py::object(attn_norm), py::object(ffn_norm), py::object(cos), py::object(sin),
                                py::object(router), py::object(gate_q), py::object(up_q), py::object(down_q),
                                py::object(M.gr), py::object(M.ur), py::object(M.d4), M.src})
      keep_.push_back(o);
    keep_.insert(keep_.end(), S.keep.begin(), S.keep.end());
    keep_.push_back(RA.bias);
    L.eps = eps, L.attn_norm = attn_norm.data(), L.cos = cos.data(), L.sin = sin.data(), L.n_pos = (size_t)cos.shape(0);
    L.ffn_norm = ffn_norm.data(), L.router = R, L.rs = RA.rs, L.mw = M.mw, L.sh = S.sh;
    layers_.push_back(L);
    has_residual_.push_back(M.mw.gate_r != nullptr || M.mw.from_source());
    H_ = H;
    sum_k_ += k;
  }

  std::vector<rmoe::DecodeLayer> layers_;
  std::vector<bool> has_residual_;
  std::vector<py::object> keep_;
  size_t H_ = 0, sum_k_ = 0;
};

#undef RMOE_CHAIN_FFN_PARAMS
#undef RMOE_CHAIN_FFN_ARGS
}  // namespace

void def_chain(py::module_& m) {
  py::class_<DecodeChain>(m, "DecodeChain", "consecutive fused decode blocks run by one call per token")
      .def(py::init<>())
#define RMOE_CHAIN_FFN_PYARGS                                                                                   \
  py::arg("router"), py::arg("k"), py::arg("sigmoid"), py::arg("norm_topk"), py::arg("rscale"), py::arg("gate_q"), \
      py::arg("up_q"), py::arg("down_q"), py::arg("gate_r") = py::none(), py::arg("up_r") = py::none(),           \
      py::arg("down4") = py::none(), py::arg("source") = py::none(), py::arg("shared_gate") = py::none(),      \
      py::arg("shared_up") = py::none(), py::arg("shared_down") = py::none(),                                   \
      py::arg("shared_gate_inp") = py::none(), py::arg("bias") = py::none(),                                    \
      py::arg("n_groups") = 0, py::arg("n_group_used") = 0
      .def("add", &DecodeChain::add, py::arg("attn_norm"), py::arg("ffn_norm"), py::arg("eps"), py::arg("wq"),
           py::arg("wk"), py::arg("wv"), py::arg("wo"), py::arg("bq"), py::arg("bk"), py::arg("bv"), py::arg("kc"),
           py::arg("vc"), py::arg("n_head"), py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), py::arg("neox"),
           py::arg("q_norm"), py::arg("k_norm"), py::arg("qk_eps"), py::arg("scale"), py::arg("qk_full"),
           RMOE_CHAIN_FFN_PYARGS,
           "one more block: its attention half (as decode_attn_block, RoPE tables [positions, rope_dim / 2]) and "
           "its expert half (as decode_moe_block)")
      .def("add_mla", &DecodeChain::add_mla, py::arg("attn_norm"), py::arg("ffn_norm"), py::arg("eps"),
           py::arg("wq"), py::arg("wq_a"), py::arg("q_a_norm"), py::arg("wq_b"), py::arg("wkv_a"),
           py::arg("kv_a_norm"), py::arg("k_b"), py::arg("v_b"), py::arg("wo"), py::arg("cache"), py::arg("n_head"),
           py::arg("cos"), py::arg("sin"), py::arg("rope_dim"), py::arg("neox"), py::arg("scale"), py::arg("nope"),
           py::arg("hv"), RMOE_CHAIN_FFN_PYARGS,
           "one more block: its latent attention half (as decode_mla_block, RoPE tables [positions, rope_dim / 2]) "
           "and its expert half (as decode_moe_block)")
#undef RMOE_CHAIN_FFN_PYARGS
      .def("run", &DecodeChain::run, py::arg("x"), py::arg("pos"), py::arg("fixed"), py::arg("ab"),
           py::arg("theta"), py::arg("r_min"), py::arg("r_max"),
           "x [H] through the blocks at pos -> (out [H], ids [sum k], w [sum k], r [blocks])")
      .def("__len__", &DecodeChain::size);
}

}  // namespace bind
}  // namespace rmoe
