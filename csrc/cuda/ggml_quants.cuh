// GGUF block types kept in their source format on the GPU (non-expert weights):
// Q8_0, Q4_K, Q5_K, Q6_K. Layouts as drawn in csrc/cpu/ggml/ggml_blocks.h; the math
// follows gguf-py's dequantizer (products rounded before the subtraction).
// The unit of work is a chunk of 32 weights: a Q8_0 block, or 1/8 of a K-quant
// super-block (e = 32c + l).
#pragma once
#include "common.cuh"

namespace rmoe_cuda {

enum GgmlType : int { T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };

RMOE_HD int ggml_block_bytes(int t) {
  return t == T_Q8_0 ? 34 : t == T_Q4_K ? 144 : t == T_Q5_K ? 176 : t == T_Q6_K ? 210 : 0;
}
RMOE_HD int ggml_chunks_per_block(int t) { return t == T_Q8_0 ? 1 : 8; }

// a * b rounded on its own (never fused into a following add), as the reference.
RMOE_HD float mul_rn(float a, float b) {
#if RMOE_DEVICE_PATH
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

RMOE_HD void k4_scale_min(const u8* s, int b, int* sc, int* mn) {
  if (b < 4) {
    *sc = s[b] & 63;
    *mn = s[b + 4] & 63;
  } else {
    *sc = (s[b + 4] & 15) | ((s[b - 4] >> 6) << 4);
    *mn = (s[b + 4] >> 4) | ((s[b] >> 6) << 4);
  }
}

// k4_scale_min for chunks c and c + 1 (c even) at once, from the 12 scale bytes
// as little-endian words s0 (bytes 0..3), s1, s2: the four chunks of a half
// decode with a few word operations.
RMOE_HD void k4_scale_min_pair(u32 s0, u32 s1, u32 s2, int c, int* sc0, int* mn0, int* sc1, int* mn1) {
  const u32 sc = c < 4 ? s0 & 0x3f3f3f3fu : (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
  const u32 mn = c < 4 ? s1 & 0x3f3f3f3fu : ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
  const int sh = 8 * (c & 3);
  *sc0 = (int)((sc >> sh) & 0xffu);
  *sc1 = (int)((sc >> (sh + 8)) & 0xffu);
  *mn0 = (int)((mn >> sh) & 0xffu);
  *mn1 = (int)((mn >> (sh + 8)) & 0xffu);
}

// Chunk c of the block at blk -> out[32].
RMOE_HD void ggml_chunk(int t, const u8* blk, int c, float* out) {
  if (t == T_Q8_0) {
    const float d = half_to_float(ld_u16(blk));
    for (int i = 0; i < 32; ++i) out[i] = (float)(signed char)blk[2 + i] * d;
  } else if (t == T_Q4_K || t == T_Q5_K) {
    const float d = half_to_float(ld_u16(blk)), dmin = half_to_float(ld_u16(blk + 2));
    int s6, m6;
    k4_scale_min(blk + 4, c, &s6, &m6);
    const float ds = d * (float)s6, dm = dmin * (float)m6;
    const int j = c >> 1, u = c & 1;
    const u8* qs = blk + (t == T_Q4_K ? 16 : 48) + 32 * j;
    const u8* qh = blk + 16;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> (4 * u)) & 15;
      if (t == T_Q5_K) q |= ((qh[l] >> c) & 1) << 4;
      out[l] = mul_rn(ds, (float)q) - dm;
    }
  } else if (t == T_Q6_K) {
    const float d = half_to_float(ld_u16(blk + 208));
    const int h = c >> 2, s = c & 3;
    const u8* ql = blk + 64 * h + 32 * (s & 1);
    const u8* qh = blk + 128 + 32 * h;
    const signed char* sc = reinterpret_cast<const signed char*>(blk + 192);
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] >> (4 * (s >> 1))) & 15, hi = (qh[l] >> (2 * s)) & 3;
      out[l] = mul_rn(d, (float)sc[2 * c + (l >> 4)]) * (float)((lo | (hi << 4)) - 32);
    }
  } else {
    for (int l = 0; l < 32; ++l) out[l] = 0.0f;
  }
}

}  // namespace rmoe_cuda
