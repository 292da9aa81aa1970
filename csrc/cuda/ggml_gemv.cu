// Non-expert weights in their GGUF types (Q8_0, Q4_K, Q5_K, Q6_K): a
// dequantize-GEMV for decode (up to GG_TMAX tokens per weight read) and a
// dequantize-to-bf16 for prefill GEMMs. Block math: ggml_quants.cuh.
#include "ggml_quants.cuh"

using namespace rmoe_cuda;

#define GG_TMAX 8

// y[t, row] = W[row] . x[t] for t < T (T <= GG_TMAX). W: [R, rb] bytes of type `type`,
// x [T, n] float32 (n a whole number of blocks), y [T, R]. One warp per row.
// grid (ceil(R / 8)), block 256.
extern "C" __global__ void __launch_bounds__(256) ggml_gemv(int type, const u8* __restrict__ W, int rb, int n, int R,
                                                            const float* __restrict__ x, int T,
                                                            float* __restrict__ y) {
  const int lane = threadIdx.x & 31, row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= R) return;
  const int bb = ggml_block_bytes(type), cpb = ggml_chunks_per_block(type);
  const int nchunks = n / 32;
  const u8* wrow = W + (i64)row * rb;
  float acc[GG_TMAX];
#pragma unroll
  for (int t = 0; t < GG_TMAX; ++t) acc[t] = 0.0f;
  for (int ch = lane; ch < nchunks; ch += 32) {
    float w[32];
    ggml_chunk(type, wrow + (i64)(ch / cpb) * bb, ch % cpb, w);
#pragma unroll
    for (int t = 0; t < GG_TMAX; ++t) {
      if (t >= T) break;
      const float4* xv = reinterpret_cast<const float4*>(x + (i64)t * n + ch * 32);
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 v = __ldg(xv + i);
        a += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
      }
      acc[t] += a;
    }
  }
#pragma unroll
  for (int t = 0; t < GG_TMAX; ++t) {
    if (t >= T) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) y[(i64)t * R + row] = v;
  }
}

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
