// AVX-512 dequantization of GGUF types, bit-exact with the scalar reference (the
// unpackers live in ggml_unpack_avx512.h, the body in ggml_dequant_impl.h). Only
// called after isa.cpp has checked the CPU and OS.
#include "ggml/ggml_kernels.h"

#if RMOE_X86
#include "ggml/ggml_unpack_avx512.h"

#define RMOE_DQ_NS avx512
#define RMOE_DQ_VEC __m512
#define RMOE_DQ_STORE _mm512_storeu_ps
#define RMOE_DQ_LANES 16
#define RMOE_DQ_FN dequant_blocks_avx512
#include "ggml/ggml_dequant_impl.h"

#endif
