"""`rapidmoe-chat serve -m MODEL`: an OpenAI-compatible HTTP server (chat
completions, completions, models, health) over one loaded model."""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import threading
from pathlib import Path

from ..engine.errors import UserError
from .args import add_model_arguments
from .cmd_chat import apply_config, load_for_cli, note

KEY_ENV = "RAPIDMOE_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                                                      "any other than loopback needs an API key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", default=None, help=f"clients must send `Authorization: Bearer KEY` "
                                                   f"(default: ${KEY_ENV} when set)")
    p.add_argument("--queue", type=int, default=8, metavar="N",
                   help="requests that may wait while one runs; more are refused with 429 (default 8)")
    p.add_argument("--max-body-kb", type=int, default=4096, help="largest request body in KiB (default 4096)")
    p.add_argument("--alias", default=None, help="the model name /v1/models reports (default: -m as given)")
    p.add_argument("--chat-template", type=Path, default=None, metavar="FILE",
                   help="a Jinja chat template to use instead of the model's (rendered sandboxed)")
    p.add_argument("--reasoning-format", choices=("split", "inline"), default="split",
                   help="split: <think> text goes to reasoning_content (default); inline: it stays in content")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check(args) -> str | None:
    key = args.api_key if args.api_key is not None else os.environ.get(KEY_ENV) or None
    if not _loopback(args.host) and not key:
        raise UserError(f"--host {args.host} is reachable from other machines: set an API key "
                        f"(--api-key or ${KEY_ENV})")
    if not 0 <= args.port <= 65535:
        raise UserError("--port must be in 0..65535")
    if args.queue < 0:
        raise UserError("--queue must be >= 0")
    if args.max_body_kb <= 0:
        raise UserError("--max-body-kb must be > 0")
    return key


def _template(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        text = path.expanduser().read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--chat-template {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    from ..engine.text.chat_template import render_chat  # deferred: loads jinja2

    render_chat(text, [{"role": "user", "content": "hi"}], bos_token="", eos_token="")  # a broken one fails now
    return text


def run(args) -> int:
    from .config import load_config  # deferred: loads platformdirs

    key = _check(args)
    template = _template(args.chat_template)
    cfg = load_config()
    apply_config(args, cfg)
    try:
        import uvicorn  # deferred: loads uvicorn

        from .serve.server import Api, build_app  # deferred: loads torch, starlette
        from .serve.worker import Worker  # deferred: loads torch, numpy
    except ImportError as e:
        raise UserError(f"serve needs the server packages ({e.name} is missing): "
                        "pip install 'starlette' 'uvicorn' 'sse-starlette'") from None

    def base_params(model):
        from ..engine.sampling import SamplingParams  # deferred: loads torch

        params = SamplingParams.from_metadata(model.metadata).with_overrides(**cfg.sampling_overrides())
        if "max_tokens" not in cfg.sampling:
            params = params.with_overrides(max_tokens=model.n_ctx)  # as OpenAI: until the context is full
        return params

    name = args.alias or str(args.model or "demo")
    worker = Worker(lambda: load_for_cli(args, quiet=False, default_split=True), args.queue, base_params,
                    template=template, log=note)
    api = Api(worker, name, key, args.max_body_kb * 1024, args.reasoning_format)
    sock = _bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(build_app(api), log_level="warning", timeout_graceful_shutdown=3, access_log=False)
    server = uvicorn.Server(config)
    note(f"listening on http://{host if ':' not in host else f'[{host}]'}:{port}/v1 "
         f"(model {name}; /health answers 503 until it is loaded)" + ("; API key required" if key else ""))
    worker.start()
    threading.Thread(target=_when_loaded, args=(worker, server, name), daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        sock.close()
    if worker.state == "failed":
        raise UserError(worker.error or "the model failed to load")
    return 0


def _bind(host: str, port: int) -> socket.socket:
    sock = None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        if sock is not None:
            sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _when_loaded(worker, server, name: str) -> None:
    """Say when the model is ready; stop the server when it cannot load."""
    worker.ready.wait()
    if worker.state == "ready":
        m = worker.model
        note(f"ready: {name} · context {m.n_ctx} · {m.placement}")
    else:
        server.should_exit = True
