"""Argument types shared by the subcommands: a bad value is argparse's one-line
error (exit 2) before anything is loaded."""
from __future__ import annotations

import argparse

MAX_THREADS = 1024  # more is a typo: each thread costs the OpenMP runtime and the kernels' pool memory


def threads(v: str) -> int:
    """--threads: a whole number of CPU threads in 1..MAX_THREADS."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads, got {v!r}") from None
    if not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_THREADS}, got {n}")
    return n
