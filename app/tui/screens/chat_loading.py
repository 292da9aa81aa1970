"""Loading a model into the chat screen. LoadPanel: the backend loads in a thread
worker, the panel shows its progress (with the time left in a conversion) and
reports `Done` for the latest load only: a load started meanwhile supersedes it;
Esc cancels it through `cancel`. ModelLoader: what the screen does around a load.
The model in use stays until the new one has loaded (a load that fails or is
cancelled changes nothing), and a message sent meanwhile is shown as waiting and
sent once the model is ready."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import ProgressBar, Static

from ..plain_words import plain_note, progress_label
from ..widgets.message import MessageView

WAITING_FOOTER = "waiting for the model to load · sent when it is ready (Esc cancels the load)"

# load(progress) -> the loaded model; progress(what, done, total) as backend.Progress
Load = Callable[[Callable[[str, int, int], None]], Any]


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


class LoadPanel(Horizontal):
    class Progress(Message, bubble=False):
        def __init__(self, what: str, done: int, total: int):
            super().__init__()
            self.what, self.done, self.total = what, done, total

    class Done(Message):
        """model, or error (KeyboardInterrupt: cancelled); bubbles to the screen."""

        def __init__(self, seq: int, spec: str, model: Any = None, error: BaseException | None = None):
            super().__init__()
            self.seq, self.spec, self.model, self.error = seq, spec, model, error

    def __init__(self, **kw):
        super().__init__(**kw)
        self.busy = False
        self.cancel = threading.Event()
        self._seq = 0
        self._clock: ConversionClock | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="load-what", markup=False)
        yield ProgressBar(id="load-bar", show_eta=False)

    def on_mount(self) -> None:
        self.display = False

    def start(self, spec: str, load: Load) -> None:
        self.cancel.set()  # a load still running gives way to this one
        self._seq += 1
        seq = self._seq
        self.busy = True
        self.cancel = cancel = threading.Event()
        self._clock = None
        self.display = True
        self.query_one("#load-what", Static).update(f"loading {spec} …")
        self.query_one("#load-bar", ProgressBar).update(total=None, progress=0)

        def progress(what: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise KeyboardInterrupt  # hub.pull keeps the partial file for a later resume
            self.post_message(self.Progress(what, done, total))

        def work() -> None:
            try:
                m = load(progress)
            except BaseException as e:  # shown, never fatal
                self.post_message(self.Done(seq, spec, error=e))
            else:
                self.post_message(self.Done(seq, spec, model=m))

        self.run_worker(work, thread=True, group="load", exclusive=True)

    def on_load_panel_progress(self, ev: Progress) -> None:
        label = progress_label(ev.what, ev.done, ev.total)
        if ev.what == "convert" and ev.total:
            self._clock = clock = self._clock or ConversionClock()
            label += clock.left(ev.done, ev.total)
        self.query_one("#load-what", Static).update(label)
        self.query_one("#load-bar", ProgressBar).update(total=ev.total or None, progress=ev.done)

    def on_load_panel_done(self, ev: Done) -> None:
        if ev.seq != self._seq:  # superseded by a later load: nobody hears of it
            ev.stop()

    def stop(self) -> None:
        """The screen has taken the latest load's result."""
        self.busy = False
        self.display = False

    def on_unmount(self) -> None:
        self.cancel.set()


class ModelLoader:
    """The chat screen's side of a load: its state around the panel, the model handed to
    the controller, and the message that waits for it."""

    def __init__(self, screen):
        self.screen = screen  # the ChatScreen
        self.waiting: tuple[str, MessageView] | None = None

    def load(self, spec: str) -> None:
        scr = self.screen
        if scr.controller.defer(scr.load, spec):
            return
        backend, n_ctx = scr.app.backend, scr.app.n_ctx
        scr.load_panel.start(spec, lambda progress: backend.load(spec, n_ctx, progress))
        scr.status.set_state("loading")
        scr.set_title()
        scr.prompt.set_waiting(True)

    async def done(self, ev: LoadPanel.Done) -> None:
        scr = self.screen
        scr.load_panel.stop()
        scr.status.set_state("")
        scr.prompt.set_waiting(False)
        if ev.error is not None:
            scr.set_title()
            still = f"; still using {scr.model.name}" if scr.model is not None else ""
            msg = ("loading cancelled" if isinstance(ev.error, KeyboardInterrupt)
                   else f"cannot load {ev.spec}: {ev.error}")
            scr.note(msg + still, "error")
            await self.return_waiting("not sent: the model did not load")
            return
        scr.controller.use_model(ev.model, ev.spec)
        for n in getattr(ev.model, "notes", ()):
            if plain_note(n):  # "" for notes whose news the loading panel gave live
                scr.note(plain_note(n))
        scr.status.set_model(scr.model.name, scr.model.placement)
        scr.set_title()
        scr.set_meter()
        if self.waiting is not None:
            text, view = self.waiting
            self.waiting = None
            await scr.send_prompt(text, view)

    async def wait(self, text: str) -> None:
        """A message sent while the model loads: shown as waiting, sent once it is ready."""
        scr = self.screen
        if self.waiting is not None:
            scr.notify("A message is already waiting for the model", severity="warning")
            return
        scr.prompt.load_text("")
        view = MessageView("user", text, footer=WAITING_FOOTER)
        self.waiting = (text, view)
        await scr.log_view.mount(view)

    async def return_waiting(self, why: str) -> None:
        """The waiting message will not be sent: back into the input (or, when something
        new is typed there, into the prompt history: Up brings it back)."""
        if self.waiting is None:
            return
        scr = self.screen
        text, view = self.waiting
        self.waiting = None
        if view.is_mounted:
            await view.remove()
        if not scr.prompt.text.strip():
            scr.prompt.edit_text(text)
            scr.note(f"{why}; your message is back in the input")
        else:
            scr.prompt.prompt_history.append(text)
            scr.note(f"{why}; Up in the input brings your message back")
