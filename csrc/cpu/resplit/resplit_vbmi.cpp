// Fused decode x int8 activation kernels that need AVX-512 VBMI + VNNI (in the kernel
// table only where both are): WR, and D4's block gather.
//
// WR: Per group of up to 3 blocks (resplit.h): the 64 codes are
// spread to one byte each (vpermb + vpmultishiftqb), each digit position p is looked
// up in a 128-entry table giving 4*L+9 in 0..18 (vpermi2b), and dotted with the
// block's int8 activations (vpdpbusd, started from -9 * sum x to undo the +9). Each
// int32 lane then covers 4 weights of one 16-weight sub-block, so the sub-scale is a
// per-lane factor: sum_lanes acc * (D * 2^(-k/4) / 4) * sx.
//
// The decode GEMV (one token) takes 8 rows at a time for both formats: each block's
// activations are loaded once for the 8 rows, and the per-row constants (WR's D, D4's
// D and M) scale the row sums at the end. Loads, not arithmetic, bounded the one-row
// loop: from DRAM at 2 threads WR went from 22 to 38 GB/s and D4 from 36 to 44.
// Rows ahead are fetched into L2, not L1 (ggml_q8_simd.h says why).
#include "common/isa.h"
#include "resplit/resplit.h"

#if RMOE_X86
#include <immintrin.h>

#include "common/simd.h"

#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace rmoe {
namespace resplit {

namespace {


struct Consts {
  __m512i tab_lo[3], tab_hi[3];  // digit position p of code c -> 4*L+9 (c < 128)
  __m512i spread[4], shift[4];   // by code width 3, 5, 7 (index (w-1)/2)
  Consts() {
    static const int kL4[5] = {0, 5, 9, 13, 18};  // 4*{-2.25,-1,0,1,2.25} + 9
    alignas(64) uint8_t t[128];
    for (int p = 0, div = 1; p < 3; ++p, div *= 5) {
      for (int c = 0; c < 128; ++c) t[c] = (uint8_t)kL4[(c / div) % 5];
      tab_lo[p] = _mm512_load_si512(t);
      tab_hi[p] = _mm512_load_si512(t + 64);
    }
    alignas(64) uint8_t sp[64], sh[64];
    for (int w = 3; w <= 7; w += 2) {
      for (int qw = 0; qw < 8; ++qw)
        for (int b = 0; b < 8; ++b) {
          sp[8 * qw + b] = (uint8_t)(w * qw + (b < w ? b : 0));  // qword qw <- bytes w*qw .. w*qw+w-1
          sh[8 * qw + b] = (uint8_t)(w * b);                      // code b of the qword at bit w*b
        }
      spread[(w - 1) / 2] = _mm512_load_si512(sp);
      shift[(w - 1) / 2] = _mm512_load_si512(sh);
    }
  }
};

const Consts& consts() {
  static const Consts c;
  return c;
}

// 64 codes of width w (group bytes g) -> one code per byte.
inline __m512i codes(const Consts& k, const uint8_t* g, size_t w) {
  const __m512i raw = _mm512_maskz_loadu_epi8((1ull << (8 * w)) - 1, g);
  const size_t i = (w - 1) / 2;
  const __m512i c = _mm512_multishift_epi64_epi8(k.shift[i], _mm512_permutexvar_epi8(k.spread[i], raw));
  return _mm512_and_si512(c, _mm512_set1_epi8((char)((1u << w) - 1)));
}

// Per-lane sub-scale factor of a block: lanes 4s..4s+3 <- tab[k_s], k_s = bits 4s+3:4s of
// the 16-bit word at w. The word is broadcast to every 16-bit half, shifted per lane, and
// vpermps reads only the low 4 bits of each index.
inline __m512 lane_scales(const uint8_t* w, __m512 tab) {
  const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  const __m512i word = _mm512_set1_epi16((short)(w[0] | (w[1] << 8)));
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(word, sh), tab);
}

// One row, NT tokens (prepared x at stride xs, 48 floats per block).
template <int NT>
void wr_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const Consts& k = consts();
  const __m512 tab = _mm512_mul_ps(_mm512_loadu_ps(kWrTable), _mm512_set1_ps(0.25f * h2f(q[0] | (q[1] << 8))));
  q += 2;
  __m512 tot[NT];
  for (int t = 0; t < NT; ++t) tot[t] = _mm512_setzero_ps();
  for (size_t b0 = 0; b0 < nb; b0 += 3) {
    const size_t m = nb - b0 < 3 ? nb - b0 : 3, w = wr_code_bits(m);
    const __m512i c = codes(k, q, w);
    for (size_t p = 0; p < m; ++p) {
      const __m512i lv = _mm512_permutex2var_epi8(k.tab_lo[p], c, k.tab_hi[p]);
      const __m512 sc = lane_scales(q + 8 * w + 2 * p, tab);
      const float* xb = xp + 48 * (b0 + p);
      for (int t = 0; t < NT; ++t) {
        const float* xt = xb + t * xs;
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_loadu_si512(xt + 32), lv, _mm512_loadu_si512(xt));
        tot[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sc, _mm512_loadu_ps(xt + 16)), tot[t]);
      }
    }
    q += wr_group_bytes(m);
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = _mm512_reduce_add_ps(tot[t]);
}

// One token, R rows at once. Per block the activations are loaded once for all R rows,
// and the lane factor uses the shared 2^(-k/4) / 4 table: each row's D scales its sum at
// the end.
template <int R>
void wr_rows(const uint8_t* q, size_t rb, size_t nb, const float* xp, float* y) {
  const Consts& k = consts();
  const __m512 tab = _mm512_mul_ps(_mm512_loadu_ps(kWrTable), _mm512_set1_ps(0.25f));
  const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  __m512 tot[R];
  __m512i c[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) tot[r] = _mm512_setzero_ps();
  size_t off = 2;
  for (size_t b0 = 0; b0 < nb; b0 += 3) {
    const size_t m = nb - b0 < 3 ? nb - b0 : 3, w = wr_code_bits(m);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* g = q + r * rb + off;
      _mm_prefetch(reinterpret_cast<const char*>(g + 2 * R * rb), _MM_HINT_T1);  // this group two row passes on
      c[r] = codes(k, g, w);
    }
    for (size_t p = 0; p < m; ++p) {
      const float* xb = xp + 48 * (b0 + p);
      const __m512i x0 = _mm512_loadu_si512(xb), corr = _mm512_loadu_si512(xb + 32);
      const __m512 sx = _mm512_loadu_ps(xb + 16);
      const __m512i lo = k.tab_lo[p], hi = k.tab_hi[p];
      const size_t so = off + 8 * w + 2 * p;  // the block's sub-scale word
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* ws = q + r * rb + so;
        const __m512i lv = _mm512_permutex2var_epi8(lo, c[r], hi);
        const __m512 sc = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi16((short)(ws[0] | (ws[1] << 8))), sh), tab);
        const __m512i acc = _mm512_dpbusd_epi32(corr, lv, x0);
        tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sc, sx), tot[r]);
      }
    }
    off += wr_group_bytes(m);
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const uint8_t* qr = q + r * rb;
    y[r] = _mm512_reduce_add_ps(tot[r]) * h2f(qr[0] | (qr[1] << 8));
  }
}

// D4, 4 blocks (72 bytes) per step: one byte permute gathers the 4 x 16 nibble bytes,
// two more put sc and mn in the low byte of each int32 lane of their block (lanes
// 4i..4i+3, the lanes vpdpbusd fills from block i's bytes). Partial steps load only the
// row's bytes; missing blocks have zero nibbles and scales (and zero activations).
struct D4Consts {
  __m512i nib, sc, mn;
  D4Consts() {
    alignas(64) uint8_t a[64], b[64], c[64];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 16; ++j) {
        a[16 * i + j] = (uint8_t)(18 * i + j);
        b[16 * i + j] = (uint8_t)(18 * i + 16);
        c[16 * i + j] = (uint8_t)(18 * i + 17);
      }
    nib = _mm512_load_si512(a);
    sc = _mm512_load_si512(b);
    mn = _mm512_load_si512(c);
  }
};

const D4Consts& d4consts() {
  static const D4Consts c;
  return c;
}

struct D4Step {
  __m512i lo, hi;  // nibbles of weights 0-15 / 16-31 of each block
  __m512 dv, mv;   // D*sc, M*mn per lane of its block
};

inline D4Step d4_step(const D4Consts& k, const uint8_t* qb, size_t nbl, __m512 D, __m512 M) {
  const size_t avail = 18 * nbl;
  const __m512i a = _mm512_maskz_loadu_epi8(avail >= 64 ? ~0ull : (1ull << avail) - 1, qb);
  const __m512i b = avail > 64 ? _mm512_maskz_loadu_epi8((1ull << (avail - 64)) - 1, qb + 64) : _mm512_setzero_si512();
  const __m512i v = _mm512_permutex2var_epi8(a, k.nib, b);
  const __mmask64 low = 0x1111111111111111ull;  // byte 0 of each int32 lane
  const __m512i m4 = _mm512_set1_epi8(0xF);
  D4Step s;
  s.lo = _mm512_and_si512(v, m4);
  s.hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  s.dv = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(low, a, k.sc, b)));
  s.mv = _mm512_mul_ps(M, _mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(low, a, k.mn, b)));
  return s;
}

// One row, NT tokens (prep_d4_q8 layout: per 4 blocks 64 floats).
template <int NT>
void d4_tile(const uint8_t* q, size_t nb, const float* xp, size_t xs, float* y, size_t ys) {
  const D4Consts& k = d4consts();
  const __m512 D = _mm512_set1_ps(h2f(q[0] | (q[1] << 8))), M = _mm512_set1_ps(h2f(q[2] | (q[3] << 8)));
  q += 4;
  __m512 tot[NT], totm[NT];
  for (int t = 0; t < NT; ++t) tot[t] = totm[t] = _mm512_setzero_ps();
  const size_t ahead = 8 * (4 + 18 * nb);  // the same blocks 8 rows on (the next row group of a GEMV)
  for (size_t b = 0; b < nb; b += 4) {
    if (NT == 1) {
      _mm_prefetch(reinterpret_cast<const char*>(q + 18 * b + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(q + 18 * b + 64 + ahead), _MM_HINT_T1);
    }
    const D4Step s = d4_step(k, q + 18 * b, nb - b < 4 ? nb - b : 4, D, M);
    const float* g = xp + (b / 4) * 64;
    for (int t = 0; t < NT; ++t) {
      const float* gt = g + t * xs;
      const __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), s.lo, _mm512_loadu_si512(gt)),
                                              s.hi, _mm512_loadu_si512(gt + 16));
      tot[t] = _mm512_fmadd_ps(s.dv, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(gt + 32)), tot[t]);
      totm[t] = _mm512_fmadd_ps(s.mv, _mm512_loadu_ps(gt + 48), totm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ys] = _mm512_reduce_add_ps(_mm512_sub_ps(tot[t], totm[t]));
}

// One token, R rows at once (prep_d4_q8 layout): the activations of a step are loaded
// once for all rows, and each row's D and M scale its two sums at the end.
template <int R>
void d4_rows(const uint8_t* q, size_t rb, size_t nb, const float* xp, float* y) {
  const D4Consts& k = d4consts();
  const __mmask64 low = 0x1111111111111111ull;  // byte 0 of each int32 lane
  const __m512i m4 = _mm512_set1_epi8(0xF);
  __m512 tot[R], totm[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) tot[r] = totm[r] = _mm512_setzero_ps();
  const size_t ahead = R * rb;  // the same blocks R rows on (the next row group)
  for (size_t b = 0; b < nb; b += 4) {
    const size_t avail = 18 * (nb - b < 4 ? nb - b : 4);
    const __mmask64 ma = avail >= 64 ? ~0ull : (1ull << avail) - 1;
    const __mmask64 mb = avail > 64 ? (1ull << (avail - 64)) - 1 : 0;
    const float* g = xp + (b / 4) * 64;
    const __m512i x0 = _mm512_loadu_si512(g), x1 = _mm512_loadu_si512(g + 16);
    const __m512 sx = _mm512_loadu_ps(g + 32), xs = _mm512_loadu_ps(g + 48);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* qb = q + r * rb + 4 + 18 * b;
      _mm_prefetch(reinterpret_cast<const char*>(qb + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(qb + 64 + ahead), _MM_HINT_T1);
      const __m512i a = _mm512_maskz_loadu_epi8(ma, qb), bb = _mm512_maskz_loadu_epi8(mb, qb + 64);
      const __m512i v = _mm512_permutex2var_epi8(a, k.nib, bb);
      const __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, m4), x0),
                                              _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), x1);
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(low, a, k.sc, bb));
      const __m512 mn = _mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(low, a, k.mn, bb));
      tot[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), sx), sc, tot[r]);
      totm[r] = _mm512_fmadd_ps(mn, xs, totm[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const uint8_t* qr = q + r * rb;
    y[r] = h2f(qr[0] | (qr[1] << 8)) * _mm512_reduce_add_ps(tot[r]) - h2f(qr[2] | (qr[3] << 8)) * _mm512_reduce_add_ps(totm[r]);
  }
}

// nr rows as groups of 8, then 4, then single rows: rows(R, first row), R an integral_constant.
template <class Rows>
void in_row_groups(size_t nr, Rows rows) {
  size_t r = 0;
  for (; r + 8 <= nr; r += 8) rows(std::integral_constant<int, 8>(), r);
  for (; r + 4 <= nr; r += 4) rows(std::integral_constant<int, 4>(), r);
  for (; r < nr; ++r) rows(std::integral_constant<int, 1>(), r);
}

// A slip in the kernel table must not reach a VBMI instruction off the AVX-512 VBMI path:
// on a CPU without it, or with it hidden or lowered by RAPIDMOE_ISA (which is how the
// tests catch such a slip on any machine).
void require_vbmi() {
  if (active_isa() != Isa::Avx512 || !cpu_features().avx512vnni || !cpu_features().avx512vbmi) {
    std::fputs("rapidmoe: internal error: a VBMI kernel was selected without AVX-512 VBMI+VNNI\n", stderr);
    std::abort();
  }
}
}  // namespace

void row_dot_d4_vbmi(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  require_vbmi();
  size_t t = 0;
  for (; t + 8 <= T; t += 8) d4_tile<8>(q, nb, xp + t * xs, xs, y + t * ys, ys);
  if (t + 4 <= T) { d4_tile<4>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 4; }
  if (t + 2 <= T) { d4_tile<2>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 2; }
  if (t < T) d4_tile<1>(q, nb, xp + t * xs, xs, y + t * ys, ys);
}


void row_dot_wr_vbmi(const uint8_t* q, size_t nb, const float* xp, size_t xs, size_t T, float* y, size_t ys) {
  require_vbmi();
  size_t t = 0;
  for (; t + 4 <= T; t += 4) wr_tile<4>(q, nb, xp + t * xs, xs, y + t * ys, ys);
  if (t + 2 <= T) { wr_tile<2>(q, nb, xp + t * xs, xs, y + t * ys, ys); t += 2; }
  if (t < T) wr_tile<1>(q, nb, xp + t * xs, xs, y + t * ys, ys);
}

// WR row -> floats: each register is one 16-weight sub-block, L = (table byte - 9) / 4
// exactly, times D * 2^(-k/4) as the scalar decoder rounds it.
void dequant_row_wr_vbmi(const uint8_t* q, size_t nb, float* out) {
  require_vbmi();
  const Consts& k = consts();
  const float D = h2f(q[0] | (q[1] << 8));
  q += 2;
  const __m512 nine = _mm512_set1_ps(9.f), quarter = _mm512_set1_ps(0.25f);
  for (size_t b0 = 0; b0 < nb; b0 += 3) {
    const size_t m = nb - b0 < 3 ? nb - b0 : 3, w = wr_code_bits(m);
    const __m512i c = codes(k, q, w);
    for (size_t p = 0; p < m; ++p) {
      const __m512i lv = _mm512_permutex2var_epi8(k.tab_lo[p], c, k.tab_hi[p]);
      const uint32_t sc = q[8 * w + 2 * p] | ((uint32_t)q[8 * w + 2 * p + 1] << 8);
      float* o = out + 64 * (b0 + p);
      alignas(64) uint8_t lb[64];
      _mm512_store_si512(lb, lv);
      for (int s = 0; s < 4; ++s) {
        const __m512i li = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(lb + 16 * s)));
        const __m512 L = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(li), nine), quarter);
        _mm512_storeu_ps(o + 16 * s, _mm512_mul_ps(_mm512_set1_ps(D * kWrTable[(sc >> (4 * s)) & 0xF]), L));
      }
    }
    q += wr_group_bytes(m);
  }
}

void rows_dot_d4_vbmi(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  require_vbmi();
  in_row_groups(nr, [&](auto R, size_t r) { d4_rows<decltype(R)::value>(q + r * rb, rb, nb, xp, y + r); });
}

void rows_dot_wr_vbmi(const uint8_t* q, size_t rb, size_t nr, size_t nb, const float* xp, float* y) {
  require_vbmi();
  in_row_groups(nr, [&](auto R, size_t r) { wr_rows<decltype(R)::value>(q + r * rb, rb, nb, xp, y + r); });
}

}  // namespace resplit
}  // namespace rmoe

#endif
