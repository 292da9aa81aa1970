"""UMIA — unified multi-level importance arbitration (DESIGN.md §2).

Per token and MoE layer: score_i = α(layer) · β(phase) · w_i over the top-k
router weights sorted descending; the critical-set size r is the number of
leading scores above θ, clamped to [r_min, r_max] (and to k). α carries the
layer's sensitivity (shallow layers matter more), β the phase's (prefill builds
the KV cache every later token reads). A profile is plain JSON:

    {"alpha": [α per layer index], "beta": {"prefill": βp, "decode": βd},
     "theta": θ, "r_min": 0, "r_max": 8}

`engine/tune/calibrate.py` fits one per (model, machine); without one,
`default_profile` applies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..hparams import ModelConfig
from ..errors import UserError

# Default modulation (no calibration), leaning to accuracy: an expert is critical
# when its weight exceeds DEFAULT_SHARE × the uniform share (top-k weight mass / k),
# shallow layers and prefill with a lower bar. With top-8 softmax weights
# (w_1 ≈ 0.2-0.5) that is 2-4 experts per token; a uniform router says nothing
# about importance, so all its experts stay critical. `calibrate` trades this
# for speed against measured KL.
DEFAULT_SHARE = 0.9
DEFAULT_ALPHA_RANGE = (1.3, 1.0)  # first layer -> last layer
DEFAULT_BETA = {"prefill": 1.25, "decode": 1.0}


@dataclass(frozen=True)
class UmiaProfile:
    alpha: tuple[float, ...]  # per layer index (blocks without routed experts are ignored)
    beta_prefill: float
    beta_decode: float
    theta: float
    r_min: int
    r_max: int
    source: str = field(default="default", compare=False)  # "default" | "calibrated"

    def to_json(self) -> dict:
        return {"alpha": [float(a) for a in self.alpha],
                "beta": {"prefill": float(self.beta_prefill), "decode": float(self.beta_decode)},
                "theta": float(self.theta), "r_min": int(self.r_min), "r_max": int(self.r_max)}

    @classmethod
    def from_json(cls, d, n_layer: int, k: int, source: str = "calibrated") -> "UmiaProfile":
        """Validated: a malformed or foreign profile raises ValueError."""
        if not isinstance(d, dict):
            raise ValueError("profile is not an object")
        alpha, beta = d.get("alpha"), d.get("beta")
        if not isinstance(alpha, list) or len(alpha) != n_layer:
            raise ValueError(f"alpha must list {n_layer} layers")
        if not isinstance(beta, dict):
            raise ValueError("beta must be an object")
        nums = [*alpha, beta.get("prefill"), beta.get("decode"), d.get("theta")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                   for v in nums):
            raise ValueError("alpha, beta and theta must be finite numbers >= 0")
        r_min, r_max = d.get("r_min"), d.get("r_max")
        if not (type(r_min) is int and type(r_max) is int and 0 <= r_min <= r_max):
            raise ValueError("need whole numbers 0 <= r_min <= r_max")
        return cls(tuple(float(a) for a in alpha), float(beta["prefill"]), float(beta["decode"]),
                   float(d["theta"]), min(r_min, k), min(r_max, k), source)


def weight_mass(cfg: ModelConfig) -> float:
    """What the top-k weights of one token sum to when renormalised (x the
    architecture's expert_weights_scale); un-normalised routers sum to less."""
    return cfg.weights_scale if cfg.weights_scale not in (0.0, 1.0) else 1.0


def smooth_alpha(n_layer: int, first: float, last: float) -> tuple[float, ...]:
    """α falling (or rising) geometrically from the first layer to the last."""
    if n_layer == 1:
        return (first,)
    return tuple(first * (last / first) ** (i / (n_layer - 1)) for i in range(n_layer))


def _file_numbers(metadata, keys: tuple[str, ...]) -> list[float] | None:
    vals = [metadata.get(f"rapidmoe.umia.{k}") for k in keys]
    ok = all(isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1e6
             for v in vals)
    return [float(v) for v in vals] if ok else None


def default_profile(cfg: ModelConfig, metadata=None) -> UmiaProfile:
    """The profile without a calibration: the model file's own (rapidmoe.umia.theta,
    .alpha and .beta, one α for every layer and one β for both phases), else the
    built-in default."""
    k = cfg.n_expert_used
    own = _file_numbers(metadata or {}, ("theta", "alpha", "beta"))
    if own is not None:
        theta, a, b = own
        return UmiaProfile(alpha=(a,) * cfg.n_layer, beta_prefill=b, beta_decode=b, theta=theta,
                           r_min=1, r_max=k, source="default")
    return UmiaProfile(alpha=smooth_alpha(cfg.n_layer, *DEFAULT_ALPHA_RANGE),
                       beta_prefill=DEFAULT_BETA["prefill"], beta_decode=DEFAULT_BETA["decode"],
                       theta=DEFAULT_SHARE * weight_mass(cfg) / k, r_min=1, r_max=k, source="default")


def critical_sizes(profile: UmiaProfile, w: np.ndarray, layer: int, prefill: bool, k: int) -> np.ndarray:
    """w [T, k] sorted descending -> r [T] int32 (numpy, for the policy and for calibration)."""
    if w.ndim != 2:
        raise ValueError("w must be [T, k]")
    a = profile.alpha[min(layer, len(profile.alpha) - 1)]
    b = profile.beta_prefill if prefill else profile.beta_decode
    score = (a * b) * w.astype(np.float64)  # [T, k]
    lead = np.cumprod(score > profile.theta, axis=1).sum(axis=1)  # leading run above θ
    return np.clip(lead, profile.r_min, min(profile.r_max, k)).astype(np.int32)


class UmiaPolicy:
    """The ResplitExperts policy: (w [T, k] sorted descending, layer, prefill) -> r [T].
    `phase` forces one phase ("prefill"/"decode") whatever T is: calibration
    scores decode behaviour on whole chunks."""

    def __init__(self, profile: UmiaProfile, k: int, phase: str | None = None):
        if phase not in (None, "prefill", "decode"):
            raise UserError(f"unknown phase {phase!r}")
        self.profile, self.k, self.phase = profile, k, phase
        self.r = "auto"  # what Model.critical reports

    def __call__(self, w: torch.Tensor, layer: int, prefill: bool) -> np.ndarray:
        if self.phase is not None:
            prefill = self.phase == "prefill"
        return critical_sizes(self.profile, w.detach().cpu().numpy(), layer, prefill, min(self.k, w.shape[1]))

    def kernel_args(self, layer: int, prefill: bool) -> tuple[int, float, float, int, int]:
        """This policy as the fused decode kernels take it: (-1, α(layer)·β(phase), θ, r_min, r_max)."""
        p = self.profile
        if self.phase is not None:
            prefill = self.phase == "prefill"
        ab = p.alpha[min(layer, len(p.alpha) - 1)] * (p.beta_prefill if prefill else p.beta_decode)
        return -1, ab, p.theta, p.r_min, min(p.r_max, self.k)
