"""A plan's parts, and the CPU mode's: everything in DRAM, a critical expert from the
pack's W_R + D4 or from the source file's own tensors (planner.py places the rest)."""
from __future__ import annotations

from dataclasses import dataclass

from ..units import fmt_bytes
from .sizes import ModelSizes, cpu_workspace_bytes


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    device: str  # "cpu" (DRAM) or "cuda:N"


def _cpu_plan(s: ModelSizes, ctx: int, chunk: int, kv_type: str, from_source: bool) -> list[Component]:
    types = ", ".join(f"{t} {fmt_bytes(b)}" for t, b in s.nonexpert_types)
    n = s.n_moe_layers * s.n_expert
    critical = ([Component(f"the model file's {n} experts (critical path, mmapped)", n * s.src_expert_bytes, "cpu")]
                if from_source else
                [Component(f"W_R of all {n} experts (gate/up residuals, mmapped)", n * s.wr_bytes, "cpu"),
                 Component(f"D4 down copies of all {n} experts (mmapped)", n * s.d4_bytes, "cpu")])
    return [
        Component(f"non-expert weights, mmapped ({types})", s.nonexpert_bytes, "cpu"),
        Component("F32 tensors copied out of the mapping (norms, routers)", s.f32_bytes, "cpu"),
        Component(f"W_Q of all {n} experts (gate/up/down, mmapped)", n * s.wq_bytes, "cpu"),
        *critical,
        Component(f"KV cache ({kv_type}, {ctx} tokens)", ctx * s.kv_bytes_per_token(kv_type), "cpu"),
        Component(f"working memory (prefill chunk {min(chunk, ctx)} over {ctx} tokens, tokenizer)",
                  cpu_workspace_bytes(s, ctx, chunk), "cpu"),
    ]


def cpu_components(s: ModelSizes, ctx: int, chunk: int, kv_type: str, critical_from: str | None,
                   dram_cap: int) -> tuple[list[Component], str, tuple[str, ...]]:
    """The CPU mode's components, where its critical experts come from ("source" or "pack")
    and a note on that choice. critical_from None: the file's tensors where they can serve
    and DRAM holds them, unless the file asks for the pack's."""
    comps, src, notes = _cpu_plan(s, ctx, chunk, kv_type, False), "pack", ()
    if critical_from != "pack" and s.src_expert_bytes:
        with_src = _cpu_plan(s, ctx, chunk, kv_type, True)
        more = sum(c.bytes for c in with_src) - sum(c.bytes for c in comps)
        if critical_from is None and s.prefers_pack:
            notes = ("critical experts from the pack's W_R + D4, as the model file asks "
                     "(--critical-from source runs them from the file)",)
        elif critical_from == "source" or sum(c.bytes for c in with_src) <= dram_cap:
            comps, src = with_src, "source"
            notes = ("critical experts run from the model file's own tensors (exact to it): keep the file; "
                     f"{fmt_bytes(more)} more DRAM than the pack's residuals",)
        else:
            notes = (f"critical experts from the pack's W_R + D4: the model file's would need {fmt_bytes(more)} "
                     "more DRAM",)
    return comps, src, notes
