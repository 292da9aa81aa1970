"""What a chat object does with its turns, whoever computes the replies (the engine's
ChatSession, or a remote server's RemoteChat)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .sampling import SamplingParams


class Conversation:
    """A chat's turns (`messages`: {"role", "content"} dicts). A subclass's
    _reply(cancel, params) yields one reply's events and appends the assistant turn."""

    messages: list[dict]

    def send(self, user_text: str, cancel: threading.Event | None = None,
             params: SamplingParams | None = None) -> Iterator:
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()  # a question a failed reply left unanswered: this one replaces it
        self.messages.append({"role": "user", "content": user_text})
        yield from self._reply(cancel, params)

    def regenerate(self, cancel=None, params=None) -> Iterator:
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        yield from self._reply(cancel, params)

    def _reply(self, cancel, params) -> Iterator:
        raise NotImplementedError
