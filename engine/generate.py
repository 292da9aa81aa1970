"""Streaming generation over a model with a persistent KV cache.

`Session.generate(prompt_tokens)` processes only the tokens that are not already
in the cache (the longest common prefix is reused), then samples and yields
events (engine/events.py). `ChatSession` adds messages and the chat template.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

import torch

from .conversation import Conversation
from .errors import ContextError
from .events import Finished, PromptProcessed, TextDelta
from .sampling import Sampler, SamplingParams

PREFILL_CHUNK = 256


class Session:
    def __init__(self, model, params: SamplingParams | None = None):
        self.model = model
        self.params = params or SamplingParams.from_metadata(model.metadata)
        self.runner = model.runner
        self.cache = self.runner.new_cache(model.n_ctx)
        self.last_trace = None  # StepTrace of the last prefill or decode call
        self.tokens: list[int] = []  # what the KV cache holds, in order

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def reset(self) -> None:
        self.tokens = []

    def _prefill(self, new: list[int], cancel) -> torch.Tensor | None:
        """Run the uncached tail of the prompt; returns the last position's logits [V]."""
        logits = None
        for i in range(0, len(new), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                return None
            chunk = new[i:i + PREFILL_CHUNK]
            pos0 = len(self.tokens)
            out, self.last_trace = self.runner.prefill(chunk, pos0, self.cache, last_only=True)
            logits = out[0]
            self.tokens.extend(chunk)
        return logits

    def generate(self, prompt: list[int], params: SamplingParams | None = None,
                 cancel: threading.Event | None = None) -> Iterator:
        p = params or self.params
        p.validate()
        tok = self.model.tokenizer
        if len(prompt) >= self.n_ctx:
            raise ContextError("the prompt", len(prompt), self.n_ctx)
        t0 = time.perf_counter()
        # reuse the cached prefix; at least one token must run to produce logits
        common = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)
        self.tokens = self.tokens[:common]
        new = prompt[common:]
        logits = self._prefill(new, cancel)
        t_prompt = time.perf_counter() - t0
        prompt_tok_s = len(new) / t_prompt if t_prompt > 0 else 0.0
        sampler = Sampler(p)
        dec = tok.stream_decoder()
        stops = [s for s in p.stop if s]
        hold = max((len(s) for s in stops), default=1) - 1
        text, emitted, n_out = "", 0, 0
        ttft = 0.0
        t_first = None
        reason = "cancelled" if logits is None else None
        history = list(prompt)
        while reason is None:
            nxt = sampler(logits, history)
            n_out += 1
            now = time.perf_counter()
            if t_first is None:
                t_first = now
                ttft = now - t0
                yield PromptProcessed(len(new), common, prompt_tok_s, ttft)
            decode_tok_s = (n_out - 1) / (now - t_first) if n_out > 1 and now > t_first else 0.0
            if nxt in tok.eog_ids:
                reason = "stop"
                text += dec.flush()
                break
            history.append(nxt)
            text += dec.push(nxt)
            hit = min((text.find(s) for s in stops if s in text), default=-1)
            if hit >= 0:
                text = text[:hit]
                reason = "stop"
            elif n_out >= p.max_tokens:
                reason = "length"
            elif len(self.tokens) >= self.n_ctx:
                reason = "context"
            # emit what can no longer become part of a stop string
            safe = len(text) if reason else max(emitted, len(text) - hold)
            if safe > emitted:
                yield TextDelta(text[emitted:safe], n_out, decode_tok_s,
                                self.last_trace.critical if self.last_trace else None)
                emitted = safe
            if reason:
                break  # the last sampled token is not fed: the next turn's prefix match copes
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            logits = self._feed(nxt)
        if len(text) > emitted:
            yield TextDelta(text[emitted:], n_out, 0.0)
        end = time.perf_counter()
        decode_tok_s = (n_out - 1) / (end - t_first) if t_first and n_out > 1 and end > t_first else 0.0
        yield Finished(reason, text, len(new), n_out, ttft, prompt_tok_s, decode_tok_s,
                       len(self.tokens), self.n_ctx)

    def _feed(self, token: int) -> torch.Tensor:
        logits, self.last_trace = self.runner.decode(token, len(self.tokens), self.cache)
        self.tokens.append(token)
        return logits


class ChatSession(Conversation):
    """Messages + chat template on top of a Session; the KV cache is reused
    across turns, so each turn processes only its new tokens."""

    def __init__(self, model, system: str | None = None, params: SamplingParams | None = None):
        from .text.chat_template import render_chat  # deferred: loads jinja2

        self._render = render_chat
        self.session = Session(model, params)
        self.model = model
        self.messages: list[dict] = []
        if system:
            self.messages.append({"role": "system", "content": system})

    @property
    def params(self) -> SamplingParams:
        return self.session.params

    @params.setter
    def params(self, p: SamplingParams) -> None:
        self.session.params = p

    def prompt_text(self, add_generation_prompt: bool = True, template: str | None = None,
                    messages: list[dict] | None = None, **variables) -> str:
        """The conversation (self.messages, or `messages`) through the chat template (the
        model's, or `template`); `variables` reach the template too (tools, enable_thinking, ...)."""
        tok, meta = self.model.tokenizer, self.model.metadata
        return self._render(template or meta.get("tokenizer.chat_template") or "",
                            self.messages if messages is None else messages,
                            bos_token=tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                            eos_token=tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
                            add_generation_prompt=add_generation_prompt, **variables)

    def encode_prompt(self, text: str) -> list[int]:
        tok = self.model.tokenizer
        # the template writes BOS itself when it wants one: add it only if it did not
        ids = tok.encode(text, add_special=True, parse_special=True)
        if len(ids) > 1 and tok.bos_id is not None and ids[0] == ids[1] == tok.bos_id:
            ids = ids[1:]
        return ids

    def prompt_tokens(self, add_generation_prompt: bool = True) -> list[int]:
        return self.encode_prompt(self.prompt_text(add_generation_prompt))

    def _reply(self, cancel, params) -> Iterator:
        try:
            ids = self.prompt_tokens()
        except Exception:
            self.messages.pop()
            raise
        final = None
        for ev in self.session.generate(ids, params, cancel):
            if isinstance(ev, Finished):
                final = ev
            yield ev
        if final is not None:
            self.messages.append({"role": "assistant", "content": final.text})
