"""Giving a replaced model's memory back to the system."""
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
