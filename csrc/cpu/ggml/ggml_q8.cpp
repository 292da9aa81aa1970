// Scalar reference of the int8-activation GEMV (ggml_q8.h): the activation
// quantizer every ISA must match byte for byte, and per weight block the
// integer sums the vector kernels compute (in another order, same values).
// Per block the float part is: y += (d_w * d_x) * sumi [+ m_w * s_x
// or - (dmin_w * d_x) * summ], sumi and summ exact integers.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "ggml/ggml_kernels.h"
#include "ggml/ggml_q8.h"

namespace rmoe {
namespace ggml {

int q8_layout_scalar(int type) {
  switch (type) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return Q8_32;
    case Q4_K: case Q5_K: case Q6_K: return Q8_K;
    default: return Q8_NONE;
  }
}

void quantize_q8_scalar(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld) {
  const size_t G = q8_group(layout);
  q8_quantize_rows(
      layout, x, k, T, dst, ld,
      [G](const float* xg, float* amax, bool* bad) {
        *amax = 0.0f;
        *bad = false;
        for (size_t j = 0; j < G; ++j) {
          const float a = std::fabs(xg[j]);
          *bad |= !(a <= FLT_MAX);
          *amax = a > *amax ? a : *amax;
        }
      },
      [G, layout](const float* xg, size_t e0, float id, bool bad, const Q8Row& row) {
        for (size_t j = 0; j < G; j += 16) {
          int sum = 0;
          for (size_t l = 0; l < 16; ++l) {
            const int q = bad ? 0 : (int)std::nearbyint(xg[j + l] * id);  // ties to even, as cvtps2dq
            const size_t e = e0 + j + l;
            row.qs[layout == Q8_K_SWAP ? q8_swap_pos(e) : e] = (int8_t)q;
            sum += q;
          }
          row.bsum[(e0 + j) / 16] = (int16_t)sum;
        }
      });
}

namespace {

// dot of one weight row (nb blocks) with one activation row (natural order).
float dot_row(int type, const uint8_t* w, size_t nb, const int8_t* xq, const float* xd, const float* xs,
              const int16_t* bs) {
  float acc = 0.0f;
  const TypeInfo ti = type_info(type);
  for (size_t i = 0; i < nb; ++i) {
    const uint8_t* b = w + i * ti.bytes;
    const int8_t* q8 = xq + i * ti.block;
    const float dx = xd[i];
    switch (type) {
      case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
        const bool q5 = type == Q5_0 || type == Q5_1, has_m = type == Q4_1 || type == Q5_1;
        const uint8_t* qs = b + (has_m ? 4 : 2) + (q5 ? 4 : 0);
        const uint32_t qh = q5 ? ld32(b + (has_m ? 4 : 2)) : 0;
        const int xsum = bs[2 * i] + bs[2 * i + 1];
        int sumi = 0;
        for (int l = 0; l < 16; ++l) {
          const int c0 = (qs[l] & 15) | (int)((qh >> l) & 1) << 4;
          const int c1 = (qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
          sumi += c0 * q8[l] + c1 * q8[l + 16];
        }
        if (!has_m) sumi -= (q5 ? 16 : 8) * xsum;  // codes are offset by 8 / 16
        acc += (half_to_float(ld16(b)) * dx) * (float)sumi;
        if (has_m) acc += half_to_float(ld16(b + 2)) * xs[i];
        break;
      }
      case Q8_0: {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += (int8_t)b[2 + l] * q8[l];
        acc += (half_to_float(ld16(b)) * dx) * (float)sumi;
        break;
      }
      case Q4_K: case Q5_K: {
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + (type == Q4_K ? 16 : 48);
        uint32_t u[4];
        k4_unpack_scales(b + 4, u);
        uint8_t sm[16];
        std::memcpy(sm, u, 16);
        int sumi = 0, summ = 0;
        for (int sb = 0; sb < 8; ++sb) {
          const int j = sb >> 1, sh = 4 * (sb & 1);
          int s = 0;
          for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * j + l] >> sh) & 15;
            if (type == Q5_K) q |= ((qh[l] >> sb) & 1) << 4;
            s += q * q8[32 * sb + l];
          }
          sumi += sm[sb] * s;
          summ += sm[8 + sb] * (bs[16 * i + 2 * sb] + bs[16 * i + 2 * sb + 1]);
        }
        acc += (half_to_float(ld16(b)) * dx) * (float)sumi;
        acc -= (half_to_float(ld16(b + 2)) * dx) * (float)summ;
        break;
      }
      case Q6_K: {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        int sumi = 0;
        for (int g = 0; g < 16; ++g) {  // 16-value groups: sum sc * (q - 32) * x
          int s = 0;
          for (int l16 = 0; l16 < 16; ++l16) {
            const int e = 16 * g + l16, h = e >> 7, sub = (e >> 5) & 3, l = e & 31;
            const int lo = (ql[64 * h + 32 * (sub & 1) + l] >> (4 * (sub >> 1))) & 15;
            const int hi = (qh[32 * h + l] >> (2 * sub)) & 3;
            s += (lo | hi << 4) * q8[e];
          }
          sumi += sc[g] * (s - 32 * bs[16 * i + g]);
        }
        acc += (half_to_float(ld16(b + 208)) * dx) * (float)sumi;
        break;
      }
      default:
        break;
    }
  }
  return acc;
}

}  // namespace

bool gemv_q8_scalar(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq,
                    size_t nt, float* y, size_t ldy) {
  const int layout = q8_layout_scalar(type);
  if (layout == Q8_NONE || k % (size_t)type_info(type).block) return false;
  const Q8View x{xq, ldq, k, q8_group(layout)};
  const size_t nb = k / (size_t)type_info(type).block;
  for (size_t r = 0; r < nr; ++r)
    for (size_t t = 0; t < nt; ++t) y[t * ldy + r] = dot_row(type, w + r * rb, nb, x.qs(t), x.d(t),
                                                                layout == Q8_32 ? x.s(t) : nullptr, x.bsum(t));
  return true;
}

}  // namespace ggml
}  // namespace rmoe
