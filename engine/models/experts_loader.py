"""Loading one layer's stacked routed experts, kept (E, out, in) as in the GGUF."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import kernels
from ..errors import UserError
from ..moe.experts import DenseExperts, QuantExperts
from ..moe.resplit import ResplitExperts
from ..weights import QWeight


def load_experts(cfg, W, il: int):
    p, H, ff, E = f"blk.{il}.", cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    if W.is_pack:  # a residual-split pack
        src = W.source  # critical experts from the source file: W_R and D4 are never read
        parts = [W.pack_part(f"{p}ffn_{kind}_exps.{fmt}", E, rows) if src is None or fmt == "wq" else None
                 for kind, fmt, rows in (("gate", "wq", ff), ("up", "wq", ff), ("down", "wq", H),
                                         ("gate", "wr", ff), ("up", "wr", ff), ("down", "d4", H))]
        source = None if src is None else (src.mat(p + "ffn_gate_exps.weight", H, ff, E),
                                           src.mat(p + "ffn_up_exps.weight", H, ff, E),
                                           src.mat(p + "ffn_down_exps.weight", ff, H, E))
        for w in source or ():
            if not isinstance(w, QWeight) or not kernels.ggml_int8_gemv(w.qtype, w.shape[-1]):
                raise UserError(f"{Path(src.path).name}: layer {il}'s experts cannot run the int8 kernels here, "
                                "so the critical experts cannot run from the file (use --critical-from pack)")
        return ResplitExperts(il, *parts, source=source)
    mats = (
        W.mat(p + "ffn_gate_exps.weight", H, ff, E),  # [E, ff, H]
        W.mat(p + "ffn_up_exps.weight", H, ff, E),  # [E, ff, H]
        W.mat(p + "ffn_down_exps.weight", ff, H, E),  # [E, H, ff]
    )
    if all(isinstance(m, torch.Tensor) for m in mats):
        return DenseExperts(*mats)
    return QuantExperts(*mats)
