"""Pick a model: what app/catalog.py lists (the offline demo, GGUFs already in the
Hugging Face cache, the models each provider of config.toml serves, asked in the
background, recommended Hub models with whether they fit this machine), or a path
/ `repo[:quant]` typed in (a repo is pulled, resumably, when loaded)."""
from __future__ import annotations

import asyncio
import threading

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ...catalog import ask_provider, available_models, recommended_models


class ModelPicker(ModalScreen[str | None]):
    """Opens at once: each provider of config.toml is asked for its models in a worker
    of its own, and its lines replace its "asking…" line as they arrive."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, current: str | None = None):
        super().__init__()
        self.current = current
        self._providers: dict[str, dict] = {}
        self._remote: dict[str, list[tuple[str, str]]] = {}  # provider -> its lines, as they arrive

    def _option(self, spec: str, label: str) -> Option:
        mark = "● " if spec and spec == self.current else "  "
        return Option(mark + label, id=spec or None, disabled=not spec)

    def _options(self) -> list[Option]:
        opts = [self._option(spec, label) for spec, label in self._local]
        if self._remote:
            opts.append(Option("Providers (config.toml)", disabled=True))
            opts += [self._option(spec, label) for lines in self._remote.values() for spec, label in lines]
        if self._recommended:
            opts.append(Option("Recommended from the Hugging Face Hub", disabled=True))
            opts += [Option("  " + label, id=spec or None, disabled=not spec) for spec, label in self._recommended]
        return opts

    def compose(self) -> ComposeResult:
        from ...remote.providers import provider_table  # deferred: loads torch

        self._local = available_models()
        try:
            self._providers = provider_table()
        except Exception as e:  # noqa: BLE001 - a bad [providers] block says so when one is loaded
            self._remote["?"] = [("", f"(providers unreadable: {' '.join(str(e).split())})")]
        for name, entry in self._providers.items():
            self._remote[name] = [("", f"{name} · {entry['base_url']} · asking…")]
        try:
            self._recommended = recommended_models()
        except Exception as e:  # hardware detection must not keep the picker from opening
            self._recommended = [("", f"(recommendations unavailable: {type(e).__name__})")]
        with Vertical(id="picker", classes="dialog"):
            yield Static("Models", classes="dialog-title")
            yield OptionList(*self._options(), id="model-list")
            yield Input(placeholder="a GGUF path, or REPO[:QUANT] to pull from the Hugging Face Hub",
                        id="model-spec")
            yield Static("type a name and Enter, or Tab to the list · Esc closes", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#model-spec", Input).focus()
        for name, entry in self._providers.items():
            self.run_worker(self._ask(name, entry), group="providers", exit_on_error=False)

    async def _ask(self, name: str, entry: dict) -> None:
        """The request runs on a daemon thread: a provider that has not answered when the
        picker closes (the worker is cancelled) or the app quits holds nothing up."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()

        def ask() -> None:
            lines = ask_provider(name, entry)
            try:
                loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(lines))
            except RuntimeError:  # the app has ended
                pass

        threading.Thread(target=ask, name=f"provider-{name}", daemon=True).start()
        self._arrived(name, await answer)

    def _arrived(self, name: str, lines: list[tuple[str, str]]) -> None:
        self._remote[name] = lines
        ol = self.query_one(OptionList)
        keep = ol.highlighted_option.id if ol.highlighted_option is not None else None
        ol.set_options(self._options())
        if keep is not None:
            ol.highlighted = ol.get_option_index(keep)

    @on(OptionList.OptionSelected)
    def _picked(self, ev: OptionList.OptionSelected) -> None:
        if ev.option.id:
            self.dismiss(ev.option.id)

    @on(Input.Submitted)
    def _typed(self, ev: Input.Submitted) -> None:
        spec = ev.value.strip()
        if spec:
            self.dismiss(spec)
