"""The memory check of a full-precision load (`--precision full`, or a model
without routed experts): the source weights are read from the mapping, but
the KV cache, the float32 copies of F32 tensors and small vectors, and the
working memory are allocated. A load whose allocations do not fit DRAM is
refused before any of them is made, as the split path's plan refuses it.
"""
from __future__ import annotations

from types import SimpleNamespace

import psutil

from ..errors import UserError
from ..gguf.reader import GGUFFile
from ..hparams import ModelConfig
from ..kv_types import kv_bytes, kv_values_per_token
from ..units import fmt_bytes
from .cgroup import cgroup_memory
from .planner import dram_reserve_bytes
from .sizes import cpu_workspace_bytes


def full_precision_bytes(g: GGUFFile, cfg: ModelConfig, ctx: int, kv_type: str) -> dict[str, int]:
    """What a full-precision load allocates (beyond the mapped file), by part."""
    copies = 0
    for t in g.tensors.values():
        if t.type_name == "F32" or len(t.ne) == 1:  # F32 matrices and every vector become float32 arrays
            copies += t.n_elements * 4
    shape = SimpleNamespace(n_head=cfg.n_head, n_expert_used=max(1, cfg.n_expert_used), n_embd=cfg.n_embd,
                            n_ff_exp=max(cfg.n_ff_exp, cfg.n_ff), head_dim=max(cfg.head_dim, cfg.head_dim_v),
                            n_vocab=cfg.n_vocab, n_layer=cfg.n_layer, kv_values_per_token=kv_values_per_token(cfg))
    return {"KV cache": ctx * kv_bytes(shape.kv_values_per_token, kv_type), "float32 weights": copies,
            "working memory": cpu_workspace_bytes(shape, ctx)}


def dram_budget_bytes(budget: int | None = None) -> int:
    """DRAM a load may use: the budget asked for, else what is available less the OS reserve."""
    if budget is not None:
        return budget

    vm = psutil.virtual_memory()
    total, avail = int(vm.total), int(vm.available)
    cg = cgroup_memory()
    if cg is not None and cg.limit is not None:
        total, avail = min(total, cg.limit), min(avail, max(0, cg.limit - cg.used))
    return max(0, min(total - dram_reserve_bytes(total), avail))


def check_full_precision(g: GGUFFile, cfg: ModelConfig, ctx: int, kv_type: str, dram_budget: int | None = None) -> None:
    parts = full_precision_bytes(g, cfg, ctx, kv_type)
    need, cap = sum(parts.values()), dram_budget_bytes(dram_budget)
    if need > cap:
        what = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in parts.items())
        raise UserError(f"{g.path}: full precision at a context of {ctx} tokens needs {fmt_bytes(need)} of DRAM "
                        f"({what}), {fmt_bytes(cap)} is available; use a smaller context", setting="n_ctx")
