"""Each architecture's knowledge of its GGUF files, one module per general.architecture
(spec.py says what each declares). ARCHS is the one list of the architectures the
engine runs; engine/models/<arch>.py builds each."""
from __future__ import annotations

from . import deepseek2, llama, olmoe, qwen2moe, qwen3moe
from .spec import ArchSpec

ARCHS: dict[str, ArchSpec] = {a.name: a for a in (qwen3moe.ARCH, qwen2moe.ARCH, llama.ARCH, olmoe.ARCH,
                                                   deepseek2.ARCH)}
