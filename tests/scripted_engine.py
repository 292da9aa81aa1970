"""A backend that emits the engine's own event types with controlled timing.

Used only where a test must control time (stop latency, status-bar figures);
the end-to-end test runs the real engine on the demo model. It honours the
same contract as engine.generate.ChatSession: the cancel Event is checked
between tokens, the reply (partial when cancelled) is appended to .messages.
"""
from __future__ import annotations

import threading
import time

from rapidmoe.app.tui.backend import LoadedModel
from rapidmoe.engine.events import Finished, PromptProcessed, TextDelta
from rapidmoe.engine.sampling import SamplingParams


class ScriptedChat:
    def __init__(self, backend: "ScriptedBackend", system, params):
        self.backend = backend
        self.params = params
        self.messages = [{"role": "system", "content": system}] if system else []
        self.context_used = 0

    def send(self, text, cancel=None, params=None):
        self.messages.append({"role": "user", "content": text})
        yield from self._reply(cancel)

    def regenerate(self, cancel=None, params=None):
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        yield from self._reply(cancel)

    def _reply(self, cancel):
        b = self.backend
        b.calls.append([dict(m) for m in self.messages])
        pieces = b.reply_for(self.messages)
        n_prompt = sum(len(m["content"].split()) + 4 for m in self.messages)
        time.sleep(b.ttft_s)
        yield PromptProcessed(n_prompt, 0, n_prompt / b.ttft_s, b.ttft_s)
        text, n = "", 0
        reason = "stop"
        for piece in pieces:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            time.sleep(b.token_s)
            n += 1
            text += piece
            yield TextDelta(piece, n, 1.0 / b.token_s, b.critical)
        self.context_used = n_prompt + n
        yield Finished(reason, text, n_prompt, n, b.ttft_s, n_prompt / b.ttft_s, 1.0 / b.token_s,
                       self.context_used, b.n_ctx)
        self.messages.append({"role": "assistant", "content": text})


class ScriptedBackend:
    """replies: list of reply strings used in turn (the last one repeats), split
    into "tokens" at spaces; token_s: seconds per token."""

    def __init__(self, replies=("Hello **world**!",), token_s=0.005, ttft_s=0.01, n_ctx=4096,
                 critical=None, load_s=0.0):
        self.replies = list(replies)
        self.token_s = token_s
        self.ttft_s = ttft_s
        self.n_ctx = n_ctx
        self.critical = critical
        self.load_s = load_s
        self.loaded: list[str] = []
        self.calls: list[list[dict]] = []
        self._turn = 0
        self._lock = threading.Lock()

    def reply_for(self, messages):
        with self._lock:
            r = self.replies[min(self._turn, len(self.replies) - 1)]
            self._turn += 1
        words = r.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)]

    def load(self, spec, n_ctx, progress):
        for i in range(5):
            progress("load", i + 1, 5)
            time.sleep(self.load_s / 5)
        self.loaded.append(spec)
        return LoadedModel(spec=spec, name=f"scripted:{spec}", n_ctx=n_ctx or self.n_ctx,
                           defaults=SamplingParams(), placement="CPU-centric")

    def new_chat(self, model, system, params):
        return ScriptedChat(self, system, params)
