"""The GPU executor.

kernels.py      the CUDA kernels (csrc/cuda) through the driver API; built on first
                use by engine/gpu/cuda_build.py (nvcc, else NVRTC from pip's CUDA wheels)
driver.py       ctypes over libcuda: modules, contexts, launches
wq_cache.py     which experts' W_Q live on the GPU (hottest first, within a budget)
schedule.py     the residual-split schedule of one MoE layer over device.py's small
                interface (the GPU, or CPU tensors standing in for it in tests)
prefill.py      W_Q experts over many tokens: dequantize to bf16 + tensor-core GEMM
placement.py    non-expert weights on the GPU in their GGUF types
graphs.py       a decode token's GPU work between host waits as CUDA graphs, captured
                once per layer and KV bucket
executor.py     attach_plan: a loaded model onto the GPU(s) exactly as its Plan says
profile.py      how busy the GPU was (CUPTI)
reference.py    float64 oracle of a split layer
"""
