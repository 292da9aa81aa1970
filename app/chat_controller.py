"""A chat without its screen: the open chat and the history store it lives in, the
engine session that answers it, and the reply being written. The TUI's ChatScreen
forwards the user's actions here and shows what comes back; nothing here imports
Textual, so a test drives a chat with the real store and engine and no terminal.

The engine session (and its KV cache) is kept per model and rebuilt from the store
whenever the chat, the model or the settings change: the store is the truth, the
session a copy the next turn recomputes only where it differs."""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..engine.errors import UserError
from ..engine.events import Finished, PromptProcessed
from ..engine.memory import release_freed
from ..engine.units import fmt_bytes
from .config import to_params
from .store import Chat, ChatStore, Message

NEW_TITLE = "New chat"


@dataclass
class FailedReply:
    """What a failed reply left behind: `kept`, the partial reply stored marked cut (a
    server failed mid-reply), or `returned`, the prompt taken back out of the history
    because nothing answered it (it belongs in the input again)."""
    kept: Message | None = None
    returned: str | None = None


class ChatController:
    """backend: tui.backend.Backend (its new_chat() makes the engine session); system,
    sampling, overrides: the app's default system prompt, config [sampling] and
    command-line flags; new_chat_params(): the settings a new chat starts with."""

    def __init__(self, store: ChatStore, backend, *, system: str = "", sampling: Mapping[str, Any] | None = None,
                 overrides: Mapping[str, Any] | None = None, new_chat_params: Callable[[], dict] = dict):
        self.store = store
        self.backend = backend
        self.default_system = system
        self.sampling = {} if sampling is None else sampling  # the app's own mappings, read at each use
        self.overrides = {} if overrides is None else overrides
        self.new_chat_params = new_chat_params
        self.model = None  # backend.LoadedModel
        self.session = None  # the backend's chat object (messages + KV cache)
        self._session_model = None  # the model the session was made for
        self.chat: Chat | None = None  # created on the first prompt (or the first setting)
        self.generating = False  # from start_reply until the screen has shown the stored reply
        self.cancel = threading.Event()
        self.stop_requested_at: float | None = None
        self.stop_latencies: list[float] = []
        self.last_final: Finished | None = None
        self.last_prompt_stats: PromptProcessed | None = None
        self._unstored = False  # a reply started and not stored yet (done, failed or cut)
        self._after_reply: list = []  # calls deferred until the reply being written is stored

    # --- settings ---
    def params(self):
        """Model defaults < config [sampling] < command-line flags < this chat's own settings
        (set later and on purpose, with /set or the settings screen)."""
        base = self.model.defaults if self.model else None
        return to_params(base, self.sampling, self.overrides, self.chat.params if self.chat else {})

    def chat_params(self) -> dict:
        """This chat's own settings (a new chat's, before the first prompt)."""
        return self.chat.params if self.chat else self.new_chat_params()

    def system_prompt(self) -> str:
        return self.chat.system if self.chat else self.default_system

    def apply_settings(self, system: str | None = None, params: dict | None = None) -> None:
        store = self.store
        if self.chat is None:  # settings before the first prompt: keep them on a new stored chat
            self.chat = store.create_chat(NEW_TITLE, model=self.model.spec if self.model else None,
                                          system=self.default_system, params=self.new_chat_params())
        if system is not None:
            store.set_system(self.chat.id, system)
        if params is not None:
            store.set_params(self.chat.id, params)
        self.chat = store.get_chat(self.chat.id)
        if self.session is not None:
            em = self.session.messages
            if em and em[0]["role"] == "system":
                em.pop(0)
            if self.chat.system:
                em.insert(0, {"role": "system", "content": self.chat.system})
            self.session.params = self.params()

    # --- the model and the engine session ---
    def use_model(self, model, spec: str) -> None:
        """A model has loaded: it answers this chat from now on, and it is the one to start with."""
        if self.model is not None:  # let go of the old model (and its KV cache) before using the new
            self.model = self.session = self._session_model = None
            release_freed()
        self.model = model
        self.store.set_state("last_model", spec)
        if self.chat is not None:
            self.store.set_model(self.chat.id, spec)
        self.rebuild_session()

    def rebuild_session(self) -> None:
        """Give the engine session this chat's system prompt and history. The session (and
        its KV cache) is kept per model: the next turn recomputes only what differs."""
        if self.model is None:
            self.session = None
            return
        if self.session is None or self._session_model is not self.model:
            self.session = self.backend.new_chat(self.model, None, self.params())
            self._session_model = self.model
        system = self.system_prompt()
        msgs = [{"role": "system", "content": system}] if system else []
        if self.chat is not None:
            msgs += self.store.context(self.chat.id)  # an unanswered prompt is not sent
        self.session.messages[:] = msgs
        self.session.params = self.params()

    # --- chats ---
    def messages(self) -> list[Message]:
        return self.store.messages(self.chat.id) if self.chat else []

    def open_chat(self, chat_id: int | None) -> list[Message]:
        """Switch to a stored chat (None: a new, empty one); its messages. A chat that
        cannot be read raises UserError and changes nothing."""
        chat = self.store.get_chat(chat_id) if chat_id is not None else None
        old, self.chat = self.chat, chat
        try:
            self.rebuild_session()
        except UserError:  # the store failed reading its history: stay on the chat that was open
            self.chat = old
            raise
        return self.messages()

    def reread_chat(self) -> None:
        """The chat was renamed elsewhere (the chat list); UserError if it was deleted."""
        self.chat = self.store.get_chat(self.chat.id)

    def rename(self, title: str) -> None:
        if self.chat is None:
            raise UserError("send a prompt first: the chat is saved with its first message")
        self.store.rename_chat(self.chat.id, title)
        self.chat = self.store.get_chat(self.chat.id)

    def clear(self) -> None:
        if self.chat is not None:
            self.store.clear_messages(self.chat.id)

    def export(self, out: Path) -> None:
        """Markdown, or JSON when `out` ends in .json; OSError when it cannot be written."""
        export = self.store.export_json if out.suffix == ".json" else self.store.export_markdown
        out.write_text(export(self.chat.id), "utf-8")

    # --- turns ---
    def add_prompt(self, text: str) -> Message:
        """Store a prompt; the first one makes the chat and names it."""
        store = self.store
        if self.chat is None:
            self.chat = store.create_chat(_title_from(text), model=self.model.spec, system=self.default_system,
                                          params=self.new_chat_params())
        elif self.chat.title == NEW_TITLE and not store.messages(self.chat.id):
            store.rename_chat(self.chat.id, _title_from(text))  # made early by a setting
            self.chat = store.get_chat(self.chat.id)
        return store.add_message(self.chat.id, "user", text)

    def drop_last_reply(self) -> bool | None:
        """Before regenerating: delete the stored last reply. True if there was one, False if
        the chat ends on a prompt, None when there is nothing to regenerate."""
        msgs = self.messages()
        if not msgs:
            return None
        if msgs[-1].role != "assistant":
            return False
        self.store.delete_messages_from(self.chat.id, msgs[-1].id)
        return True

    def take_back_last_prompt(self) -> Message | None:
        """Delete the last prompt and all after it, to edit and resend; the prompt, or None."""
        users = [m for m in self.messages() if m.role == "user"]
        if not users:
            return None
        last = users[-1]
        self.store.delete_messages_from(self.chat.id, last.id)
        em = self.session.messages
        idx = max((i for i, m in enumerate(em) if m["role"] == "user"), default=len(em))
        del em[idx:]  # the KV cache keeps the common prefix; only the edited turn is recomputed
        return last

    # --- the reply being written ---
    def start_reply(self, text: str | None) -> Iterator:
        """The reply's engine events, computed as they are iterated (in a worker thread, in
        the TUI). text: a new prompt, stored by add_prompt; None: regenerate the last reply."""
        self.cancel = threading.Event()
        self.stop_requested_at = None
        self.generating = self._unstored = True
        session, cancel, params = self.session, self.cancel, self.params()

        def events() -> Iterator:
            yield from (session.send(text, cancel, params) if text is not None else session.regenerate(cancel, params))

        return events()

    def stop(self) -> None:
        """Stop the reply being written; the engine checks between tokens and the partial reply is kept."""
        if self.generating and not self.cancel.is_set():
            self.stop_requested_at = time.perf_counter()
            self.cancel.set()

    def reply_done(self, f: Finished) -> Message:
        """Store the finished (or stopped) reply with its figures."""
        self._unstored = False
        self.last_final = f
        if self.stop_requested_at is not None:
            self.stop_latencies.append(time.perf_counter() - self.stop_requested_at)
            self.stop_requested_at = None
        stats = {"finish_reason": f.finish_reason, "prompt_tokens": f.prompt_tokens,
                 "completion_tokens": f.completion_tokens, "ttft_s": round(f.ttft_s, 4),
                 "prompt_tok_s": round(f.prompt_tok_s, 2), "decode_tok_s": round(f.decode_tok_s, 2),
                 "context_used": f.context_used, "context_size": f.context_size, **self._answered_by()}
        return self.store.add_message(self.chat.id, "assistant", f.text, stats)

    def reply_failed(self, err: BaseException, prompt: str | None) -> FailedReply:
        """A server that failed mid-reply: what came is kept, marked cut. Otherwise a prompt
        that could not be answered leaves the history (prompt None: a regenerate)."""
        self._unstored = False
        partial = getattr(err, "partial", "")
        if partial and self.chat is not None:
            stats = {"finish_reason": "cut", "cut": "server", **self._answered_by()}
            return FailedReply(kept=self.store.add_message(self.chat.id, "assistant", partial, stats))
        msgs = self.session.messages if self.session else []
        if prompt is None or not msgs or msgs[-1]["role"] != "user":
            return FailedReply()
        msgs.pop()
        last = self.store.messages(self.chat.id)[-1]
        self.store.delete_messages_from(self.chat.id, last.id)
        return FailedReply(returned=prompt)

    def save_cut(self, text: str, *, tokens: int = 0, decode_tok_s: float | None = None,
                 ttft_s: float | None = None) -> Message | None:
        """The app closes mid-reply: keep what was written so far, marked as cut, so the
        chat does not end on an unanswered prompt."""
        if not self._unstored or self.chat is None:
            return None
        self.cancel.set()
        self.generating = self._unstored = False
        stats = {"finish_reason": "cancelled", "cut": "quit", "completion_tokens": tokens,
                 "decode_tok_s": round(decode_tok_s or 0.0, 2), "ttft_s": round(ttft_s or 0.0, 4)}
        return self.store.add_message(self.chat.id, "assistant", text, stats)

    def end_reply(self) -> None:
        """The stored reply is shown: the next action may start."""
        self.generating = False

    def defer(self, fn, *args) -> bool:
        """Stop the reply being written and run fn(*args) once it is stored; True if deferred.
        Switching chats or models mid-reply must not store the reply in the wrong place."""
        if not self.generating:
            return False
        self.stop()
        self._after_reply.append((fn, args))
        return True

    async def run_deferred(self) -> None:
        calls, self._after_reply = self._after_reply, []
        for fn, args in calls:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result

    def _answered_by(self) -> dict:
        """A provider's reply records who answered: {"answered_by": "provider:NAME/MODEL"}."""
        by = getattr(self.session, "answered_by", None)
        return {"answered_by": by} if by else {}

    # --- what to tell the user ---
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

    def loaded_text(self, r: tuple[int, ...] | None, memory: str) -> str:
        """What is loaded and where (`ps` for this app); r: the critical-set size per layer
        the engine last reported, memory: what the process holds."""
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
        live = (f"; last reply r {sum(r) / len(r):.1f}" + (f" of k = {k}" if k else "")
                + f" (per layer {min(r)}–{max(r)})" if r else "; r not reported yet")
        return (f"model {m.name} ({m.spec}){size} · context {m.n_ctx} tokens\n"
                f"placement ({mode} plan): {m.placement}\n"
                f"critical experts: {policy}{live}\n"
                f"memory in use: {memory}")


def _title_from(text: str) -> str:
    t = " ".join(text.split())
    return t if len(t) <= 48 else t[:47] + "…"
