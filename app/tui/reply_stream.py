"""The reply being written: the generation worker's text and live figures, held
under a lock until the screen's drain timer takes them (engine events arrive on
a worker thread; widgets change only on the UI thread)."""
from __future__ import annotations

import threading
from typing import Any

from ...engine.events import Finished, PromptProcessed, TextDelta


class ReplyStream:
    def __init__(self):
        self._lock = threading.Lock()
        self._buf: list[str] = []
        self._live: dict[str, Any] = {}

    def reset(self) -> None:
        with self._lock:
            self._buf.clear()
            self._live = {}

    def put(self, e) -> Finished | None:
        """One engine event from the worker; returns the Finished event when it is one."""
        if isinstance(e, TextDelta):
            with self._lock:
                self._buf.append(e.text)
                self._live["decode_tok_s"] = e.decode_tok_s
                self._live["tokens"] = e.completion_tokens
                if e.critical is not None:
                    self._live["critical"] = e.critical
        elif isinstance(e, PromptProcessed):
            with self._lock:
                # 0: nobody measured it (a server that reports no timings)
                self._live.update(prompt_tok_s=e.prompt_tok_s or None, ttft_s=e.ttft_s, prompt=e)
        elif isinstance(e, Finished):
            return e
        return None

    def take(self) -> tuple[str, dict[str, Any]]:
        """The text written since the last take, and the live figures so far."""
        with self._lock:
            text = "".join(self._buf)
            self._buf.clear()
            return text, dict(self._live)
