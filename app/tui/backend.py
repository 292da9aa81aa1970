"""The TUI's one door to the engine. `EngineBackend` is the real one; tests that
must control timing pass another object with the same two methods.

A chat object (engine.generate.ChatSession or a stand-in) has `.messages`
(list of {"role", "content"}), `.params`, `.send(text, cancel, params)` and
`.regenerate(cancel, params)`, both yielding engine.events dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from ...engine.errors import UserError
from ...engine.generate import ChatSession
from ...engine.sampling import SamplingParams
from ..remote.chat import RemoteChat
from ..remote.client import Endpoint, list_models
from ..remote.providers import resolve

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
        self.placement = placement  # engine.plan.planner.PlanRequest: budgets, mode, W_Q cache fraction

    def load(self, spec: str, n_ctx: int | None, progress: Progress) -> LoadedModel:
        from ...engine.loader import load_model  # deferred: loads the compiled kernels, gguf

        remote = resolve(spec)  # PROVIDER[:MODEL] of config.toml, or MODEL@URL: chats go to that server
        if remote is not None:
            return load_remote(spec, remote, progress)
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
        if isinstance(model.handle, Endpoint):
            return RemoteChat(model.handle, system=system or None, params=params)
        return ChatSession(model.handle, system=system or None, params=params)


def load_remote(spec: str, ep, progress: Progress) -> LoadedModel:
    """A provider's model: asked for once (/v1/models), so a wrong URL, key or model name
    fails here, in one line. The server's own defaults and context apply; our `serve` also
    says where its model lives, which the status bar shows."""
    where = ep.name or ep.base_url
    progress(f"connect {where}", 0, 1)
    models = list_models(ep)
    if ep.model is None and models:  # --endpoint without -m: the server's (first) model
        ep = replace(ep, model=models[0]["id"])
    entry = next((m for m in models if m["id"] == ep.model), None)
    if entry is None and models:
        raise UserError(f"{where} serves {', '.join(m['id'] for m in models[:8])}, not {ep.model}")
    entry = entry or {}
    progress(f"connect {where}", 1, 1)
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    n_ctx = entry.get("context_length") or entry.get("max_model_len") or 0
    placement = f"{where} · {meta['placement']}" if meta.get("placement") else f"server {ep.base_url}"
    return LoadedModel(spec=spec, name=f"{ep.model} @ {where}", n_ctx=int(n_ctx) if isinstance(n_ctx, int) else 0,
                       defaults=SamplingParams(), placement=placement, handle=ep)
