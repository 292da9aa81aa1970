"""GGUF files: a bounds-checked, memory-mapped reader and the quant oracles."""
from .reader import GGUFFile, TensorInfo, read_metadata

__all__ = ["GGUFFile", "TensorInfo", "read_metadata"]
