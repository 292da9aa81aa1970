// A CPU emulation of the little of CUDA's execution model the kernels use, so
// the real kernel sources (indexing, warp shuffles, tails) run on a machine
// without a GPU: one std::thread per CUDA thread of a block, warps kept in step
// by a barrier at every shuffle. Slow and only for small test shapes; timing
// and memory-model questions stay with the device.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define RMOE_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // blocks run one after another: one copy serves each block in turn

struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct EmuDim { unsigned x = 1, y = 1, z = 1; };

inline thread_local EmuDim threadIdx, blockIdx;
inline EmuDim blockDim, gridDim;

template <class T>
inline T __ldg(const T* p) { return *p; }
inline int min(int a, int b) { return a < b ? a : b; }
inline float __expf(float x) { return expf(x); }

// A misaligned vector load faults on the device; here it is recorded and the
// launch reports failure (emu_call returns nonzero).
inline std::atomic<bool> emu_fault{false};
inline void emu_check_aligned(const void* p, unsigned a) {
  if (reinterpret_cast<uintptr_t>(p) % a && !emu_fault.exchange(true))
    fprintf(stderr, "emulator: %u-byte access at %p is misaligned\n", a, p);
}

struct EmuWarp {
  std::barrier<> bar{32};
  uint64_t slot[32];
};
inline thread_local EmuWarp* emu_warp = nullptr;
inline thread_local std::barrier<>* emu_block = nullptr;
inline void __syncthreads() { emu_block->arrive_and_wait(); }  // every thread of the block must reach it

template <class T>
inline T emu_exchange(T v, int src, bool keep_own) {
  const int lane = threadIdx.x & 31;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu_warp->slot[lane] = bits;
  emu_warp->bar.arrive_and_wait();
  T r = v;
  if (!keep_own) std::memcpy(&r, &emu_warp->slot[src & 31], sizeof(T));
  emu_warp->bar.arrive_and_wait();  // nobody overwrites a slot before all have read
  return r;
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) { return emu_exchange(v, src, false); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) { return emu_exchange(v, (int)(threadIdx.x & 31) ^ m, false); }
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned d) {
  const int lane = threadIdx.x & 31;
  return emu_exchange(v, lane + (int)d, lane + (int)d > 31);
}

// Runs kernel(args...) over the grid: `block` threads, blocks one after another.
template <class K, class... A>
void emu_launch(EmuDim grid, unsigned block, K kernel, A... args) {
  gridDim = grid;
  blockDim = EmuDim{block, 1, 1};
  std::vector<std::unique_ptr<EmuWarp>> warps;
  for (unsigned w = 0; w < (block + 31) / 32; ++w) warps.emplace_back(new EmuWarp);
  std::barrier<> block_bar((std::ptrdiff_t)block);
  std::vector<std::thread> th;
  for (unsigned t = 0; t < block; ++t)
    th.emplace_back([&, t] {
      threadIdx = EmuDim{t, 0, 0};
      emu_warp = warps[t / 32].get();
      emu_block = &block_bar;
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx = EmuDim{bx, by, 0};
          kernel(args...);
          block_bar.arrive_and_wait();
        }
    });
  for (auto& x : th) x.join();
}
