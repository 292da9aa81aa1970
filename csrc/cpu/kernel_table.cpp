#include "kernel_table.h"

#include "common/convert.h"

namespace rmoe {

namespace {

using namespace resplit;
using namespace ggml;

KernelTable scalar_path() {
  KernelTable t{};
  t.isa = Isa::Scalar;
  t.f16_to_f32_row = f16_to_f32_row_scalar;
  t.ggml = {dequant_blocks_scalar, nullptr, gemm_tile_scalar, q8_layout_scalar, gemv_q8_scalar, quantize_q8_scalar};
  t.resplit = {false,
               q8_block_scalar,
               {dequant_row_wq_scalar, dequant_row_wr_scalar, dequant_row_d4_scalar},
               {row_dot_wq_scalar, row_dot_wr_scalar, row_dot_d4_scalar},
               {nullptr, nullptr, nullptr},
               nullptr,
               0.f,
               silu_mul_scalar,
               nullptr};
  t.quant = {block_best_scalar, half_encode_scalar, wq_alone_scales_scalar, d4_fit_scalar, nullptr};
  t.attn = {kv_rows_f32_scalar, kv_scores_scalar, kv_max_scalar, kv_exp_scalar, kv_accum_scalar, nullptr, nullptr};
  return t;
}

#if RMOE_X86
// AVX2 + FMA + F16C. With AVX-VNNI the WQ / WR / D4 row tiles take vpdpbusd (and WQ the
// 6-bit z activations); without it WR and D4 have rows kernels that share activation
// loads, and WQ's z activations have 5 bits (maddubs).
KernelTable avx2_path(const CpuFeatures& f) {
  const bool vnni = f.avxvnni;
  KernelTable t{};
  t.isa = Isa::Avx2;
  t.f16_to_f32_row = f16_to_f32_row_avx2;
  t.ggml = {dequant_blocks_avx2, gemv_fused_avx2, gemm_tile_avx2, q8_layout_avx2, gemv_q8_avx2, quantize_q8_avx2};
  t.resplit.int8_acts = true;
  t.resplit.q8_block = q8_block_avx2;
  t.resplit.dequant_row[0] = dequant_row_wq_avx2;
  t.resplit.dequant_row[1] = dequant_row_wr_avx2;
  t.resplit.dequant_row[2] = dequant_row_d4_avx2;
  t.resplit.row_dot[0] = vnni ? row_dot_wq_avxvnni : row_dot_wq_avx2;
  t.resplit.row_dot[1] = vnni ? row_dot_wr_avxvnni : row_dot_wr_avx2;
  t.resplit.row_dot[2] = vnni ? row_dot_d4_avxvnni : row_dot_d4_avx2;
  t.resplit.rows_dot[0] = vnni ? rows_dot_wq_avxvnni : rows_dot_wq_avx2;
  t.resplit.rows_dot[1] = vnni ? nullptr : rows_dot_wr_avx2;
  t.resplit.rows_dot[2] = vnni ? nullptr : rows_dot_d4_avx2;
  t.resplit.rows_dot_wq_z = vnni ? rows_dot_wq_z_avxvnni : rows_dot_wq_z_avx2;
  t.resplit.wq_z_levels = vnni ? 31.f : 16.f;
  t.resplit.silu_mul = silu_mul_avx2;
  t.resplit.i8 = i8_isa_avx2();
  t.quant = {block_best_avx2, half_encode_avx2, wq_alone_scales_avx2, d4_fit_avx2, d4_fit8_avx2};
  t.attn = {kv_rows_f32_avx2, kv_scores_avx2,      kv_max_avx2,       kv_exp_avx2,
            kv_accum_avx2,    kv_scores_rows_avx2, kv_accum_rows_avx2};
  return t;
}

// AVX-512 F/BW/VL/DQ. VNNI: vpdpbusd tiles, the WQ rows and z kernels, the 16-row int8
// GEMM; VBMI (with VNNI): WR by byte-table lookups and D4's byte-permute gather. Without
// them the AVX2 pieces stand in where AVX-512 has no version of its own.
KernelTable avx512_path(const CpuFeatures& f) {
  const bool vnni = f.avx512vnni, vbmi = vnni && f.avx512vbmi;
  KernelTable t{};
  t.isa = Isa::Avx512;
  t.f16_to_f32_row = f16_to_f32_row_avx2;
  t.ggml = {dequant_blocks_avx512, gemv_fused_avx512,  gemm_tile_avx512, q8_layout_avx512,
            vnni ? gemv_q8_avx512vnni : gemv_q8_avx512, quantize_q8_avx512};
  t.resplit.int8_acts = true;
  t.resplit.q8_block = q8_block_avx512;
  t.resplit.dequant_row[0] = dequant_row_wq_avx512;
  t.resplit.dequant_row[1] = vbmi ? dequant_row_wr_vbmi : dequant_row_wr_avx2;
  t.resplit.dequant_row[2] = dequant_row_d4_avx512;
  t.resplit.row_dot[0] = vnni ? row_dot_wq_avx512vnni : row_dot_wq_avx512;
  t.resplit.row_dot[1] = vbmi ? row_dot_wr_vbmi : row_dot_wr_avx2;
  t.resplit.row_dot[2] = vbmi ? row_dot_d4_vbmi : vnni ? row_dot_d4_avx512vnni : row_dot_d4_avx512;
  t.resplit.rows_dot[0] = vnni ? rows_dot_wq_avx512vnni : nullptr;
  t.resplit.rows_dot[1] = vbmi ? rows_dot_wr_vbmi : rows_dot_wr_avx2;
  t.resplit.rows_dot[2] = vbmi ? rows_dot_d4_vbmi : nullptr;
  t.resplit.rows_dot_wq_z = vnni ? rows_dot_wq_z_avx512vnni : rows_dot_wq_z_avx2;
  t.resplit.wq_z_levels = vnni ? 31.f : 16.f;
  t.resplit.silu_mul = silu_mul_avx512;
  t.resplit.i8 = vnni ? i8_isa_avx512() : i8_isa_avx2();
  t.quant = {block_best_avx2, half_encode_avx2, wq_alone_scales_avx2, d4_fit_avx2, d4_fit8_avx2};
  t.attn = {kv_rows_f32_avx512, kv_scores_avx512,      kv_max_avx2,         kv_exp_avx2,
            kv_accum_avx512,    kv_scores_rows_avx512, kv_accum_rows_avx512};
  return t;
}
#endif

}  // namespace

const KernelTable& kernels() {
  static const KernelTable t = [] {
#if RMOE_X86
    const Isa isa = active_isa();
    if (isa == Isa::Avx512) return avx512_path(cpu_features());
    if (isa == Isa::Avx2) return avx2_path(cpu_features());
#endif
    return scalar_path();
  }();
  return t;
}

}  // namespace rmoe
