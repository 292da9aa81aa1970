"""The GPU executor: CUDA kernels through the driver API (kernels.py), the W_Q
cache (wq_cache.py), the residual-split schedule (schedule.py) over a small
device interface (device.py) that CPU tensors can stand in for, and non-expert
weights kept in their GGUF types on the GPU (placement.py)."""
