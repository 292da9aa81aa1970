"""RemoteChat: engine.generate.ChatSession's interface over a provider."""
from __future__ import annotations

from typing import Iterator

from ...engine.events import Finished
from ...engine.conversation import Conversation
from ...engine.sampling import SamplingParams
from .client import Endpoint, RemoteError, stream_chat


class RemoteChat(Conversation):
    def __init__(self, endpoint: Endpoint, system: str | None = None, params: SamplingParams | None = None,
                 stall_s: float = 60.0, retries: int = 3, extra_body: dict | None = None):
        self.endpoint = endpoint
        self.params = params or SamplingParams()
        self.stall_s, self.retries, self.extra_body = stall_s, retries, extra_body
        self.messages: list[dict] = []
        if system:
            self.messages.append({"role": "system", "content": system})

    @property
    def answered_by(self) -> str:
        """provider:NAME/MODEL (NAME: the base URL for --endpoint), as the history records it."""
        return f"provider:{self.endpoint.name or self.endpoint.base_url}/{self.endpoint.model or ''}"

    def _reply(self, cancel, params) -> Iterator:
        # reasoning is shown, not sent back: servers expect the answer only in the history
        from ..think import split_think

        msgs = [{"role": m["role"], "content": m["content"]} for m in self.messages]  # not our own marks
        try:
            for ev in stream_chat(self.endpoint, msgs, params or self.params, cancel, self.stall_s, self.retries,
                                  self.extra_body):
                if isinstance(ev, Finished):
                    self.messages.append({"role": "assistant", "content": split_think(ev.text)[1]})
                yield ev
        except RemoteError as e:
            if e.partial:  # kept, marked as cut
                self.messages.append({"role": "assistant", "content": split_think(e.partial)[1], "cut": True})
            raise  # without a partial reply the question stays, for regenerate to retry
