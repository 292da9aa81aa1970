"""Router math exactly as llama.cpp does it per architecture (DESIGN.md §5)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels

from ..hparams import GATING_SIGMOID, ModelConfig


@dataclass(frozen=True)
class RouterSpec:
    n_expert: int
    k: int
    sigmoid: bool
    norm_topk: bool
    scale: float  # 0 or 1: none
    n_groups: int  # > 1: group-limited top-k
    n_group_used: int

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> "RouterSpec":
        return cls(cfg.n_expert, cfg.n_expert_used, cfg.gating == GATING_SIGMOID, cfg.norm_topk,
                   cfg.weights_scale, cfg.n_expert_groups, cfg.n_group_used)


def route(logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None):
    """logits [T, E] -> (ids [T, k] int64 sorted by selection score, weights [T, k] f32).
    The selection adds the bias (exp_probs_b); the weights use unbiased probabilities.
    On the CPU this is the kernel the fused decode uses (ties: lower id first)."""
    if logits.device.type == "cpu":
        ids, w = kernels.route(logits.detach().numpy(), spec.k, spec.sigmoid, spec.norm_topk, spec.scale,
                               None if bias is None else bias.detach().float().numpy(), spec.n_groups,
                               spec.n_group_used)
        return torch.from_numpy(ids).long(), torch.from_numpy(w)
    probs = torch.sigmoid(logits) if spec.sigmoid else torch.softmax(logits, dim=-1)  # [T, E]
    sel = probs + bias if bias is not None else probs
    if spec.n_groups > 1:
        T = sel.shape[0]
        groups = sel.view(T, spec.n_groups, -1)  # [T, G, E/G]
        group_score = groups.topk(2, dim=-1).values.sum(-1)  # [T, G]: sum of each group's top 2
        keep = group_score.topk(spec.n_group_used, dim=-1).indices  # [T, g]
        mask = torch.ones(T, spec.n_groups, dtype=torch.bool, device=sel.device)
        mask.scatter_(1, keep, False)
        sel = groups.masked_fill(mask[:, :, None], float("-inf")).view(T, -1)
    ids = sel.topk(spec.k, dim=-1).indices  # [T, k]
    w = probs.gather(1, ids)  # [T, k]
    if spec.norm_topk:
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    if spec.scale not in (0.0, 1.0):
        w = w * spec.scale
    return ids, w
