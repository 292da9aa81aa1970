// The argument checks of the decode bindings (bindings_decode.cpp: attention and the
// fused block halves; bindings_chain.cpp: DecodeChain): each turns Python arrays into the
// kernels' raw views, or raises a one-line ValueError naming what is wrong.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "bindings.h"
#include "decode.h"
#include "ggml/ggml_kernels.h"

namespace rmoe {
namespace bind {

// A layer's KV cache rows, used in place (never a converted copy): a writable C-contiguous
// [heads, n_ctx, dim] array of float32 or float16, or of uint8 holding q8_0 blocks
// ([heads, n_ctx, dim / 32 * 34]). Each head's rows are one stream, as decode reads them.
struct KvArg {
  rmoe::KvRows rows;
  size_t heads, n_ctx;
};

inline KvArg kv_rows(const py::array& a, const char* what) {
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
inline const float* opt_f32(const py::object& o, size_t n, const char* what, F32Array& keep) {
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
inline rmoe::GgmlMat ggml_mat(const py::tuple& t, size_t k, const char* what) {
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

// DeepSeek's latent attention for decode_mla_block: the projections (wq, or wq_a, q_a_norm
// and wq_b; each a ggml_mat pair or None), the layer's cache rows [1, n_ctx, kv + rope_dim]
// and the RoPE values (cos/sin: at least rope_dim / 2 values; the caller checks a table's
// shape), checked against the width H, the heads and the rows.
struct MlaArgs {
  rmoe::MlaProj p;
  rmoe::AttnDecode a{};
  rmoe::KvRows rows{};
  size_t n_ctx = 0;
  F32Array cos, sin, qan, kvn;
  MlaArgs(size_t H, const py::object& wq, const py::object& wq_a, const py::object& q_a_norm, const py::object& wq_b,
          const py::tuple& wkv_a, const F32Array& kv_a_norm, const py::tuple& k_b, const py::tuple& v_b,
          const py::tuple& wo, const py::array& cache, size_t n_head, const F32Array& cos_, const F32Array& sin_,
          size_t rope_dim, bool neox, float scale, size_t nope, size_t hv, const char* fn)
      : cos(cos_), sin(sin_), kvn(kv_a_norm) {
    const auto bad = [fn](const char* what) { return py::value_error(std::string(fn) + ": " + what); };
    const KvArg C = kv_rows(cache, "cache");
    rows = C.rows;
    n_ctx = C.n_ctx;
    const size_t dk = rows.dim;
    if (C.heads != 1 || rope_dim % 2 || rope_dim >= dk || (size_t)cos.size() < rope_dim / 2 ||
        (size_t)sin.size() < rope_dim / 2 || n_head == 0 || nope == 0 || hv == 0)
      throw bad("cache rows, heads or RoPE do not agree");
    p.n_head = n_head, p.kv = dk - rope_dim, p.nope = nope, p.hv = hv;
    if (rows.type == rmoe::KvType::Q8_0 && p.kv % 32) throw bad("a q8_0 cache needs a latent of whole blocks");
    if (wq.is_none() == wq_a.is_none() || wq_a.is_none() != wq_b.is_none() || wq_a.is_none() != q_a_norm.is_none())
      throw bad("give wq, or wq_a, q_a_norm and wq_b");
    const size_t q_rows = n_head * (nope + rope_dim);
    if (!wq.is_none()) {
      p.wq = ggml_mat(wq.cast<py::tuple>(), H, "wq");
      if (p.wq.rows != q_rows) throw bad("wq rows are not the heads' queries");
    } else {
      p.wq_a = ggml_mat(wq_a.cast<py::tuple>(), H, "wq_a");
      p.wq_b = ggml_mat(wq_b.cast<py::tuple>(), p.wq_a.rows, "wq_b");
      p.q_a_norm = opt_f32(q_a_norm, p.wq_a.rows, "q_a_norm", qan);
      if (p.wq_b.rows != q_rows) throw bad("wq_b rows are not the heads' queries");
    }
    p.wkv_a = ggml_mat(wkv_a, H, "wkv_a");
    p.k_b = ggml_mat(k_b, nope, "k_b");
    p.v_b = ggml_mat(v_b, p.kv, "v_b");
    p.wo = ggml_mat(wo, n_head * hv, "wo");
    if (p.wkv_a.rows != dk || (size_t)kvn.size() != p.kv || p.k_b.rows != n_head * p.kv ||
        p.v_b.rows != n_head * hv || p.wo.rows != H)
      throw bad("projection shapes do not agree with the heads and the cache rows");
    p.kv_a_norm = kvn.data();
    a.n_head = n_head, a.rope_dim = rope_dim, a.neox = neox, a.cos = cos.data(), a.sin = sin.data(), a.scale = scale;
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

}  // namespace bind
}  // namespace rmoe
