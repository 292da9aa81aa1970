"""One module per architecture, named by general.architecture."""
from __future__ import annotations

import importlib

ARCH_MODULES = {"qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "llama": "llama", "olmoe": "olmoe",
                "deepseek2": "deepseek2"}


def arch_module(arch: str):
    return importlib.import_module(f".{ARCH_MODULES[arch]}", __package__)
