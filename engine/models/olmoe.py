"""OLMoE (olmoe): RMS q/k norms over the full projections (before the head
split), NEOX RoPE; softmax router without top-k renormalisation."""
from __future__ import annotations

from functools import partial

from .base import build_standard

build = partial(build_standard, qk_norm="full")
