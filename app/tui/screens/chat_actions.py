"""What the chat screen can be asked to do: by a key, a `/` command or the
command palette. A mixin of ChatScreen, kept apart so each file stays small."""
from __future__ import annotations

import time
from pathlib import Path

from ....engine.errors import UserError
from ....engine.units import fmt_bytes
from ..attach import edit_in_editor, fenced_file
from ..commands import help_text, parse_set, parse_slash
from ..widgets.context_meter import ContextMeter
from ..widgets.message import MessageView
from .chats import ChatsScreen


class ChatActions:
    # --- generation control ---
    def action_stop(self) -> None:
        if self.is_loading:
            self.load_cancel.set()
            return
        if self.generating and not self.cancel.is_set():
            self.stop_requested_at = time.perf_counter()
            self.cancel.set()  # the engine checks it between tokens; the partial reply is kept

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
        views = list(self.log_view.query(MessageView))
        msgs = self.app.store.messages(self.chat.id) if self.chat else []
        if not msgs:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        if msgs[-1].role == "assistant":
            self.app.store.delete_messages_from(self.chat.id, msgs[-1].id)
            if views and views[-1].role == "assistant":
                await views[-1].remove()
        await self.start_reply(None)

    async def action_edit_last(self) -> None:
        if not self._ready():
            return
        msgs = self.app.store.messages(self.chat.id) if self.chat else []
        users = [m for m in msgs if m.role == "user"]
        if not users:
            self.notify("No prompt to edit yet", severity="warning")
            return
        last = users[-1]
        self.app.store.delete_messages_from(self.chat.id, last.id)
        for v in list(self.log_view.query(MessageView)):
            if v.message_id is not None and v.message_id >= last.id:
                await v.remove()
        em = self.engine_chat.messages
        idx = max((i for i, m in enumerate(em) if m["role"] == "user"), default=len(em))
        del em[idx:]  # the KV cache keeps the common prefix; only the edited turn is recomputed
        self.prompt.load_text(last.content)
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def _ready(self) -> bool:
        if self.generating:
            self.notify("A reply is still being written (Esc stops it)", severity="warning")
            return False
        if self.engine_chat is None:
            self.notify("No model loaded", severity="warning")
            return False
        return True

    # --- copy ---
    def _last_reply(self) -> MessageView | None:
        views = [v for v in self.log_view.query(MessageView) if v.role == "assistant"]
        return views[-1] if views else None

    def action_copy_reply(self) -> None:
        v = self._last_reply()
        if v is None:
            self.notify("No reply to copy", severity="warning")
        else:
            v.action_copy()

    def action_copy_code(self) -> None:
        v = self._last_reply()
        if v is None:
            self.notify("No reply to copy from", severity="warning")
        else:
            v.action_copy_code()

    # --- chats ---
    async def show_chat(self, chat_id: int | None) -> None:
        """Switch to a stored chat (None: a new, empty one)."""
        if self.defer_while_generating(self.show_chat, chat_id):
            return
        store = self.app.store
        try:
            chat = store.get_chat(chat_id) if chat_id is not None else None
        except UserError as e:  # damaged stored settings, or the history failing: say so, stay
            self.notify(str(e), severity="error", markup=False)
            return
        await self.return_waiting("not sent: you left that chat")
        self.chat = chat
        await self.log_view.remove_children()
        if self.chat is not None:
            await self.log_view.mount_all(
                [MessageView(m.role, m.content, message_id=m.id,
                             label=None if m.role == "user" else (self.chat.model or "assistant"),
                             footer=_stored_footer(m.stats)) for m in store.messages(self.chat.id)])
        self._set_title()
        self._warned_ctx = False
        self.rebuild_engine_chat()
        if self.model is not None:
            self.query_one(ContextMeter).set_usage(0, self.model.n_ctx, self.params().max_tokens)

    async def action_new_chat(self) -> None:
        await self.show_chat(None)

    async def action_clear(self) -> None:
        if self.defer_while_generating(self.action_clear):
            return
        if self.chat is not None:
            self.app.store.clear_messages(self.chat.id)
        await self.show_chat(self.chat.id if self.chat else None)

    def action_chats(self) -> None:
        async def done(result) -> None:
            if result is None:
                return
            kind, chat_id = result
            if kind == "open":
                await self.show_chat(chat_id)
            elif self.chat is not None:  # renamed or deleted: re-read the open chat
                try:
                    self.chat = self.app.store.get_chat(self.chat.id)
                    self._set_title()
                except UserError:
                    await self.show_chat(None)

        self.app.push_screen(ChatsScreen(current=self.chat.id if self.chat else None), done)

    def action_models(self) -> None:
        from .model_picker import ModelPicker  # deferred: loads psutil, rich

        def done(spec) -> None:
            if spec:
                self.load(spec)

        self.app.push_screen(ModelPicker(current=self.model.spec if self.model else None), done)

    def action_settings(self) -> None:
        from .settings import SettingsScreen  # deferred: loads platformdirs

        def done(result) -> None:
            if result is not None:
                self.apply_settings(result["system"], result["params"])

        self.app.push_screen(SettingsScreen(self.system_prompt(), self.params(),
                                            self.chat.params if self.chat else self.app.new_chat_params()), done)

    def apply_settings(self, system: str | None = None, params: dict | None = None) -> None:
        store = self.app.store
        if self.chat is None:  # settings before the first prompt: keep them on a new stored chat
            self.chat = store.create_chat("New chat", model=self.model.spec if self.model else None,
                                          system=self.app.default_system, params=self.app.new_chat_params())
        if system is not None:
            store.set_system(self.chat.id, system)
        if params is not None:
            store.set_params(self.chat.id, params)
        self.chat = store.get_chat(self.chat.id)
        self._set_title()
        if self.engine_chat is not None:
            em = self.engine_chat.messages
            if em and em[0]["role"] == "system":
                em.pop(0)
            if self.chat.system:
                em.insert(0, {"role": "system", "content": self.chat.system})
            self.engine_chat.params = self.params()

    def action_export(self, path: str = "") -> None:
        if self.chat is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        out = Path(path).expanduser() if path else Path.cwd() / f"chat-{self.chat.id}.md"
        store = self.app.store
        try:
            text = store.export_json(self.chat.id) if out.suffix == ".json" else store.export_markdown(self.chat.id)
            out.write_text(text, "utf-8")
        except OSError as e:
            self.notify(f"cannot write {out}: {e.strerror}", severity="error", markup=False)
            return
        self.notify(f"Exported to {out}", markup=False)

    def action_attach(self, path: str) -> None:
        """Append a text file to the prompt as a fenced block."""
        block = fenced_file(path)
        text = self.prompt.text.rstrip()
        self.prompt.load_text((text + "\n\n" if text else "") + block)
        self.prompt.move_cursor(self.prompt.document.end)
        self.notify(f"attached {Path(path).name}", timeout=2, markup=False)

    def action_editor(self) -> None:
        """Edit the prompt in $VISUAL / $EDITOR."""
        try:
            text = edit_in_editor(self.app, self.prompt.text)
        except UserError as e:
            self.note(str(e), "error")
            return
        self.prompt.load_text(text)
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def action_stats(self) -> None:
        """The last reply's figures, then what is loaded and where it lives (`ps` for this app)."""
        self.note(self.stats_text() + "\n" + self.loaded_text())

    def loaded_text(self) -> str:
        m = self.model
        if m is None:
            return "no model loaded"
        handle = m.handle  # the engine's model; a stand-in backend may leave it None
        if hasattr(handle, "base_url"):  # a provider's model: the server runs it
            return (f"model {m.name} ({m.spec}) · served by {handle.base_url} · context {m.n_ctx or '?'} tokens\n"
                    f"placement: {m.placement} (the server's, no residual split here)")
        plan = getattr(handle, "plan", None)
        mode = getattr(plan, "mode", None) or ("cpu (full precision)" if handle is not None else "—")
        size = f" · file {fmt_bytes(m.size_bytes)}" if m.size_bytes else ""
        k = getattr(getattr(handle, "cfg", None), "n_expert_used", None)
        setting = getattr(handle, "critical", None)
        policy = ("full precision (no residual split)" if handle is not None and setting is None else
                  "UMIA (auto)" if setting == "auto" else f"fixed r = {setting}" if setting is not None else "—")
        r = self.status.critical  # per layer, as the engine last reported it
        live = (f"; last reply r {sum(r) / len(r):.1f}" + (f" of k = {k}" if k else "")
                + f" (per layer {min(r)}–{max(r)})" if r else "; r not reported yet")
        mem = f"DRAM {self.status.dram}" + (f" · VRAM {self.status.vram}" if self.status.vram else "")
        return (f"model {m.name} ({m.spec}){size} · context {m.n_ctx} tokens\n"
                f"placement ({mode} plan): {m.placement}\n"
                f"critical experts: {policy}{live}\n"
                f"memory in use: {mem}")

    def action_help(self) -> None:
        self.note(help_text(self.app.key_summary()))

    # --- `/` commands ---
    async def run_slash(self, text: str) -> None:
        try:
            await self._slash(*parse_slash(text))
        except UserError as e:
            self.note(str(e), "error")

    async def _slash(self, name: str, arg: str) -> None:
        if name == "/model":
            self.load(arg) if arg else self.action_models()
        elif name == "/system":
            if not arg:
                self.note(f"system prompt: {self.system_prompt() or '(none)'}")
            else:
                self.apply_settings(system="" if arg == "-" else arg)
                self.note("system prompt " + ("cleared" if arg == "-" else "set"))
        elif name == "/set":
            if not arg:
                p = self.params()
                self.note("sampling: " + ", ".join(f"{k}={v}" for k, v in vars(p).items()))
                return
            kv = parse_set(arg)
            params = dict(self.chat.params if self.chat else self.app.new_chat_params())
            params.update({k: list(v) if isinstance(v, tuple) else v for k, v in kv.items()})
            self.app.to_params_checked(params)
            self.apply_settings(params=params)
            self.note("set " + ", ".join(f"{k}={v}" for k, v in kv.items()))
        elif name == "/clear":
            await self.action_clear()
        elif name == "/regen":
            await self.action_regenerate()
        elif name == "/edit":
            await self.action_edit_last()
        elif name == "/stats":
            if arg in ("on", "off"):
                self.stats_after_reply = arg == "on"
                self.note(f"stats after each reply: {arg}")
            else:
                self.action_stats()
        elif name == "/new":
            await self.action_new_chat()
        elif name == "/chats":
            self.action_chats()
        elif name == "/rename":
            if self.chat is None:
                raise UserError("send a prompt first: the chat is saved with its first message")
            self.app.store.rename_chat(self.chat.id, arg)
            self.chat = self.app.store.get_chat(self.chat.id)
            self._set_title()
        elif name == "/export":
            self.action_export(arg)
        elif name == "/copy":
            self.action_copy_code() if arg == "code" else self.action_copy_reply()
        elif name == "/theme":
            if not arg:
                self.note("themes: " + ", ".join(sorted(self.app.available_themes)))
            elif arg not in self.app.available_themes:
                raise UserError(f"no theme {arg!r}; /theme lists them")
            else:
                self.app.theme = arg
        elif name == "/attach":
            if not arg:
                raise UserError("/attach needs a file path")
            self.action_attach(arg)
        elif name == "/editor":
            self.action_editor()
        elif name == "/help":
            self.action_help()
        elif name == "/quit":
            self.app.exit()


def _stored_footer(stats: dict | None) -> str:
    if not stats:
        return ""
    tail = (" · cut off: the app was closed" if stats.get("cut") == "quit" else
            " · stopped" if stats.get("finish_reason") == "cancelled" else "")
    return (f"{stats.get('completion_tokens', 0)} tok · {stats.get('decode_tok_s', 0):.1f} tok/s · "
            f"TTFT {stats.get('ttft_s', 0):.2f} s{tail}")
