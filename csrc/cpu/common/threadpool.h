// A small persistent thread pool for the CPU kernels.
// parallel_for(n, fn) splits [0, n) into contiguous chunks, runs them on the
// workers plus the calling thread, and returns when all are done. Kernels call
// it with the GIL released. The pool size comes from set_num_threads() (the
// engine passes --threads) and defaults to the usable cores.
#pragma once
#include <cstddef>
#include <functional>

namespace rmoe {

void set_num_threads(int n);  // n <= 0: usable cores
int num_threads();

// fn(begin, end, thread_index) over a partition of [0, n); min_chunk bounds how
// finely work is split so tiny jobs stay on one thread.
void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t min_chunk = 1);

}  // namespace rmoe
