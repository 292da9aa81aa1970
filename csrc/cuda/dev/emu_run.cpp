// Runs the real CUDA kernels under dev/emu.h (no GPU) on inputs from stdin;
// tests compare the outputs with the numpy/CPU references.
//   wq    in: i32 E, F, H, S, N; u8 wg[E,F,rb(H)], wu[E,F,rb(H)], wd[E,H,rb(F)]; i32 eid[S], xrow[S];
//             f32 x[N,H], scale[S]
//         out: f32 g[S,F], u[S,F], h[S,F], y[S,H]; u16 deq[S,F,H] (bf16 of gate);
//              i32 1 if the other rows-per-warp variants gave the same bits
//   ggml  in: i32 type, R, n, T; u8 w[R, rb]; f32 x[T,n]   out: f32 y[T,R]; u16 deq[R,n]
#include "emu.h"

#include <cstdio>

#include "../ggml_gemv.cu"
#include "../resplit_wq.cu"

template <class T>
static std::vector<T> rd(size_t n) {
  std::vector<T> v(n);
  if (n && fread(v.data(), sizeof(T), n, stdin) != n) v.assign(n, T());
  return v;
}
template <class T>
static void wr(const std::vector<T>& v) { fwrite(v.data(), sizeof(T), v.size(), stdout); }

static int run_wq() {
  auto hd = rd<int>(5);
  const int E = hd[0], F = hd[1], H = hd[2], S = hd[3], N = hd[4];
  const int nbH = (H + 31) / 32, nbF = (F + 31) / 32, rbH = nbH * 8, rbF = nbF * 8;
  auto wg = rd<u8>((size_t)E * F * rbH), wu = rd<u8>((size_t)E * F * rbH), wd = rd<u8>((size_t)E * H * rbF);
  auto eid = rd<int>(S), xrow = rd<int>(S);
  auto x = rd<float>((size_t)N * H);
  auto scale = rd<float>(S);
  std::vector<uint4> Z((size_t)N * 4 * nbH), Zh((size_t)S * 4 * nbF);
  std::vector<float2> SF((size_t)N * nbH), SFh((size_t)S * nbF);
  emu_launch({(unsigned)(nbH + 7) / 8, (unsigned)N, 1}, 256, wq_prep, x.data(), H, H, nbH, Z.data(), SF.data());
  std::vector<float> g((size_t)S * F), u((size_t)S * F), h((size_t)S * F), y((size_t)S * H);
  const EmuDim gu{(unsigned)(F + 15) / 16, (unsigned)S, 1};
  emu_launch(gu, 256, wq_gemv_gate_up, wg.data(), wu.data(), (i64)F * rbH, rbH, eid.data(), xrow.data(), Z.data(),
             SF.data(), nbH, F, 0, g.data(), u.data());
  emu_launch(gu, 256, wq_gemv_gate_up, wg.data(), wu.data(), (i64)F * rbH, rbH, eid.data(), xrow.data(), Z.data(),
             SF.data(), nbH, F, 1, h.data(), (float*)nullptr);
  emu_launch({(unsigned)(nbF + 7) / 8, (unsigned)S, 1}, 256, wq_prep, h.data(), F, F, nbF, Zh.data(), SFh.data());
  std::vector<int> rows(S);
  for (int s = 0; s < S; ++s) rows[s] = s;
  emu_launch({(unsigned)(H + 31) / 32, (unsigned)S, 1}, 256, wq_gemv, wd.data(), (i64)H * rbF, rbF, eid.data(),
             rows.data(), Zh.data(), SFh.data(), nbF, H, scale.data(), y.data());
  std::vector<u16> deq((size_t)S * F * H);
  emu_launch({(unsigned)(F * nbH + 255) / 256, (unsigned)S, 1}, 256, wq_dequant_bf16, wg.data(), (i64)F * rbH, rbH,
             eid.data(), H, F, deq.data());
  // the other rows-per-warp variants must give the same bits (same per-row arithmetic)
  std::vector<float> g2((size_t)S * F), u2((size_t)S * F), y2((size_t)S * H);
  int variants_equal = 1;
  for (auto k : {wq_gemv_gate_up_r1, wq_gemv_gate_up_r4}) {
    const unsigned rpc = k == wq_gemv_gate_up_r1 ? 8 : 32;
    emu_launch({(unsigned)(F + rpc - 1) / rpc, (unsigned)S, 1}, 256, k, wg.data(), wu.data(), (i64)F * rbH, rbH,
               eid.data(), xrow.data(), Z.data(), SF.data(), nbH, F, 0, g2.data(), u2.data());
    variants_equal &= g2 == g && u2 == u;
  }
  for (auto k : {wq_gemv_r8}) {  // (r2 is the same template; emulating it costs the most blocks)
    const unsigned rpc = 64;
    emu_launch({(unsigned)(H + rpc - 1) / rpc, (unsigned)S, 1}, 256, k, wd.data(), (i64)H * rbF, rbF, eid.data(),
               rows.data(), Zh.data(), SFh.data(), nbF, H, scale.data(), y2.data());
    variants_equal &= y2 == y;
  }
  wr(g); wr(u); wr(h); wr(y); wr(deq);
  wr(std::vector<int>{variants_equal});
  return 0;
}

static int run_ggml() {
  auto hd = rd<int>(4);
  const int type = hd[0], R = hd[1], n = hd[2], T = hd[3];
  const int rb = n / (type == T_Q8_0 ? 32 : 256) * ggml_block_bytes(type);
  auto w = rd<u8>((size_t)R * rb);
  auto x = rd<float>((size_t)T * n);
  std::vector<float> y((size_t)T * R);
  emu_launch({(unsigned)(R + 7) / 8, 1, 1}, 256, ggml_gemv, type, w.data(), rb, n, R, x.data(), T, y.data());
  std::vector<u16> deq((size_t)R * n);
  emu_launch({(unsigned)(R * (n / 32) + 255) / 256, 1, 1}, 256, ggml_dequant_bf16, type, w.data(), rb, n, R, deq.data());
  wr(y); wr(deq);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  if (!strcmp(argv[1], "wq")) return run_wq();
  if (!strcmp(argv[1], "ggml")) return run_ggml();
  return 2;
}
