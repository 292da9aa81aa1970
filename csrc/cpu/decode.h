// A decode token's transformer block halves in one call each (no Python between the
// steps): the attention half x + Wo.attn(norm(x)) and the routed-expert half
// h + moe(norm(h)) of the residual split. Math and order as engine/models/base.py,
// engine/moe/router.py and engine/moe/umia.py.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attn/attn.h"
#include "resplit/resplit.h"

namespace rmoe {

struct GgmlMat {  // rows x k weights of a GGUF type, raw rows of rb bytes
  int type;
  const uint8_t* w;
  size_t rows, rb, k;
};

// out [H] = x + Wo . attention(q, k, v of rms_norm(x)); a describes heads, RoPE and
// norms (its cos/sin are the position's); biases may be null.
void decode_attn_block(const float* x, size_t H, const float* norm_w, float eps, const GgmlMat& wq, const GgmlMat& wk,
                       const GgmlMat& wv, const GgmlMat& wo, const float* bq, const float* bk, const float* bv,
                       const AttnDecode& a, const KvRows& kc, const KvRows& vc, size_t pos, float* out);

// DeepSeek's multi-head latent attention in the absorbed form (engine/models/mla.py) for
// one decode token. q = wq . xn, or wq_b . rms_norm(wq_a . xn) when wq.w is null; the row
// cached at pos is [rms_norm(latent) | roped k_pe] (rows: one head of kv + rope_dim values);
// every head attends over those rows (its query [k_b_h . q_nope_h | roped q_pe_h]) and
// reads the latent part as values; k_b [n_head * kv rows, nope] and v_b [n_head * hv rows,
// kv] are per-head stacks. a: rope_dim, neox, cos/sin at pos, scale.
struct MlaProj {
  GgmlMat wq{}, wq_a{}, wq_b{}, wkv_a{}, k_b{}, v_b{}, wo{};
  const float* q_a_norm = nullptr;  // [wq_a.rows] when wq_a is used
  const float* kv_a_norm = nullptr;  // [kv]
  size_t n_head = 0, kv = 0, nope = 0, hv = 0;
};
// out [H] = x + Wo . mla(rms_norm(x)), the cache row at pos written.
void decode_mla_block(const float* x, size_t H, const float* norm_w, float eps, const MlaProj& m, const AttnDecode& a,
                      const KvRows& rows, size_t pos, float* out);

struct RouteSpec {
  size_t E, k;
  bool sigmoid;    // else softmax
  bool norm_topk;  // weights / sum (at least 2^-14)
  float scale;     // applied when not 0 or 1
  const float* bias = nullptr;  // [E] added to the probabilities for selection only (exp_probs_b), or null
  size_t n_groups = 0, n_group_used = 0;  // n_groups > 1: only the n_group_used groups of E / n_groups
                                          // experts with the largest sums of their top 2 scores compete
};
// logits [T, E] -> ids, w [T, k]: the k experts of the highest selection score
// (probability + bias), in that order (ties: the lower id first), and their weights
// (the unbiased probabilities).
void route_rows(const float* logits, size_t T, const RouteSpec& rs, int32_t* ids, float* w);

struct CritPolicy {
  int fixed;      // >= 0: r = min(fixed, k); < 0: UMIA, r = leading run of ab * w_j > theta
  double ab, theta;
  int r_min, r_max;
};

// A dense SwiGLU expert every token uses beside the routed ones (engine/moe/block.py
// SharedExpert): down . (silu(gate . x) * (up . x)), times sigmoid(gate_inp . x) where
// gate_inp is set (qwen2moe). gate.w null: the layer has none.
struct SharedFFN {
  GgmlMat gate{}, up{}, down{};
  const float* gate_inp = nullptr;  // [H] or null
};

// out [H] = h + (sum_j w_j expert_j(xn) + shared(xn)), xn = rms_norm(h); experts in the
// residual-split formats (mw), the r of the largest weights critical. Returns r; ids, w [k]
// as route_rows gives them (in selection order).
int decode_moe_block(const float* h, size_t H, const float* norm_w, float eps, const GgmlMat& router,
                     const RouteSpec& rs, const CritPolicy& pol, const resplit::MoeWeights& mw, const SharedFFN& sh,
                     float* out, int32_t* ids, float* w);

// One transformer block whose two halves both fuse (decode_attn_block, or decode_mla_block
// when is_mla, then decode_moe_block), as decode_layers runs it.
struct DecodeLayer {
  float eps;  // the block's two norms
  const float* attn_norm;
  GgmlMat wq, wk, wv, wo;
  const float *bq, *bk, *bv;  // may be null
  bool is_mla;                // the attention half is mla (its rows: kc), not wq..bv
  MlaProj mla;
  AttnDecode a;               // its cos/sin are set per position from the tables below
  const float *cos, *sin;     // [n_pos, rope_dim / 2]
  size_t n_pos;
  KvRows kc, vc;
  size_t n_ctx;
  const float* ffn_norm;
  GgmlMat router;
  RouteSpec rs;
  resplit::MoeWeights mw;
  SharedFFN sh;
};

// One decode token at pos through n consecutive blocks, with no Python between them.
// x [H] in and out; per block i: pol[i], and ids, w [k] at ids + off_i, w + off_i
// (off_i = the k's of the blocks before it) and r[i], as decode_moe_block gives them.
void decode_layers(const DecodeLayer* layers, size_t n, size_t H, size_t pos, const CritPolicy* pol, float* x,
                   int32_t* ids, float* w, int* r);

}  // namespace rmoe
