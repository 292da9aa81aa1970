"""This chat's system prompt and sampling settings. An empty field means "the
default" (the model's GGUF metadata, then the config file)."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from ....engine.errors import UserError
from ....engine.sampling import SamplingParams
from ...config import to_params

FIELDS = [("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float),
          ("repeat_penalty", float), ("seed", int), ("max_tokens", int), ("stop", str)]


class SettingsScreen(ModalScreen[dict | None]):
    """Dismisses with {"system": str, "params": {field: value}} or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, system: str, effective: SamplingParams, chat_params: dict):
        super().__init__()
        self.system = system
        self.effective = effective
        self.chat_params = chat_params

    def compose(self) -> ComposeResult:
        with Vertical(id="settings", classes="dialog"):
            yield Static("Chat settings", classes="dialog-title")
            yield Label("System prompt")
            yield TextArea(self.system, id="system")
            with Grid(id="sampling"):
                for name, _ in FIELDS:
                    yield Label(name)
                    cur = self.chat_params.get(name)
                    value = "" if cur is None else (", ".join(cur) if name == "stop" else str(cur))
                    shown = getattr(self.effective, name)
                    hint = ", ".join(shown) if name == "stop" else str(shown)
                    yield Input(value, placeholder=f"default: {hint or '—'}", id=f"p-{name}")
            yield Static("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def collect(self) -> dict:
        params: dict = {}
        for name, kind in FIELDS:
            raw = self.query_one(f"#p-{name}", Input).value.strip()
            if not raw:
                continue
            if kind is str:
                params[name] = [s.strip() for s in raw.split(",") if s.strip()]
                continue
            try:
                params[name] = kind(raw)
            except ValueError:
                raise UserError(f"{name}: {raw!r} is not {'an integer' if kind is int else 'a number'}") from None
        to_params(SamplingParams(), params).validate()
        return {"system": self.query_one("#system", TextArea).text.strip(), "params": params}

    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        try:
            result = self.collect()
        except UserError as e:
            self.query_one("#settings-error", Static).update(str(e))
            return
        self.dismiss(result)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
