// Matmul with weights kept in their GGUF type: y [T, rows] = x [T, k] @ W^T.
//
// Rows are processed in blocks of RB, spread over the thread pool. Paths:
// * the integer types with an int8 kernel (Q4_0..Q8_0, Q4_K..Q6_K), any T:
//   x is quantized once per call to int8 blocks (ggml_q8.h) and each weight
//   block is dotted with integer instructions, as llama.cpp does, 8 tokens at
//   a time. Results match dequantize(W) @ q8(x), not @ x, and a token's results
//   do not depend on the other tokens of the call (matmul and expert_matmul).
//   RAPIDMOE_GGML_F32ACT=1 turns this off (the paths below, exact x).
// * small T otherwise (up to 8 with AVX-512, 4 with AVX2): the ISA file's fused
//   GEMV unpacks each weight block into f32 registers and multiplies it at once;
//   W is streamed from memory once.
// * larger T (prefill): each row block is dequantized KC columns at a time
//   into a small f32 buffer (L1/L2 resident) and reused by every activation
//   row, so each weight is dequantized once, not T times.
// On the f32 paths weights dequantize exactly and activations stay f32, except
// against F16 and BF16 weights: there they are first rounded to the weight's type,
// as llama.cpp does (its vec_dot_type), so results match dequantize(W) @ round(x)
// up to f32 summation order. Every path
// computes each output row on its own, so the thread count never changes a
// result. This file is the only one that calls parallel_for, so the ISA files
// stay free of library templates (see ggml_blocks.h on linkage).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/convert.h"
#include "ggml/ggml_blocks.h"
#include "ggml/ggml_kernels.h"
#include "ggml/ggml_q8.h"
#include "common/threadpool.h"
#include "kernel_table.h"

namespace rmoe {
namespace ggml {

void gemm_tile_scalar(const float* w, size_t ldw, size_t nr, const float* x, size_t ldx, size_t nt,
                      size_t k, float* y, size_t ldy) {
  for (size_t r = 0; r < nr; ++r)
    for (size_t t = 0; t < nt; ++t) {
      const float* a = w + r * ldw;
      const float* b = x + t * ldx;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // independent lanes: vectorizable without reassociation
      size_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
      for (; i < k; ++i) acc[i & 7] += a[i] * b[i];
      y[t * ldy + r] += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
}

namespace {

constexpr size_t RB = 16;   // weight rows per block
constexpr size_t KC = 512;  // columns dequantized at a time (a multiple of every block size)

// The int8-activation GEMV of the active ISA for `type`, if any.
struct Q8Path {
  int layout = Q8_NONE;
  bool (*gemv)(int, const uint8_t*, size_t, size_t, size_t, const uint8_t*, size_t, size_t, float*, size_t) = nullptr;
  void (*quant)(int, const float*, size_t, size_t, uint8_t*, size_t) = nullptr;
};

constexpr size_t Q8_MAX_T = 8;

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

Q8Path q8_path(int type, size_t k) {
  // RAPIDMOE_GGML_F32ACT=1: exact f32 activations. Read once. (RAPIDMOE_ISA=avx512-novnni
  // hides VNNI: the AVX-512 kernels a CPU lacking it runs.)
  static const bool f32act = env_set("RAPIDMOE_GGML_F32ACT");
  Q8Path p;
  if (f32act) return p;
  const auto& k8 = kernels().ggml;
  p = {k8.q8_layout(type), k8.gemv_q8, k8.quantize_q8};
  if (p.layout == Q8_NONE || k == 0 || k % (size_t)type_info(type).block) p = Q8Path{};
  return p;
}

// x [T, k] -> buf, quantized rows ld bytes apart.
const uint8_t* quantize_rows(const Q8Path& p, const float* x, size_t k, size_t T, std::vector<uint8_t>& buf,
                             size_t* ld) {
  *ld = q8_row_bytes(p.layout, k);
  if (buf.size() < T * *ld) buf.resize(T * *ld);
  p.quant(p.layout, x, k, T, buf.data(), *ld);
  return buf.data();
}

// x [n], or its values rounded to F16 / BF16 in buf when W is of that type.
const float* acts_for(int type, const float* x, size_t n, std::vector<float>& buf) {
  if (type != F16 && type != BF16) return x;
  buf.resize(n);
  if (type == F16)
    for (size_t i = 0; i < n; ++i) buf[i] = f16_to_f32(f32_to_f16_bits(x[i]));
  else
    for (size_t i = 0; i < n; ++i) buf[i] = bf16_to_f32(f32_to_bf16_bits(x[i]));
  return buf.data();
}

// Row blocks per thread chunk so that a chunk is worth waking a thread for
// (~2^18 multiply-adds, tens of microseconds).
size_t min_blocks(size_t k, size_t T) { return std::max<size_t>(1, ((size_t)1 << 18) / (RB * k * std::max<size_t>(1, T) + 1)); }

// Rows [r0, r1) of W [.., rb] against x [T, k]; adds into y[t * ldy + r].
void row_block(int type, const uint8_t* w, size_t rb, size_t k, size_t r0, size_t r1, const float* x, size_t T,
               float* y, size_t ldy, const Kernels& kt) {
  if (kt.gemv_fused && kt.gemv_fused(type, w + r0 * rb, rb, k, r1 - r0, x, T, y + r0, ldy)) return;  // small T
  thread_local std::vector<float> tile_buf;  // RB x KC dequantized weights, per pool thread
  if (tile_buf.size() < RB * KC) tile_buf.resize(RB * KC);
  float* buf = tile_buf.data();
  const TypeInfo ti = type_info(type);
  const bool direct = type == F32 && reinterpret_cast<uintptr_t>(w) % alignof(float) == 0;
  const size_t nr = r1 - r0;
  for (size_t kc = 0; kc < k; kc += KC) {
    const size_t kn = std::min(KC, k - kc);
    const float* wt;
    size_t ldw;
    if (direct) {
      wt = reinterpret_cast<const float*>(w + r0 * rb) + kc;
      ldw = k;
    } else {
      const size_t b0 = kc / (size_t)ti.block, nb = kn / (size_t)ti.block;
      for (size_t r = 0; r < nr; ++r) {
        // 16 short row streams defeat the hardware prefetcher: ask for this
        // row's next chunk (or the next row block's first) while this one is unpacked.
        const uint8_t* next = kc + KC < k ? w + (r0 + r) * rb + (b0 + nb) * ti.bytes : w + (r0 + RB + r) * rb;
        for (size_t p = 0; p < nb * ti.bytes; p += 64) __builtin_prefetch(next + p);
        dequant_blocks(type, w + (r0 + r) * rb + b0 * ti.bytes, buf + r * KC, nb);
      }
      wt = buf;
      ldw = KC;
    }
    kt.gemm_tile(wt, ldw, nr, x + kc, k, T, kn, y + r0, ldy);
  }
}

}  // namespace

int q8_act_layout(int type, size_t k) { return q8_path(type, k).layout; }

size_t q8_act_row_bytes(int layout, size_t k) { return q8_row_bytes(layout, k); }

void q8_act_quantize(int layout, const float* x, size_t k, size_t T, uint8_t* dst, size_t ld) {
  kernels().ggml.quantize_q8(layout, x, k, T, dst, ld);
}

void q8_act_gemv(int type, const uint8_t* w, size_t rb, size_t k, size_t nr, const uint8_t* xq, size_t ldq, size_t nt,
                 float* y, size_t ldy) {
  kernels().ggml.gemv_q8(type, w, rb, k, nr, xq, ldq, nt, y, ldy);
}

void matmul(int type, const uint8_t* w, size_t rows, size_t rb, size_t k, const float* x, size_t T, float* y) {
  std::memset(y, 0, T * rows * sizeof(float));
  const Q8Path q8 = q8_path(type, k);
  if (q8.gemv) {
    // Any T: x quantized once; each row block (L1/L2 resident) meets the tokens
    // 8 at a time, so prefill and decode give the same numbers for a token.
    thread_local std::vector<uint8_t> qbuf;  // the caller's thread: reused across calls
    size_t ldq;
    const uint8_t* xq = quantize_rows(q8, x, k, T, qbuf, &ldq);
    parallel_for(
        (rows + RB - 1) / RB,
        [&](size_t b0, size_t b1, int) {
          for (size_t b = b0; b < b1; ++b) {
            const size_t r0 = b * RB, r1 = std::min(rows, (b + 1) * RB);
            for (size_t t0 = 0; t0 < T; t0 += Q8_MAX_T)
              q8.gemv(type, w + r0 * rb, rb, k, r1 - r0, xq + t0 * ldq, ldq, std::min(Q8_MAX_T, T - t0),
                      y + t0 * rows + r0, rows);
          }
        },
        min_blocks(k, T));
    return;
  }
  std::vector<float> xr;
  x = acts_for(type, x, T * k, xr);
  const Kernels& kt = kernels().ggml;
  const size_t nblocks = (rows + RB - 1) / RB;
  parallel_for(
      nblocks,
      [&](size_t b0, size_t b1, int) {
        for (size_t b = b0; b < b1; ++b)
          row_block(type, w, rb, k, b * RB, std::min(rows, (b + 1) * RB), x, T, y, rows, kt);
      },
      min_blocks(k, T));
}

void matvec_multi(size_t n, const int* types, const uint8_t* const* ws, const size_t* rows, const size_t* rbs, size_t k,
                  const float* x, float* const* ys) {
  // One x [k] against several matrices in one parallel pass (decode's q, k and v): x is
  // quantized once, and the small matrices share the threads' chunks with the large one.
  std::vector<Q8Path> qp(n);
  bool shared = n > 0;
  for (size_t i = 0; i < n; ++i) {
    qp[i] = q8_path(types[i], k);
    shared = shared && qp[i].gemv && qp[i].layout == qp[0].layout;
  }
  if (!shared) {
    for (size_t i = 0; i < n; ++i) matmul(types[i], ws[i], rows[i], rbs[i], k, x, 1, ys[i]);
    return;
  }
  thread_local std::vector<uint8_t> qbuf;
  size_t ldq;
  const uint8_t* xq = quantize_rows(qp[0], x, k, 1, qbuf, &ldq);
  std::vector<size_t> start(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    std::memset(ys[i], 0, rows[i] * sizeof(float));
    start[i + 1] = start[i] + (rows[i] + RB - 1) / RB;
  }
  parallel_for(
      start[n],
      [&](size_t b0, size_t b1, int) {
        size_t i = 0;
        for (size_t b = b0; b < b1; ++b) {
          while (b >= start[i + 1]) ++i;
          const size_t r0 = (b - start[i]) * RB, r1 = std::min(rows[i], r0 + RB);
          qp[i].gemv(types[i], ws[i] + r0 * rbs[i], rbs[i], k, r1 - r0, xq, ldq, 1, ys[i] + r0, rows[i]);
        }
      },
      min_blocks(k, 1));
}

void expert_matmul(int type, const uint8_t* w, size_t E, size_t rows, size_t rb, size_t k, const int32_t* ids,
                   const float* x, size_t n, float* y) {
  // Group the rows of x by expert so each expert's weights are read once.
  std::vector<size_t> count(E + 1, 0), order(n);
  for (size_t j = 0; j < n; ++j) ++count[(size_t)ids[j] + 1];
  for (size_t e = 0; e < E; ++e) count[e + 1] += count[e];  // count[e] = first slot of expert e
  std::vector<size_t> fill(count.begin(), count.end() - 1);
  for (size_t j = 0; j < n; ++j) order[fill[(size_t)ids[j]]++] = j;
  std::vector<float> xg(n * k), yg(n * rows, 0.0f);
  std::vector<float> xr;
  x = acts_for(type, x, n * k, xr);
  for (size_t i = 0; i < n; ++i) std::memcpy(xg.data() + i * k, x + order[i] * k, k * sizeof(float));

  // Work items: (expert, row block) over the experts in use.
  const size_t nrb = (rows + RB - 1) / RB;
  std::vector<size_t> used;
  for (size_t e = 0; e < E; ++e)
    if (count[e + 1] > count[e]) used.push_back(e);
  const Kernels& kt = kernels().ggml;
  // With an int8 kernel, x is quantized once and each expert's row block meets
  // its tokens 8 at a time, as in matmul: a token's numbers do not depend on
  // what else is in the batch.
  const Q8Path q8 = q8_path(type, k);
  std::vector<uint8_t> qbuf;
  size_t ldq = 0;
  const uint8_t* xq = q8.gemv && n ? quantize_rows(q8, xg.data(), k, n, qbuf, &ldq) : nullptr;
  parallel_for(
      used.size() * nrb,
      [&](size_t i0, size_t i1, int) {
        for (size_t i = i0; i < i1; ++i) {
          const size_t e = used[i / nrb], b = i % nrb;
          const size_t t0 = count[e], nt = count[e + 1] - t0;
          const size_t r0 = b * RB, r1 = std::min(rows, (b + 1) * RB);
          if (xq) {
            for (size_t t = t0; t < t0 + nt; t += Q8_MAX_T)
              q8.gemv(type, w + e * rows * rb + r0 * rb, rb, k, r1 - r0, xq + t * ldq, ldq,
                      std::min(Q8_MAX_T, t0 + nt - t), yg.data() + t * rows + r0, rows);
            continue;
          }
          row_block(type, w + e * rows * rb, rb, k, r0, r1, xg.data() + t0 * k, nt, yg.data() + t0 * rows, rows, kt);
        }
      },
      min_blocks(k, (n + used.size() - 1) / std::max<size_t>(1, used.size())));
  for (size_t i = 0; i < n; ++i) std::memcpy(y + order[i] * rows, yg.data() + i * rows, rows * sizeof(float));
}

}  // namespace ggml
}  // namespace rmoe
