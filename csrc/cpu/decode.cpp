#include "decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ggml/ggml_kernels.h"

namespace rmoe {

namespace {
void matvec(const GgmlMat& m, const float* x, float* y) { ggml::matmul(m.type, m.w, m.rows, m.rb, m.k, x, 1, y); }
}  // namespace

void decode_attn_block(const float* x, size_t H, const float* norm_w, float eps, const GgmlMat& wq, const GgmlMat& wk,
                       const GgmlMat& wv, const GgmlMat& wo, const float* bq, const float* bk, const float* bv,
                       const AttnDecode& a, const KvRows& kc, const KvRows& vc, size_t pos, float* out) {
  std::vector<float> xn(H), q(wq.rows), k(wk.rows), v(wv.rows), o(a.n_head * a.head_dim_v), y(wo.rows);
  rms_norm_row(x, H, norm_w, eps, xn.data());
  const int types[3] = {wq.type, wk.type, wv.type};
  const uint8_t* ws[3] = {wq.w, wk.w, wv.w};
  const size_t rows[3] = {wq.rows, wk.rows, wv.rows}, rbs[3] = {wq.rb, wk.rb, wv.rb};
  float* ys[3] = {q.data(), k.data(), v.data()};
  ggml::matvec_multi(3, types, ws, rows, rbs, H, xn.data(), ys);
  auto add = [](std::vector<float>& t, const float* b) {
    if (b)
      for (size_t i = 0; i < t.size(); ++i) t[i] += b[i];
  };
  add(q, bq);
  add(k, bk);
  add(v, bv);
  attn_decode(a, q.data(), k.data(), v.data(), kc, vc, pos, o.data());
  matvec(wo, o.data(), y.data());
  for (size_t i = 0; i < H; ++i) out[i] = x[i] + y[i];
}

void decode_mla_block(const float* x, size_t H, const float* norm_w, float eps, const MlaProj& m, const AttnDecode& a,
                      const KvRows& rows, size_t pos, float* out) {
  const size_t nh = m.n_head, kv = m.kv, rd = a.rope_dim, nope = m.nope, hk = nope + rd, dk = kv + rd;
  std::vector<float> xn(H), q(nh * hk), ckv(dk), qn(nh * nope), lat(nh * kv), qcat(nh * dk), row(dk), o_lat(nh * kv),
      o(nh * m.hv), y(H);
  rms_norm_row(x, H, norm_w, eps, xn.data());
  const GgmlMat& first = m.wq.w ? m.wq : m.wq_a;
  std::vector<float> qa(m.wq.w ? 0 : m.wq_a.rows);
  {
    const int types[2] = {first.type, m.wkv_a.type};
    const uint8_t* ws[2] = {first.w, m.wkv_a.w};
    const size_t rs[2] = {first.rows, m.wkv_a.rows}, rbs[2] = {first.rb, m.wkv_a.rb};
    float* ys[2] = {m.wq.w ? q.data() : qa.data(), ckv.data()};
    ggml::matvec_multi(2, types, ws, rs, rbs, H, xn.data(), ys);
  }
  if (!m.wq.w) {
    rms_norm_row(qa.data(), qa.size(), m.q_a_norm, eps, qa.data());
    matvec(m.wq_b, qa.data(), q.data());
  }
  std::vector<int32_t> heads(nh);
  for (size_t h = 0; h < nh; ++h) {
    heads[h] = (int32_t)h;
    float* qh = q.data() + h * hk;
    std::copy(qh, qh + nope, qn.data() + h * nope);
    rope_head(qh + nope, a);
    std::copy(qh + nope, qh + hk, qcat.data() + h * dk + kv);
  }
  ggml::expert_matmul(m.k_b.type, m.k_b.w, nh, kv, m.k_b.rb, nope, heads.data(), qn.data(), nh, lat.data());
  for (size_t h = 0; h < nh; ++h) std::copy(lat.data() + h * kv, lat.data() + (h + 1) * kv, qcat.data() + h * dk);
  rms_norm_row(ckv.data(), kv, m.kv_a_norm, eps, row.data());
  std::copy(ckv.data() + kv, ckv.data() + dk, row.data() + kv);
  rope_head(row.data() + kv, a);
  kv_store(rows, pos, 1, row.data());
  KvRows values = rows;  // the latent part of the same rows
  values.dim = kv;
  attn_cached(qcat.data(), 1, nh, 1, rows, values, pos, a.scale, o_lat.data());
  ggml::expert_matmul(m.v_b.type, m.v_b.w, nh, m.hv, m.v_b.rb, kv, heads.data(), o_lat.data(), nh, o.data());
  matvec(m.wo, o.data(), y.data());
  for (size_t i = 0; i < H; ++i) out[i] = x[i] + y[i];
}

void route_rows(const float* logits, size_t T, const RouteSpec& rs, int32_t* ids, float* w) {
  const size_t E = rs.E, k = rs.k;
  std::vector<float> p(E), sel(E);
  std::vector<int32_t> order(E);
  const bool grouped = rs.n_groups > 1;
  const size_t per = grouped ? E / rs.n_groups : E;
  std::vector<float> gscore(grouped ? rs.n_groups : 0);
  std::vector<int32_t> gorder(gscore.size());
  const auto before = [](const std::vector<float>& s) {  // higher score first, ties: the lower index
    return [&s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  };
  for (size_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    if (rs.sigmoid) {
      for (size_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      const float mx = *std::max_element(l, l + E);
      float sum = 0.f;
      for (size_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
      for (size_t e = 0; e < E; ++e) p[e] /= sum;
    }
    for (size_t e = 0; e < E; ++e) sel[e] = rs.bias ? p[e] + rs.bias[e] : p[e];
    if (grouped) {  // each group's score: the sum of its top 2 (engine/moe/router.py)
      for (size_t g = 0; g < rs.n_groups; ++g) {
        const float* s = sel.data() + g * per;
        float a = -INFINITY, b = -INFINITY;
        for (size_t j = 0; j < per; ++j) {
          if (s[j] > a) b = a, a = s[j];
          else if (s[j] > b) b = s[j];
        }
        gscore[g] = per > 1 ? a + b : a;
        gorder[g] = (int32_t)g;
      }
      std::partial_sort(gorder.begin(), gorder.begin() + rs.n_group_used, gorder.end(), before(gscore));
      std::vector<bool> keep(rs.n_groups, false);
      for (size_t i = 0; i < rs.n_group_used; ++i) keep[gorder[i]] = true;
      for (size_t e = 0; e < E; ++e)
        if (!keep[e / per]) sel[e] = -INFINITY;
    }
    for (size_t e = 0; e < E; ++e) order[e] = (int32_t)e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before(sel));
    float* wt = w + t * k;
    float sum = 0.f;
    for (size_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      sum += (wt[j] = p[order[j]]);
    }
    if (rs.norm_topk)
      for (size_t j = 0; j < k; ++j) wt[j] /= std::max(sum, 6.103515625e-5f);
    if (rs.scale != 0.f && rs.scale != 1.f)
      for (size_t j = 0; j < k; ++j) wt[j] *= rs.scale;
  }
}

namespace {
// y += shared(xn), the steps and order of SharedExpert.__call__ and MoEFFN.__call__.
void add_shared(const SharedFFN& sh, const float* xn, size_t H, float* y) {
  const size_t F = sh.gate.rows;
  std::vector<float> g(F), u(F), a(F), s(H);
  const int types[2] = {sh.gate.type, sh.up.type};
  const uint8_t* ws[2] = {sh.gate.w, sh.up.w};
  const size_t rows[2] = {F, F}, rbs[2] = {sh.gate.rb, sh.up.rb};
  float* ys[2] = {g.data(), u.data()};
  ggml::matvec_multi(2, types, ws, rows, rbs, H, xn, ys);
  resplit::silu_mul(g.data(), u.data(), F, a.data());
  matvec(sh.down, a.data(), s.data());
  float gw = 1.f;
  if (sh.gate_inp) {
    float z = 0.f;
    for (size_t i = 0; i < H; ++i) z += xn[i] * sh.gate_inp[i];
    gw = 1.f / (1.f + std::exp(-z));
  }
  for (size_t i = 0; i < H; ++i) y[i] += sh.gate_inp ? s[i] * gw : s[i];
}
}  // namespace

int decode_moe_block(const float* h, size_t H, const float* norm_w, float eps, const GgmlMat& router,
                     const RouteSpec& rs, const CritPolicy& pol, const resplit::MoeWeights& mw, const SharedFFN& sh,
                     float* out, int32_t* ids, float* w) {
  std::vector<float> xn(H), logits(rs.E), y(H);
  rms_norm_row(h, H, norm_w, eps, xn.data());
  matvec(router, xn.data(), logits.data());
  route_rows(logits.data(), 1, rs, ids, w);
  const int k = (int)rs.k;
  // the critical experts are those of the largest weights (ResplitExperts): with a selection
  // bias that order is not the selection's, so the slots go by weight, ties in selection order
  std::vector<int32_t> order(k), wid(k);
  std::vector<float> ww(k);
  for (int j = 0; j < k; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
  for (int j = 0; j < k; ++j) wid[j] = ids[order[j]], ww[j] = w[order[j]];
  int r;
  if (pol.fixed >= 0) {
    r = std::min(pol.fixed, k);
  } else {
    int lead = 0;
    while (lead < k && pol.ab * (double)ww[lead] > pol.theta) ++lead;
    r = std::max(pol.r_min, std::min(lead, std::min(pol.r_max, k)));
  }
  resplit::moe_forward(mw, xn.data(), 1, rs.k, wid.data(), ww.data(), &r, y.data());
  if (sh.gate.w) add_shared(sh, xn.data(), H, y.data());
  for (size_t i = 0; i < H; ++i) out[i] = h[i] + y[i];
  return r;
}

void decode_layers(const DecodeLayer* layers, size_t n, size_t H, size_t pos, const CritPolicy* pol, float* x,
                   int32_t* ids, float* w, int* r) {
  std::vector<float> h(H);
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    const DecodeLayer& L = layers[i];
    AttnDecode a = L.a;
    a.cos = L.cos + pos * (a.rope_dim / 2);
    a.sin = L.sin + pos * (a.rope_dim / 2);
    if (L.is_mla)
      decode_mla_block(x, H, L.attn_norm, L.eps, L.mla, a, L.kc, pos, h.data());
    else
      decode_attn_block(x, H, L.attn_norm, L.eps, L.wq, L.wk, L.wv, L.wo, L.bq, L.bk, L.bv, a, L.kc, L.vc, pos,
                        h.data());
    r[i] = decode_moe_block(h.data(), H, L.ffn_norm, L.eps, L.router, L.rs, pol[i], L.mw, L.sh, x, ids + off,
                            w + off);
    off += L.rs.k;
  }
}

}  // namespace rmoe
