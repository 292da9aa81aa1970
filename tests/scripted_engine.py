"""A backend that emits the engine's own event types, paced by the test.

Used only where a test must control timing (stopping mid-reply, a load that is
still running, status-bar figures); the end-to-end test runs the real engine on
the demo model. It honours the same contract as engine.generate.ChatSession:
the cancel Event is checked between tokens, the reply (partial when cancelled)
is appended to .messages.

Nothing here sleeps to make a state last: a reply held mid-way (`hold_after`)
waits for its cancel Event, a held load (`held`) for `release(spec)`. The
figures the events report (tok/s, TTFT) are fixed numbers, whatever the pace.
"""
from __future__ import annotations

import threading
from collections import defaultdict

from rapidmoe.app.tui.backend import LoadedModel
from rapidmoe.engine.events import Finished, PromptProcessed, TextDelta
from rapidmoe.engine.sampling import SamplingParams

HOLD_LIMIT_S = 120.0  # a held reply or load gives up after this (longer than any wait_for): a failure bound


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
        cancel = cancel or threading.Event()
        b.calls.append([dict(m) for m in self.messages])
        pieces = b.reply_for(self.messages)
        n_prompt = sum(len(m["content"].split()) + 4 for m in self.messages)
        yield PromptProcessed(n_prompt, 0, n_prompt / b.ttft_s, b.ttft_s)
        text, n = "", 0
        reason = "stop"
        for piece in pieces:
            if b.hold_after is not None and n == b.hold_after:
                b.holding.set()
                cancel.wait(HOLD_LIMIT_S)  # mid-reply until the app stops it
            if cancel.is_set():
                reason = "cancelled"
                break
            n += 1
            text += piece
            yield TextDelta(piece, n, 1.0 / b.token_s, b.critical)
        self.context_used = n_prompt + n
        yield Finished(reason, text, n_prompt, n, b.ttft_s, n_prompt / b.ttft_s, 1.0 / b.token_s,
                       self.context_used, b.n_ctx)
        self.messages.append({"role": "assistant", "content": text})


class ScriptedBackend:
    """replies: reply strings used in turn (the last one repeats), split into
    "tokens" at spaces. token_s / ttft_s: the figures the events report.
    hold_after=N: every reply stops after N tokens until it is cancelled
    (`holding` is set once it waits there). held: specs whose load stops after
    its first progress step until release(spec). errors: spec -> exception its
    load raises. placement, notes: what a loaded model reports."""

    def __init__(self, replies=("Hello **world**!",), token_s=0.002, ttft_s=0.01, n_ctx=4096,
                 critical=None, hold_after=None, held=(), errors=None, placement="CPU-centric", notes=()):
        self.replies = list(replies)
        self.token_s = token_s
        self.ttft_s = ttft_s
        self.n_ctx = n_ctx
        self.critical = critical
        self.hold_after = hold_after
        self.holding = threading.Event()
        self._release = {spec: threading.Event() for spec in held}
        self.errors = dict(errors or {})
        self.placement = placement
        self.notes = list(notes)
        self.loaded: list[str] = []  # specs whose load returned a model, in order
        self.load_ended: dict[str, threading.Event] = defaultdict(threading.Event)
        self.calls: list[list[dict]] = []
        self._turn = 0
        self._lock = threading.Lock()

    def reply_for(self, messages):
        with self._lock:
            r = self.replies[min(self._turn, len(self.replies) - 1)]
            self._turn += 1
        words = r.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)]

    def release(self, spec: str) -> None:
        self._release[spec].set()

    def load(self, spec, n_ctx, progress):
        try:
            progress("load", 1, 5)  # raises KeyboardInterrupt once the app cancels this load
            if spec in self._release:
                self._release[spec].wait(HOLD_LIMIT_S)
            for i in range(2, 6):
                progress("load", i, 5)
            if spec in self.errors:
                raise self.errors[spec]
            self.loaded.append(spec)
            return LoadedModel(spec=spec, name=f"scripted:{spec}", n_ctx=n_ctx or self.n_ctx,
                               defaults=SamplingParams(), placement=self.placement, notes=list(self.notes))
        finally:
            self.load_ended[spec].set()

    def new_chat(self, model, system, params):
        return ScriptedChat(self, system, params)
