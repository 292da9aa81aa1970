"""Loading one layer's stacked routed experts, kept (E, out, in) as in the GGUF."""
from __future__ import annotations

import torch

from ..moe.experts import DenseExperts, QuantExperts
from ..moe.resplit import ResplitExperts


def load_experts(cfg, W, il: int):
    p, H, ff, E = f"blk.{il}.", cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    if W.is_pack:  # a residual-split pack
        parts = [W.pack_part(f"{p}ffn_{kind}_exps.{fmt}", E, rows)
                 for kind, fmt, rows in (("gate", "wq", ff), ("up", "wq", ff), ("down", "wq", H),
                                         ("gate", "wr", ff), ("up", "wr", ff), ("down", "d4", H))]
        return ResplitExperts(il, *parts)
    mats = (
        W.mat(p + "ffn_gate_exps.weight", H, ff, E),  # [E, ff, H]
        W.mat(p + "ffn_up_exps.weight", H, ff, E),  # [E, ff, H]
        W.mat(p + "ffn_down_exps.weight", ff, H, E),  # [E, H, ff]
    )
    if all(isinstance(m, torch.Tensor) for m in mats):
        return DenseExperts(*mats)
    return QuantExperts(*mats)
