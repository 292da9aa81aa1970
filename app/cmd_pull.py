"""`rapidmoe-chat pull REPO[:QUANT]`: download a GGUF model into the Hugging Face cache.

Progress goes to stderr (a live bar on a terminal, a line per file otherwise);
the downloaded paths go to stdout, one per line, first part first, so
`$(rapidmoe-chat pull ...)` works in scripts.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..engine.hub.pull import DEFAULT_QUANT, DownloadProgress, pull


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="REPO[:QUANT]",
                   help=f"Hugging Face repo with GGUF files, e.g. unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M "
                        f"(quant matched case-insensitively, default {DEFAULT_QUANT}); or a local .gguf path")
    p.add_argument("--offline", action="store_true",
                   help="use the local Hugging Face cache only (same as HF_HUB_OFFLINE=1)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _eta(s: float | None) -> str:
    if s is None:
        return "--:--"
    s = int(s + 0.5)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class LineProgress:
    """Non-terminal stderr: one line when a file starts and one when it ends."""

    def __init__(self, out=None):
        self.out = out or sys.stderr
        self.started: dict[int, float] = {}

    def __call__(self, p: DownloadProgress) -> None:
        tag = f"[{p.index + 1}/{p.count}] {p.filename}"
        total = _human(p.total) if p.total is not None else "?"
        if p.index not in self.started:
            self.started[p.index] = time.monotonic()
            if not p.finished:
                resume = f", resuming at {_human(p.resumed_from)}" if p.resumed_from else ""
                print(f"downloading {tag} ({total}{resume})", file=self.out, flush=True)
        if p.finished:
            dt = max(time.monotonic() - self.started[p.index], 1e-6)
            got = p.done - p.resumed_from
            how = f"{_human(got)} in {dt:.1f} s, {_human(got / dt)}/s" if got else "already in the cache"
            print(f"done {tag} ({total}; {how})", file=self.out, flush=True)

    def close(self) -> None:
        pass


class BarProgress:
    """Terminal stderr: a rich progress bar per file with bytes, rate and ETA."""

    def __init__(self, console=None):
        from rich.console import Console  # deferred: loads rich
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn  # deferred: loads rich

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("ETA {task.fields[eta]}"),
            console=console or Console(stderr=True), transient=False,
        )
        self.tasks: dict[int, int] = {}

    def __call__(self, p: DownloadProgress) -> None:
        if not self.tasks:
            self.progress.start()  # lazily: nothing live on screen while resolving or on errors
        if p.index not in self.tasks:
            desc = f"[{p.index + 1}/{p.count}] {p.filename}"
            self.tasks[p.index] = self.progress.add_task(desc, total=p.total, rate="", eta="--:--")
        rate = f"{_human(p.rate)}/s" if p.rate > 0 else ""
        self.progress.update(self.tasks[p.index], completed=p.done, total=p.total, rate=rate,
                             eta="0:00" if p.finished else _eta(p.eta_s))

    def close(self) -> None:
        self.progress.stop()


def run(args: argparse.Namespace) -> int:
    show = None if args.quiet else (BarProgress() if sys.stderr.isatty() else LineProgress())
    try:
        paths = pull(args.model, offline=args.offline, progress=show)
    except KeyboardInterrupt:
        if show:
            show.close()
        print("\ninterrupted: the partial download stays in the Hugging Face cache; "
              "run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        if show:
            show.close()
    for p in paths:
        print(p)
    return 0
