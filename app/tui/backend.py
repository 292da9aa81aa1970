"""The TUI's one door to the engine. `EngineBackend` is the real one; tests that
must control timing pass another object with the same two methods.

A chat object (engine.generate.ChatSession or a stand-in) has `.messages`
(list of {"role", "content"}), `.params`, `.send(text, cancel, params)` and
`.regenerate(cancel, params)`, both yielding engine.events dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ...engine.sampling import SamplingParams

# progress(what, done, total): ("load", 3, 30), ("download x.gguf · 12.0 MiB/s", bytes, bytes)
Progress = Callable[[str, int, int], None]


@dataclass
class LoadedModel:
    spec: str  # what the user asked for ("demo", a path, repo[:quant])
    name: str  # shown in the status bar
    n_ctx: int
    defaults: SamplingParams  # the model's own defaults (GGUF metadata)
    placement: str  # the loaded plan in one line: "GPU 0: attention + KV + W_Q 83% (121 GB) · CPU: residuals + ..."
    handle: Any = None  # the backend's model object
    size_bytes: int = 0
    notes: list[str] = field(default_factory=list)  # one-off remarks from loading, shown once


class Backend(Protocol):
    def load(self, spec: str, n_ctx: int | None, progress: Progress) -> LoadedModel: ...

    def new_chat(self, model: LoadedModel, system: str | None, params: SamplingParams) -> Any: ...


def _download_progress(progress: Progress):
    def cb(p):
        rate = f" · {p.rate / 2**20:.1f} MiB/s" if p.rate else ""
        eta = f" · {p.eta_s:.0f} s left" if p.eta_s is not None and p.rate else ""
        progress(f"download {p.filename} ({p.index + 1}/{p.count}){rate}{eta}", p.done, p.total or 0)

    return cb


class EngineBackend:
    """critical: None = the source weights; r or "k" = the residual-split pack
    (converted on first use) with r critical experts per token."""

    def __init__(self, critical: int | str | None = "k", placement=None):
        self.critical = critical
        self.placement = placement  # engine.plan.PlanRequest: budgets, mode, W_Q cache fraction

    def load(self, spec: str, n_ctx: int | None, progress: Progress) -> LoadedModel:
        from ...engine.model import load_model

        notes: list[str] = []
        # "demo", a path, or repo[:quant] (pulled, resumably, when the HF cache lacks it)
        m = load_model(spec, n_ctx=n_ctx or None, progress=progress,
                       download_progress=_download_progress(progress), critical=self.critical,
                       log=notes.append, placement=self.placement)
        name = str(m.metadata.get("general.name") or Path(m.path).stem)
        return LoadedModel(spec=spec, name=name, n_ctx=m.n_ctx,
                           defaults=SamplingParams.from_metadata(m.metadata),
                           placement=m.placement, handle=m,
                           size_bytes=int(m.file_bytes or 0), notes=notes)

    def new_chat(self, model: LoadedModel, system: str | None, params: SamplingParams):
        from ...engine.generate import ChatSession

        return ChatSession(model.handle, system=system or None, params=params)
