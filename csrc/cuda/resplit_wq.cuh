// W_Q (engine/quant/resplit_oracle.py, csrc/cpu/resplit/resplit.h) on the GPU: the
// per-block math, shared by the kernels and by the host harness that checks it.
//
// Activations are prepared once per row of x (wq_prep): per 32-block, x is
// quantized to q = rint(x / s), s = amax / 8191, and rearranged into 16 words
// of two int16 each so that the block's base-3 bytes never need a digit loop:
//
//   digit i of byte b is d_i = H_{i+1} - 3 H_i with H_m = (b * 3^m) >> 8
//   (b * 3^5 < 2^16, so H_m is byte 1 of a 16-bit lane of one IMAD), hence
//   sum_i d_i q_{6i+j} = sum_{m=1..5} H_m(b_j) z_{m,j},
//   z_{m,j} = q_{6(m-1)+j} - 3 q_{6m+j} (m < 5),  z_{5,j} = q_{24+j}
//   (|z| <= 4 * 8191 fits int16). Byte 6's two trits (weights 30, 31):
//   H'_1 (q30 - 3 q31) + H'_2 q31.
//
//   word 3(m-1)+p = [z_{m,2p} | z_{m,2p+1} << 16]   (m = 1..5, p = 0..2)
//   word 15       = [q30 - 3 q31 | q31 << 16]
//
// Each 4 weights then cost 2 IMAD, 1 PRMT and 2 DP2A, exact in integers:
// block dot = dq * s * (sum d q - sum q), since t = d - 1.
#pragma once
#include "common.cuh"

namespace rmoe_cuda {

constexpr int WQ_BLOCK = 32, WQ_BYTES = 8, WQ_PREP_WORDS = 16;
constexpr float WQ_QMAX = 8191.0f;

// Sources of word w: z = q[a0] - 3 q[b0] (low half), q[a1] - 3 q[b1] (high half); b < 0: none.
RMOE_HD void wq_word_src(int w, int* a0, int* b0, int* a1, int* b1) {
  if (w == 15) {
    *a0 = 30; *b0 = 31; *a1 = 31; *b1 = -1;
    return;
  }
  const int m = w / 3 + 1, j = 2 * (w % 3);
  *a0 = 6 * (m - 1) + j;
  *a1 = *a0 + 1;
  *b0 = m < 5 ? 6 * m + j : -1;
  *b1 = m < 5 ? *b0 + 1 : -1;
}

RMOE_HD u32 wq_pack_word(int lo, int hi) { return ((u32)lo & 0xffffu) | ((u32)hi << 16); }

// Block scale dq from bytes 4..7 of a block (w1): 12-bit code = float16 bits 14:3.
RMOE_HD float wq_scale(u32 w1) {
  const u32 code = ((w1 >> 16) & 0xfu) | ((w1 >> 24) << 4);
  return half_to_float(code << 3);
}

// sum_i d_i * q_i over one block (d the base-3 digit, 0..2): w0 = bytes 0..3, w1 = bytes 4..7.
RMOE_HD int wq_block_idot(u32 w0, u32 w1, const u32* z /*[16]*/) {
  const u32 A = byte_perm(w0, 0, 0x4240);  // [b0, b2] as 16-bit lanes
  const u32 B = byte_perm(w0, 0, 0x4341);  // [b1, b3]
  const u32 C = byte_perm(w1, 0, 0x4140);  // [b4, b5]
  const u32 D = ((w1 >> 16) & 0xf0u) * (3u + (9u << 16));  // b6's trits: H'_1 in byte 1, H'_2 in byte 3
  int acc = 0;
  u32 pm = 3;
#pragma unroll
  for (int m = 1; m <= 5; ++m, pm *= 3) {
    const u32 a = A * pm, b = B * pm, c = C * pm;
    const u32 p0 = byte_perm(a, b, 0x7351);                  // [H(b0), H(b1), H(b2), H(b3)]
    const u32 p1 = byte_perm(c, m == 1 ? D : 0u, 0x7531);    // [H(b4), H(b5), H'_1, H'_2]
    acc = dp2a_lo_su(z[3 * (m - 1) + 0], p0, acc);
    acc = dp2a_hi_su(z[3 * (m - 1) + 1], p0, acc);
    acc = dp2a_lo_su(z[3 * (m - 1) + 2], p1, acc);
    if (m == 1) acc = dp2a_hi_su(z[15], p1, acc);
  }
  return acc;
}

// Weight e (0..31) of a block as float: dq * (digit - 1).
RMOE_HD float wq_weight(const u8* blk, int e, float dq) {
  u32 u, nd;
  if (e < 30) {
    u = blk[e % 6];
    nd = e / 6 + 1;
  } else {
    u = blk[6] & 0xf0u;
    nd = e - 29;
  }
  u32 d = 0;
  for (u32 i = 0; i < nd; ++i) {
    u *= 3;
    d = u >> 8;
    u &= 255;
  }
  return dq * (float)((int)d - 1);
}

// Host-side prep of one block (the device does the same per warp): x [32] -> z [16], sf = (s, sum q).
RMOE_HD void wq_prep_block_ref(const float* x, u32* z, float* sf) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = max_keep_nan(amax, fabsf(x[i]));
  const bool bad = !(amax <= 3.402823466e38f);
  const float inv = !bad && amax > 0.0f ? WQ_QMAX / amax : 0.0f;
  int q[32], S = 0;
  for (int i = 0; i < 32; ++i) {
    q[i] = inv > 0.0f ? (int)rintf(x[i] * inv) : 0;
    q[i] = q[i] > 8191 ? 8191 : (q[i] < -8191 ? -8191 : q[i]);
    S += q[i];
  }
  for (int w = 0; w < 16; ++w) {
    int a0, b0, a1, b1;
    wq_word_src(w, &a0, &b0, &a1, &b1);
    const int lo = q[a0] - (b0 >= 0 ? 3 * q[b0] : 0), hi = q[a1] - (b1 >= 0 ? 3 * q[b1] : 0);
    z[w] = wq_pack_word(lo, hi);
  }
  sf[0] = bad ? amax - amax : amax / WQ_QMAX;
  sf[1] = (float)S;
}

}  // namespace rmoe_cuda
