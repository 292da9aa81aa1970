"""The main screen: messages, the prompt, the context meter and the status bar.

Engine work runs in thread workers. A reply's deltas go into a buffer under a
lock; a timer drains it at `refresh_hz` and appends the new text to the reply's
Markdown, so the screen redraws ~25 times a second whatever the token rate.
"""
from __future__ import annotations

import inspect
import threading
import time

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from ....engine.errors import UserError
from ....engine.events import Finished, PromptProcessed
from ...config import to_params
from ..commands import static_choices
from ..reply_stream import ReplyStream
from ..widgets.context_meter import ContextMeter
from ..widgets.message import MessageView, Note
from ..widgets.prompt_input import PromptInput, key_label
from ..widgets.status_bar import StatusBar
from .chat_actions import ChatActions
from .chat_loading import ModelLoading
from .model_picker import available_models

# binding id (= action, = [keys] entry in the config) -> (default key, footer label)
SCREEN_KEYS = {
    "stop": ("escape", "Stop"), "regenerate": ("ctrl+r", "Regen"), "edit_last": ("ctrl+g", "Edit"),
    "copy_reply": ("ctrl+t", "Copy"), "copy_code": ("ctrl+b", "Code"), "new_chat": ("ctrl+n", "New"),
    "chats": ("ctrl+o", "Chats"), "models": ("ctrl+l", "Models"), "settings": ("ctrl+s", "Settings"),
    "editor": ("f4", "Editor"),
}


class ReplyDone(Message):
    def __init__(self, final: Finished, view: MessageView):
        super().__init__()
        self.final, self.view = final, view


class ReplyFailed(Message):
    def __init__(self, error: BaseException, view: MessageView, prompt: str | None):
        super().__init__()
        self.error, self.view, self.prompt = error, view, prompt


class ChatScreen(ChatActions, ModelLoading, Screen):
    BINDINGS = [Binding(k, a, label, id=a, priority=True, show=a not in ("copy_code", "editor"))
                for a, (k, label) in SCREEN_KEYS.items()] + [
        # not a priority binding: with text selected in the input, Ctrl+C copies it
        Binding("ctrl+c", "interrupt", "Stop or quit", id="interrupt", show=False)]

    def __init__(self):
        super().__init__()
        self.model = None  # backend.LoadedModel
        self.engine_chat = None  # the backend's chat object (messages + KV cache)
        self._engine_model = None  # the model engine_chat was made for
        self.chat = None  # store.Chat, created on the first prompt
        self.generating = False
        self.is_loading = False
        self.cancel = threading.Event()
        self.load_cancel = threading.Event()
        self.stream = ReplyStream()
        self._current: MessageView | None = None
        self.stop_requested_at: float | None = None
        self.stop_latencies: list[float] = []
        self.last_final: Finished | None = None
        self.last_prompt_stats: PromptProcessed | None = None
        self.stats_after_reply = False
        self._warned_ctx = False
        self._after_reply: list = []  # calls deferred until the reply being written has stopped
        self._load_seq = 0
        self._waiting: tuple[str, MessageView] | None = None  # a message sent while the model loads

    def compose(self) -> ComposeResult:
        yield Static("", id="title", markup=False)
        yield VerticalScroll(id="log")
        with Horizontal(id="loading"):
            yield Static("", id="load-what", markup=False)
            yield ProgressBar(id="load-bar", show_eta=False)
        keys = self.app.key_summary()
        with Horizontal(id="input-row"):
            yield PromptInput(id="prompt", send_keys=_split(keys["send"]), newline_keys=_split(keys["newline"]))
            yield ContextMeter(id="ctx")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#loading").display = False
        self.query_one("#log", VerticalScroll).anchor()  # follow new text unless the user scrolls up
        self.query_one(PromptInput).prompt_history = self.app.store.prompt_history()
        self.query_one(PromptInput).focus()
        self.query_one(PromptInput).arg_choices = self.arg_choices
        self.set_interval(1 / self.app.config.refresh_hz, self._drain)
        self._set_title()

    # --- helpers used by the actions ---
    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#log", VerticalScroll)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    def note(self, text: str, kind: str = "info") -> Note:
        n = Note(text, kind)
        self.log_view.mount(n)
        return n

    def _set_title(self) -> None:
        title = self.chat.title if self.chat else "New chat"
        model = f"  ·  {self.model.name}" if self.model else ""
        loading = "  ·  loading…" if self.is_loading else ""
        unsaved = "  ·  not saved (--no-history)" if not self.app.store.persistent else ""
        self.query_one("#title", Static).update(f" {title}{model}{loading}{unsaved}")

    def greet(self, spec: str) -> None:
        """The first screen of a new user: what is happening and what to do."""
        keys = self.app.key_summary()
        what = ("A small demo model, made for trying the app offline, is getting ready"
                if spec == "demo" else f"The model {spec} is getting ready")
        self.note(f"Welcome to rapidmoe-chat. {what}; you can type meanwhile. "
                  f"{key_label(keys['send'])} sends your message, /help lists the keys and commands, "
                  f"{key_label(keys['models'])} picks another model.")

    def arg_choices(self, command: str) -> list[str]:
        if command == "/theme":
            return list(self.app.available_themes)
        if command == "/model":
            return [spec for spec, _ in available_models() if spec]
        return static_choices(command)

    # --- model loading (the rest is in loading.py) ---
    def defer_while_generating(self, fn, *args) -> bool:
        """Stop the reply being written and run fn(*args) once it is stored; True if deferred.
        Switching chats or models mid-reply must not store the reply in the wrong place."""
        if not self.generating:
            return False
        self.action_stop()
        self._after_reply.append((fn, args))
        return True

    async def _run_deferred(self) -> None:
        calls, self._after_reply = self._after_reply, []
        for fn, args in calls:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result

    # --- engine chat state ---
    def params(self):
        """Model defaults < config [sampling] < command-line flags < this chat's own settings
        (set later and on purpose, with /set or the settings screen)."""
        base = self.model.defaults if self.model else None
        return to_params(base, self.app.config.sampling, self.app.overrides,
                         self.chat.params if self.chat else {})

    def system_prompt(self) -> str:
        return self.chat.system if self.chat else self.app.default_system

    def rebuild_engine_chat(self) -> None:
        """Give the engine chat this chat's system prompt and history. The engine chat (and
        its KV cache) is kept per model: the next turn recomputes only what differs."""
        if self.model is None:
            self.engine_chat = None
            return
        if self.engine_chat is None or self._engine_model is not self.model:
            self.engine_chat = self.app.backend.new_chat(self.model, None, self.params())
            self._engine_model = self.model
        system = self.system_prompt()
        msgs = [{"role": "system", "content": system}] if system else []
        if self.chat is not None:
            msgs += self.app.store.context(self.chat.id)  # an unanswered prompt is not sent
        self.engine_chat.messages[:] = msgs
        self.engine_chat.params = self.params()

    # --- generation ---
    @on(PromptInput.Submitted)
    async def _on_submit(self, ev: PromptInput.Submitted) -> None:
        text = ev.text
        if text.lstrip().startswith("/"):
            self.prompt.load_text("")
            await self.run_slash(text.strip())
            return
        if self.generating:
            self.notify("A reply is still being written (Esc stops it)", severity="warning")
            return
        if self.is_loading:
            await self.wait_for_model(text)
            return
        if self.model is None or self.engine_chat is None:
            self.notify("No model loaded: /model or Ctrl+L picks one", severity="warning")
            return
        self.prompt.load_text("")
        await self.send_prompt(text)

    async def send_prompt(self, text: str, view: MessageView | None = None) -> None:
        """Store the prompt and start its reply; view: the prompt already shown (it waited)."""
        self.prompt.prompt_history.append(text)
        store = self.app.store
        if self.chat is None:
            self.chat = store.create_chat(_title_from(text), model=self.model.spec,
                                          system=self.app.default_system,
                                          params=self.app.new_chat_params())
            self._set_title()
        elif self.chat.title == "New chat" and not store.messages(self.chat.id):
            store.rename_chat(self.chat.id, _title_from(text))  # made early by a setting
            self.chat = store.get_chat(self.chat.id)
            self._set_title()
        msg = store.add_message(self.chat.id, "user", text)
        if view is None:
            await self.log_view.mount(MessageView("user", text, message_id=msg.id))
        else:
            view.message_id = msg.id
            view.set_footer("")
        await self.start_reply(text)

    async def start_reply(self, text: str | None) -> None:
        """text: a new prompt to send; None: regenerate the reply to the last one."""
        self.cancel = threading.Event()
        self.stop_requested_at = None
        view = MessageView("assistant", label=self.model.name, streaming=True)
        await self.log_view.mount(view)
        self._current = view
        self.generating = True
        self.status.set_state("thinking")
        self.status.set_stats(reset=True)
        chat, cancel, params, stream = self.engine_chat, self.cancel, self.params(), self.stream
        stream.reset()

        def work() -> None:
            try:
                it = chat.send(text, cancel, params) if text is not None else chat.regenerate(cancel, params)
                for e in it:
                    if (final := stream.put(e)) is not None:
                        self.post_message(ReplyDone(final, view))
            except BaseException as e:
                self.post_message(ReplyFailed(e, view, text))

        self.run_worker(work, thread=True, group="generate")

    async def _drain(self) -> None:
        """The timer: move buffered deltas into the reply being written."""
        view = self._current
        text, live = self.stream.take()
        if view is None:
            return
        if text:
            view.feed(text)
            await view.flush()
            if self.status.state == "thinking":
                self.status.set_state("writing")
        if live:
            self.status.set_stats(decode_tok_s=live.get("decode_tok_s"), prompt_tok_s=live.get("prompt_tok_s"),
                                  ttft_s=live.get("ttft_s"), critical=live.get("critical"))
            if "prompt" in live:
                self.last_prompt_stats = live["prompt"]

    @on(ReplyDone)
    async def _on_reply_done(self, ev: ReplyDone) -> None:
        try:
            await self._show_reply_done(ev)
        finally:  # "generating" ends once the reply is stored and drawn
            self.generating = False
        await self._run_deferred()

    async def _show_reply_done(self, ev: ReplyDone) -> None:
        await self._drain()
        f = ev.final
        self._current = None  # from here on the reply is stored (save_cut_reply has nothing to do)
        self.last_final = f
        if self.stop_requested_at is not None:
            latency = time.perf_counter() - self.stop_requested_at
            self.stop_latencies.append(latency)
            self.stop_requested_at = None
        self.status.set_state("")
        self.status.set_stats(decode_tok_s=f.decode_tok_s, prompt_tok_s=f.prompt_tok_s or None, ttft_s=f.ttft_s)
        stats = {"finish_reason": f.finish_reason, "prompt_tokens": f.prompt_tokens,
                 "completion_tokens": f.completion_tokens, "ttft_s": round(f.ttft_s, 4),
                 "prompt_tok_s": round(f.prompt_tok_s, 2), "decode_tok_s": round(f.decode_tok_s, 2),
                 "context_used": f.context_used, "context_size": f.context_size, **self._answered_by()}
        msg = self.app.store.add_message(self.chat.id, "assistant", f.text, stats)
        ev.view.message_id = msg.id
        await ev.view.finish(f.text, _footer(f))
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

    @on(ReplyFailed)
    async def _on_reply_failed(self, ev: ReplyFailed) -> None:
        try:
            await self._show_reply_failed(ev)
        finally:
            self.generating = False
        await self._run_deferred()

    def _answered_by(self) -> dict:
        """A provider's reply records who answered: {"answered_by": "provider:NAME/MODEL"}."""
        by = getattr(self.engine_chat, "answered_by", None)
        return {"answered_by": by} if by else {}

    async def _show_reply_failed(self, ev: ReplyFailed) -> None:
        self._current = None
        self.status.set_state("")
        err = ev.error
        partial = getattr(err, "partial", "")
        if partial and self.chat is not None:  # a server failed mid-reply: what came is kept, marked cut
            stats = {"finish_reason": "cut", "cut": "server", **self._answered_by()}
            msg = self.app.store.add_message(self.chat.id, "assistant", partial, stats)
            ev.view.message_id = msg.id
            await ev.view.finish(partial, "cut: the server failed")
            self.note(str(err), "error")
            return
        await ev.view.remove()
        self.note(str(err) if isinstance(err, UserError) else f"generation failed: {type(err).__name__}: {err}",
                  "error")
        # a prompt that could not be answered goes back into the input, not into the history
        msgs = self.engine_chat.messages if self.engine_chat else []
        if ev.prompt is not None and msgs and msgs[-1]["role"] == "user":
            msgs.pop()
            last = self.app.store.messages(self.chat.id)[-1]
            self.app.store.delete_messages_from(self.chat.id, last.id)
            views = list(self.log_view.query(MessageView))
            if views and views[-1].role == "user":
                await views[-1].remove()
            self.prompt.load_text(ev.prompt)

    def stats_text(self) -> str:
        f = self.last_final
        if f is None:
            return "No reply yet."
        p = self.last_prompt_stats
        cached = f" ({p.cached_tokens} reused from the KV cache)" if p and p.cached_tokens else ""
        lat = f" · stop latency {self.stop_latencies[-1] * 1000:.0f} ms" if (
            f.finish_reason == "cancelled" and self.stop_latencies) else ""
        return (f"prompt {f.prompt_tokens} tok{cached} at {f.prompt_tok_s:.1f} tok/s · TTFT {f.ttft_s:.2f} s · "
                f"reply {f.completion_tokens} tok at {f.decode_tok_s:.1f} tok/s · {f.finish_reason}{lat} · "
                f"context {f.context_used}/{f.context_size}")

    def save_cut_reply(self) -> None:
        """The app closes mid-reply: keep what was written so far, marked as cut, so
        the chat does not end on an unanswered prompt."""
        view = self._current
        if not self.generating or view is None or self.chat is None:
            return
        self.cancel.set()
        written, live = self.stream.take()
        text = view.text + written
        self.generating = False
        self._current = None
        stats = {"finish_reason": "cancelled", "cut": "quit", "completion_tokens": live.get("tokens", 0),
                 "decode_tok_s": round(live.get("decode_tok_s") or 0.0, 2),
                 "ttft_s": round(live.get("ttft_s") or 0.0, 4)}
        self.app.store.add_message(self.chat.id, "assistant", text, stats)

    def on_unmount(self) -> None:
        self.cancel.set()
        self.load_cancel.set()


def _split(keys: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in keys.split(",") if k.strip())


def _title_from(text: str) -> str:
    t = " ".join(text.split())
    return t if len(t) <= 48 else t[:47] + "…"


def _footer(f: Finished) -> str:
    tail = {"stop": "", "cancelled": " · stopped", "length": " · max tokens reached",
            "context": " · context full"}.get(f.finish_reason, f" · {f.finish_reason}")
    prompt = f"prompt {f.prompt_tok_s:.0f} tok/s · " if f.prompt_tok_s else ""  # 0: a server that reports none
    return f"{f.completion_tokens} tok · {f.decode_tok_s:.1f} tok/s · {prompt}TTFT {f.ttft_s:.2f} s{tail}"
