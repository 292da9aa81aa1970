// W_Q kernels: activation prep, dequantize-GEMV batched over the selected
// experts of a layer (one launch per projection, gate and up fused with an
// optional SwiGLU epilogue), and dequantize-to-bf16 for the prefill GEMMs.
// Formats and the integer dot: resplit_wq.cuh. Launch shapes: engine/gpu/cuda_kernels.py.
#include "resplit_wq.cuh"

using namespace rmoe_cuda;

// x [N, ldx] (first n columns used, zero-padded to nb*32) ->
// Z [N, 4, nb] uint4 (words 4g..4g+3 of block b at Z[(row*4+g)*nb + b]), SF [N, nb] (s, sum q).
// grid (ceil(nb/8), N), block 256: one warp per 32-block.
extern "C" __global__ void __launch_bounds__(256) wq_prep(const float* __restrict__ x, int n, int ldx, int nb,
                                                          uint4* __restrict__ Z, float2* __restrict__ SF) {
  const int lane = threadIdx.x & 31, b = blockIdx.x * 8 + (threadIdx.x >> 5), row = blockIdx.y;
  if (b >= nb) return;  // uniform per warp
  const int col = b * 32 + lane;
  const float v = col < n ? x[(i64)row * ldx + col] : 0.0f;
  // NaN or inf if any v is: then q = 0 and the block's scale NaN, so all it multiplies is NaN (as on the CPU)
  const float amax = warp_max(fabsf(v));
  const bool bad = !(amax <= 3.402823466e38f);
  const float inv = !bad && amax > 0.0f ? WQ_QMAX / amax : 0.0f;
  int q = inv > 0.0f ? (int)rintf(v * inv) : 0;
  q = q > 8191 ? 8191 : (q < -8191 ? -8191 : q);
  int S = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(0xffffffffu, S, o);
  int a0, b0, a1, b1;
  wq_word_src(lane & 15, &a0, &b0, &a1, &b1);
  const int qa0 = __shfl_sync(0xffffffffu, q, a0), qb0 = __shfl_sync(0xffffffffu, q, b0 < 0 ? 0 : b0);
  const int qa1 = __shfl_sync(0xffffffffu, q, a1), qb1 = __shfl_sync(0xffffffffu, q, b1 < 0 ? 0 : b1);
  const u32 word = wq_pack_word(qa0 - (b0 >= 0 ? 3 * qb0 : 0), qa1 - (b1 >= 0 ? 3 * qb1 : 0));
  const u32 w1 = __shfl_down_sync(0xffffffffu, word, 1), w2 = __shfl_down_sync(0xffffffffu, word, 2),
            w3 = __shfl_down_sync(0xffffffffu, word, 3);
  if (lane < 16 && (lane & 3) == 0) {
    uint4 o;
    o.x = word; o.y = w1; o.z = w2; o.w = w3;
    Z[((i64)row * 4 + (lane >> 2)) * nb + b] = o;
  }
  if (lane == 0) {
    float2 f;
    f.x = bad ? amax - amax : amax / WQ_QMAX;  // NaN for inf and NaN alike
    f.y = (float)S;
    SF[(i64)row * nb + b] = f;
  }
}

__device__ __forceinline__ void load_z(const uint4* __restrict__ z, int nb, int b, u32* zw) {
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const uint4 v = __ldg(z + (i64)g * nb + b);
    zw[4 * g] = v.x; zw[4 * g + 1] = v.y; zw[4 * g + 2] = v.z; zw[4 * g + 3] = v.w;
  }
}

__device__ __forceinline__ float wq_block_dot(uint2 w, const u32* zw, float2 f) {
  return (float)(wq_block_idot(w.x, w.y, zw) - (int)f.y) * (f.x * wq_scale(w.y));
}

// Bodies templated on rows per warp (RPW); the extern "C" entry points below
// instantiate the default and the variants the device check times.

// Gate and up of the selected experts at once. Slot s uses expert (cache position)
// eid[s] on prep row xrow[s]. W*: [C, F, rb] bytes, expert stride estride bytes.
// mode 0: out0 = g [S, F], out1 = u [S, F];  mode 1: out0 = silu(g) * u [S, F].
// grid (ceil(F / (8*RPW)), S), block 256: each warp RPW rows, each a gate and an up dot.
template <int RPW>
__device__ __forceinline__ void gate_up_body(const u8* __restrict__ Wg, const u8* __restrict__ Wu, i64 estride, int rb,
                                             const int* __restrict__ eid, const int* __restrict__ xrow,
                                             const uint4* __restrict__ Z, const float2* __restrict__ SF, int nb, int F,
                                             int mode, float* __restrict__ out0, float* __restrict__ out1) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, s = blockIdx.y;
  const int row0 = (blockIdx.x * 8 + warp) * RPW;
  if (row0 >= F) return;
  const i64 e = eid[s];
  const int xr = xrow[s];
  const uint4* z = Z + (i64)xr * 4 * nb;
  const float2* sf = SF + (i64)xr * nb;
  const u8* g[RPW];
  const u8* u[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int row = min(row0 + r, F - 1);  // a missing last row re-reads one, never writes
    g[r] = Wg + e * estride + (i64)row * rb;
    u[r] = Wu + e * estride + (i64)row * rb;
  }
  float ag[RPW], au[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) ag[r] = au[r] = 0.0f;
  for (int b = lane; b < nb; b += 32) {
    uint2 wg[RPW], wu[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {  // all weight loads first: several in flight
      wg[r] = __ldg(reinterpret_cast<const uint2*>(g[r]) + b);
      wu[r] = __ldg(reinterpret_cast<const uint2*>(u[r]) + b);
    }
    u32 zw[16];
    load_z(z, nb, b, zw);
    const float2 f = __ldg(sf + b);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      ag[r] += wq_block_dot(wg[r], zw, f);
      au[r] += wq_block_dot(wu[r], zw, f);
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const float gs = warp_sum(ag[r]), us = warp_sum(au[r]);
    const int row = row0 + r;
    if (lane == 0 && row < F) {
      if (mode == 1) {
        out0[(i64)s * F + row] = silu(gs) * us;
      } else {
        out0[(i64)s * F + row] = gs;
        out1[(i64)s * F + row] = us;
      }
    }
  }
}

// One projection of the selected experts: y[s, o] = scale[s] * (W[eid[s]] . x[xrow[s]])[o].
// W: [C, R, rb] bytes; scale may be null (1). grid (ceil(R / (8*RPW)), S), block 256.
template <int RPW>
__device__ __forceinline__ void gemv_body(const u8* __restrict__ W, i64 estride, int rb, const int* __restrict__ eid,
                                          const int* __restrict__ xrow, const uint4* __restrict__ Z,
                                          const float2* __restrict__ SF, int nb, int R, const float* __restrict__ scale,
                                          float* __restrict__ y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, s = blockIdx.y;
  const int row0 = (blockIdx.x * 8 + warp) * RPW;
  if (row0 >= R) return;
  const i64 e = eid[s];
  const int xr = xrow[s];
  const uint4* z = Z + (i64)xr * 4 * nb;
  const float2* sf = SF + (i64)xr * nb;
  const u8* w[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) w[r] = W + e * estride + (i64)min(row0 + r, R - 1) * rb;
  float acc[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) acc[r] = 0.0f;
  for (int b = lane; b < nb; b += 32) {
    uint2 wv[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) wv[r] = __ldg(reinterpret_cast<const uint2*>(w[r]) + b);
    u32 zw[16];
    load_z(z, nb, b, zw);
    const float2 f = __ldg(sf + b);
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[r] += wq_block_dot(wv[r], zw, f);
  }
  const float sc = scale ? scale[s] : 1.0f;
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < R) y[(i64)s * R + row0 + r] = sc * v;
  }
}

#define RMOE_GATE_UP(name, rpw)                                                                              \
  extern "C" __global__ void __launch_bounds__(256) name(                                                    \
      const u8* __restrict__ Wg, const u8* __restrict__ Wu, i64 estride, int rb, const int* __restrict__ eid, \
      const int* __restrict__ xrow, const uint4* __restrict__ Z, const float2* __restrict__ SF, int nb, int F, \
      int mode, float* __restrict__ out0, float* __restrict__ out1) {                                         \
    gate_up_body<rpw>(Wg, Wu, estride, rb, eid, xrow, Z, SF, nb, F, mode, out0, out1);                       \
  }
#define RMOE_GEMV(name, rpw)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) name(                                                    \
      const u8* __restrict__ W, i64 estride, int rb, const int* __restrict__ eid, const int* __restrict__ xrow, \
      const uint4* __restrict__ Z, const float2* __restrict__ SF, int nb, int R, const float* __restrict__ scale, \
      float* __restrict__ y) {                                                                                \
    gemv_body<rpw>(W, estride, rb, eid, xrow, Z, SF, nb, R, scale, y);                                         \
  }
RMOE_GATE_UP(wq_gemv_gate_up, 2)
RMOE_GATE_UP(wq_gemv_gate_up_r1, 1)
RMOE_GATE_UP(wq_gemv_gate_up_r4, 4)
RMOE_GEMV(wq_gemv, 4)
RMOE_GEMV(wq_gemv_r2, 2)
RMOE_GEMV(wq_gemv_r8, 8)

// W[eid[s]] -> bf16 [S, R, n] (prefill: the GEMMs then run on tensor cores).
// One thread per (row, 32-block). grid (ceil(R*nb / 256), S), block 256.
extern "C" __global__ void __launch_bounds__(256) wq_dequant_bf16(const u8* __restrict__ W, i64 estride, int rb,
                                                                   const int* __restrict__ eid, int n, int R,
                                                                   u16* __restrict__ out) {
  const int nb = rb / WQ_BYTES;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)R * nb) return;
  const int s = blockIdx.y, row = (int)(idx / nb), b = (int)(idx % nb);
  const u8* blk = W + (i64)eid[s] * estride + (i64)row * rb + b * WQ_BYTES;
  const float dq = wq_scale(ld_u32(blk + 4));
  u16* o = out + ((i64)s * R + row) * n + b * 32;
  const int lim = min(32, n - b * 32);
  for (int e = 0; e < lim; ++e) o[e] = float_to_bf16(wq_weight(blk, e, dq));
}
