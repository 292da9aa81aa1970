"""The OpenAI response objects: chat completions and their stream chunks,
text completions, usage, plus llama-server's `timings` and our `rapidmoe`."""
from __future__ import annotations

import secrets
import time

from ...engine.events import Finished

FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage(f: Finished, prompt_len: int) -> dict:
    return {"prompt_tokens": prompt_len, "completion_tokens": f.completion_tokens,
            "total_tokens": prompt_len + f.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": prompt_len - f.prompt_tokens}}


def timings(f: Finished, prompt_len: int) -> dict:
    decoded = max(f.completion_tokens - 1, 0)  # the first token's time is the prompt's (TTFT)
    return {"prompt_n": f.prompt_tokens, "cache_n": prompt_len - f.prompt_tokens,
            "prompt_ms": round(f.prompt_tokens / f.prompt_tok_s * 1000, 3) if f.prompt_tok_s else 0.0,
            "prompt_per_second": round(f.prompt_tok_s, 3),
            "predicted_n": f.completion_tokens,
            "predicted_ms": round(decoded / f.decode_tok_s * 1000, 3) if f.decode_tok_s else 0.0,
            "predicted_per_second": round(f.decode_tok_s, 3),
            "ttft_ms": round(f.ttft_s * 1000, 3)}


def rapidmoe(model, stats: dict) -> dict:
    plan = getattr(model, "plan", None)
    return {**stats, "placement": model.placement, "plan_mode": plan.mode if plan is not None else None,
            "critical_setting": model.critical}


class Shaper:
    """Builds the objects of one request (one id, one created time)."""

    def __init__(self, kind: str, model_name: str):
        self.kind, self.model = kind, model_name
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def chunk(self, delta: dict | None = None, text: str | None = None, finish: str | None = None) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, use: dict) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": use}

    def whole(self, content: str, finish: str, use: dict, extra: dict, reasoning: str = "",
              tool_calls: list | None = None) -> dict:
        if self.kind == "chat":
            msg: dict = {"role": "assistant", "content": content if content or not tool_calls else None}
            if reasoning:
                msg["reasoning_content"] = reasoning
            if tool_calls:
                msg["tool_calls"] = tool_calls
            choice = {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion"), "choices": [choice], "usage": use, **extra}
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice], "usage": use, **extra}
