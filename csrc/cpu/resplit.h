// Residual-split expert formats (WQ, WR, D4): quantizers, dequantizers and the
// batched-over-experts kernels. The numpy oracle engine/quant/resplit_oracle.py
// defines the bytes; the quantizers here reproduce it bit for bit.
//
// WQ  2.0 bpw, gate/up/down low-bit part. Row = ceil(n/32) blocks of 8 bytes:
//
//   byte:  0      1      2      3      4      5      6            7
//        +------+------+------+------+------+------+------+-----+----------+
//        | 5 trits per byte, base-3 fraction code  |2trit |s3:0 | s11:4    |
//        +------+------+------+------+------+------+------+-----+----------+
//   byte j<6 = ceil(c*256/243), c = sum_i (t_i+1)*3^(4-i); digit i = weight 6i+j
//   byte 6: bits 7:4 = ceil(c2*16/9), c2 = 3(t30+1)+(t31+1); bits 3:0 = s3:0
//   s (12 bits) = float16 bits 14:3 of the block scale dq;  w = dq * t
//   digit decode: u <- 3u; d = u >> 8; u &= 255  (5 times from u = byte)
//
// WR  2.63 bpw (+2 bytes per row), residual of gate/up. Row = f16 D, then
//     ceil(n/64) blocks of 21 bytes, 5 levels L[d] = {-2.25,-1,0,1,2.25}, d in 0..4:
//
//   bytes 0-15 : lo16[g]  g = 0..7         code v_g bits 15:0
//   bytes 16-18: 24-bit LE, bits 3g+2:3g   code v_g bits 18:16
//   bytes 19-20: 16-bit LE, bits 4s+3:4s   sub-scale code k_s, s = 0..3
//   v_g = ceil(c*2^19/5^8), c = sum_i d_ig*5^(7-i); digit i = weight 8i+g
//   w = D * 2^(-k_s/4) * L[d]   for weights 16s..16s+15
//   digit decode: u <- 5u; d = u >> 19; u &= 2^19-1  (8 times from u = v)
//
// D4  4.52 bpw (+4 bytes per row), CPU copy of down_proj. Row = f16 D, f16 M,
//     then ceil(n/32) blocks of 18 bytes:
//
//   bytes 0-15: q_j | q_{j+16} << 4      byte 16: sc (u8)   byte 17: mn (u8)
//   w = (D*sc) * q - (M*mn)
#pragma once
#include <cstddef>
#include <cstdint>

namespace rmoe {
namespace resplit {

enum class Fmt : int { WQ = 0, WR = 1, D4 = 2 };

size_t row_bytes(Fmt fmt, size_t n);  // bytes of one quantized row of n weights

// Quantizers, multithreaded over rows. w: [rows, n] float32.
void quantize_wq(const float* w, size_t rows, size_t n, uint8_t* out /*[rows, row_bytes(WQ,n)]*/);
void quantize_wq_wr(const float* w, size_t rows, size_t n,
                    uint8_t* wq /*[rows, row_bytes(WQ,n)]*/, uint8_t* wr /*[rows, row_bytes(WR,n)]*/);
void quantize_d4(const float* w, size_t rows, size_t n, uint8_t* out /*[rows, row_bytes(D4,n)]*/);

// Dequantize rows (the ISA path in use). q: [rows, row_bytes(fmt,n)] -> out [rows, n].
void dequantize(Fmt fmt, const uint8_t* q, size_t rows, size_t n, float* out);

// One row of each format into floats: padded length (multiple of the block),
// out must hold it. Per ISA; scalar is the reference.
using DequantRowFn = void (*)(const uint8_t* row, size_t nblocks, float* out);
DequantRowFn dequant_row_fn(Fmt fmt);  // chosen by active_isa()
using DotFn = float (*)(const float* a, const float* b, size_t n);
DotFn dot_fn();

// Batched expert GEMM: for each selected slot s (one expert id each),
//   y[s][t][o] = sum_i W[ids[s]][o][i] * x[s][t][i]   for t < ntok[s].
// W: [E, out_dim, row_bytes(fmt,in_dim)] bytes; x rows for slot s start at
// x + xoff[s]*in_dim, y rows at y + xoff[s]*out_dim (both [*, dim] float32).
void expert_gemm(Fmt fmt, const uint8_t* W, size_t E, size_t out_dim, size_t in_dim,
                 const int32_t* ids /*[S]*/, const int64_t* xoff /*[S]*/, const int64_t* ntok /*[S]*/, size_t S,
                 const float* x /*[*, in_dim]*/, float* y /*[*, out_dim]*/, bool accumulate);

// The split execution of one MoE layer on the CPU.
// x [T,H]; ids, weights [T,k]; ncrit [T]: slots j < ncrit[t] are critical.
// Critical: g = x.WQg + x.WRg, u = x.WQu + x.WRu, h = silu(g)*u, y = h.D4d.
// Others:   g = x.WQg,          u = x.WQu,          h = silu(g)*u, y = h.WQd.
// out [T,H] = sum_j weights[t,j] * y_j.  F: expert ffn width.
struct MoeWeights {
  size_t E, H, F;
  const uint8_t* gate_q;  // [E, F, row_bytes(WQ,H)]
  const uint8_t* up_q;    // [E, F, row_bytes(WQ,H)]
  const uint8_t* down_q;  // [E, H, row_bytes(WQ,F)]
  const uint8_t* gate_r;  // [E, F, row_bytes(WR,H)]   may be null if no slot is critical
  const uint8_t* up_r;    // [E, F, row_bytes(WR,H)]
  const uint8_t* down4;   // [E, H, row_bytes(D4,F)]
};
void moe_forward(const MoeWeights& w, const float* x /*[T,H]*/, size_t T, size_t k,
                 const int32_t* ids /*[T,k]*/, const float* weights /*[T,k]*/,
                 const int32_t* ncrit /*[T]*/, float* out /*[T,H]*/);

// ISA variants (resplit_gemv_avx2.cpp / _avx512.cpp); only called after isa.cpp allows them.
void dequant_row_wq_avx2(const uint8_t* row, size_t nb, float* out);
void dequant_row_wr_avx2(const uint8_t* row, size_t nb, float* out);
void dequant_row_d4_avx2(const uint8_t* row, size_t nb, float* out);
float dot_avx2(const float* a, const float* b, size_t n);
void dequant_row_wq_avx512(const uint8_t* row, size_t nb, float* out);
void dequant_row_wr_avx512(const uint8_t* row, size_t nb, float* out);
void dequant_row_d4_avx512(const uint8_t* row, size_t nb, float* out);
float dot_avx512(const float* a, const float* b, size_t n);

// Scalar references.
void dequant_row_wq_scalar(const uint8_t* row, size_t nb, float* out);
void dequant_row_wr_scalar(const uint8_t* row, size_t nb, float* out);
void dequant_row_d4_scalar(const uint8_t* row, size_t nb, float* out);
float dot_scalar(const float* a, const float* b, size_t n);

// Shared constants (must equal the oracle's float32 values).
extern const float kWrTable[16];  // 2^(-k/4)

// float32 -> float16 bits, round-half-even (as numpy's astype(float16)).
uint16_t f32_to_f16_bits(float f);

}  // namespace resplit
}  // namespace rmoe
