"""OpenAI request bodies -> checked requests. Every problem is an ApiError(400)
naming the field; fields we do not use (user, metadata, store, ...) are ignored."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad

ROLES = {"system", "user", "assistant", "tool", "developer"}
MAX_STOPS = 16
# the names the template gets from us: a request's chat_template_kwargs cannot replace them
RESERVED = {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass
class GenRequest:
    kind: str  # "chat" | "completion"
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] = field(default_factory=list)
    prompt: str = ""
    tools: list[dict] | None = None
    tool_choice: str = "auto"  # "auto" | "required" | "function" (the one tool in `tools`)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning: str | None = None  # "split" | "inline" | None: the server's setting
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams overrides


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise bad("the request body is not UTF-8", code="invalid_json") from None
    except (json.JSONDecodeError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise bad(f"the request body is not valid JSON ({msg})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict, key: str, lo: float | None = None, hi: float | None = None,
            integer: bool = False, lo_open: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        if integer and isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise bad(f"'{key}' must be {kind}, not {json.dumps(v)[:40]}", key)
    if not integer:
        try:
            v = float(v)
        except OverflowError:  # an integer past float's range
            raise bad(f"'{key}' must be finite", key) from None
    if isinstance(v, float) and not math.isfinite(v):
        raise bad(f"'{key}' must be finite", key)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise bad(f"'{key}' must be {'>' if lo_open else '>='} {lo}, got {v}", key)
    if hi is not None and v > hi:
        raise bad(f"'{key}' must be <= {hi}, got {v}", key)
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be true or false", key)
    return v


def _sampling(body: dict, n_ctx: int) -> dict:
    s: dict[str, Any] = {}
    mt = _number(body, "max_completion_tokens", 1, integer=True)
    if mt is None:
        mt = _number(body, "max_tokens", 1, integer=True)
    if mt is not None:
        if mt > n_ctx:
            name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
            raise bad(f"'{name}' is {mt} but the context holds {n_ctx} tokens", name)
        s["max_tokens"] = mt
    for key, lo, hi, integer, lo_open in (("temperature", 0, 100, False, False), ("top_p", 0, 1, False, True),
                                          ("top_k", 0, None, True, False), ("min_p", 0, 1, False, False),
                                          ("repeat_penalty", 0, None, False, True),
                                          ("frequency_penalty", -2, 2, False, False),
                                          ("presence_penalty", -2, 2, False, False)):
        v = _number(body, key, lo, hi, integer, lo_open)
        if v is not None:
            s[key] = float(v) if not integer else v
    seed = _number(body, "seed", integer=True)
    if seed is not None:
        s["seed"] = seed % (1 << 63)  # torch seeds are 64-bit; negative seeds map onto them
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise bad("'stop' must be a string or a list of strings", "stop")
        if len(stops) > MAX_STOPS:
            raise bad(f"'stop' holds at most {MAX_STOPS} strings", "stop")
        s["stop"] = tuple(x for x in stops if x)
    n = body.get("n")
    if n is not None and n != 1:
        raise bad("only 'n' = 1 is supported", "n")
    if body.get("logprobs") not in (None, False, 0):
        raise bad("'logprobs' is not supported", "logprobs")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("'response_format' supports only {\"type\": \"text\"}", "response_format")
    return s


def _common(req: GenRequest, body: dict, n_ctx: int) -> GenRequest:
    req.stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        req.include_usage = _bool(opts, "include_usage")
    req.sampling = _sampling(body, n_ctx)
    if "model" in body and not isinstance(body["model"], str):
        raise bad("'model' must be a string", "model")
    return req


def _text_content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad(f"{where}.content: each part must be an object with a 'type'", "messages")
            if part["type"] != "text":
                raise bad(f"{where}.content: '{part['type'][:40]}' parts are not supported (text only)", "messages")
            if not isinstance(part.get("text"), str):
                raise bad(f"{where}.content: a text part needs a string 'text'", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}.content must be a string or a list of text parts", "messages")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls must be a list", "messages")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.tool_calls: each call needs a function with a name", "messages")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise bad(f"{where}.tool_calls: function.arguments must be a JSON string", "messages")
        out.append({"id": str(c.get("id") or ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(sorted(ROLES))}", "messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        content = _text_content(m.get("content"), where)
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        elif content is None:
            raise bad(f"{where}.content is missing", "messages")
        msg["content"] = content
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _tools(body: dict) -> tuple[list[dict] | None, str]:
    """-> (the tools the template is given, "auto" | "required" | "function"); with a named
    function ("function") the list holds that tool alone."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise bad("'tools' must be a list", "tools")
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools")
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(
        choice.get("function"), dict) and isinstance(choice["function"].get("name"), str)
    if choice is not None and choice not in ("none", "auto", "required") and not named:
        raise bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                  "{\"name\": ...}}", "tool_choice")
    if (named or choice == "required") and not tools:
        raise bad("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice")
    if not tools or choice == "none":
        return None, "auto"
    if named:
        name = choice["function"]["name"]
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise bad(f"'tool_choice' names {name[:64]!r}, which is not among 'tools'", "tool_choice")
        return chosen[:1], "function"
    return tools, choice or "auto"


def _template_kwargs(body: dict) -> dict:
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    for k in kw:
        if not _IDENT.match(k) or k in RESERVED:
            raise bad(f"'chat_template_kwargs' cannot set {k[:40]!r}", "chat_template_kwargs")
    return kw


def _reasoning(body: dict) -> str | None:
    v = body.get("reasoning_format")
    if v is None:
        return None
    names = {"split": "split", "deepseek": "split", "auto": "split", "inline": "inline", "none": "inline"}
    if not isinstance(v, str) or v not in names:
        raise bad("'reasoning_format' must be split or inline", "reasoning_format")
    return names[v]


def parse_chat(body: dict, n_ctx: int) -> GenRequest:
    req = _common(GenRequest("chat"), body, n_ctx)
    req.messages = _messages(body)
    req.tools, req.tool_choice = _tools(body)
    req.template_kwargs = _template_kwargs(body)
    req.reasoning = _reasoning(body)
    return req


def parse_completion(body: dict, n_ctx: int) -> GenRequest:
    req = _common(GenRequest("completion"), body, n_ctx)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad("'prompt' must be a non-empty string", "prompt")
    if body.get("echo"):
        raise bad("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported", "suffix")
    req.prompt = prompt
    return req


def check_limit(n_prompt: int, n_ctx: int) -> None:
    if n_prompt >= n_ctx:
        raise ApiError(400, f"the prompt is {n_prompt} tokens but the context holds {n_ctx}",
                       "context_length_exceeded", "messages")
