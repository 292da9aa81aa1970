"""One module per architecture, named by general.architecture (engine/arch/ lists them
and holds what each reads from its file); each has build(cfg, W, n_ctx, progress)."""
from __future__ import annotations

import importlib

from ..arch import ARCHS


def arch_module(arch: str):
    return importlib.import_module(f".{ARCHS[arch].name}", __package__)
