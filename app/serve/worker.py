"""The one owner of the model: loads it, then runs requests one at a time, in
the order they came, on one thread. One Session keeps the KV cache between
requests, so a request that extends the previous conversation processes only
its new tokens. A job's events go back to the event loop that waits for them."""
from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...engine.errors import UserError
from ...engine.events import Finished
from ...engine.generate import ChatSession, Session
from .constrain import CallConstraint, CallText, call_format
from .errors import ApiError, bad
from .protocol import GenRequest, check_limit
from .reply import CLOSE, template_opens_think


class TracingSession(Session):
    """A Session that adds up each decode step's critical-set sizes per MoE layer, and
    masks each step's logits with `constraint` (a forced tool call) when one is set."""

    constraint: CallConstraint | None = None

    def begin(self, constraint: CallConstraint | None = None) -> None:
        self.r_sum: dict[int, float] = {}
        self.r_steps = 0
        self.constraint = constraint

    def _masked(self, logits):
        return self.constraint.mask(logits) if self.constraint is not None and logits is not None else logits

    def _prefill(self, new: list[int], cancel):
        """The prompt's last token always runs alone: whether the rest came from the
        cache or not, it sees the same computation, so a seed gives the same reply."""
        if len(new) > 1 and (super()._prefill(new[:-1], cancel) is None or (cancel and cancel.is_set())):
            return None
        return self._masked(super()._prefill(new[-1:], cancel))

    def _feed(self, token: int):
        if self.constraint is not None:
            self.constraint.advance(token)
        logits = super()._feed(token)
        tr = self.last_trace
        if tr is not None and tr.r:
            self.r_steps += 1
            for layer, r in tr.r.items():
                self.r_sum[layer] = self.r_sum.get(layer, 0.0) + float(np.mean(r))
        return self._masked(logits)

    def critical_stats(self) -> dict[str, Any]:
        if not self.r_steps:
            return {"critical_mean": None, "critical_per_layer": None, "decode_steps": 0}
        per_layer = [round(self.r_sum[k] / self.r_steps, 3) for k in sorted(self.r_sum)]
        return {"critical_mean": round(float(np.mean(per_layer)), 3), "critical_per_layer": per_layer,
                "decode_steps": self.r_steps}


@dataclass
class Prepared:
    req: GenRequest
    ids: list[int]
    params: Any  # SamplingParams
    opened_think: bool = False
    call: CallConstraint | None = None  # tool_choice required or named: the reply is this call


@dataclass
class Done:
    finished: Finished
    prompt_len: int
    stats: dict


@dataclass
class Job:
    prep: Prepared
    loop: asyncio.AbstractEventLoop
    live: bool = True  # the client wants each delta (a stream); else only the end
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    _batch: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, item) -> None:
        """Hand an item to the event loop, waking it once for all that piled up meanwhile:
        each wake-up takes the GIL from the thread that runs the model."""
        with self._lock:
            self._batch.append(item)
            if len(self._batch) > 1:
                return  # a wake-up is already on its way
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone: the server is shutting down
            self.cancel.set()

    def _drain(self) -> None:
        with self._lock:
            items, self._batch = self._batch, []
        for item in items:
            self.events.put_nowait(item)


class Worker:
    def __init__(self, load: Callable[[], Any], queue_limit: int, base_params: Callable[[Any], Any],
                 template: str | None = None, log: Callable[[str], None] | None = None):
        self._load, self._base = load, base_params
        self.queue_limit = queue_limit
        self.template = template
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.state = "loading"  # -> "ready" | "failed"
        self.error: str | None = None
        self.model = None
        self.ready = threading.Event()
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.pending = 0  # running + waiting
        self._thread = threading.Thread(target=self._main, name="rapidmoe-serve-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)

    # -- on the model thread --
    def _main(self) -> None:
        try:
            model = self._load()
            self.params = self._base(model)
            self.chat = ChatSession(model, params=self.params)
            self.chat.session = self.session = TracingSession(model, self.params)
            self.model = model
            self.state = "ready"
        except BaseException as e:  # noqa: BLE001 - any load failure is reported, then the server stops
            self.error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            self.state = "failed"
        finally:
            self.ready.set()
        if self.state != "ready":
            return
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            finally:
                with self._lock:
                    self.pending -= 1

    def _run(self, job: Job) -> None:
        p = job.prep
        if job.cancel.is_set():
            self.log(f"{p.req.kind}: the client left before its turn: skipped")
            job.put(None)
            return
        self.session.begin(p.call)
        try:
            final = None
            for ev in self.session.generate(p.ids, p.params, job.cancel):
                if isinstance(ev, Finished):
                    final = ev
                elif job.live:
                    job.put(ev)
            self.log(f"{p.req.kind}: prompt {len(p.ids)} tokens ({len(p.ids) - final.prompt_tokens} cached), "
                     f"{final.completion_tokens} generated, {final.decode_tok_s:.1f} tok/s, "
                     f"finish {final.finish_reason}")  # before the client hears of the end
            job.put(Done(final, len(p.ids), self.session.critical_stats()))
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the server
            self.session.reset()  # the cache may hold a half-run prompt
            self.log(f"{p.req.kind}: failed: {type(e).__name__}: {e}")
            job.put(ApiError(500, f"generation failed: {type(e).__name__}: {e}", "server_error"))

    # -- on the event loop's side --
    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def prepare(self, req: GenRequest) -> Prepared:
        """Render and tokenize (no model state is touched: safe beside a running job)."""
        params = self.params.with_overrides(**req.sampling)
        opened, call = False, None
        if req.kind == "completion":
            ids = self.model.tokenizer.encode(req.prompt, add_special=True, parse_special=False)
        else:
            text = self._render(req)
            opened = template_opens_think(text)
            if req.tool_choice != "auto":
                text, call = self._force_call(req, text, opened)
                opened = False
                params = params.with_overrides(stop=())  # the reply is a call: stop strings are for text
            ids = self.chat.encode_prompt(text)
        check_limit(len(ids), self.n_ctx)
        return Prepared(req, ids, params, opened, call)

    def _force_call(self, req: GenRequest, text: str, opened: bool) -> tuple[str, CallConstraint]:
        """The prompt ends with the template's tool-call opener (and the named function's
        name); the constraint keeps the reply a call (app/serve/constrain.py)."""
        fmt = call_format(self.template or self.model.metadata.get("tokenizer.chat_template") or "")
        if fmt is None:
            raise bad(f"tool_choice {req.tool_choice!r} needs a chat template that writes Hermes <tool_call> "
                      "or DeepSeek tool calls; this one writes neither", "tool_choice", "tool_choice_unsupported")
        names = [t["function"]["name"] for t in req.tools]
        text += (f"\n{CLOSE}\n\n" if opened else "") + fmt.opener
        if req.tool_choice == "function":
            return text + names[0] + fmt.mid, CallConstraint(self.model.tokenizer, CallText(fmt.mid, name=names[0]))
        return text, CallConstraint(self.model.tokenizer, CallText(fmt.mid, names=names))

    def _render(self, req: GenRequest) -> str:
        template = self.template or self.model.metadata.get("tokenizer.chat_template") or ""
        kw = dict(req.template_kwargs)
        if req.tools:
            if "tools" not in template:
                raise bad("this model's chat template does not support tools", "tools", "tools_unsupported")
            kw["tools"] = req.tools
        msgs = req.messages
        try:
            return self.chat.prompt_text(template=self.template, messages=_with_object_args(msgs), **kw)
        except UserError as e:
            if not any("tool_calls" in m for m in msgs):
                raise bad(str(e), "messages", "template_error") from None
        try:  # templates that write function.arguments as a string (DeepSeek) rather than as JSON
            return self.chat.prompt_text(template=self.template, messages=msgs, **kw)
        except UserError as e:
            raise bad(str(e), "messages", "template_error") from None

    def submit(self, prep: Prepared, loop) -> Job:
        job = Job(prep, loop, live=prep.req.stream)
        with self._lock:
            if self.pending > self.queue_limit:
                raise ApiError(429, f"the server is busy: {self.pending - 1} requests are already waiting "
                                    f"(--queue {self.queue_limit})", "queue_full")
            self.pending += 1
        self._jobs.put(job)
        return job


def _with_object_args(msgs: list[dict]) -> list[dict]:
    """Most templates (Qwen, Hermes) print tool_call.arguments with tojson: give them the object."""
    out = []
    for m in msgs:
        if "tool_calls" in m:
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=_obj(c["function"]["arguments"])))
                                    for c in m["tool_calls"]])
        out.append(m)
    return out


def _obj(args: str):
    try:
        return json.loads(args)
    except ValueError:
        return args
