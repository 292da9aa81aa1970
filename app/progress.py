"""Progress on stderr for long CLI steps (demo build, convert, load, calibrate)."""
from __future__ import annotations

import sys
import time


class StepProgress:
    """Callable progress(step, done, total). On a terminal: one bar per step with rate and
    ETA, redrawn in place. Elsewhere (a log file, a pipe, CI): plain lines, as `pull`
    prints its downloads: one when a step starts, one when a step of a second or more ends."""

    def __init__(self, enabled: bool = True, stream=None, lines: bool | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.lines = (not isatty()) if lines is None else lines
        self.step = None
        self.t0 = 0.0
        self.last = 0.0
        self.finished = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._end()

    def _end(self):
        if self.enabled and self.step is not None and not self.lines:
            self.stream.write("\n")
            self.stream.flush()
        self.step = None

    def __call__(self, step: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if step != self.step:
            self._end()
            self.step, self.t0, self.last, self.finished = step, now, 0.0, False
            if self.lines:
                self._line(f"{step} ...")
        if self.lines:
            if done >= total and not self.finished:
                self.finished = True
                if now - self.t0 >= 1.0:
                    self._line(f"{step} done in {now - self.t0:.1f} s")
            return
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        el = now - self.t0
        eta = el / frac - el if frac > 0 else 0.0
        bar = "#" * int(frac * 24)
        self.stream.write(f"\r{step:>8} [{bar:<24}] {frac * 100:5.1f}%  {el:5.1f}s  ETA {eta:5.1f}s")
        self.stream.flush()

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
