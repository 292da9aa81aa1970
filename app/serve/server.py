"""The Starlette app: /health, /v1/models, /v1/chat/completions, /v1/completions.

Every refusal has the OpenAI error shape and its status (400 bad JSON or field,
401 key, 404/405 route, 413 body too large, 429 queue full, 503 loading), and
the server keeps serving after it. A client that goes away (stream or not)
sets its job's cancel event: the engine stops within one decode step."""
from __future__ import annotations

import asyncio
import hmac
import json
import time

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...engine.events import TextDelta
from .errors import ApiError
from .protocol import GenRequest, parse_chat, parse_completion, parse_json
from .reply import ForcedCall, ReplyView
from .shapes import FINISH, Shaper, rapidmoe, timings, usage
from .worker import Done, Job, Worker


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class Api:
    def __init__(self, worker: Worker, model_name: str, api_key: str | None, max_body: int,
                 reasoning: str = "split"):
        self.worker, self.model_name = worker, model_name
        self.api_key, self.max_body, self.reasoning = api_key, max_body, reasoning
        self.started = int(time.time())

    # -- checks, in the order a request meets them --
    def _auth(self, request: Request) -> None:
        if not self.api_key:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_api_key")

    def _ready(self) -> None:
        if self.worker.state == "loading":
            raise ApiError(503, "the model is still loading", "loading")
        if self.worker.state != "ready":
            raise ApiError(503, f"the model failed to load: {self.worker.error}", "load_failed")

    async def _body(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise ApiError(413, f"the request body is {declared} bytes; the limit is {self.max_body}", "body_too_large")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise ApiError(413, f"the request body is over the limit of {self.max_body} bytes",
                                   "body_too_large")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ApiError(400, "the client went away while sending the body", "client_disconnected") from None
        return parse_json(b"".join(chunks))

    # -- routes --
    async def health(self, request: Request) -> Response:
        try:
            self._ready()
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        self._auth(request)
        self._ready()
        m = self.worker.model
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.started, "owned_by": "rapidmoe-chat",
            "context_length": m.n_ctx,
            "meta": {"n_ctx_train": m.cfg.n_ctx_train, "placement": m.placement, "critical": m.critical}}]})

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, parse_completion)

    async def _generate(self, request: Request, parse) -> Response:
        self._auth(request)
        self._ready()
        req: GenRequest = parse(await self._body(request), self.worker.n_ctx)
        prep = await anyio.to_thread.run_sync(self.worker.prepare, req)
        job = self.worker.submit(prep, asyncio.get_running_loop())
        shaper = Shaper(req.kind, self.model_name)
        split = req.kind == "chat" and (req.reasoning or self.reasoning) == "split"
        view = ForcedCall(prep.call) if prep.call else ReplyView(opened=prep.opened_think and req.kind == "chat",
                                                                  split=split, tools=bool(req.tools))
        if req.stream:
            async def gone(_message) -> None:  # also when the stream had not begun yet
                job.cancel.set()

            return EventSourceResponse(self._stream(job, shaper, view, req), sep="\n", ping=10,
                                       client_close_handler_callable=gone)
        return await self._whole(request, job, shaper, view, req)

    # -- running a job --
    async def _events(self, job: Job):
        while True:
            item = await job.events.get()
            if item is None:  # cancelled before it started
                return
            if isinstance(item, ApiError):
                raise item
            yield item
            if isinstance(item, Done):
                return

    def _extra(self, done: Done) -> dict:
        return {"timings": timings(done.finished, done.prompt_len),
                "rapidmoe": rapidmoe(self.worker.model, done.stats)}

    async def _stream(self, job: Job, shaper: Shaper, view: ReplyView, req: GenRequest):
        chat = req.kind == "chat"

        def delta(dr: str, dc: str):
            if chat:
                d = {k: v for k, v in (("reasoning_content", dr), ("content", dc)) if v}
                return json.dumps(shaper.chunk(d)) if d else None
            return json.dumps(shaper.chunk(text=dc)) if dc else None

        try:
            if chat:
                yield json.dumps(shaper.chunk({"role": "assistant", "content": ""}))
            async for item in self._events(job):
                if isinstance(item, TextDelta):
                    out = delta(*view.push(item.text))
                    if out:
                        yield out
                elif isinstance(item, Done):
                    out = delta(*view.finish())
                    if out:
                        yield out
                    finish = _finish(view, req, item)
                    if view.tool_calls:
                        calls = [{"index": i, **c} for i, c in enumerate(view.tool_calls)]
                        yield json.dumps(shaper.chunk({"tool_calls": calls}))
                    yield json.dumps({**shaper.chunk(finish=finish), **self._extra(item)})
                    if req.include_usage:
                        yield json.dumps({**shaper.usage_chunk(usage(item.finished, item.prompt_len)),
                                          **self._extra(item)})
            yield "[DONE]"
        except ApiError as e:
            yield json.dumps(e.body())
        finally:
            job.cancel.set()  # a client that left stops the engine at its next step

    async def _whole(self, request: Request, job: Job, shaper: Shaper, view: ReplyView,
                     req: GenRequest) -> Response:
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            job.cancel.set()

        watcher = asyncio.create_task(watch())
        try:
            async for item in self._events(job):
                if isinstance(item, Done):  # a whole-reply job sends only its end
                    view.push(item.finished.text)
                    view.finish()
                    finish = _finish(view, req, item)
                    return JSONResponse(shaper.whole(view.content, finish, usage(item.finished, item.prompt_len),
                                                     self._extra(item), view.reasoning, view.tool_calls))
            return Response(status_code=204)  # the client left before its turn
        finally:
            watcher.cancel()
            job.cancel.set()


def _finish(view, req: GenRequest, done: Done) -> str:
    """The finish_reason; a forced tool call the reply did not complete is an error, not a reply."""
    if view.tool_calls:
        return "tool_calls"
    reason = done.finished.finish_reason
    if req.tool_choice != "auto":
        asked = "required" if req.tool_choice == "required" else f"names {req.tools[0]['function']['name']!r}"
        raise ApiError(400, f"tool_choice {asked}, but the reply ended ({FINISH[reason]}, "
                            f"{done.finished.completion_tokens} tokens) before its tool call was complete"
                       + ("; raise max_tokens" if reason in ("length", "context") else ""),
                       "tool_call_incomplete", "max_tokens")
    return FINISH[reason]


def build_app(api: Api) -> Starlette:
    async def on_api_error(request, exc: ApiError):
        return error_response(exc)

    async def on_http(request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ApiError(exc.status_code, msg, code))

    async def on_other(request, exc: Exception):
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))

    routes = [Route("/health", api.health, methods=["GET"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/completions", api.completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={ApiError: on_api_error, HTTPException: on_http,
                                                       Exception: on_other})
