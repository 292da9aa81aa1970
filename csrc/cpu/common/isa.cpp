#include "common/isa.h"

#include <cstdlib>
#include <cstring>

#if RMOE_X86
#include <cpuid.h>
#endif

namespace rmoe {

namespace {

#if RMOE_X86
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if RMOE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (osxsave) {
    const uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;                // XMM + YMM state
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM state
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
    f.avx512vbmi = c & (1u << 1);
    f.amx_tile = d & (1u << 24);
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = a & (1u << 4);
    f.avx512bf16 = a & (1u << 5);
  }
#endif
  return f;
}

Isa detect_best() {
  const CpuFeatures& f = cpu_features();
  if (f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx2 && f.fma && f.f16c)
    return Isa::Avx512;
  if (f.os_avx && f.avx2 && f.fma && f.f16c) return Isa::Avx2;
  return Isa::Scalar;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures d = detect();
    // RAPIDMOE_ISA=avx512-novnni: AVX-512 as a CPU without VNNI, VBMI and BF16 runs it
    // (e.g. Skylake-SP); avx512-novbmi: with VNNI but no VBMI (Cascade Lake). Tests
    // cover those kernels on any AVX-512 machine.
    // avx2-novnni: AVX2 as a CPU without AVX-VNNI (Haswell to Comet Lake, Zen 1-4) runs it.
    const char* forced = std::getenv("RAPIDMOE_ISA");
    if (forced && !std::strcmp(forced, "avx512-novnni"))
      d.avx512vnni = d.avx512vbmi = d.avx512bf16 = d.avxvnni = false;
    if (forced && !std::strcmp(forced, "avx512-novbmi")) d.avx512vbmi = false;
    if (forced && !std::strcmp(forced, "avx2-novnni")) d.avxvnni = false;
    return d;
  }();
  return f;
}

Isa active_isa() {
  static const Isa isa = [] {
    Isa best = detect_best();
    const char* forced = std::getenv("RAPIDMOE_ISA");
    if (forced && *forced) {
      Isa want = best;
      if (!std::strcmp(forced, "scalar")) want = Isa::Scalar;
      else if (!std::strncmp(forced, "avx2", 4)) want = Isa::Avx2;
      else if (!std::strncmp(forced, "avx512", 6)) want = Isa::Avx512;
      // Forcing can only lower the path: a path the CPU lacks is never taken.
      if ((int)want < (int)best) best = want;
    }
    return best;
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace rmoe
