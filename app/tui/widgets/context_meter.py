"""How full the context window is, with a warning before a reply could be cut."""
from __future__ import annotations

from textual.widgets import Static

WARN_FRACTION = 0.8


class ContextMeter(Static):
    def __init__(self, **kw):
        super().__init__("", **kw)
        self.ctx_used = 0
        self.ctx_size = 0
        self.reserve = 0  # tokens the next reply may take (max_tokens)

    def on_mount(self) -> None:
        self.redraw()

    def set_usage(self, used: int, size: int, reserve: int = 0) -> None:
        self.ctx_used, self.ctx_size, self.reserve = used, size, reserve
        self.redraw()

    @property
    def level(self) -> str:
        """"ok", "warn" (past 80% or the next reply may not fit) or "full"."""
        if not self.ctx_size:
            return "ok"
        if self.ctx_used >= self.ctx_size - 1:
            return "full"
        if self.ctx_used >= WARN_FRACTION * self.ctx_size or self.ctx_used + self.reserve > self.ctx_size:
            return "warn"
        return "ok"

    def redraw(self) -> None:
        if not self.ctx_size:
            self.update("ctx —")
            return
        frac = self.ctx_used / self.ctx_size
        width = 10
        filled = min(width, int(round(frac * width)))
        bar = "█" * filled + "░" * (width - filled)
        self.update(f"ctx {bar} {self.ctx_used}/{self.ctx_size}")
        for lvl in ("ok", "warn", "full"):
            self.set_class(self.level == lvl, f"-{lvl}")
        self.tooltip = {"ok": "context in use",
                        "warn": "the context is nearly full: the next reply may be cut (/clear or Ctrl+N)",
                        "full": "the context is full: start a new chat (Ctrl+N) or /clear"}[self.level]
