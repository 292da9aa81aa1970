// GGUF's own tensor types: block layouts and a scalar dequantizer per block.
//
// Every quantized type stores a row as consecutive blocks; a block holds
// `block` weights in `bytes` bytes. f16 fields are IEEE half, little endian.
// The scalar functions here are the reference the ISA variants must match bit
// for bit; their float arithmetic follows gguf-py's numpy dequantizer exactly
// (same products, same order, never fused into an FMA), so results are equal,
// not just close.
//
// Everything below has internal linkage on purpose: this header is also
// included by *_avx2.cpp / *_avx512.cpp, and an inline function with external
// linkage compiled there could be picked by the linker for scalar callers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rmoe {
namespace ggml {

// Type ids as in GGUF (gguf-py GGMLQuantizationType).
enum Type : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

struct TypeInfo {
  int block;  // weights per block (1 for the float types)
  int bytes;  // bytes per block
};

// {0, 0} for a type these kernels do not handle.
static inline TypeInfo type_info(int t) {
  switch (t) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case BF16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case Q2_K: return {256, 84};
    case Q3_K: return {256, 110};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: return {0, 0};
  }
}

// Byte offsets of each block's fields (the structs document the layout; the
// kernels read through byte pointers because rows need not be 2-aligned).
//
// Q4_0, 32 weights, 18 bytes        w[j] = d * (q[j] - 8)
//   [d:f16][qs:16 bytes]   qs[i] = q[i+16] << 4 | q[i]      (i < 16)
// Q4_1, 32 weights, 20 bytes        w[j] = d * q[j] + m
//   [d:f16][m:f16][qs:16 bytes]     qs as Q4_0
// Q5_0, 32 weights, 22 bytes        w[j] = d * (q[j] - 16), q 5 bits
//   [d:f16][qh:u32][qs:16 bytes]    q[j] = nibble as Q4_0 | bit j of qh << 4
// Q5_1, 32 weights, 24 bytes        w[j] = d * q[j] + m
//   [d:f16][m:f16][qh:u32][qs:16 bytes]
// Q8_0, 32 weights, 34 bytes        w[j] = d * q[j]
//   [d:f16][q:32 x int8]
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };

// K-quants: 256 weights per super-block, split into sub-blocks of 16 or 32
// with small integer scales that the f16 `d` (and `dmin`) scale again.
//
// Element e of a super-block, written e = 128*h + 32*s + l (h<2, s<4, l<32),
// is how Q2_K, Q3_K and Q6_K interleave their bit planes:
//
// Q2_K, 84 bytes, sub-blocks of 16   w = d*(sc&15) * q - dmin*(sc>>4)
//   [scales:16][qs:64][d:f16][dmin:f16]
//   q(e)  = qs[32h + l] >> 2s & 3            sc = scales[e / 16]
// Q3_K, 110 bytes, sub-blocks of 16  w = d*(sc-32) * q
//   [hmask:32][qs:64][scales:12][d:f16]
//   q(e)  = (qs[32h + l] >> 2s & 3) - (hmask[l] >> (4h+s) & 1 ? 0 : 4)
//   6-bit sc[j]: low 4 bits  scales[j] & 15 (j<8), scales[j-8] >> 4 (j>=8)
//                high 2 bits scales[8 + j%4] >> 2*(j/4) & 3
//        byte:  0..7  hhhhllll   (nibbles of sc[j+8] | sc[j])
//               8..11 ddccbbaa   (2-bit high parts of sc[i], sc[i+4], sc[i+8], sc[i+12])
// Q6_K, 210 bytes, sub-blocks of 16  w = d*sc * (q - 32), sc int8
//   [ql:128][qh:64][scales:16 x int8][d:f16]
//   q(e)  = (ql[64h + 32(s&1) + l] >> 4(s>>1) & 15) | (qh[32h + l] >> 2s & 3) << 4
//
// Q4_K / Q5_K: element e = 64*j + 32*u + l (j<4, u<2, l<32), sub-block b = 2j+u
// Q4_K, 144 bytes, sub-blocks of 32  w = d*sc[b] * q - dmin*mn[b]
//   [d:f16][dmin:f16][scales:12][qs:128]
//   q(e)  = qs[32j + l] >> 4u & 15
// Q5_K, 176 bytes                    w as Q4_K, q 5 bits
//   [d:f16][dmin:f16][scales:12][qh:32][qs:128]
//   q(e)  = (qs[32j + l] >> 4u & 15) | (qh[l] >> b & 1) << 4
//   6-bit sc/mn packing of the 12 scale bytes (b<4 | b>=4):
//        byte 0..3   MMssssss  sc[b] = low 6 bits;  MM = high bits of sc[b+4]
//        byte 4..7   MMmmmmmm  mn[b] = low 6 bits;  MM = high bits of mn[b+4]
//        byte 8..11  mmmmssss  low 4 bits of mn[b+4] (high nibble), sc[b+4] (low)
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34, "32-weight block sizes");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "K-quant block sizes");

namespace {

// IEEE half -> float, exact. Kept here (internal linkage) rather than using
// convert.h's inline, whose out-of-line copy may be the one built with AVX flags.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
  uint32_t bits;
  if (em >= 0x7c00u) {
    bits = sign | 0x7f800000u | ((em & 0x3ffu) << 13);  // inf, nan
  } else if (em >= 0x0400u) {
    bits = sign | ((em + ((127u - 15u) << 10)) << 13);  // normal: rebias the exponent
  } else {
    const float f = (float)em * 5.9604644775390625e-08f;  // subnormal: em * 2^-24, exact
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t ld32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K/Q5_K 6-bit scale and min of sub-block b (see the diagram above).
inline void k4_scale_min(const uint8_t* s, int b, int* sc, int* mn) {
  if (b < 4) {
    *sc = s[b] & 63;
    *mn = s[b + 4] & 63;
  } else {
    *sc = (s[b + 4] & 15) | ((s[b - 4] >> 6) << 4);
    *mn = (s[b + 4] >> 4) | ((s[b] >> 6) << 4);
  }
}

// Q3_K signed 6-bit scale of sub-block j (value - 32).
inline int k3_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
  const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Keeps the compiler from contracting a product and a following add into an
// FMA (GNU C++ allows that by default): the reference rounds twice.
inline float rounded(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile float t = v;
  v = t;
#endif
  return v;
}

// Scalar dequantization of one block of type t: src -> out[block].
inline void dequant_block_scalar(int t, const uint8_t* b, float* out) {
  switch (t) {
    case Q4_0: {
      const float d = half_to_float(ld16(b));
      for (int i = 0; i < 16; ++i) {
        out[i] = d * (float)((b[2 + i] & 15) - 8);
        out[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
      }
      break;
    }
    case Q4_1: {
      const float d = half_to_float(ld16(b)), m = half_to_float(ld16(b + 2));
      for (int i = 0; i < 16; ++i) {
        out[i] = rounded(d * (float)(b[4 + i] & 15)) + m;
        out[i + 16] = rounded(d * (float)(b[4 + i] >> 4)) + m;
      }
      break;
    }
    case Q5_0: {
      const float d = half_to_float(ld16(b));
      const uint32_t qh = ld32(b + 2);
      for (int i = 0; i < 16; ++i) {
        const int q0 = (b[6 + i] & 15) | ((qh >> i) & 1) << 4;
        const int q1 = (b[6 + i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
        out[i] = d * (float)(q0 - 16);
        out[i + 16] = d * (float)(q1 - 16);
      }
      break;
    }
    case Q5_1: {
      const float d = half_to_float(ld16(b)), m = half_to_float(ld16(b + 2));
      const uint32_t qh = ld32(b + 4);
      for (int i = 0; i < 16; ++i) {
        const int q0 = (b[8 + i] & 15) | ((qh >> i) & 1) << 4;
        const int q1 = (b[8 + i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
        out[i] = rounded(d * (float)q0) + m;
        out[i + 16] = rounded(d * (float)q1) + m;
      }
      break;
    }
    case Q8_0: {
      const float d = half_to_float(ld16(b));
      for (int i = 0; i < 32; ++i) out[i] = (float)(int8_t)b[2 + i] * d;
      break;
    }
    case Q2_K: {
      const uint8_t* sc = b;
      const uint8_t* qs = b + 16;
      const float d = half_to_float(ld16(b + 80)), dmin = half_to_float(ld16(b + 82));
      for (int e = 0; e < 256; ++e) {
        const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int q = (qs[32 * h + l] >> (2 * s)) & 3;
        const float dl = d * (float)(sc[e >> 4] & 15), ml = dmin * (float)(sc[e >> 4] >> 4);
        out[e] = rounded(dl * (float)q) - ml;
      }
      break;
    }
    case Q3_K: {
      const uint8_t* hm = b;
      const uint8_t* qs = b + 32;
      const uint8_t* sc = b + 96;
      const float d = half_to_float(ld16(b + 108));
      for (int e = 0; e < 256; ++e) {
        const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hm[l] >> (4 * h + s)) & 1) ? 0 : 4);
        const float dl = d * (float)k3_scale(sc, e >> 4);
        out[e] = dl * (float)q;
      }
      break;
    }
    case Q4_K:
    case Q5_K: {
      const float d = half_to_float(ld16(b)), dmin = half_to_float(ld16(b + 2));
      const uint8_t* sc = b + 4;
      const uint8_t* qh = b + 16;  // Q5_K only
      const uint8_t* qs = b + (t == Q4_K ? 16 : 48);
      for (int sb = 0; sb < 8; ++sb) {
        int s6, m6;
        k4_scale_min(sc, sb, &s6, &m6);
        const float ds = d * (float)s6, dm = dmin * (float)m6;
        const int j = sb >> 1, u = sb & 1;
        for (int l = 0; l < 32; ++l) {
          int q = (qs[32 * j + l] >> (4 * u)) & 15;
          if (t == Q5_K) q |= ((qh[l] >> sb) & 1) << 4;
          out[32 * sb + l] = rounded(ds * (float)q) - dm;
        }
      }
      break;
    }
    case Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half_to_float(ld16(b + 208));
      for (int e = 0; e < 256; ++e) {
        const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
        const int lo = (ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
        const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
        out[e] = (d * (float)sc[e >> 4]) * (float)((lo | (hi << 4)) - 32);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace
}  // namespace ggml
}  // namespace rmoe
