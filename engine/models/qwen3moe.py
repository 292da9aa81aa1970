"""Qwen3-MoE (qwen3moe): per-head RMS q/k norms before NEOX RoPE; softmax router,
top-k renormalised; no shared expert."""
from __future__ import annotations

from functools import partial

from .base import build_standard

build = partial(build_standard, qk_norm="head")
