"""Memory in use: giving a replaced model's memory back to the system, and what the GPUs hold."""
from __future__ import annotations

import ctypes
import gc
import sys


def release_freed() -> None:
    """Collect garbage, then ask the C allocator to return its free pages. Without
    the second step, glibc keeps a replaced model's freed buffers (100-200 MiB for
    the demo) in its heaps, and each reload of a model leaves the process bigger."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)  # glibc; other C libraries have no malloc_trim
        except (OSError, AttributeError):
            pass


def vram_in_use() -> int | None:
    """Bytes in use on the GPUs torch can see; None where there is none (CUDA is not
    initialised when it is absent)."""
    try:
        import torch  # deferred: loads torch

        if not torch.cuda.is_available():
            return None
        return sum(total - free for free, total in map(torch.cuda.mem_get_info, range(torch.cuda.device_count())))
    except Exception:  # a driver that answers with an error shows no VRAM rather than failing the status bar
        return None
