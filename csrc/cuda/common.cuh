// Shared helpers for the CUDA kernels. No system headers: every .cu file here
// compiles with nvcc and with NVRTC alike (NVRTC has no standard library), and
// the per-block math is __host__ __device__ so a host harness can check it
// against the numpy oracles on a machine without a GPU.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef short i16;
typedef long long i64;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define RMOE_HD __host__ __device__ __forceinline__
#else
#define RMOE_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define RMOE_DEVICE_PATH 1
#else
#define RMOE_DEVICE_PATH 0
#endif

namespace rmoe_cuda {

RMOE_HD u32 ld_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
RMOE_HD u32 ld_u32(const u8* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

// max that keeps a NaN (fmaxf drops one): an activation block's maximum, so that a NaN
// activation makes its block's scale NaN on the GPU as on the CPU (q8_block_*).
RMOE_HD float max_keep_nan(float a, float b) { return a != a || b != b ? a + b : fmaxf(a, b); }

// float <-> bits, each way on the device by its intrinsic, on the host by a union (the
// two are the same shape on purpose).
RMOE_HD float bits_to_float(u32 b) {
#if RMOE_DEVICE_PATH
  return __uint_as_float(b);
#else
  union { u32 u; float f; } v;
  v.u = b;
  return v.f;
#endif
}

RMOE_HD u32 float_to_bits(float f) {
#if RMOE_DEVICE_PATH
  return __float_as_uint(f);
#else
  union { u32 u; float f; } v;
  v.f = f;
  return v.u;
#endif
}

// IEEE half bits -> float, exact (as numpy's float16 -> float32).
RMOE_HD float half_to_float(u32 h) {
#if RMOE_DEVICE_PATH
  float f;
  unsigned short hs = (unsigned short)h;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
  return f;
#else
  const u32 sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_to_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return bits_to_float(sign | ((em + ((127u - 15u) << 10)) << 13));
  const float f = (float)em * 5.9604644775390625e-08f;  // subnormal: em * 2^-24
  return bits_to_float(float_to_bits(f) | sign);
#endif
}

// float -> bfloat16 bits, round to nearest even (NaN kept a NaN).
RMOE_HD u16 float_to_bf16(float f) {
  const u32 b = float_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40);
  return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// PRMT: byte s_i (0..7) of {b:a} into byte i of the result.
RMOE_HD u32 byte_perm(u32 a, u32 b, u32 s) {
#if RMOE_DEVICE_PATH
  return __byte_perm(a, b, s);
#else
  u32 r = 0;
  for (int i = 0; i < 4; ++i) {
    const u32 k = (s >> (4 * i)) & 7u;
    const u32 byte = k < 4 ? (a >> (8 * k)) & 0xffu : (b >> (8 * (k - 4))) & 0xffu;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

// c + a.lo16*b.byte0 + a.hi16*b.byte1 (a: two signed 16-bit, b: unsigned bytes).
RMOE_HD int dp2a_lo_su(u32 a, u32 b, int c) {
#if RMOE_DEVICE_PATH
  int d;
  asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return c + (int)(i16)(a & 0xffffu) * (int)(b & 0xffu) + (int)(i16)(a >> 16) * (int)((b >> 8) & 0xffu);
#endif
}

// c + a.lo16*b.byte2 + a.hi16*b.byte3.
RMOE_HD int dp2a_hi_su(u32 a, u32 b, int c) {
#if RMOE_DEVICE_PATH
  int d;
  asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return c + (int)(i16)(a & 0xffffu) * (int)((b >> 16) & 0xffu) + (int)(i16)(a >> 16) * (int)(b >> 24);
#endif
}

// c + the dot product of the four signed bytes of a with those of b.
RMOE_HD int dp4a_ss(u32 a, u32 b, int c) {
#if RMOE_DEVICE_PATH
  return __dp4a((int)a, (int)b, c);
#else
  for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
  return c;
#endif
}

}  // namespace rmoe_cuda

#if RMOE_DEVICE_PATH || defined(RMOE_EMULATE)  // dev/emu.h runs the kernels on the CPU
namespace rmoe_cuda {
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }
__device__ __forceinline__ float warp_max(float v) {  // NaN kept
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max_keep_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 16 bytes at p, which must be 16-byte aligned (one vector load through the read-only path).
__device__ __forceinline__ uint4 ld16(const u8* p) {
#ifdef RMOE_EMULATE
  emu_check_aligned(p, 16);
#endif
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// The aligned 16-byte granules around 16 bytes at a 2-byte aligned p: two vector
// loads (one when p is aligned) that consecutive lanes share, put back in order
// by win16. The second granule holds at least one of the 16 bytes, so it lies in
// the same allocation.
struct Win16 {
  uint4 a, b;
  u32 s;  // p's offset in the first granule (even)
};
__device__ __forceinline__ Win16 ld_win16(const u8* p) {
#ifdef RMOE_EMULATE
  emu_check_aligned(p, 2);
#endif
  Win16 w;
  w.s = (u32)((unsigned long long)p & 15u);
  const u8* g = p - w.s;
  w.a = ld16(g);
  w.b = w.a;
  if (w.s) w.b = ld16(g + 16);
  return w;
}
__device__ __forceinline__ uint4 win16(const Win16& w) {
  u32 v0 = w.a.x, v1 = w.a.y, v2 = w.a.z, v3 = w.a.w, v4 = w.b.x, v5 = w.b.y, v6 = w.b.z, v7 = w.b.w;
  if (w.s & 8) {  // selects, not branches: s differs from lane to lane
    v0 = v2; v1 = v3; v2 = v4; v3 = v5; v4 = v6; v5 = v7;
  }
  if (w.s & 4) {
    v0 = v1; v1 = v2; v2 = v3; v3 = v4; v4 = v5;
  }
  const u32 sel = (w.s & 2) ? 0x5432u : 0x3210u;
  uint4 r;
  r.x = byte_perm(v0, v1, sel); r.y = byte_perm(v1, v2, sel); r.z = byte_perm(v2, v3, sel); r.w = byte_perm(v3, v4, sel);
  return r;
}
}  // namespace rmoe_cuda
#endif
