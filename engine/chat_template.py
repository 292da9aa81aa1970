"""Chat templates (`tokenizer.chat_template`) rendered the way Hugging Face
transformers renders them: jinja2 with trim_blocks / lstrip_blocks, loop
controls, `raise_exception`, `strftime_now` and a `tojson` that keeps
non-ASCII text. Templates come from model files, so they run in jinja2's
immutable sandbox: no attribute access to internals, no mutation of the
messages we pass in.
"""
from __future__ import annotations

import datetime
import functools
import json
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import UserError

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def default_template() -> str:
    """ChatML, used when the model file carries no chat template."""
    return CHATML


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part for
    training masks in transformers; for rendering it is just its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


MAX_RESULT = 1 << 20  # no template needs a megabyte-long string or list from one operation


class _Sandbox(ImmutableSandboxedEnvironment):
    """Also bounds `*` and `**`, which could otherwise ask for gigabytes ('x' * 10**10)."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
            raise jinja2.exceptions.SecurityError("exponent too large")
        if operator == "*":
            for seq, k in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(k, int) and len(seq) * k > MAX_RESULT:
                    raise jinja2.exceptions.SecurityError("repetition result too large")
        return super().call_binop(context, operator, left, right)


@functools.lru_cache(maxsize=1)
def _env() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    return _env().from_string(template)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def render_chat(template: str | None, messages: list[dict], *, bos_token: str, eos_token: str,
                add_generation_prompt: bool = True, **variables: Any) -> str:
    """Render a conversation to prompt text. `variables` are passed to the template
    as well (tools, documents, enable_thinking, ...). A broken template or one that
    refuses the conversation is a UserError with a one-line message."""
    try:
        tmpl = _compile(template or CHATML)
        return tmpl.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                           add_generation_prompt=add_generation_prompt, **variables)
    except _TemplateRaised as e:
        raise UserError(f"the chat template refused the conversation: {_one_line(e)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template is invalid (line {e.lineno}): {_one_line(e.message)}") from None
    except jinja2.exceptions.SecurityError as e:
        raise UserError(f"the chat template tried something unsafe: {_one_line(e)}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, RecursionError) as e:
        raise UserError(f"the chat template failed: {type(e).__name__}: {_one_line(e)}") from None
