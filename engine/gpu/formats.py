"""What a non-expert tensor becomes in VRAM, from its GGUF type and shape alone
(no torch), so that the plan counts exactly what loading places
(engine/gpu/placement.py, through the host objects engine/weights.py makes):

    F32, and every vector (norms, biases)         f32: 4 bytes per value
    attn_kv_b (legacy MLA, split on the host)     f32
    a matrix, or MLA's per-head stack, of a type  its own bytes (Q8_0/Q4_K/Q5_K/Q6_K)
      the GGUF GEMV reads
    any other matrix                              f16 (F16) or bf16: 2 bytes per value
"""
from __future__ import annotations

import math

GGUF_GEMV_TYPES = {8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}  # Q8_0, Q4_K, Q5_K, Q6_K: (block, bytes)
F32 = 0


def vram_bytes(name: str, ggml_type: int, ne: tuple[int, ...], nbytes: int) -> int:
    n = math.prod(ne)
    if ggml_type == F32 or sum(1 for d in ne if d > 1) <= 1 or name.endswith("attn_kv_b.weight"):
        return 4 * n  # {n, 1} is a vector, as the loader reads it
    if ggml_type in GGUF_GEMV_TYPES:
        return nbytes
    return 2 * n
