"""Perplexity and divergence of a model over a text: the engine's reference door."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ContextError, UserError

CHUNK = 256


def all_logits(model, tokens: list[int], progress=None, policy=None) -> np.ndarray:
    """tokens [T] -> logits float32 [T, V], row i = logits after token i (policy:
    the critical-set policy; None: the model's own)."""
    if len(tokens) > model.n_ctx:
        raise ContextError("the text", len(tokens), model.n_ctx)
    cache = model.runner.new_cache(model.n_ctx)
    out = np.empty((len(tokens), model.cfg.n_vocab), dtype=np.float32)
    for i in range(0, len(tokens), CHUNK):
        chunk = tokens[i:i + CHUNK]
        out[i:i + len(chunk)] = model.runner.prefill(chunk, i, cache, policy)[0].numpy()
        if progress:
            progress("eval", min(i + CHUNK, len(tokens)), len(tokens))
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def perplexity(tokens: list[int], logits: np.ndarray) -> float:
    if len(tokens) < 2:
        raise UserError("the text must be at least 2 tokens long for perplexity")
    lp = log_softmax(logits[:-1])
    nll = -lp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]
    return float(np.exp(nll.mean()))


@dataclass(frozen=True)
class Divergence:
    kl_mean: float
    kl_p99: float
    top1: float
    n: int


def divergence(base_logits: np.ndarray, logits: np.ndarray) -> Divergence:
    """KL(base || model) per position, and top-1 agreement."""
    lb, lm = log_softmax(base_logits), log_softmax(logits)
    kl = (np.exp(lb) * (lb - lm)).sum(-1)
    top1 = float((base_logits.argmax(-1) == logits.argmax(-1)).mean())
    return Divergence(float(kl.mean()), float(np.percentile(kl, 99)), top1, int(len(kl)))


def save_logits(path: Path, tokens: list[int], logits: np.ndarray) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, tokens=np.asarray(tokens, dtype=np.int32), logits=logits.astype(np.float32))
    tmp.replace(path)


def load_logits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return z["tokens"], z["logits"]
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (KeyError, ValueError, OSError) as e:
        raise UserError(f"{path}: not a logits file from `eval --save-logits` ({e})") from None
