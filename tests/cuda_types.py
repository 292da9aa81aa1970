"""The GGUF types the CUDA kernels take, for tests/test_cuda_compile.py and
tests/test_cuda_emulated.py: ggml type id -> (name, weights per block, bytes per
block, byte offsets of the block's f16 scales)."""
GGML = {8: ("Q8_0", 32, 34, [0]), 12: ("Q4_K", 256, 144, [0, 2]), 13: ("Q5_K", 256, 176, [0, 2]),
        14: ("Q6_K", 256, 210, [208])}
