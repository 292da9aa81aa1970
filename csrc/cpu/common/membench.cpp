// A STREAM-like read-bandwidth probe for `bench`: every thread sums its share of
// a buffer larger than the caches; the best of a few passes is reported.
#include "common/membench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/threadpool.h"

namespace rmoe {

double read_bandwidth_gbs(const uint8_t* buf, size_t n, int passes) {
  const size_t words = n / 8;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(buf);
  double best = 0.0;
  std::vector<uint64_t> sink(256, 0);
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(words, [&](size_t b, size_t e, int tid) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {  // four chains keep several loads in flight
        a0 += w[i];
        a1 += w[i + 1];
        a2 += w[i + 2];
        a3 += w[i + 3];
      }
      for (; i < e; ++i) a0 += w[i];
      sink[(size_t)tid % sink.size()] += a0 + a1 + a2 + a3;  // keep the loads alive
    }, 1 << 16);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, (double)(words * 8) / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace rmoe
