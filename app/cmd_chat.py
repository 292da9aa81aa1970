"""The default command: the TUI, or one prompt with -p (streamed to stdout)."""
from __future__ import annotations

import argparse
import json
import sys
import threading

from ..engine.errors import UserError
from ..engine.events import Finished, TextDelta
from .args import (
    add_model_arguments,
    add_sampling_arguments,
    apply_offline,
    apply_threads,
    check_sampling,
    critical_setting,
    flag_note,
    plan_request,
    remote_endpoint,
    sampling_overrides,
)
from .progress import StepProgress


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="chat through an OpenAI-compatible server (URL ends in /v1; -m names its model, "
                        "RAPIDMOE_ENDPOINT_KEY its key); a configured one: -m PROVIDER[:MODEL]")
    p.add_argument("-p", "--prompt", default=None, help="one prompt ('-' reads stdin); without it: the TUI")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--continue", dest="continue_", action="store_true", help="continue the last chat (history)")
    p.add_argument("--chat", type=int, default=None, metavar="ID", help="continue the chat with this id")
    p.add_argument("--no-history", action="store_true", help="do not store this exchange in the chat history")
    add_sampling_arguments(p)
    p.add_argument("--verbose", action="store_true", help="print prompt/decode tok/s and TTFT to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def note(msg: str) -> None:
    print(f"rapidmoe-chat: {flag_note(msg)}", file=sys.stderr)


def load_for_cli(args, quiet: bool = False, default_split: bool = False):
    from ..engine.loader import load_model  # deferred: loads torch, the compiled kernels

    apply_threads(args.threads)
    apply_offline(args)
    from .cmd_pull import BarProgress, LineProgress  # deferred: loads huggingface_hub, httpx2

    dl = None if quiet else (BarProgress() if sys.stderr.isatty() else LineProgress())
    try:
        with StepProgress(enabled=not quiet) as prog:
            return load_model(args.model, n_ctx=args.ctx, progress=prog, download_progress=dl,
                              critical=critical_setting(args, default_split), log=note,
                              placement=plan_request(args))
    finally:
        if dl is not None:
            dl.close()


def run(args) -> int:
    prompt = args.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = "-"
    if prompt is None:
        from .tui.app import run_tui  # deferred: loads torch, textual

        return run_tui(args)
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise UserError("empty prompt")
    return run_prompt(args, prompt)


def apply_config(args, cfg) -> None:
    """The settings the TUI reads, for -p: a flag wins, then config.toml / RAPIDMOE_*
    (model, ctx), then the defaults (the demo, the model's context)."""
    if args.model is None and cfg.model:
        args.model = cfg.model
    if args.ctx is None and cfg.ctx:
        args.ctx = cfg.ctx


def run_prompt(args, prompt: str) -> int:
    from ..engine.sampling import SamplingParams  # deferred: loads torch
    from .config import load_config  # deferred: loads platformdirs
    from .remote.client import RemoteError  # deferred: loads torch

    # a bad config, bad flags and a bad --chat id fail before anything is loaded or converted
    cfg = load_config()
    check_sampling(SamplingParams().with_overrides(**cfg.sampling_overrides()).with_overrides(**sampling_overrides(args)))
    if args.raw and args.system:
        raise UserError("--system has no effect with --raw")
    if getattr(args, "endpoint", None) is None:  # with --endpoint, -m alone names the server's model
        apply_config(args, cfg)
    remote = remote_endpoint(args)
    store, stored = (None, None) if args.raw else _open_history(args)
    cancel = threading.Event()
    model, chat, system, events = _start_reply(args, prompt, cfg, remote, store, stored, cancel)
    out = sys.stdout
    final: Finished | None = None
    text_parts: list[str] = []
    try:
        for ev in events:
            if isinstance(ev, TextDelta):
                text_parts.append(ev.text)
                if not args.json:
                    out.write(ev.text)
                    out.flush()
            elif isinstance(ev, Finished):
                final = ev
    except RemoteError as e:  # the server failed: what came is kept, marked cut, and the error is one line
        if args.json:
            out.write(json.dumps({"text": e.partial, "finish_reason": "cut"}) + "\n")
        elif text_parts:
            out.write("\n")
        out.flush()
        if store is not None and not args.no_history and e.partial:
            _record(args, store, stored, prompt, Finished("cut", e.partial, 0, len(text_parts), 0.0, 0.0, 0.0, 0, 0),
                    system, chat.answered_by)
        raise
    except KeyboardInterrupt:
        cancel.set()
        if args.json:
            out.write(json.dumps({"text": "".join(text_parts), "finish_reason": "cancelled"}) + "\n")
        else:
            out.write("\n")
        out.flush()
        return 130
    assert final is not None
    _print_result(args, final, model, chat, remote)
    out.flush()
    if store is not None and not args.no_history:  # after the reply is out: a failed write never loses it
        _record(args, store, stored, prompt, final, system, chat.answered_by if remote else None)
    return 0


def _start_reply(args, prompt: str, cfg, remote, store, stored, cancel):
    """The model (None for a server's), the chat object, the system prompt and the
    reply's events: a server's chat, a raw completion, or a local chat."""
    from ..engine.generate import ChatSession, Session  # deferred: loads torch
    from ..engine.sampling import SamplingParams  # deferred: loads torch

    system = args.system if args.system is not None else stored.system if stored else cfg.system
    if remote is not None:  # the server's model: config.toml [sampling] < flags, sent with each request
        from .remote.chat import RemoteChat  # deferred: loads torch

        params = SamplingParams().with_overrides(**cfg.sampling_overrides()).with_overrides(**sampling_overrides(args))
        chat = RemoteChat(remote, system=system or None, params=params)
        if stored is not None:
            chat.messages += store.context(stored.id)
        return None, chat, system, chat.send(prompt, cancel=cancel)
    model = load_for_cli(args, quiet=args.json or not sys.stderr.isatty(), default_split=True)
    # the model's own defaults < config.toml [sampling] < flags, as in the TUI
    params = (SamplingParams.from_metadata(model.metadata).with_overrides(**cfg.sampling_overrides())
              .with_overrides(**sampling_overrides(args)))
    if args.raw:
        sess = Session(model, params)
        ids = model.tokenizer.encode(prompt, add_special=True, parse_special=False)
        return model, None, system, sess.generate(ids, params, cancel)
    chat = ChatSession(model, system=system or None, params=params)
    if stored is not None:
        chat.messages += store.context(stored.id)
    return model, chat, system, chat.send(prompt, cancel=cancel)


def _print_result(args, final: Finished, model, chat, remote) -> None:
    """--json's object, or the closing newline; --verbose's figures on stderr."""
    out = sys.stdout
    if args.json:
        out.write(json.dumps({
            "text": final.text, "prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens,
            "ttft_s": round(final.ttft_s, 4), "prompt_tok_s": round(final.prompt_tok_s, 2),
            "decode_tok_s": round(final.decode_tok_s, 2), "finish_reason": final.finish_reason,
            "placement": model.placement if model else None,
            "plan_mode": model.plan.mode if model and model.plan else None,
            **({"answered_by": chat.answered_by} if remote else {}),
        }) + "\n")
    else:
        if not final.text.endswith("\n"):
            out.write("\n")
        if final.finish_reason == "context":
            print("rapidmoe-chat: stopped: the context window is full (raise --ctx)", file=sys.stderr)
    if args.verbose:  # a server's prompt speed only when it reports one (`timings`)
        prompt_rate = f", {final.prompt_tok_s:.1f} tok/s" if model or final.prompt_tok_s else ""
        # a server that sends no `usage` leaves the count at 0 (a prompt never has 0 tokens)
        read = (f"{final.prompt_tokens} tokens{prompt_rate}" if model or final.prompt_tokens
                else "not reported by the server")
        print(f"prompt: {read} | "
              f"decode: {final.completion_tokens} tokens, {final.decode_tok_s:.1f} tok/s | "
              f"TTFT {final.ttft_s * 1000:.0f} ms | finish: {final.finish_reason}", file=sys.stderr)
        print(f"placement: {model.placement}" if model else f"answered by: {chat.answered_by} ({remote.base_url})",
              file=sys.stderr)
        graphs = model.runner.graph_summary() if model else None
        if graphs:
            print(f"decode graphs: {graphs}", file=sys.stderr)


def _open_history(args):
    """-> (store or None, the chat to continue or None). Opened and checked before the
    model loads: a history that cannot be read or written fails now, in one line."""
    if args.chat is not None and args.continue_:
        raise UserError("--chat and --continue exclude each other")
    if args.no_history and args.chat is None and not args.continue_:
        return None, None
    from .store import ChatStore  # deferred: loads platformdirs

    store = ChatStore()
    if not args.no_history:
        store.check_writable()
    if args.chat is not None:
        return store, store.get_chat(args.chat)
    if args.continue_:
        last = store.last_chat()
        if last is None:
            raise UserError("no chat to continue yet")
        return store, last
    return store, None


def _record(args, store, chat, prompt: str, final: Finished, system: str | None,
            answered_by: str | None = None) -> None:
    """Keep the exchange in the chat history (a new chat, or the continued one), prompt and
    reply in one transaction. answered_by: provider:NAME/MODEL for a reply from a server."""
    stats = {"completion_tokens": final.completion_tokens, "decode_tok_s": round(final.decode_tok_s, 2),
             "prompt_tok_s": round(final.prompt_tok_s, 2), "ttft_s": round(final.ttft_s, 4),
             "finish_reason": final.finish_reason}
    if answered_by:
        stats["answered_by"] = answered_by
    if chat is not None and not store.has_chat(chat.id):
        chat = None  # deleted while the reply was written (in the TUI): the exchange becomes a new chat
    try:
        store.add_exchange(chat.id if chat else None, prompt, final.text, stats,
                           title=" ".join(prompt.split())[:60] or "New chat",
                           model=answered_by or str(args.model or "demo"), system=system or "")
    except UserError as e:
        raise UserError(f"the reply above was not saved in the chat history: {e}") from None
