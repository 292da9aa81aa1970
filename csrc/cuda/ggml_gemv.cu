// Non-expert weights in their GGUF types (Q8_0, Q4_K, Q5_K, Q6_K): a GEMV for
// decode (up to 8 tokens per weight read) and a dequantize-to-bf16 for
// prefill GEMMs. Block layouts: ggml_quants.cuh.
//
// The GEMV reads every weight byte once with 16-byte loads in which consecutive
// lanes take consecutive bytes of a block, and multiplies in integers: x is
// quantized once per call (ggml_quant_x) to int8 per 32 elements, q = rint(x/dx),
// dx = amax/127, so each weight costs a quarter of a DP4A per token, and the
// block's scales are applied in float once per 16 or 32 weights. That rounding of
// x is the only approximation: |y - W.x| <= sum over blocks dx/2 * sum |w|
// (plus float rounding), the error llama.cpp accepts for its q8_1 activations.
#include "ggml_quants.cuh"

using namespace rmoe_cuda;

#define GG_UNROLL 2  // work items a thread loads before it computes on them

// ---------------------------------------------------------------- activations
// x [T, n] float32 (16-byte aligned rows) -> XQ [T, n] int8 and XS [T, n/16]
// {dx, dx * sum of these 16 q}: the half-block sums serve the K-quants'
// minimums. A thread takes 4 elements, 8 lanes a 32-block.
// grid (ceil(n/4 / 256), T), block 256.
extern "C" __global__ void __launch_bounds__(256) ggml_quant_x(const float* __restrict__ x, int n,
                                                               u32* __restrict__ XQ, float2* __restrict__ XS) {
  const int i = blockIdx.x * 256 + threadIdx.x, t = blockIdx.y;
  const bool ok = i < n / 4;  // a 32-block's 8 lanes agree; all lanes reach the shuffles
  const i64 at = (i64)t * n + 4 * i;
  float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
  if (ok) {
#ifdef RMOE_EMULATE
    emu_check_aligned(x + at, 16);
#endif
    v = __ldg(reinterpret_cast<const float4*>(x + at));
  }
  // NaN kept (a NaN or an infinity makes its block's dx NaN, as on the CPU)
  float amax = max_keep_nan(max_keep_nan(fabsf(v.x), fabsf(v.y)), max_keep_nan(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = max_keep_nan(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool bad = !(amax <= 3.402823466e38f);  // a NaN or an infinity: q = 0, dx NaN
  const float inv = !bad && amax > 0.0f ? 127.0f / amax : 0.0f;
  const float e[4] = {v.x, v.y, v.z, v.w};
  u32 word = 0;
  int s = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int q = inv > 0.0f ? (int)rintf(e[j] * inv) : 0;
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    s += q;
    word |= ((u32)q & 0xffu) << (8 * j);
  }
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);  // over 16 elements
  if (ok) {
    XQ[at >> 2] = word;
    if ((threadIdx.x & 3) == 0) {
      float2 f;
      f.x = bad ? amax - amax : amax / 127.0f;
      f.y = f.x * (float)s;
      XS[at >> 4] = f;
    }
  }
}

// ---------------------------------------------------------------- one work item per format
// A work item is 16 bytes of a block's quants (32 weights of a K-quant, 16 of
// Q8_0) and the x they meet. A thread always takes the same item k of its blocks
// (threads per row is a multiple of IPB), so the item's geometry is loop-invariant.
// load() issues the item's loads; dot() adds its products to acc[t], t < T.
struct GgX {
  const u8* q;       // token t's n values at q + t * ld (int8)
  const float2* s;   // their scales at s + (t * ld) / 16
  int n, T;
  i64 ld;            // values per token row of x (n, or heads * n)
};

// 16 quantized x at element e of token t, and their {dx, dx * sum q}.
__device__ __forceinline__ uint4 gx_q(const GgX& X, int t, int e) { return ld16(X.q + (i64)t * X.ld + e); }
__device__ __forceinline__ float2 gx_s(const GgX& X, int t, int e) { return __ldg(X.s + ((i64)t * X.ld + e) / 16); }

__device__ __forceinline__ int dot16(uint4 w, uint4 x) {
  return dp4a_ss(w.w, x.w, dp4a_ss(w.z, x.z, dp4a_ss(w.y, x.y, dp4a_ss(w.x, x.x, 0))));
}

// Q8_0: item h = 16 bytes at 2 + 16h (2-byte aligned: a window of two granules).
struct GgQ8_0 {
  static constexpr int IPB = 2, BYTES = 34, WEIGHTS = 32;
  struct Raw {
    Win16 q;
    u32 d;
  };
  static __device__ __forceinline__ void load(const u8* blk, int h, Raw& r) {
    r.q = ld_win16(blk + 2 + 16 * h);
    r.d = __ldg(reinterpret_cast<const u16*>(blk));
  }
  template <int NT>
  static __device__ __forceinline__ void dot(const Raw& r, int h, int b, const GgX& X, float* acc) {
    const uint4 q = win16(r.q);
    const float d = half_to_float(r.d);
    const int e = 32 * b + 16 * h;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= X.T) break;
      acc[t] = fmaf(d * gx_s(X, t, e).x, (float)dot16(q, gx_q(X, t, e)), acc[t]);
    }
  }
};

// Q4_K / Q5_K: item k = qs bytes 16k..16k+15 (aligned: 144 and 176 are multiples
// of 16): their low nibbles are elements l0..l0+15 of chunk c0 = 2(k/2), their
// high nibbles the same of chunk c0 + 1, l0 = 16(k%2). Q5_K's fifth bits: qh
// bytes l0.., bit c. The header (d, dmin, 12 scale bytes) is one 16-byte load
// that the block's eight lanes share.
template <bool Q5>
struct GgQ45K {
  static constexpr int IPB = 8, BYTES = Q5 ? 176 : 144, WEIGHTS = 256;
  struct Raw {
    uint4 hd, qh, qs;
  };
  static __device__ __forceinline__ void load(const u8* blk, int k, Raw& r) {
    r.hd = ld16(blk);
    r.qh = Q5 ? ld16(blk + 16 + 16 * (k & 1)) : r.hd;
    r.qs = ld16(blk + (Q5 ? 48 : 16) + 16 * k);
  }
  template <int NT>
  static __device__ __forceinline__ void dot(const Raw& r, int k, int b, const GgX& X, float* acc) {
    const int c0 = k & 6, h = k & 1;
    int sc0, m0, sc1, m1;
    k4_scale_min_pair(r.hd.y, r.hd.z, r.hd.w, c0, &sc0, &m0, &sc1, &m1);
    const float d = half_to_float(r.hd.x & 0xffffu), dmin = half_to_float(r.hd.x >> 16);
    const float ds0 = d * (float)sc0, dm0 = dmin * (float)m0, ds1 = d * (float)sc1, dm1 = dmin * (float)m1;
    const u32 qs[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w}, qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
    u32 l[4], u[4];  // chunk c0's and chunk c0 + 1's quants, a byte each
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      l[i] = qs[i] & 0x0f0f0f0fu;
      u[i] = (qs[i] >> 4) & 0x0f0f0f0fu;
      if (Q5) {
        l[i] |= ((qh[i] >> c0) & 0x01010101u) << 4;
        u[i] |= ((qh[i] >> (c0 + 1)) & 0x01010101u) << 4;
      }
    }
    const uint4 lo = {l[0], l[1], l[2], l[3]}, hi = {u[0], u[1], u[2], u[3]};
    const int e0 = 256 * b + 32 * c0 + 16 * h, e1 = e0 + 32;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= X.T) break;
      const float2 s0 = gx_s(X, t, e0), s1 = gx_s(X, t, e1);
      const int i0 = dot16(lo, gx_q(X, t, e0)), i1 = dot16(hi, gx_q(X, t, e1));
      float a = fmaf(ds0 * s0.x, (float)i0, -dm0 * s0.y);
      a = fmaf(ds1 * s1.x, (float)i1, a);
      acc[t] += a - dm1 * s1.y;
    }
  }
};

// Q6_K: item v = ql bytes 16v..16v+15 of half g = v/4: with w = v%4, s = w/2,
// l0 = 16(w%2), its low nibbles are elements l0.. of chunk c = 4g + s, its high
// nibbles those of chunk c + 2; the two high bits: qh bytes 32g + l0.., bits 2s
// and 2s + 4. Blocks of 210 bytes are only 2-byte aligned: windows of two granules.
struct GgQ6K {
  static constexpr int IPB = 8, BYTES = 210, WEIGHTS = 256;
  struct Raw {
    Win16 ql, qh;
    u32 d, sc;  // sc: the two int8 scales, chunk c's in byte 0, chunk c + 2's in byte 1
  };
  static __device__ __forceinline__ void load(const u8* blk, int v, Raw& r) {
    const int g = v >> 2, s = (v >> 1) & 1, l16 = v & 1;
    r.ql = ld_win16(blk + 16 * v);
    r.qh = ld_win16(blk + 128 + 32 * g + 16 * l16);
    const u8* sc = blk + 192 + 2 * (4 * g + s) + l16;
    r.sc = (u32)__ldg(sc) | ((u32)__ldg(sc + 4) << 8);
    r.d = __ldg(reinterpret_cast<const u16*>(blk + 208));
  }
  template <int NT>
  static __device__ __forceinline__ void dot(const Raw& r, int v, int b, const GgX& X, float* acc) {
    const int g = v >> 2, s = (v >> 1) & 1, l16 = v & 1;
    const uint4 ql = win16(r.ql), qh = win16(r.qh);
    const float d = half_to_float(r.d);
    const float d0 = d * (float)(signed char)(r.sc & 0xffu), d1 = d * (float)(signed char)(r.sc >> 8);
    const u32 qlw[4] = {ql.x, ql.y, ql.z, ql.w}, qhw[4] = {qh.x, qh.y, qh.z, qh.w};
    u32 l[4], u[4];  // chunk c's and chunk c + 2's quants less 32, a signed byte each
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      l[i] = (qlw[i] & 0x0f0f0f0fu) | (((qhw[i] >> (2 * s)) & 0x03030303u) << 4);
      u[i] = ((qlw[i] >> 4) & 0x0f0f0f0fu) | (((qhw[i] >> (2 * s + 4)) & 0x03030303u) << 4);
      l[i] = ((l[i] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;  // q - 32 in each byte, no borrows
      u[i] = ((u[i] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    }
    const uint4 lo = {l[0], l[1], l[2], l[3]}, hi = {u[0], u[1], u[2], u[3]};
    const int e0 = 256 * b + 32 * (4 * g + s) + 16 * l16, e1 = e0 + 64;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= X.T) break;
      const float a = d0 * gx_s(X, t, e0).x * (float)dot16(lo, gx_q(X, t, e0));
      acc[t] += fmaf(d1 * gx_s(X, t, e1).x, (float)dot16(hi, gx_q(X, t, e1)), a);
    }
  }
};

// A row's items lr, lr + tpr, ... : GG_UNROLL items' loads in flight before their math.
template <class F, int NT>
__device__ __forceinline__ void gg_row(const u8* __restrict__ wrow, int nb, int lr, int tpr, const GgX& X,
                                       float* acc) {
  const int items = nb * F::IPB, k = lr % F::IPB;
  for (int i0 = lr; i0 < items; i0 += tpr * GG_UNROLL) {
    typename F::Raw raw[GG_UNROLL];
#pragma unroll
    for (int u = 0; u < GG_UNROLL; ++u) {
      const int it = i0 + u * tpr;
      if (it < items) F::load(wrow + (i64)(it / F::IPB) * F::BYTES, k, raw[u]);
    }
#pragma unroll
    for (int u = 0; u < GG_UNROLL; ++u) {
      const int it = i0 + u * tpr;
      if (it < items) F::template dot<NT>(raw[u], k, it / F::IPB, X, acc);
    }
  }
}

// y[t, h, row] = W[h, row] . x[t, h] for t < T <= NT and H heads (H = 1: one
// matrix; H > 1: MLA's per-head stacks, each head its own matrix and its own
// slice of x). W: [H, R, rb] bytes of format F (16-byte aligned; n a whole number
// of blocks); XQ, XS: x [T, H * n] from ggml_quant_x; y [T, H, R]. tpr threads
// per row (a power of two, 8..256): a CTA takes 256/tpr consecutive rows of head
// blockIdx.y, a row's threads split its items and reduce by shuffles, then
// through shared memory when tpr > 32.
template <class F, int NT>
__device__ __forceinline__ void gg_gemv(const u8* __restrict__ W, int rb, int n, int R, const u8* __restrict__ XQ,
                                        const float2* __restrict__ XS, int T, float* __restrict__ y, int tpr, int H) {
  const int tid = threadIdx.x, lane = tid & 31, lr = tid & (tpr - 1);
  const int row = blockIdx.x * (256 / tpr) + tid / tpr, h = blockIdx.y;
  const i64 yld = (i64)H * R;  // outputs per token
  W += (i64)h * R * rb;
  y += (i64)h * R;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if (row < R) {  // no return: every thread reaches the shuffles and the barrier below
    const GgX X{XQ + (i64)h * n, XS + (i64)h * n / 16, n, T, (i64)H * n};
    gg_row<F, NT>(W + (i64)row * rb, n / F::WEIGHTS, lr, tpr, X, acc);
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= T) break;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      if (o < tpr) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  }
  if (tpr <= 32) {
    if (lr == 0 && row < R) {
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < T) y[(i64)t * yld + row] = acc[t];
    }
    return;
  }
  __shared__ float part[8][NT];  // [warp][t]
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t) part[tid >> 5][t] = acc[t];
  }
  __syncthreads();
  if (lr < T && row < R) {  // thread t of the row sums token t over the row's warps
    const int w0 = (tid - lr) >> 5;
    float v = 0.0f;
    for (int w = 0; w < tpr / 32; ++w) v += part[w0 + w][lr];
    y[(i64)lr * yld + row] = v;
  }
}

// Entry points ggml_gemv_<format>_t<NT>, NT in 1, 2, 4, 8 (registers grow with
// NT, so few tokens keep more threads resident); all take
// (W, rb, n, R, XQ, XS, T, y, tpr, H). grid (ceil(R / (256 / tpr)), H), block 256.
#define GG_FORMATS(X) X(q8_0, GgQ8_0) X(q4_k, GgQ45K<false>) X(q5_k, GgQ45K<true>) X(q6_k, GgQ6K)
#define GG_ENTRY(fmt, F, NT)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) ggml_gemv_##fmt##_t##NT(                                     \
      const u8* __restrict__ W, int rb, int n, int R, const u8* __restrict__ XQ, const float2* __restrict__ XS, \
      int T, float* __restrict__ y, int tpr, int H) {                                                           \
    gg_gemv<F, NT>(W, rb, n, R, XQ, XS, T, y, tpr, H);                                                          \
  }
#define GG_ENTRIES(fmt, F) GG_ENTRY(fmt, F, 1) GG_ENTRY(fmt, F, 2) GG_ENTRY(fmt, F, 4) GG_ENTRY(fmt, F, 8)
GG_FORMATS(GG_ENTRIES)

// W [R, rb] of type `type` -> bf16 [R, n]. One thread per 32-weight chunk.
// grid (ceil(R * n/32 / 256)), block 256.
extern "C" __global__ void __launch_bounds__(256) ggml_dequant_bf16(int type, const u8* __restrict__ W, int rb, int n,
                                                                    int R, u16* __restrict__ out) {
  const int nchunks = n / 32;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)R * nchunks) return;
  const int row = (int)(idx / nchunks), ch = (int)(idx % nchunks);
  const int bb = ggml_block_bytes(type), cpb = ggml_chunks_per_block(type);
  float w[32];
  ggml_chunk(type, W + (i64)row * rb + (i64)(ch / cpb) * bb, ch % cpb, w);
  u16* o = out + (i64)row * n + ch * 32;
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = float_to_bf16(w[i]);
}
