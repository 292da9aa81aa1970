// Host harness for the CUDA kernels' per-block math (built with any C++ compiler,
// no CUDA needed): tests feed it bytes on stdin and compare its output with the
// numpy oracles. Usage: block_harness CMD < input > output
//   wq_dot   in: u32 nb, f32 x[nb*32], u8 w[nb*8]  out: f32 per block dq*s*(sum d q - sum q)
//   wq_deq   in: u32 nb, u8 w[nb*8]                 out: f32 [nb*32]
//   ggml_deq in: i32 type, u32 nblocks, u8 blocks   out: f32 [nblocks * block weights]
//   bf16     in: u32 n, f32 x[n]                    out: u16 [n]
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "../ggml_quants.cuh"
#include "../resplit_wq.cuh"

using namespace rmoe_cuda;

template <class T>
static std::vector<T> read_n(size_t n) {
  std::vector<T> v(n);
  if (n && fread(v.data(), sizeof(T), n, stdin) != n) {
    fprintf(stderr, "short input\n");
    v.clear();
  }
  return v;
}

template <class T>
static void write_all(const std::vector<T>& v) {
  fwrite(v.data(), sizeof(T), v.size(), stdout);
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* cmd = argv[1];
  if (!strcmp(cmd, "wq_dot")) {
    const u32 nb = read_n<u32>(1)[0];
    auto x = read_n<float>(nb * 32);
    auto w = read_n<u8>(nb * 8);
    std::vector<float> out(nb);
    for (u32 b = 0; b < nb; ++b) {
      u32 z[16];
      float sf[2];
      wq_prep_block_ref(&x[b * 32], z, sf);
      const u32 w0 = ld_u32(&w[b * 8]), w1 = ld_u32(&w[b * 8 + 4]);
      out[b] = (float)(wq_block_idot(w0, w1, z) - (int)sf[1]) * (sf[0] * wq_scale(w1));
    }
    write_all(out);
  } else if (!strcmp(cmd, "wq_deq")) {
    const u32 nb = read_n<u32>(1)[0];
    auto w = read_n<u8>(nb * 8);
    std::vector<float> out(nb * 32);
    for (u32 b = 0; b < nb; ++b) {
      const float dq = wq_scale(ld_u32(&w[b * 8 + 4]));
      for (int e = 0; e < 32; ++e) out[b * 32 + e] = wq_weight(&w[b * 8], e, dq);
    }
    write_all(out);
  } else if (!strcmp(cmd, "ggml_deq")) {
    const int t = read_n<int>(1)[0];
    const u32 nblk = read_n<u32>(1)[0];
    const int bb = ggml_block_bytes(t), cpb = ggml_chunks_per_block(t);
    if (!bb) return 3;
    auto blocks = read_n<u8>((size_t)nblk * bb);
    std::vector<float> out((size_t)nblk * cpb * 32);
    for (u32 i = 0; i < nblk; ++i)
      for (int c = 0; c < cpb; ++c) ggml_chunk(t, &blocks[(size_t)i * bb], c, &out[((size_t)i * cpb + c) * 32]);
    write_all(out);
  } else if (!strcmp(cmd, "bf16")) {
    const u32 n = read_n<u32>(1)[0];
    auto x = read_n<float>(n);
    std::vector<u16> out(n);
    for (u32 i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
    write_all(out);
  } else {
    return 2;
  }
  return 0;
}
