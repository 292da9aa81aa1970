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
// WR  2.6 bpw + 2 bytes per row (2.602 at n = 2048), residual of gate/up: 5 levels
//     L[d] = {-2.25,-1,0,1,2.25}, one 4-bit sub-scale code k_s per 16 weights,
//     w = D * 2^(-k_s/4) * L[d]. Row = f16 D, then the 64-weight blocks in groups of
//     up to 3 (the last group holds the remaining m = 1..3 blocks). Per group: 64 codes
//     of w = 2m+1 bits, code j = sum_p d(block p, weight j) * 5^p, packed LSB-first,
//     then m 16-bit LE sub-scale words (k_s at bits 4s+3:4s for weights 16s..16s+15):
//
//   bits:  0 .. w-1 | w .. 2w-1 | ... | 63w .. 64w-1 || word block 0 | ... | word block m-1
//          code 0   | code 1    | ... | code 63      || (8w bytes of codes, then 2m bytes)
//
//   A full group is 62 bytes per 192 weights. The SIMD kernel spreads the codes to
//   one byte each and looks each digit position up in a 128-entry table.
//
// D4  4.5 bpw + 4 bytes per row (4.516 at n = 2048), CPU copy of down_proj. Row = f16 D, f16 M,
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

// Bumped whenever bytes or their meaning change (packs key on it). 2: WR levels
// {-2.25,-1,0,1,2.25} and the joint WQ+WR search. 3: WR digits in groups of 64
// table-decoded codes (same values as 2, new bytes).
constexpr int kFormatVersion = 3;
inline size_t wr_code_bits(size_t m) { return 2 * m + 1; }                  // m blocks in the group
inline size_t wr_group_bytes(size_t m) { return 8 * wr_code_bits(m) + 2 * m; }

size_t row_bytes(Fmt fmt, size_t n);  // bytes of one quantized row of n weights

// Quantizers, multithreaded over rows. w: [rows, n] float32. quantize_wq gives the
// least-squares ternary scale (WQ alone: down_proj); quantize_wq_wr searches WQ and
// WR of gate/up jointly (resplit_search.h); n need not be a multiple of the block.
void quantize_wq(const float* w, size_t rows, size_t n, uint8_t* out /*[rows, row_bytes(WQ,n)]*/);
void quantize_wq_wr(const float* w, size_t rows, size_t n,
                    uint8_t* wq /*[rows, row_bytes(WQ,n)]*/, uint8_t* wr /*[rows, row_bytes(WR,n)]*/);
void quantize_d4(const float* w, size_t rows, size_t n, uint8_t* out /*[rows, row_bytes(D4,n)]*/);

// Dequantize rows (the ISA path in use). q: [rows, row_bytes(fmt,n)] -> out [rows, n].
void dequantize(Fmt fmt, const uint8_t* q, size_t rows, size_t n, float* out);

// One row of each format into floats: padded length (multiple of the block),
// out must hold it. Per ISA; scalar is the reference.
using DequantRowFn = void (*)(const uint8_t* row /*[row_bytes]*/, size_t nblocks, float* out /*[nblocks*block]*/);
DequantRowFn dequant_row_fn(Fmt fmt);  // the kernel table's

// Activations prepared once per token for the fused kernels (prep_x). The SIMD
// paths run WQ and D4 on int8 activations (per 32 weights: sx = max|x|/127,
// xq = rint(x/sx); prep_wq_q8/prep_d4_q8/prep_wr_q8 in resplit_gemv.cpp); the scalar
// path uses f32:
//   WQ: per pair of 32-blocks 80 floats [digit i 0..4][block of pair 0..1][byte lane 0..7]:
//       lane j<6 = x[6i+j], lane 6 = x[30+i] (i<2, else 0), lane 7 = -sum(x of block) at i=0
//       (byte lane 7 decodes to digit 1 at i=0 and is weighted 0 elsewhere).
//   WR: x zero-padded to a multiple of 64; int8: per 64-block 48 floats, int8 xq[64],
//       float sx[16] (lanes 0-7: sx of weights 0-31, 8-15: of 32-63), int32 c[16] =
//       -9 * (sum of xq[4l..4l+3]) (levels are stored as 4L+9, unsigned).
//   D4: x padded to 32s, then one sum per 32-block.
size_t prep_floats(Fmt fmt, size_t n);
void prep_x(Fmt fmt, const float* x /*[n]*/, size_t n, float* out /*[prep_floats]*/);
// Fused decode x dot: y[t*ys] = W_row . x_t for t < T, x_t = xp + t*xs (prepared), nb blocks.
using RowDotFn = void (*)(const uint8_t* row /*[row_bytes]*/, size_t nb /*blocks*/,
                          const float* xp /*[T, xs] prepared*/, size_t xs, size_t T, float* y /*[T] at stride ys*/,
                          size_t ys);
RowDotFn row_dot_fn(Fmt fmt);  // the kernel table's
// One token against nr consecutive rows (stride rb): y[r] = W_r . x. Where an ISA has
// such a kernel it shares activation loads across rows; nullptr where it has none.
using RowsDotFn = void (*)(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);
RowsDotFn rows_dot_fn(Fmt fmt);  // the kernel table's
void rows_dot_wq_avx512vnni(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // VNNI only
void rows_dot_wq_avxvnni(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // AVX-VNNI only
void rows_dot_wq_avx2(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // no AVX-VNNI
void rows_dot_wr_avx2(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // + AVX-512 w/o VBMI
void rows_dot_d4_avx2(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // no AVX-VNNI
// Non-critical experts' rows outside the int8 GEMM (all of decode) run WQ on coarser
// "z" activations on the SIMD paths (wq_z_acts()): per 32 values sx = max|x|/L,
// xq = rint(x/sx), stored as z_j = 3 xq_j - xq_{j-1} over the 6 digit states, so the
// kernel takes 6 byte products per weight byte instead of 10 (VNNI) or instead of 5
// extracted digits (maddubs). L = wq_z_levels(): 31 (6 bits, |z| <= 124) where
// vpdpbusd is (AVX-512 VNNI, AVX-VNNI), 16 (5 bits, |z| <= 64) where maddubs sums the
// pairs in 16 bits. WQ's own error (~0.2 of the weight's energy) dwarfs the ~1e-3
// (6 bits) or ~4e-3 (5 bits) of the rounding; critical rows keep int8.
//   per 8 blocks 128 floats: int8 z[6][8 blocks][8 lanes] (lanes as the int8 layout),
//   float sx[16] (lanes 2b, 2b+1 = sx_b), float c[16] (lane 2b = sx_b * sum(xq_b)).
bool wq_z_acts();
float wq_z_levels();
size_t prep_floats_wq_z(size_t n);
void prep_wq_z(const float* x /*[n]*/, size_t n, float* out /*[prep_floats_wq_z]*/);
void rows_dot_wq_z_avx512vnni(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // VNNI only
void rows_dot_wq_z_avxvnni(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // AVX-VNNI only
void rows_dot_wq_z_avx2(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);  // no VNNI: L = 16
bool wr_int8_acts();  // the SIMD paths (AVX2 and up) run WR on int8 activations
// Kernels that need AVX-512 VBMI and VNNI (resplit_vbmi.cpp): WR by byte-table lookups,
// and D4 with its blocks gathered by byte permutes.
void row_dot_d4_vbmi(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_wr_vbmi(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void rows_dot_wr_vbmi(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);
void rows_dot_d4_vbmi(const uint8_t* rows, size_t rb, size_t nr, size_t nb, const float* xp, float* y);
void dequant_row_wr_vbmi(const uint8_t* row, size_t nb, float* out);

// Batched expert GEMM: for each selected slot s (one expert id each),
//   y[s][t][o] = sum_i W[ids[s]][o][i] * x[s][t][i]   for t < ntok[s].
// W: [E, out_dim, row_bytes(fmt,in_dim)] bytes; x rows for slot s start at
// x + xoff[s]*in_dim, y rows at y + xoff[s]*out_dim (both [*, dim] float32).
void expert_gemm(Fmt fmt, const uint8_t* W, size_t E, size_t out_dim, size_t in_dim,
                 const int32_t* ids /*[S]*/, const int64_t* xoff /*[S]*/, const int64_t* ntok /*[S]*/, size_t S,
                 const float* x /*[*, in_dim]*/, float* y /*[*, out_dim]*/, bool accumulate,
                 bool z = false /*WQ: z activations where wq_z_acts()*/);

// Several batched expert GEMMs in one parallel pass (rows of all jobs share the
// threads). xp: activations already prepared for the job's format (prep_x),
// one row of prep_floats(fmt, in_dim) per x row; jobs must write disjoint y.
struct GemmJob {
  Fmt fmt;
  const uint8_t* W;  // [E, out_dim, row_bytes(fmt, in_dim)]
  size_t out_dim, in_dim;
  const int32_t* ids;    // [S] expert per slot
  const int64_t* xoff;   // [S] first x/y row of the slot
  const int64_t* ntok;   // [S] rows of the slot
  size_t S;
  const float* xp;       // [*, prep_floats(fmt, in_dim)]
  float* y;              // [*, out_dim]
  bool accumulate;
  bool z = false;        // WQ on z activations (xp by prep_wq_z; wq_z_acts() only)
  // >= 0: W holds rows of this GGUF type (src_rb bytes each, a source file's experts; fmt is
  // not read) and xp the int8 rows of ggml::q8_act_quantize (q8_act_row_bytes / 4 floats a
  // row); accumulate must be false.
  int src_type = -1;
  size_t src_rb = 0;
};
void run_jobs(const GemmJob* jobs, size_t nj);

// Prefill GEMM for expert groups of many tokens (resplit_i8.cpp): tiles of rows are
// dequantized (Wa, plus Wb when set: WQ + WR of a critical gate/up), requantized to
// int8 per 32 weights by the activations' rule (oracle q8_activations) and multiplied
// with int8 activations, several rows per register (resplit_i8_avx512.cpp: VNNI, 16 rows
// a register; resplit_i8_avx2.cpp: 16-bit products, 8 rows). Activations: prep_i8 per
// row into i8_act_bytes(n) bytes and nb = ceil(n/32) scales; gathered row r reads
// activation row xrow[r] (identity when xrow is null) and writes y row r.
bool i8_gemm_available();
bool i8_gemm_for_source();  // available, and source_rows
constexpr size_t kI8MinTokens = 8;  // moe_forward gives groups of at least this many tokens the i8 GEMM
size_t i8_act_bytes(size_t n);
void prep_i8(const float* x, size_t n, uint8_t* xq, float* sx);
struct I8Job {
  Fmt fa;
  const uint8_t* Wa;  // [E, out_dim, row_bytes(fa, in_dim)]
  Fmt fb;
  const uint8_t* Wb;  // same shape in fb, added to Wa's weights; null: Wa alone
  size_t out_dim, in_dim;
  const int32_t* ids;   // [S]
  const int64_t* xoff;  // [S] first gathered row of the slot
  const int64_t* ntok;  // [S]
  size_t S;
  const int32_t* xrow;  // [rows] activation row per gathered row, or null
  const uint8_t* xq;    // [*, i8_act_bytes(in_dim)]
  const float* sx;      // [*, nb]
  float* y;             // [rows, out_dim]
  // >= 0: Wa holds rows of this GGUF type (src_rb bytes each, a source file's experts; fa
  // is not read, Wb must be null)
  int src_type = -1;
  size_t src_rb = 0;
};
void run_i8_jobs(const I8Job* jobs, size_t nj);

// One ISA's pieces of the int8 GEMM (raw pointers only: the ISA files hold no library
// templates). A tile is `rows` rows: pack_row requantizes row r (f: nb*32 floats, zero
// padded) into the tile's w (kI8TileBlockBytes per 32-weight block), s and nc ([nb][rows]
// each); gemm gives nt <= max_nt tokens' sums for the tile's first nr rows. x86 only.
constexpr size_t kI8TileBlockBytes = 1024;  // AVX-512: 32 rows x 32 int8; AVX2: 16 rows x 32 int16
struct I8Isa {
  size_t rows, max_nt, act_bytes;  // act_bytes: bytes per activation
  // groups of a source file's critical experts run here too: faster than the GGUF int8 GEMV
  // on their rows (measured on Q4_K_M experts: AVX-512 VNNI yes, AVX2 no)
  bool source_rows;
  void (*pack_row)(const float* f, size_t nb, size_t r, uint8_t* w, float* s, int32_t* nc);
  void (*gemm)(const uint8_t* w, const float* s, const int32_t* nc, size_t nb, const uint8_t* const* xq,
               const float* const* sx, float* const* y, size_t nt, size_t nr);
  void (*prep)(const float* x, size_t n, uint8_t* xq, float* sx);
};
const I8Isa* i8_isa_avx512();  // VNNI
const I8Isa* i8_isa_avx2();

// 32 activations (n < 32: zero padded) -> int8 per the rule above; returns sum(q).
// levels: 127 (int8); 31 for z activations.
int q8_block_scalar(const float* x, size_t n, int8_t* q, float* sx, float levels = 127.f);
// A block with a NaN or an infinity: q = 0, sx = NaN (every product with it is NaN); returns 0.
static inline int q8_bad_block(int8_t* q, float* sx) {  // static: see convert.h on linkage
  for (int j = 0; j < 32; ++j) q[j] = 0;
  *sx = __builtin_nanf("");
  return 0;
}
int q8_block_avx2(const float* x, size_t n, int8_t* q, float* sx, float levels = 127.f);
int q8_block_avx512(const float* x, size_t n, int8_t* q, float* sx, float levels = 127.f);

// h[i] = silu(g[i]) * u[i] (the ISA path in use; the AVX-512 exp is within 2 ulp of std::exp).
void silu_mul(const float* g, const float* u, size_t n, float* h);
void silu_mul_scalar(const float* g, const float* u, size_t n, float* h);
void silu_mul_avx512(const float* g, const float* u, size_t n, float* h);
void silu_mul_avx2(const float* g, const float* u, size_t n, float* h);

// The split execution of one MoE layer on the CPU.
// x [T,H]; ids, weights [T,k]; ncrit [T]: slots j < ncrit[t] are critical.
// Critical: g = x.WQg + x.WRg, u = x.WQu + x.WRu, h = silu(g)*u, y = h.D4d.
// Others:   g = x.WQg,          u = x.WQu,          h = silu(g)*u, y = h.WQd.
// out [T,H] = sum_j weights[t,j] * y_j.  F: expert ffn width.
// With the source file's expert tensors (gate_s, up_s, down_s), a critical expert runs
// from them instead: g = x.Wg, u = x.Wu, y = h.Wd in the file's types (int8 activations,
// as llama.cpp and ggml::matmul compute them); WR and D4 are not read.
struct SrcExperts {  // [E, rows, rb] of a GGUF type with an int8 GEMV (ggml::q8_act_layout >= 0)
  int type = -1;
  const uint8_t* w = nullptr;
  size_t rb = 0;
};
struct MoeWeights {
  size_t E, H, F;
  const uint8_t* gate_q;  // [E, F, row_bytes(WQ,H)]
  const uint8_t* up_q;    // [E, F, row_bytes(WQ,H)]
  const uint8_t* down_q;  // [E, H, row_bytes(WQ,F)]
  const uint8_t* gate_r;  // [E, F, row_bytes(WR,H)]   may be null if no slot is critical
  const uint8_t* up_r;    // [E, F, row_bytes(WR,H)]
  const uint8_t* down4;   // [E, H, row_bytes(D4,F)]
  SrcExperts gate_s{}, up_s{}, down_s{};  // [E, F, .], [E, F, .], [E, H, .]; w null: critical from WR + D4
  bool from_source() const { return gate_s.w != nullptr; }
};
void moe_forward(const MoeWeights& w, const float* x /*[T,H]*/, size_t T, size_t k,
                 const int32_t* ids /*[T,k]*/, const float* weights /*[T,k]*/,
                 const int32_t* ncrit /*[T]*/, float* out /*[T,H]*/);
// Critical slots whose x.WQ of gate and up was computed elsewhere (the GPU's share of
// the residual split): g = gq + x.WRg, u = uq + x.WRu, y = (silu(g)*u).D4, and
// out [T,H] = sum over slots i of weights[i] * y_i at row tok[i].
void residual_forward(const MoeWeights& w, const float* x /*[T,H]*/, size_t T, size_t n, const int32_t* tok /*[n]*/,
                      const int32_t* ids /*[n]*/, const float* weights /*[n]*/, const float* gq /*[n,F]*/,
                      const float* uq /*[n,F]*/, float* out /*[T,H]*/);

// ISA variants; only called after isa.cpp allows them.
#define RMOE_RESPLIT_VARIANTS(sfx)                                                                   \
  void dequant_row_wq_##sfx(const uint8_t* row, size_t nb, float* out);                             \
  void dequant_row_wr_##sfx(const uint8_t* row, size_t nb, float* out);                             \
  void dequant_row_d4_##sfx(const uint8_t* row, size_t nb, float* out);                             \
  void row_dot_wq_##sfx(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys); \
  void row_dot_wr_##sfx(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys); \
  void row_dot_d4_##sfx(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
RMOE_RESPLIT_VARIANTS(scalar)  // resplit_dequant.cpp, resplit_gemv.cpp: the references
RMOE_RESPLIT_VARIANTS(avx2)    // resplit_*_avx2.cpp
#undef RMOE_RESPLIT_VARIANTS
// AVX-512 (resplit_*_avx512.cpp): WR runs the VBMI kernels or the AVX2 ones; WQ and D4
// take vpdpbusd where VNNI is (*_avx512vnni), maddubs + madd where not.
void dequant_row_wq_avx512(const uint8_t* row, size_t nb, float* out);
void dequant_row_d4_avx512(const uint8_t* row, size_t nb, float* out);
void row_dot_wq_avx512(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_wq_avx512vnni(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_d4_avx512(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_d4_avx512vnni(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
// The AVX2 tiles with vpdpbusd (resplit_gemv_avxvnni.cpp; cpu_features().avxvnni only).
void row_dot_wq_avxvnni(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_wr_avxvnni(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);
void row_dot_d4_avxvnni(const uint8_t* row, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys);

// One ISA's set of the pieces above (kernel_table.cpp picks it once); indexed by Fmt.
struct Kernels {
  bool int8_acts;  // WQ, WR and D4 run on int8 activations (the SIMD paths)
  int (*q8_block)(const float* x, size_t n, int8_t* q, float* sx, float levels);
  DequantRowFn dequant_row[3];
  RowDotFn row_dot[3];
  RowsDotFn rows_dot[3];    // null where the ISA has no rows kernel for the format
  RowsDotFn rows_dot_wq_z;  // null: no z activations (wq_z_acts() is false)
  float wq_z_levels;        // L of the z activations rows_dot_wq_z takes
  void (*silu_mul)(const float* g, const float* u, size_t n, float* h);
  const I8Isa* i8;  // null: no int8 prefill GEMM
};

// Shared constants (must equal the oracle's float32 values).
extern const float kWrTable[16];  // 2^(-k/4)

}  // namespace resplit
}  // namespace rmoe
