"""The live status line: decode / prompt tok/s, time to first token,
critical-set size r (mean and a per-layer sparkline; "—" until the engine
reports it), DRAM and VRAM in use, and where the weights live. It is laid out
for its width: at 80 columns decode tok/s, r, memory and placement still show."""
from __future__ import annotations

import os

import psutil
from rich.text import Text
from textual.widgets import Static

from ....engine.memory import vram_in_use
from ....engine.units import fmt_bytes

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


def _vram() -> str | None:
    used = vram_in_use()
    return None if used is None else fmt_bytes(used)


# from the widest layout to the narrowest; the first that fits is drawn
_LEVELS = [
    dict(prompt=True, ttft=True, spark=24, labels=True),
    dict(prompt=False, ttft=True, spark=24, labels=True),
    dict(prompt=False, ttft=True, spark=12, labels=True),
    dict(prompt=False, ttft=False, spark=12, labels=True),
    dict(prompt=False, ttft=False, spark=0, labels=True),
    dict(prompt=False, ttft=False, spark=0, labels=False),
]
PLACEMENT_MIN = 28  # cells of the placement kept before the layout gets narrower


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

    def on_resize(self) -> None:
        self.redraw()

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

    def show_live(self, wrote: bool, live: dict) -> None:
        """A reply's figures while it is written (tui/reply_stream.py); wrote: text came."""
        if wrote and self.state == "thinking":
            self.set_state("writing")
        if live:
            self.set_stats(decode_tok_s=live.get("decode_tok_s"), prompt_tok_s=live.get("prompt_tok_s"),
                           ttft_s=live.get("ttft_s"), critical=live.get("critical"))

    def line_text(self, width: int | None = None) -> Text:
        """The line at `width` cells (the bar's own width when None). Narrow terminals drop
        or shorten the least needed fields first: prompt tok/s, the r sparkline, TTFT, then
        labels; decode tok/s, r, memory and placement stay (a long placement is cut)."""
        width = width or self.size.width or 200
        for lv in _LEVELS:
            head = self._line(lv)
            room = width - head.cell_len
            if room >= 0 and (not self.placement or len(self.placement) <= room or room >= PLACEMENT_MIN):
                break
        if self.placement:
            place = self.placement if len(self.placement) <= room else self.placement[:max(room - 1, 1)] + "…"
            head.append(place)
        head.truncate(width, overflow="ellipsis")
        return head

    def _line(self, lv: dict) -> Text:
        """Every field but the placement, which comes last (after " │ ")."""
        def num(v, fmt):
            return "—" if v is None else format(v, fmt)

        parts: list[list[tuple[str, str]]] = []  # fields of (text, style) runs
        if self.state:
            parts.append([(self.state, "italic")])
        decode = num(self.decode_tok_s, ".1f")
        parts.append([("decode ", ""), (decode, "bold"), (" tok/s", "")] if lv["labels"] else
                     [(decode, "bold"), (" tok/s", "")])
        if lv["prompt"]:
            parts.append([("prompt ", ""), (num(self.prompt_tok_s, ".0f"), "bold"), (" tok/s", "")])
        if lv["ttft"]:
            parts.append([("TTFT ", ""), (num(self.ttft_s, ".2f") + (" s" if self.ttft_s is not None else ""),
                                          "bold")])
        if self.critical:
            mean = sum(self.critical) / len(self.critical)
            r = [("r ", ""), (f"{mean:.1f}", "bold")]
            if lv["spark"]:
                r.append((" " + sparkline(self.critical, width=lv["spark"]), "cyan"))
            parts.append(r)
        else:
            parts.append([("r ", ""), ("—", "bold")])
        mem = f"DRAM {self.dram}" if lv["labels"] else f"RAM {self.dram}"
        if self.vram:
            mem += f" · VRAM {self.vram}" if lv["labels"] else f" · GPU {self.vram}"
        parts.append([(mem, "")])
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, runs in enumerate(parts):
            t.append(" │ " if i else " ")
            for text, style in runs:
                t.append(text, style=style)
        if self.placement:
            t.append(" │ ")
        return t

    def redraw(self) -> None:
        self.update(self.line_text())
