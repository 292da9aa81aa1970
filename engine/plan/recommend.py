"""Recommended Hub models and whether each fits this machine, from `plan`
alone: the architecture keys of each model's GGUF header are in
assets/recommended_models.toml, so nothing is downloaded to decide. Expert
bytes are the pack's exactly; non-expert bytes are estimated at the quant's
typical width (Q4_K_M: 4.5 bpw matrices, 6.5625 bpw output head)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from ..hparams import config_from_metadata
from .planner import Plan, plan
from ..kv_types import kv_row_dims, kv_values_per_token
from .sizes import ModelSizes, expert_part_bytes

MATRIX_BPW, HEAD_BPW = 4.5, 6.5625


@dataclass(frozen=True)
class Recommendation:
    spec: str
    title: str
    sizes: ModelSizes
    plan: Plan


def _sizes(spec: str, meta: dict) -> ModelSizes:
    cfg = config_from_metadata(meta, spec)
    H, E = cfg.n_embd, cfg.n_expert
    attn = H * cfg.n_head * cfg.head_dim + 2 * H * cfg.n_head_kv * cfg.head_dim + cfg.n_head * cfg.head_dim_v * H
    shared = 3 * H * cfg.n_ff_shexp + (H if cfg.n_ff_shexp else 0)
    layer = int((attn + shared) * MATRIX_BPW / 8) + H * E * 4 + 2 * H * 4  # + f32 router and norms
    wq, wr, d4 = expert_part_bytes(cfg)
    embd = int(cfg.n_vocab * H * MATRIX_BPW / 8)
    head = int(cfg.n_vocab * H * HEAD_BPW / 8)
    expert_src = int(cfg.n_layer * E * 3 * H * cfg.n_ff_exp * 4.85 / 8)
    return ModelSizes(
        name=spec, arch=cfg.arch, n_layer=cfg.n_layer, n_ctx_train=cfg.n_ctx_train, n_embd=H, n_head=cfg.n_head,
        n_vocab=cfg.n_vocab, n_expert=E, n_expert_used=cfg.n_expert_used, n_ff_exp=cfg.n_ff_exp,
        head_dim=max(cfg.head_dim, cfg.head_dim_v), expert_layers=tuple(range(cfg.n_layer)), wq_bytes=wq,
        wr_bytes=wr, d4_bytes=d4, layer_bytes=(layer,) * cfg.n_layer, gpu_layer_bytes=(layer,) * cfg.n_layer,
        embd_bytes=embd, head_bytes=head, tied_head=False, gpu_head_bytes=head, f32_bytes=cfg.n_layer * (H * E * 4 + 2 * H * 4), nonexpert_types=(("Q4_K_M (est.)", layer * cfg.n_layer + embd + head),),
        kv_values_per_token=kv_values_per_token(cfg), kv_row_dims=kv_row_dims(cfg),
        source_bytes=layer * cfg.n_layer + embd + head + expert_src)


def recommendations(hw, ctx: int = 4096) -> list[Recommendation]:
    """Every recommended model with its plan on `hw` (fits or not, and why)."""
    data = tomllib.loads(resources.files("rapidmoe.assets").joinpath("recommended_models.toml").read_text("utf-8"))
    out = []
    for m in data.get("model", []):
        sizes = _sizes(m["spec"], m["meta"])
        out.append(Recommendation(m["spec"], m["title"], sizes, plan(sizes, hw, min(ctx, sizes.n_ctx_train))))
    return out
