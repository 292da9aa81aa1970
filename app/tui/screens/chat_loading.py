"""Loading a model, a mixin of ChatScreen: the backend loads in a thread worker
and posts its progress; the model in use stays until the new one has loaded
(a load that fails or is cancelled changes nothing), and a message sent
meanwhile is shown as waiting and sent once the model is ready."""
from __future__ import annotations

import threading
import time
from typing import Any

from textual.message import Message
from textual.widgets import ProgressBar, Static

from ....engine.memory import release_freed
from ..plain_words import plain_note, progress_label
from ..widgets.context_meter import ContextMeter
from ..widgets.message import MessageView

WAITING_FOOTER = "waiting for the model to load · sent when it is ready (Esc cancels the load)"


class LoadProgress(Message):
    def __init__(self, what: str, done: int, total: int):
        super().__init__()
        self.what, self.done, self.total = what, done, total


class LoadDone(Message):
    def __init__(self, seq: int, model: Any = None, error: BaseException | None = None, spec: str = ""):
        super().__init__()
        self.seq, self.model, self.error, self.spec = seq, model, error, spec


class ConversionClock:
    """Time left in a conversion: from the rate recorded on this machine (if any) until
    the conversion has run long enough to measure its own (engine/pack/cost.py)."""

    def __init__(self):
        self.t0, self.done0, self.rate = time.monotonic(), None, None

    def left(self, done: int, total: int) -> str:
        from ....engine.pack.cost import fmt_duration, last_rate  # deferred: loads platformdirs

        if self.done0 is None or done < self.done0:
            self.t0, self.done0 = time.monotonic(), done
        dt = time.monotonic() - self.t0
        if dt >= 3 and done > self.done0:
            rate = (done - self.done0) / dt
        else:
            if self.rate is None:  # a recorded rate; measuring now would time a busy machine
                self.rate = last_rate() or 0.0
            rate = self.rate
        return f" · about {fmt_duration((total - done) / rate)} left" if rate > 0 and done < total else ""


class ModelLoading:
    def load(self, spec: str) -> None:
        if self.defer_while_generating(self.load, spec):
            return
        self.load_cancel.set()  # a load still running gives way to this one
        self._load_seq += 1
        seq = self._load_seq
        self.is_loading = True
        self.load_cancel = threading.Event()
        self._convert_clock = None
        self.query_one("#loading").display = True
        self.query_one("#load-what", Static).update(f"loading {spec} …")
        self.query_one("#load-bar", ProgressBar).update(total=None, progress=0)
        self.status.set_state("loading")
        self._set_title()
        self.prompt.set_waiting(True)
        n_ctx = self.app.n_ctx
        cancel = self.load_cancel

        def progress(what: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise KeyboardInterrupt  # hub.pull keeps the partial file for a later resume
            self.post_message(LoadProgress(what, done, total))

        def work() -> None:
            try:
                m = self.app.backend.load(spec, n_ctx, progress)
            except BaseException as e:  # shown, never fatal
                self.post_message(LoadDone(seq, error=e, spec=spec))
            else:
                self.post_message(LoadDone(seq, model=m, spec=spec))

        self.run_worker(work, thread=True, group="load", exclusive=True)

    def on_load_progress(self, ev: LoadProgress) -> None:
        label = progress_label(ev.what, ev.done, ev.total)
        if ev.what == "convert" and ev.total:
            self._convert_clock = clock = getattr(self, "_convert_clock", None) or ConversionClock()
            label += clock.left(ev.done, ev.total)
        self.query_one("#load-what", Static).update(label)
        self.query_one("#load-bar", ProgressBar).update(total=ev.total or None, progress=ev.done)

    async def on_load_done(self, ev: LoadDone) -> None:
        if ev.seq != self._load_seq:  # superseded by a later load
            return
        self.is_loading = False
        self.query_one("#loading").display = False
        self.status.set_state("")
        self.prompt.set_waiting(False)
        if ev.error is not None:
            self._set_title()
            still = f"; still using {self.model.name}" if self.model is not None else ""
            msg = ("loading cancelled" if isinstance(ev.error, KeyboardInterrupt)
                   else f"cannot load {ev.spec}: {ev.error}")
            self.note(msg + still, "error")
            await self.return_waiting("not sent: the model did not load")
            return
        if self.model is not None:  # let go of the old model (and its KV cache) before using the new
            self.model = self.engine_chat = self._engine_model = None
            release_freed()
        self.model = ev.model
        for n in getattr(ev.model, "notes", ()):
            if plain_note(n):  # "" for notes whose news the loading panel gave live
                self.note(plain_note(n))
        self.app.store.set_state("last_model", ev.spec)
        self.status.set_model(self.model.name, self.model.placement)
        self._set_title()
        if self.chat is not None:
            self.app.store.set_model(self.chat.id, ev.spec)
        self.rebuild_engine_chat()
        self.query_one(ContextMeter).set_usage(0, self.model.n_ctx, self.params().max_tokens)
        if self._waiting is not None:
            text, view = self._waiting
            self._waiting = None
            await self.send_prompt(text, view)

    # --- a message that waits for the model ---
    async def wait_for_model(self, text: str) -> None:
        if self._waiting is not None:
            self.notify("A message is already waiting for the model", severity="warning")
            return
        self.prompt.load_text("")
        view = MessageView("user", text, footer=WAITING_FOOTER)
        self._waiting = (text, view)
        await self.log_view.mount(view)

    async def return_waiting(self, why: str) -> None:
        """The waiting message will not be sent: back into the input (or, when something
        new is typed there, into the prompt history: Up brings it back)."""
        if self._waiting is None:
            return
        text, view = self._waiting
        self._waiting = None
        if view.is_mounted:
            await view.remove()
        if not self.prompt.text.strip():
            self.prompt.load_text(text)
            self.prompt.move_cursor(self.prompt.document.end)
            self.note(f"{why}; your message is back in the input")
        else:
            self.prompt.prompt_history.append(text)
            self.note(f"{why}; Up in the input brings your message back")
