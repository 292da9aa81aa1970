// Run-time CPU feature detection and the forced-path override (RAPIDMOE_ISA).
#pragma once
#include <string>

namespace rmoe {

enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avxvnni = false;  // AVX-VNNI: VEX vpdpbusd on ymm (Alder Lake and later, Zen 5)
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512vbmi = false, avx512bf16 = false;
  bool os_avx = false, os_avx512 = false;  // XCR0 says the OS saves the registers
  bool amx_tile = false;                   // advertised by CPUID only; never executed here
};

const CpuFeatures& cpu_features();
// Best path this CPU and OS allow, lowered by RAPIDMOE_ISA=scalar|avx2|avx2-novnni|avx512|
// avx512-novnni|avx512-novbmi (the -no* forms also hide AVX-VNNI / VNNI+VBMI+BF16 / VBMI
// from cpu_features()).
Isa active_isa();
const char* isa_name(Isa isa);

}  // namespace rmoe
