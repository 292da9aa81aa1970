"""The engine -> app seam: small frozen dataclasses yielded by generation.

The TUI and the CLI consume only these; they never call into the model.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptProcessed:
    """The prompt (the new tokens of this turn) went through the model."""

    prompt_tokens: int  # tokens processed this turn (not the cached ones)
    cached_tokens: int  # tokens reused from the KV cache
    prompt_tok_s: float
    ttft_s: float  # time from the request to the first sampled token


@dataclass(frozen=True)
class TextDelta:
    """Newly decoded text (always whole UTF-8 characters) and the running stats."""

    text: str
    completion_tokens: int
    decode_tok_s: float  # over the tokens decoded so far in this reply (None-free: 0.0 before the 2nd token)
    critical: tuple[int, ...] | None = None  # critical-set size r per MoE layer for this token; None = not split


@dataclass(frozen=True)
class Finished:
    """The reply ended. finish_reason: "stop" (EOS/EOT or a stop string), "length"
    (max tokens), "context" (context window full), "cancelled"."""

    finish_reason: str
    text: str  # the whole reply
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    prompt_tok_s: float
    decode_tok_s: float
    context_used: int  # tokens in the KV cache after this reply
    context_size: int


Event = PromptProcessed | TextDelta | Finished
