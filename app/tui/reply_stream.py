"""The reply being written, as a widget that owns its generation worker, its buffer
and its drain timer. Engine events arrive on the worker's thread and wait in the
buffer, under a lock; the timer moves them into the message at `refresh_hz`
(widgets change only on the UI thread), so the screen redraws ~25 times a second
whatever the token rate, and reports the live figures to whoever shows them.
`Done` or `Failed` bubbles up once the engine is through."""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

from textual.message import Message

from ...engine.events import Finished, PromptProcessed, TextDelta
from .widgets.message import MessageView

# on_drain(wrote, live): wrote: new text was drawn; live: the figures so far (see put())
OnDrain = Callable[[bool, dict[str, Any]], None]


class ReplyStream(MessageView):
    class Done(Message):
        def __init__(self, view: "ReplyStream", final: Finished):
            super().__init__()
            self.view, self.final = view, final

    class Failed(Message):
        """prompt: the prompt the reply was for (None: a regenerate)."""

        def __init__(self, view: "ReplyStream", error: BaseException, prompt: str | None):
            super().__init__()
            self.view, self.error, self.prompt = view, error, prompt

    def __init__(self, label: str, refresh_hz: float, on_drain: OnDrain):
        super().__init__("assistant", label=label, streaming=True)
        self._buf_lock = threading.Lock()
        self._buf: list[str] = []
        self._live: dict[str, Any] = {}
        self._period = 1 / refresh_hz
        self._on_drain = on_drain
        self._timer = None

    def on_mount(self) -> None:
        self._timer = self.set_interval(self._period, self.drain)

    def start(self, events: Iterator, prompt: str | None) -> None:
        """Run the reply's engine events (ChatController.start_reply) in a thread worker."""
        def work() -> None:
            try:
                for e in events:
                    if (final := self.put(e)) is not None:
                        self.post_message(self.Done(self, final))
            except BaseException as e:
                self.post_message(self.Failed(self, e, prompt))

        self.run_worker(work, thread=True, group="generate")

    def put(self, e) -> Finished | None:
        """One engine event, from the worker; returns the Finished event when it is one."""
        if isinstance(e, TextDelta):
            with self._buf_lock:
                self._buf.append(e.text)
                self._live["decode_tok_s"] = e.decode_tok_s
                self._live["tokens"] = e.completion_tokens
                if e.critical is not None:
                    self._live["critical"] = e.critical
        elif isinstance(e, PromptProcessed):
            with self._buf_lock:
                # 0: nobody measured it (a server that reports no timings)
                self._live.update(prompt_tok_s=e.prompt_tok_s or None, ttft_s=e.ttft_s, prompt=e)
        elif isinstance(e, Finished):
            return e
        return None

    def take(self) -> tuple[str, dict[str, Any]]:
        """The text written since the last take, and the live figures so far."""
        with self._buf_lock:
            text = "".join(self._buf)
            self._buf.clear()
            return text, dict(self._live)

    async def drain(self) -> None:
        """The timer: draw the buffered text, then report the figures."""
        text, live = self.take()
        if text:
            self.feed(text)
            await self.flush()
        self._on_drain(bool(text), live)

    async def finish(self, text: str, footer: str = "") -> None:
        if self._timer is not None:  # the reply is whole: nothing more to drain
            self._timer.stop()
        await super().finish(text, footer)
