#include "ggml_kernels.h"
#include "ggml_q8.h"
namespace rmoe { namespace ggml {
int q8_layout_avx512(int) { return Q8_NONE; }
void quantize_q8_avx512(int l, const float* x, size_t k, size_t T, uint8_t* d, size_t ld) { quantize_q8_scalar(l, x, k, T, d, ld); }
bool gemv_q8_avx512(int, const uint8_t*, size_t, size_t, size_t, const uint8_t*, size_t, size_t, float*, size_t) { return false; }
}}
namespace rmoe { namespace ggml {
bool gemv_q8_avx512vnni(int, const uint8_t*, size_t, size_t, size_t, const uint8_t*, size_t, size_t, float*, size_t) { return false; }
}}
