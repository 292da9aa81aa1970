"""Progress on stderr for long CLI steps (demo build, convert, load)."""
from __future__ import annotations

import sys
import time


class StepProgress:
    """Callable progress(step, done, total) drawing one bar per step with rate and ETA."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.step = None
        self.t0 = 0.0
        self.last = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._end()

    def _end(self):
        if self.enabled and self.step is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.step = None

    def __call__(self, step: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if step != self.step:
            self._end()
            self.step, self.t0, self.last = step, now, 0.0
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        el = now - self.t0
        eta = el / frac - el if frac > 0 else 0.0
        bar = "#" * int(frac * 24)
        self.stream.write(f"\r{step:>8} [{bar:<24}] {frac * 100:5.1f}%  {el:5.1f}s  ETA {eta:5.1f}s")
        self.stream.flush()
