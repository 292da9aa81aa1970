"""The live status line: model, decode / prompt tok/s, time to first token,
critical-set size r (mean and a per-layer sparkline; "—" until the engine
reports it), DRAM and VRAM in use, and where the weights live."""
from __future__ import annotations

import os

import psutil
from rich.text import Text
from textual.widgets import Static

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values, top: int | None = None, width: int = 24) -> str:
    """One block per layer; more layers than `width` are averaged in equal buckets."""
    if not values:
        return ""
    values = list(values)
    if len(values) > width:
        n = len(values)
        values = [sum(values[i * n // width:(i + 1) * n // width]) / len(values[i * n // width:(i + 1) * n // width])
                  for i in range(width)]
    hi = max(top or 0, max(values), 1)
    return "".join(SPARK[min(len(SPARK) - 1, int(v * (len(SPARK) - 1) / hi + 0.5))] for v in values)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _vram() -> str | None:
    """VRAM in use on the GPUs torch can see, without initialising CUDA if it is absent."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        used = sum(torch.cuda.mem_get_info(i)[1] - torch.cuda.mem_get_info(i)[0]
                   for i in range(torch.cuda.device_count()))
        return fmt_bytes(used)
    except Exception:
        return None


class StatusBar(Static):
    def __init__(self, **kw):
        super().__init__("", **kw)
        self.model = "no model"
        self.placement = ""
        self.state = ""
        self.decode_tok_s: float | None = None
        self.prompt_tok_s: float | None = None
        self.ttft_s: float | None = None
        self.critical: tuple[int, ...] | None = None
        self.dram = ""
        self.vram: str | None = None
        self._proc = psutil.Process(os.getpid())

    def on_mount(self) -> None:
        self.sample_memory()
        self.set_interval(1.0, self.sample_memory)

    def sample_memory(self) -> None:
        self.dram = fmt_bytes(self._proc.memory_info().rss)
        self.vram = _vram()
        self.redraw()

    def set_model(self, name: str, placement: str) -> None:
        self.model, self.placement = name, placement
        self.redraw()

    def set_state(self, state: str) -> None:
        self.state = state
        self.redraw()

    def set_stats(self, *, decode_tok_s=None, prompt_tok_s=None, ttft_s=None, critical=None,
                  reset: bool = False) -> None:
        if reset:
            self.decode_tok_s = self.prompt_tok_s = self.ttft_s = None
            self.critical = None
        if decode_tok_s is not None:
            self.decode_tok_s = decode_tok_s
        if prompt_tok_s is not None:
            self.prompt_tok_s = prompt_tok_s
        if ttft_s is not None:
            self.ttft_s = ttft_s
        if critical is not None:
            self.critical = tuple(critical)
        self.redraw()

    def line_text(self) -> Text:
        def num(v, fmt):
            return "—" if v is None else format(v, fmt)

        t = Text(no_wrap=True, overflow="ellipsis")
        if self.state:
            t.append(f" {self.state} ", style="italic")
            t.append("│")
        t.append(" decode ")
        t.append(num(self.decode_tok_s, ".1f"), style="bold")
        t.append(" tok/s │ prompt ")
        t.append(num(self.prompt_tok_s, ".0f"), style="bold")
        t.append(" tok/s │ TTFT ")
        t.append(num(self.ttft_s, ".2f") + (" s" if self.ttft_s is not None else ""), style="bold")
        t.append(" │ r ")
        if self.critical:
            mean = sum(self.critical) / len(self.critical)
            t.append(f"{mean:.1f} ", style="bold")
            t.append(sparkline(self.critical), style="cyan")
        else:
            t.append("—", style="bold")
        t.append(f" │ DRAM {self.dram}")
        if self.vram:
            t.append(f" │ VRAM {self.vram}")
        if self.placement:
            t.append(f" │ {self.placement}")
        return t

    def redraw(self) -> None:
        self.update(self.line_text())
