"""The KV cache's number types (`--kv-type`, as llama.cpp's -ctk/-ctv) and what they
cost: f16 is the default (half the bytes of f32, KL against f32 far below sampling
noise); q8_0 keeps ggml's blocks of 32 values with an f16 scale (34 bytes per 32
values); f32 is exact and what the parity references with llama.cpp use. The rows
that hold them are engine/kv_cache.py's."""
from __future__ import annotations

from .arch import ARCHS
from .errors import UserError

KV_TYPES = ("f16", "q8_0", "f32")
DEFAULT_KV_TYPE = "f16"
Q8_BLOCK, Q8_BYTES = 32, 34


def check_kv_type(kv_type: str, dims=()) -> str:
    """kv_type if it names a cache type that can hold rows of every dim in dims, else a one-line error."""
    if kv_type not in KV_TYPES:
        raise UserError(f"unknown KV cache type {kv_type!r}; use one of {', '.join(KV_TYPES)}")
    bad = [d for d in dims if kv_type == "q8_0" and d % Q8_BLOCK]
    if bad:
        raise UserError(f"a q8_0 KV cache needs head sizes that are multiples of {Q8_BLOCK} (this model has {bad[0]});"
                        " use f16")
    return kv_type


def kv_bytes(values: int, kv_type: str) -> int:
    """Bytes of `values` cache values in kv_type (rows are whole q8_0 blocks)."""
    if kv_type == "q8_0":
        return -(-values // Q8_BLOCK) * Q8_BYTES
    return values * (4 if kv_type == "f32" else 2)


def kv_row_dims(cfg) -> tuple[int, ...]:
    """The lengths of the rows a model's cache keeps (its architecture's, engine/arch/:
    deepseek2 one row of latent plus rope key, the others a K and a V row per KV head)."""
    return ARCHS[cfg.arch].kv_rows(cfg)


def kv_values_per_token(cfg) -> int:
    """Cache values per token of context over all layers (its architecture's, engine/arch/)."""
    return ARCHS[cfg.arch].kv_values_per_token(cfg)
