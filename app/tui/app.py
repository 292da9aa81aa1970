"""The Textual app: owns the config, the chat store and the engine backend, and
shows the chat screen. `run_tui(args)` is what `rapidmoe-chat` without -p runs."""
from __future__ import annotations

from importlib import resources
from typing import Any, Mapping

from textual.app import App
from textual.binding import Binding

from ...engine.errors import UserError
from ...engine.sampling import SamplingParams
from ..args import apply_offline, apply_threads, critical_setting, plan_request, remote_endpoint, sampling_overrides
from ..config import Config, load_config, to_params, update_config_file
from ..remote.providers import endpoint_spec
from ..store import ChatStore
from .backend import Backend, EngineBackend
from .commands import ChatCommands
from .paste_parser import install
from .screens.chat import SCREEN_KEYS, ChatScreen


def _css() -> str:
    return resources.files("rapidmoe.assets").joinpath("app.tcss").read_text("utf-8")


class ChatApp(App):
    CSS = _css()
    TITLE = "rapidmoe-chat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="quit", priority=True)]

    def __init__(self, *, backend: Backend | None = None, config: Config | None = None,
                 store: ChatStore | None = None, model: str | None = None, n_ctx: int | None = None,
                 system: str | None = None, overrides: Mapping[str, Any] | None = None,
                 chat_id: int | None = None):
        super().__init__()
        self.config = config or load_config()
        self.store = store or ChatStore()
        self.backend: Backend = backend or EngineBackend()
        self.model_spec = model
        self.n_ctx = n_ctx or self.config.ctx or None
        self.default_system = self.config.system if system is None else system
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.open_chat_id = chat_id
        self._theme_ready = False
        self.chat_screen: ChatScreen | None = None

    def initial_model(self) -> str:
        return self.model_spec or self.config.model or self.store.get_state("last_model") or "demo"

    def new_chat_params(self) -> dict[str, Any]:
        return {}

    def to_params_checked(self, chat_params: Mapping[str, Any]) -> SamplingParams:
        p = to_params(SamplingParams(), chat_params)
        p.validate()
        return p

    def key_summary(self) -> dict[str, str]:
        keys = {a: self.config.keys.get(a, k) for a, (k, _) in SCREEN_KEYS.items()}
        keys["send"] = self.config.keys.get("send", "enter")
        keys["newline"] = self.config.keys.get("newline", "shift+enter,ctrl+j,alt+enter")
        keys["quit"] = self.config.keys.get("quit", "ctrl+q")
        return keys

    async def on_mount(self) -> None:
        if self.config.theme in self.available_themes:
            self.theme = self.config.theme
        else:
            self.notify(f"unknown theme {self.config.theme!r} in the config; using {self.theme}",
                        severity="warning", markup=False)
        self.theme_changed_signal.subscribe(self, self._save_theme)
        keymap = {a: v for a, v in self.config.keys.items() if a in SCREEN_KEYS or a == "quit"}
        self.set_keymap(keymap)
        screen = self.chat_screen = ChatScreen()
        await self.push_screen(screen)
        spec = self.initial_model()
        if self.open_chat_id is not None:
            await screen.show_chat(self.open_chat_id)
        elif not self.store.list_chats():
            screen.greet(spec)
        screen.load(spec)

    def _save_theme(self, theme) -> None:
        name = getattr(theme, "name", str(theme))
        if name == self.config.theme:
            return
        try:
            update_config_file({"ui": {"theme": name}}, self.config.path)
            self.config.theme = name
        except (OSError, UserError) as e:
            self.notify(f"theme not saved: {e}", severity="warning", markup=False)

    def on_unmount(self) -> None:
        if self.chat_screen is not None:  # closed mid-reply (Ctrl+Q, /quit, the terminal going away)
            self.chat_screen.save_cut_reply()
        self.store.close()


def run_tui(args) -> int:
    """args: the parsed command line (model, ctx, system, sampling flags; each optional)."""
    app = app_from_args(args)
    install()
    app.run()
    return int(app.return_code or 0)


def app_from_args(args, backend: Backend | None = None) -> ChatApp:
    overrides = sampling_overrides(args)
    apply_threads(getattr(args, "threads", None))
    apply_offline(args)
    if backend is None:
        # the same rules as -p: UMIA's residual split unless told otherwise, placed by the plan
        backend = EngineBackend(critical=critical_setting(args, True), placement=plan_request(args))
    model = getattr(args, "model", None)
    if getattr(args, "endpoint", None):  # chats go through that server; -m names its model
        remote_endpoint(args)  # what only a local model has is refused in one line
        model = endpoint_spec(model, args.endpoint)
    chat_id = getattr(args, "chat", None)
    store = ChatStore()
    if not getattr(args, "no_history", False):
        store.check_writable()  # a read-only history: one line now, not a failure at the first reply
    if chat_id is None and (getattr(args, "continue_", False) or getattr(args, "continue", False)):
        last = store.last_chat()
        chat_id = last.id if last else None
    elif chat_id is not None:
        store.get_chat(int(chat_id))  # a bad id: one clear line before the screen opens
    if getattr(args, "no_history", False):  # read what was asked for, write nothing
        store = ChatStore.scratch(store, chat_id=int(chat_id) if chat_id is not None else None)
        chat_id = store.last_chat().id if chat_id is not None else None
    return ChatApp(backend=backend, store=store, model=model, n_ctx=getattr(args, "ctx", None),
                   system=getattr(args, "system", None), overrides=overrides,
                   chat_id=int(chat_id) if chat_id is not None else None)
