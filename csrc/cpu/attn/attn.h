// Decode attention on the CPU over a KV cache kept as f32, f16 or q8_0 rows.
//
// attn_decode is one decode step of standard GQA attention after the q/k/v
// projections: optional per-head RMS norms of q and k, RoPE, the new K/V stored
// into the cache, then attn_cached. attn_cached is causal softmax(scale * q.K^T) V
// for a run of queries (a prefill chunk, or one decode token) in the flash order:
// threads take a KV group with a block of queries (each K/V tile is converted once
// for every query row that shares it) and, when there are too few such blocks,
// a block of keys too; each keeps a running maximum, sum and output per row, and
// key blocks are merged at the end. No score matrix beyond one tile is ever held. The math follows the torch path in
// engine/models/common.py (llama.cpp's order); rounding differs only in the order
// of the sums.
#pragma once
#include <cstddef>
#include <cstdint>

namespace rmoe {

// GGUF type ids of the cache rows.
enum class KvType : int { F32 = 0, F16 = 1, Q8_0 = 8 };

// One layer's cache rows: position j, head g at base + j * pos_stride + g * head_stride
// (bytes), dim values each. q8_0 rows are ggml blocks ([d:f16][q:32 x int8], dim % 32 == 0).
// The engine keeps each head's rows together (head_stride = n_ctx * pos_stride): a head's
// keys are one stream for the hardware prefetchers.
struct KvRows {
  KvType type;
  uint8_t* base;
  size_t pos_stride, head_stride, dim;
};

size_t kv_row_bytes(KvType t, size_t dim);  // bytes of one head's row of dim values

// Rows of n_heads heads at position pos from x [n_heads * dim] (f16: round to nearest
// even; q8_0: d = max|x| / 127 over each 32 values, q = round(x / d), ties to even).
void kv_store(const KvRows& c, size_t pos, size_t n_heads, const float* x);

// q [n_q, n_head, K.dim]: query t at position pos0 + t sees positions 0..pos0 + t (causal;
// head h reads group h / (n_head / n_groups)); out [n_q, n_head, V.dim].
void attn_cached(const float* q, size_t n_q, size_t n_head, size_t n_groups, const KvRows& K, const KvRows& V,
                 size_t pos0, float scale, float* out);

struct AttnDecode {
  size_t n_head, n_head_kv, head_dim, head_dim_v;
  size_t rope_dim;   // first rope_dim dims of each head rotate
  bool neox;         // pairs (i, i + d/2); otherwise adjacent pairs (2i, 2i + 1)
  const float* cos;  // [rope_dim / 2] at pos
  const float* sin;
  const float* q_norm;  // [head_dim] or null (qk_full: [n_head * head_dim])
  const float* k_norm;  // [head_dim] or null (qk_full: [n_head_kv * head_dim])
  float eps, scale;
  bool qk_full = false;  // the norms span the whole q and k (olmoe), not each head
};

// The first a.rope_dim values of x rotated in place by a.cos / a.sin (a.neox: pairs
// (i, i + d/2), else (2i, 2i + 1)), as engine/models/common.Rope.
void rope_head(float* x, const AttnDecode& a);

// out = x * rsqrt(mean(x^2) + eps) * w, as ggml (out may be x)
void rms_norm_row(const float* x, size_t n, const float* w, float eps, float* out);

// q [n_head*hd], k [n_kv*hd], v [n_kv*hdv] (q and k are modified in place); kc, vc: the
// layer's caches (position pos is written); out [n_head*hdv].
void attn_decode(const AttnDecode& a, float* q, float* k, const float* v, const KvRows& kc, const KvRows& vc,
                 size_t pos, float* out);

// One ISA's pieces of attn_cached (kernel_table.cpp picks them): a tile is n rows of dim
// f32 values, row after row, read from the cache by rows_f32; scores_rows and accum_rows
// work on the cache's own f16 / f32 rows (no tile) where the ISA has them, else null.
struct TileOps {
  void (*rows_f32)(const KvRows& c, size_t g, size_t j0, size_t n, float* tile);  // rows j0.. of group g
  // s[h * sstride + t] = scale * q_h . tile_t
  void (*scores)(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                 float* s, size_t sstride);
  float (*max)(const float* p, size_t n);     // max of p[0..n), -inf for n = 0
  float (*exp)(float* p, size_t n, float m);  // p = e^(p - m), returns the sum
  // For each of `rows` rows r (weights p + r * pstride): o[r] = c[r] * o[r] + sum_t p_t tile_t[0:dim].
  void (*accum)(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                size_t dim, const float* c, float* const* o);
  void (*scores_rows)(const float* q, size_t nq, size_t qstride, const KvRows& k, size_t g, size_t j0, size_t n,
                      float scale, float* s, size_t sstride);
  void (*accum_rows)(const float* p, size_t pstride, size_t rows, const KvRows& v, size_t g, size_t j0, size_t n,
                     const float* c, float* const* o);
};
// The portable pieces (attn.cpp) and the ISA ones, called only where isa.cpp allows their
// ISA: AVX2 + FMA + F16C (attn_avx2.cpp) and AVX-512 (attn_avx512.cpp).
void kv_rows_f32_scalar(const KvRows& c, size_t g, size_t j0, size_t n, float* tile);
void kv_scores_scalar(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                      float* s, size_t sstride);
float kv_max_scalar(const float* p, size_t n);
float kv_exp_scalar(float* p, size_t n, float m);
void kv_accum_scalar(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                     size_t dim, const float* c, float* const* o);
void kv_rows_f32_avx2(const KvRows& c, size_t g, size_t j0, size_t n, float* tile);  // rows j0.. of group g
void kv_scores_avx2(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                    float* s, size_t sstride);  // s[h * sstride + t] = scale * q_h . tile_t
float kv_max_avx2(const float* p, size_t n);     // max of p[0..n), -inf for n = 0
float kv_exp_avx2(float* p, size_t n, float m);  // p = e^(p - m), returns the sum
// For each of `rows` rows r (weights p + r * pstride): o[r] = c[r] * o[r] + sum_t p_t tile_t[0:dim].
void kv_accum_avx2(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                   size_t dim, const float* c, float* const* o);
void kv_scores_rows_avx2(const float* q, size_t nq, size_t qstride, const KvRows& k, size_t g, size_t j0, size_t n,
                         float scale, float* s, size_t sstride);  // as kv_scores_rows_avx512 below
void kv_accum_rows_avx2(const float* p, size_t pstride, size_t rows, const KvRows& v, size_t g, size_t j0, size_t n,
                        const float* c, float* const* o);
void kv_rows_f32_avx512(const KvRows& c, size_t g, size_t j0, size_t n, float* tile);
void kv_scores_avx512(const float* q, size_t nq, size_t qstride, const float* tile, size_t n, size_t dim, float scale,
                      float* s, size_t sstride);
void kv_accum_avx512(const float* p, size_t pstride, size_t rows, const float* tile, size_t tstride, size_t n,
                     size_t dim, const float* c, float* const* o);
// The same on the cache's own rows j0 .. j0 + n of group g, f16 or f32 (no tile): f16 is
// converted as it is loaded.
void kv_scores_rows_avx512(const float* q, size_t nq, size_t qstride, const KvRows& k, size_t g, size_t j0, size_t n,
                           float scale, float* s, size_t sstride);
void kv_accum_rows_avx512(const float* p, size_t pstride, size_t rows, const KvRows& v, size_t g, size_t j0, size_t n,
                          const float* c, float* const* o);

}  // namespace rmoe
