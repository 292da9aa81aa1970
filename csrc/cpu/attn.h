// One decode step of standard GQA attention on the CPU, after the q/k/v projections:
// optional per-head RMS norms of q and k, RoPE, the new K/V written into the cache,
// then softmax(scale * q.K^T) V for every query head over positions 0..pos. The math
// and its order follow the torch path in engine/models/common.py (llama.cpp's order).
#pragma once
#include <cstddef>

namespace rmoe {

struct AttnDecode {
  size_t n_head, n_head_kv, head_dim, head_dim_v;
  size_t rope_dim;   // first rope_dim dims of each head rotate
  bool neox;         // pairs (i, i + d/2); otherwise adjacent pairs (2i, 2i + 1)
  const float* cos;  // [rope_dim / 2] at pos
  const float* sin;
  const float* q_norm;  // [head_dim] or null
  const float* k_norm;
  float eps, scale;
};

// q [n_head*hd], k [n_kv*hd], v [n_kv*hdv] (q and k are modified in place); kc [>pos, n_kv, hd],
// vc [>pos, n_kv, hdv]: row pos is written; out [n_head*hdv].
void attn_decode(const AttnDecode& a, float* q, float* k, const float* v, float* kc, float* vc, size_t pos, float* out);

// One query head over S positions (AVX2 + FMA; attn_avx2.cpp): q [hd]; keys at k + j*ks,
// values at v + j*vs; p: scratch [S]; out [hdv].
void attn_head_avx2(const float* q, const float* k, const float* v, size_t ks, size_t vs, size_t hd, size_t hdv,
                    size_t S, float scale, float* p, float* out);

}  // namespace rmoe
