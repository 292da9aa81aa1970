// Resplit row decoders: the scalar references, the kernel table's decoder and the
// multithreaded dequantizer (also the reference the fused kernels are tested by).
#include <cstring>
#include <vector>

#include "common/convert.h"
#include "kernel_table.h"
#include "resplit/resplit.h"
#include "common/threadpool.h"

namespace rmoe {
namespace resplit {

// ---------------------------------------------------------------- scalar reference
void dequant_row_wq_scalar(const uint8_t* q, size_t nb, float* out) {
  for (size_t b = 0; b < nb; ++b, q += 8, out += 32) {
    const uint32_t code = (q[6] & 0xFu) | ((uint32_t)q[7] << 4);
    const float dq = f16_to_f32((uint16_t)(code << 3));
    for (int j = 0; j < 6; ++j) {
      uint32_t u = q[j];
      for (int i = 0; i < 5; ++i) {
        u *= 3;
        out[6 * i + j] = dq * (float)((int)(u >> 8) - 1);
        u &= 255;
      }
    }
    uint32_t u = q[6] & 0xF0u;
    for (int i = 0; i < 2; ++i) {
      u *= 3;
      out[30 + i] = dq * (float)((int)(u >> 8) - 1);
      u &= 255;
    }
  }
}

namespace {
// WR level of digit position p of every 7-bit code (codes >= 125 never occur).
struct WrLevelTable {
  float lv[3][128];
  WrLevelTable() {
    static const float kLv[5] = {-2.25f, -1.0f, 0.0f, 1.0f, 2.25f};
    for (int c = 0; c < 128; ++c)
      for (int p = 0, div = 1; p < 3; ++p, div *= 5) lv[p][c] = kLv[(c / div) % 5];
  }
};
const WrLevelTable kWrLv;
}  // namespace

void dequant_row_wr_scalar(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  q += 2;
  uint8_t code[64];
  for (size_t b0 = 0; b0 < nb; b0 += 3) {
    const size_t m = nb - b0 < 3 ? nb - b0 : 3, w = wr_code_bits(m);
    for (size_t j = 0; j < 64; ++j) {
      // code j: bits w*j .. w*j+w-1; the second byte read is still inside the group
      // (its sub-scale words follow the codes)
      const size_t bit = w * j;
      code[j] = (uint8_t)(((q[bit / 8] | ((uint32_t)q[bit / 8 + 1] << 8)) >> (bit % 8)) & ((1u << w) - 1));
    }
    for (size_t p = 0; p < m; ++p) {
      const uint32_t sc = q[8 * w + 2 * p] | ((uint32_t)q[8 * w + 2 * p + 1] << 8);
      const float* lv = kWrLv.lv[p];
      float* o = out + 64 * (b0 + p);
      for (int s = 0; s < 4; ++s) {
        const float dr = D * kWrTable[(sc >> (4 * s)) & 0xF];
        for (int j = 16 * s; j < 16 * s + 16; ++j) o[j] = dr * lv[code[j]];
      }
    }
    q += wr_group_bytes(m);
  }
}

void dequant_row_d4_scalar(const uint8_t* q, size_t nb, float* out) {
  const float D = f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
  const float M = f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
  q += 4;
  for (size_t b = 0; b < nb; ++b, q += 18, out += 32) {
    const float d = D * (float)q[16], dm = M * (float)q[17];
    for (int j = 0; j < 16; ++j) {
      out[j] = d * (float)(q[j] & 0xF) - dm;
      out[j + 16] = d * (float)(q[j] >> 4) - dm;
    }
  }
}

// ---------------------------------------------------------------- the path in use
namespace {
size_t block_of(Fmt f) { return f == Fmt::WR ? 64 : 32; }
}  // namespace

DequantRowFn dequant_row_fn(Fmt fmt) { return kernels().resplit.dequant_row[(int)fmt]; }

void dequantize(Fmt fmt, const uint8_t* q, size_t rows, size_t n, float* out) {
  const size_t rb = row_bytes(fmt, n), bl = block_of(fmt), nb = (n + bl - 1) / bl;
  const DequantRowFn fn = dequant_row_fn(fmt);
  parallel_for(rows, [&](size_t b, size_t e, int) {
    std::vector<float> buf(nb * bl);
    for (size_t r = b; r < e; ++r) {
      fn(q + r * rb, nb, buf.data());
      std::memcpy(out + r * n, buf.data(), n * sizeof(float));
    }
  }, 16);
}

}  // namespace resplit
}  // namespace rmoe
