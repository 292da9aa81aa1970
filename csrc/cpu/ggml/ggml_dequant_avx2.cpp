// AVX2 dequantization of GGUF types, bit-exact with the scalar reference (the
// unpackers live in ggml_unpack_avx2.h, the body in ggml_dequant_impl.h). Only
// called after isa.cpp has checked the CPU and OS.
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx2.h"

#define RMOE_DQ_NS avx2
#define RMOE_DQ_VEC __m256
#define RMOE_DQ_STORE _mm256_storeu_ps
#define RMOE_DQ_LANES 8
#define RMOE_DQ_FN dequant_blocks_avx2
#include "ggml/ggml_dequant_impl.h"

#endif
