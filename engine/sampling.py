"""Token sampling: greedy, temperature, top-k, top-p, min-p, repeat penalty, seed.
Order as llama.cpp's default chain: penalties -> top-k -> top-p -> min-p -> temperature -> draw."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from .errors import SettingError, UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0  # OpenAI's additive penalties, over the same last-n window
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()

    def with_overrides(self, **kw) -> "SamplingParams":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "SamplingParams":
        """Defaults, replaced by the GGUF's general.sampling.* keys when it carries them."""
        keys = {"temperature": ("general.sampling.temp", float), "top_k": ("general.sampling.top_k", int),
                "top_p": ("general.sampling.top_p", float), "min_p": ("general.sampling.min_p", float),
                "repeat_penalty": ("general.sampling.penalty_repeat", float),
                "repeat_last_n": ("general.sampling.penalty_last_n", int)}
        kw = {}
        for field, (key, kind) in keys.items():
            if key in meta:
                try:
                    v = kind(meta[key])
                    cls(**{field: v}).validate()  # a file's NaN or negative default is ignored, not sampled with
                    kw[field] = v
                except (TypeError, ValueError, OverflowError, UserError):
                    pass
        return cls(**kw)

    def validate(self) -> None:
        if not 0 <= self.temperature < math.inf:  # (the negated forms refuse NaN as well)
            raise SettingError("temperature", "must be >= 0 and finite")
        if not 0 < self.top_p <= 1:
            raise SettingError("top_p", "must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise SettingError("min_p", "must be in [0, 1]")
        if self.top_k < 0:
            raise SettingError("top_k", "must be >= 0 (0 = off)")
        if not 0 < self.repeat_penalty < math.inf:
            raise SettingError("repeat_penalty", "must be > 0 and finite")
        if self.max_tokens <= 0:
            raise SettingError("max_tokens", "must be > 0")
        if self.seed is not None and not -2**63 <= self.seed < 2**64:  # what a torch.Generator takes
            raise SettingError("seed", "must be in [-2**63, 2**64)")


class Sampler:
    def __init__(self, params: SamplingParams):
        self.p = params
        self.gen = torch.Generator()
        self.gen.manual_seed(params.seed if params.seed is not None else torch.seed())

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        """logits [V] (float32) -> token id."""
        p = self.p
        logits = logits.float().clone()
        if not bool(torch.isfinite(logits).all()):  # damaged weights: say so once, never sample garbage
            raise UserError("the model computed NaN or infinite logits: its weights are damaged or out of range")
        if p.repeat_penalty != 1.0 and history:
            recent = torch.tensor(sorted(set(history[-p.repeat_last_n:])), dtype=torch.long)
            vals = logits[recent]
            logits[recent] = torch.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if (p.frequency_penalty or p.presence_penalty) and history:
            ids, counts = torch.tensor(history[-p.repeat_last_n:], dtype=torch.long).unique(return_counts=True)
            logits[ids] -= counts.float() * p.frequency_penalty + p.presence_penalty
        if p.temperature <= 0:
            return int(torch.argmax(logits))
        if p.top_k > 0:
            vals, idx = torch.topk(logits, min(p.top_k, logits.numel()))  # sorted descending
        else:
            vals, idx = torch.sort(logits, descending=True)
        probs = torch.softmax(vals, -1)
        if p.top_p < 1.0:
            cum = torch.cumsum(probs, -1)
            keep = int((cum < p.top_p).sum()) + 1  # smallest prefix reaching top_p
            vals, idx, probs = vals[:keep], idx[:keep], probs[:keep]
        if p.min_p > 0:
            probs = torch.softmax(vals, -1)
            keep = int((probs >= p.min_p * probs[0]).sum())
            vals, idx = vals[:max(keep, 1)], idx[:max(keep, 1)]
        final = torch.softmax(vals / p.temperature, -1)
        return int(idx[torch.multinomial(final, 1, generator=self.gen)])
