"""The main screen: messages, the prompt, the context meter and the status bar.

A view over the chat controller (app/chat_controller.py), which owns the chat,
its history and the engine session: the screen forwards what the user does and
shows what comes back. A reply is generated in a thread worker and drawn by its
ReplyStream; `/` commands and the dialogs are in chat_actions.py, and a model
loads in chat_loading.py's panel (a message sent meanwhile waits for it, shown).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static

from ....engine.errors import UserError
from ...chat_controller import NEW_TITLE, ChatController
from ..attach import edit_in_editor, fenced_file
from ..commands import help_text
from ..reply_stream import ReplyStream
from ..widgets.chat_log import ChatLog
from ..widgets.context_meter import ContextMeter
from ..widgets.message import MessageView, Note, reply_footer
from ..widgets.prompt_input import PromptInput, key_label
from ..widgets.status_bar import StatusBar
from .chat_actions import arg_choices, open_chats, open_models, open_settings, run_slash
from .chat_loading import LoadPanel, ModelLoader

# binding id (= action, = [keys] entry in the config) -> (default key, footer label)
SCREEN_KEYS = {
    "stop": ("escape", "Stop"), "regenerate": ("ctrl+r", "Regen"), "edit_last": ("ctrl+g", "Edit"),
    "copy_reply": ("ctrl+t", "Copy"), "copy_code": ("ctrl+b", "Code"), "new_chat": ("ctrl+n", "New"),
    "chats": ("ctrl+o", "Chats"), "models": ("ctrl+l", "Models"), "settings": ("ctrl+s", "Settings"),
    "editor": ("f4", "Editor"),
}


def _shown(name: str) -> property:
    return property(lambda self: getattr(self.controller, name))


class ChatScreen(Screen):
    BINDINGS = [Binding(k, a, label, id=a, priority=True, show=a not in ("copy_code", "editor"))
                for a, (k, label) in SCREEN_KEYS.items()] + [
        # not a priority binding: with text selected in the input, Ctrl+C copies it
        Binding("ctrl+c", "interrupt", "Stop or quit", id="interrupt", show=False)]

    # the chat's state is the controller's; the screen reads it
    model, chat, engine_chat, generating = _shown("model"), _shown("chat"), _shown("session"), _shown("generating")
    last_final, last_prompt_stats, stop_latencies = (_shown("last_final"), _shown("last_prompt_stats"),
                                                     _shown("stop_latencies"))

    def __init__(self):
        super().__init__()
        app = self.app
        self.controller = ChatController(app.store, app.backend, system=app.default_system,
                                         sampling=app.config.sampling, overrides=app.overrides,
                                         new_chat_params=app.new_chat_params)
        self.stats_after_reply = False
        self._current: ReplyStream | None = None  # the reply being written, until it is stored
        self._warned_ctx = False
        self.loader = ModelLoader(self)

    def compose(self) -> ComposeResult:
        yield Static("", id="title", markup=False)
        yield ChatLog(id="log")
        yield LoadPanel(id="loading")
        keys = self.app.key_summary()
        with Horizontal(id="input-row"):
            yield PromptInput(id="prompt", send_keys=_split(keys["send"]), newline_keys=_split(keys["newline"]))
            yield ContextMeter(id="ctx")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.prompt.prompt_history = self.app.store.prompt_history()
        self.prompt.focus()
        self.prompt.arg_choices = partial(arg_choices, self.app)
        self.set_title()

    # --- what the screen is made of ---
    @property
    def log_view(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def load_panel(self) -> LoadPanel:
        return self.query_one(LoadPanel)

    @property
    def is_loading(self) -> bool:
        return self.load_panel.busy

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    def params(self):
        return self.controller.params()

    def note(self, text: str, kind: str = "info") -> Note:
        return self.log_view.note(text, kind)

    def set_title(self) -> None:
        title = self.chat.title if self.chat else NEW_TITLE
        model = f"  ·  {self.model.name}" if self.model else ""
        loading = "  ·  loading…" if self.is_loading else ""
        unsaved = "  ·  not saved (--no-history)" if not self.app.store.persistent else ""
        self.query_one("#title", Static).update(f" {title}{model}{loading}{unsaved}")

    def set_meter(self) -> None:
        if self.model is not None:
            self.query_one(ContextMeter).set_usage(0, self.model.n_ctx, self.params().max_tokens)

    def greet(self, spec: str) -> None:
        """The first screen of a new user: what is happening and what to do."""
        keys = self.app.key_summary()
        what = ("A small demo model, made for trying the app offline, is getting ready"
                if spec == "demo" else f"The model {spec} is getting ready")
        self.note(f"Welcome to rapidmoe-chat. {what}; you can type meanwhile. "
                  f"{key_label(keys['send'])} sends your message, /help lists the keys and commands, "
                  f"{key_label(keys['models'])} picks another model.")

    # --- a turn ---
    @on(PromptInput.Submitted)
    async def _on_submit(self, ev: PromptInput.Submitted) -> None:
        text = ev.text
        if text.lstrip().startswith("/"):
            self.prompt.load_text("")
            await run_slash(self, text.strip())
            return
        if self.generating:
            self.notify("A reply is still being written (Esc stops it)", severity="warning")
            return
        if self.is_loading:
            await self.loader.wait(text)
            return
        if self.model is None or self.engine_chat is None:
            self.notify("No model loaded: /model or Ctrl+L picks one", severity="warning")
            return
        self.prompt.load_text("")
        await self.send_prompt(text)

    async def send_prompt(self, text: str, view: MessageView | None = None) -> None:
        """Store the prompt and start its reply; view: the prompt already shown (it waited)."""
        self.prompt.prompt_history.append(text)
        msg = self.controller.add_prompt(text)
        self.set_title()
        if view is None:
            await self.log_view.mount(MessageView("user", text, message_id=msg.id))
        else:
            view.message_id = msg.id
            view.set_footer("")
        await self.start_reply(text)

    async def start_reply(self, text: str | None) -> None:
        """text: a new prompt to send; None: regenerate the reply to the last one."""
        events = self.controller.start_reply(text)
        view = ReplyStream(self.model.name, self.app.config.refresh_hz, self._show_live)
        await self.log_view.mount(view)
        self._current = view
        self.status.set_state("thinking")
        self.status.set_stats(reset=True)
        view.start(events, text)

    def _show_live(self, wrote: bool, live: dict) -> None:
        """The reply stream drew new text, or has new figures."""
        self.status.show_live(wrote, live)
        if "prompt" in live:
            self.controller.last_prompt_stats = live["prompt"]

    async def on_reply_stream_done(self, ev: ReplyStream.Done) -> None:
        await self._end_reply(self._show_reply_done(ev))

    async def on_reply_stream_failed(self, ev: ReplyStream.Failed) -> None:
        await self._end_reply(self._show_reply_failed(ev))

    async def _end_reply(self, shown) -> None:
        try:
            await shown
        finally:  # "generating" ends once the reply is stored and drawn
            self.controller.end_reply()
        await self.controller.run_deferred()

    async def _show_reply_done(self, ev: ReplyStream.Done) -> None:
        await ev.view.drain()
        f = ev.final
        self._current = None  # from here on the reply is stored (save_cut_reply has nothing to do)
        self.status.set_state("")
        self.status.set_stats(decode_tok_s=f.decode_tok_s, prompt_tok_s=f.prompt_tok_s or None, ttft_s=f.ttft_s)
        ev.view.message_id = self.controller.reply_done(f).id
        await ev.view.finish(f.text, reply_footer(f))
        meter = self.query_one(ContextMeter)
        meter.set_usage(f.context_used, f.context_size, self.params().max_tokens)
        if f.finish_reason == "context":
            self.note("The context window is full: the reply was cut. Start a new chat (Ctrl+N) or /clear.",
                      "warning")
        elif meter.level != "ok" and not self._warned_ctx:
            self._warned_ctx = True
            self.notify(meter.tooltip, severity="warning", timeout=6)
        if self.stats_after_reply:
            self.note(self.stats_text())

    async def _show_reply_failed(self, ev: ReplyStream.Failed) -> None:
        self._current = None
        self.status.set_state("")
        err = ev.error
        failed = self.controller.reply_failed(err, ev.prompt)
        if failed.kept is not None:  # a server failed mid-reply: what came is kept, marked cut
            ev.view.message_id = failed.kept.id
            await ev.view.finish(failed.kept.content, "cut: the server failed")
            self.note(str(err), "error")
            return
        await ev.view.remove()
        self.note(str(err) if isinstance(err, UserError) else f"generation failed: {type(err).__name__}: {err}",
                  "error")
        if failed.returned is not None:  # an unanswered prompt goes back into the input, not the history
            await self.log_view.remove_last("user")
            self.prompt.load_text(failed.returned)

    def save_cut_reply(self) -> None:
        """The app closes mid-reply: the controller keeps what was written, marked cut."""
        view = self._current
        if view is None:
            return
        self._current = None
        written, live = view.take()
        self.controller.save_cut(view.text + written, tokens=live.get("tokens", 0),
                                 decode_tok_s=live.get("decode_tok_s"), ttft_s=live.get("ttft_s"))

    def on_unmount(self) -> None:
        self.controller.cancel.set()  # the load panel cancels its load itself

    # --- generation control ---
    def action_stop(self) -> None:
        if self.is_loading:
            self.load_panel.cancel.set()
        else:
            self.controller.stop()

    def action_interrupt(self) -> None:
        """Ctrl+C: copy selected text if there is some; else stop the reply or the load
        (as Esc does); quit only when there is nothing to stop."""
        selected = self.get_selected_text()
        if selected:
            self.app.copy_to_clipboard(selected)
        elif self.generating or self.is_loading:
            self.action_stop()
        else:
            self.app.exit()

    async def action_regenerate(self) -> None:
        if not self._ready():
            return
        if self.is_loading:
            self.notify("A model is loading: regenerate once it is ready", severity="warning")
            return
        dropped = self.controller.drop_last_reply()
        if dropped is None:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        if dropped:
            await self.log_view.remove_last("assistant")
        await self.start_reply(None)

    async def action_edit_last(self) -> None:
        if not self._ready():
            return
        last = self.controller.take_back_last_prompt()
        if last is None:
            self.notify("No prompt to edit yet", severity="warning")
            return
        await self.log_view.remove_from(last.id)
        self.prompt.edit_text(last.content, focus=True)

    def _ready(self) -> bool:
        if self.generating:
            self.notify("A reply is still being written (Esc stops it)", severity="warning")
            return False
        if self.engine_chat is None:
            self.notify("No model loaded", severity="warning")
            return False
        return True

    # --- copy, the prompt ---
    def _last_reply(self, missing: str) -> MessageView | None:
        if (v := self.log_view.last_reply()) is None:
            self.notify(missing, severity="warning")
        return v

    def action_copy_reply(self) -> None:
        if (v := self._last_reply("No reply to copy")) is not None:
            v.action_copy()

    def action_copy_code(self) -> None:
        if (v := self._last_reply("No reply to copy from")) is not None:
            v.action_copy_code()

    def action_attach(self, path: str) -> None:
        """Append a text file to the prompt as a fenced block."""
        block = fenced_file(path)
        text = self.prompt.text.rstrip()
        self.prompt.edit_text((text + "\n\n" if text else "") + block)
        self.notify(f"attached {Path(path).name}", timeout=2, markup=False)

    def action_editor(self) -> None:
        """Edit the prompt in $VISUAL / $EDITOR."""
        try:
            self.prompt.edit_text(edit_in_editor(self.app, self.prompt.text), focus=True)
        except UserError as e:
            self.note(str(e), "error")

    # --- the model (chat_loading.py) ---
    def load(self, spec: str) -> None:
        self.loader.load(spec)

    async def on_load_panel_done(self, ev: LoadPanel.Done) -> None:
        await self.loader.done(ev)

    # --- chats ---
    async def show_chat(self, chat_id: int | None) -> None:
        """Switch to a stored chat (None: a new, empty one)."""
        if self.controller.defer(self.show_chat, chat_id):
            return
        try:
            messages = self.controller.open_chat(chat_id)
        except UserError as e:  # damaged stored settings, or the history failing: say so, stay
            self.notify(str(e), severity="error", markup=False)
            return
        await self.loader.return_waiting("not sent: you left that chat")
        await self.log_view.show(messages, (self.chat.model or "assistant") if self.chat else "")
        self.set_title()
        self._warned_ctx = False
        self.set_meter()

    async def action_new_chat(self) -> None:
        await self.show_chat(None)

    async def action_clear(self) -> None:
        if self.controller.defer(self.action_clear):
            return
        self.controller.clear()
        await self.show_chat(self.chat.id if self.chat else None)

    def action_chats(self) -> None:
        open_chats(self)

    def action_models(self) -> None:
        open_models(self)

    def action_settings(self) -> None:
        open_settings(self)

    def apply_settings(self, system: str | None = None, params: dict | None = None) -> None:
        self.controller.apply_settings(system, params)
        self.set_title()

    def action_export(self, path: str = "") -> None:
        if self.chat is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        out = Path(path).expanduser() if path else Path.cwd() / f"chat-{self.chat.id}.md"
        try:
            self.controller.export(out)
        except OSError as e:
            self.notify(f"cannot write {out}: {e.strerror}", severity="error", markup=False)
            return
        self.notify(f"Exported to {out}", markup=False)

    # --- what the app can tell ---
    def stats_text(self) -> str:
        return self.controller.stats_text()

    def loaded_text(self) -> str:
        s = self.status
        return self.controller.loaded_text(s.critical, f"DRAM {s.dram}" + (f" · VRAM {s.vram}" if s.vram else ""))

    def action_stats(self) -> None:
        """The last reply's figures, then what is loaded and where it lives (`ps` for this app)."""
        self.note(self.stats_text() + "\n" + self.loaded_text())

    def action_help(self) -> None:
        self.note(help_text(self.app.key_summary()))


def _split(keys: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in keys.split(",") if k.strip())
