#pragma once
#include <cstddef>
#include <cstdint>

namespace rmoe {
// buf [n] bytes (n >> last-level cache) -> best read GB/s over `passes` passes.
double read_bandwidth_gbs(const uint8_t* buf, size_t n, int passes);
}  // namespace rmoe
