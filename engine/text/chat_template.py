"""Chat templates (`tokenizer.chat_template`) rendered the way Hugging Face
transformers renders them: jinja2 with trim_blocks / lstrip_blocks, loop
controls, `raise_exception`, `strftime_now` and a `tojson` that keeps
non-ASCII text. Templates come from model files, so they run in jinja2's
immutable sandbox: no attribute access to internals, no mutation of the
messages we pass in, no file or code access. A rendering is also bounded in
loop steps, time and the size of every value it makes (see _Sandbox), so a
hostile template ends in one line instead of exhausting the machine.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import re
import threading
import time
from typing import Any

import jinja2
import jinja2.compiler
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import UserError

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
MAX_CHARS = 16 << 20  # no prompt, and no string a template builds on the way, is longer
MAX_STEPS = 1_000_000  # loop iterations in one rendering (a chat of thousands of turns needs thousands)
MAX_INT_ARG = 1 << 20  # no width, count or indent a template passes is larger
TIME_LIMIT_S = 10.0  # RAPIDMOE_TEMPLATE_TIMEOUT overrides it


class _Stopped(Exception):
    """A bound on time, steps or size was reached: the rendering is abandoned."""


class _Budget(threading.local):
    steps = 0
    deadline = float("inf")

    def start(self) -> None:
        self.steps = 0
        try:
            limit = float(os.environ.get("RAPIDMOE_TEMPLATE_TIMEOUT") or TIME_LIMIT_S)
        except ValueError:
            limit = TIME_LIMIT_S
        self.deadline = time.monotonic() + limit

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise _Stopped(f"more than {MAX_STEPS:,} loop steps")
        if (self.steps & 255) == 0 or n > 1:
            self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Stopped("it ran out of time")


_budget = _Budget()
_WIDTHS = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?|\{[^{}]*:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")


def _size(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes, list, tuple, dict)) else 0


def _check_size(v: Any, what: str) -> Any:
    if _size(v) > MAX_CHARS:
        raise _Stopped(f"{what} made a value of {_size(v):,} items (the bound is {MAX_CHARS:,})")
    return v


def _check_args(args: tuple, kwargs: dict) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise _Stopped(f"an argument of {a:.3g} (the bound is {MAX_INT_ARG:,})")


def _estimate(name: str, obj: Any, args: tuple, kwargs: dict) -> int:
    """An upper bound on the length of what str method / filter `name` would return."""
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
    strs = [a for a in (*args, *kwargs.values()) if isinstance(a, str)]
    n = _size(obj) + sum(map(len, strs))
    if name in ("ljust", "rjust", "center", "zfill", "truncate"):
        return n + max(ints, default=0)
    if name == "replace" and isinstance(obj, str) and len(args) >= 2 and isinstance(args[1], str):
        hits = obj.count(args[0]) if isinstance(args[0], str) and args[0] else len(obj) + 1
        return len(obj) + hits * len(args[1])
    if name == "wordwrap" and isinstance(obj, str):  # at worst a wrap string after every character
        return len(obj) + (len(obj) + 1) * max(map(len, strs), default=1)
    if name in ("expandtabs", "indent") and isinstance(obj, str):
        per = max(ints, default=8) + max(map(len, strs), default=0)
        return len(obj) + (obj.count("\t") + obj.count("\n") + 1) * per
    if name == "join":
        items = obj if not isinstance(obj, str) else (args[0] if args else ())
        sep = obj if isinstance(obj, str) else (args[0] if args and isinstance(args[0], str) else "")
        try:
            k = len(items)
            return sum(len(x) if isinstance(x, str) else 32 for x in items) + k * len(sep)
        except TypeError:
            return n
    if name in ("format", "format_map", "%") and isinstance(obj, str):
        widths = sum(int(x) for m in _WIDTHS.finditer(obj) for x in m.groups() if x)
        return n + widths + len(obj) * max(ints, default=0) + sum(_size(a) for a in (*args, *kwargs.values()))
    return 0


def _bounded_filter(name: str, fn):
    @functools.wraps(fn)  # keeps jinja's pass_environment / pass_context marks
    def wrapper(*args, **kwargs):
        _check_args(args, kwargs)
        value = next((a for a in args if isinstance(a, (str, list, tuple))), None)
        if _estimate(name, value, args[1:], kwargs) > MAX_CHARS:
            raise _Stopped(f"the {name} filter would make a value over {MAX_CHARS:,} characters")
        return _check_size(fn(*args, **kwargs), f"the {name} filter")
    return wrapper


class _Sandbox(ImmutableSandboxedEnvironment):
    """Bounds what a template may cost: every operator, call, filter and loop step is
    checked against size, step and time limits, so a template cannot exhaust memory
    ('x' * 10**10, string doubling, ljust(10**9)) or run for minutes (nested loops)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def call_binop(self, context, operator, left, right):
        _budget.check_time()
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
            raise jinja2.exceptions.SecurityError("exponent too large")
        if operator == "*":
            for seq, k in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(k, int) and len(seq) * k > MAX_RESULT:
                    raise jinja2.exceptions.SecurityError("repetition result too large")
        if operator == "+" and _size(left) + _size(right) > MAX_CHARS:
            raise _Stopped(f"a + made a value over {MAX_CHARS:,} characters")
        if operator == "%" and isinstance(left, str):
            args = right if isinstance(right, tuple) else (right,)
            if _estimate("%", left, args, {}) > MAX_CHARS:
                raise _Stopped(f"a % format would make a value over {MAX_CHARS:,} characters")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        _budget.check_time()
        _check_args(args, kwargs)
        target = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(target, str) and _estimate(name, target, args, kwargs) > MAX_CHARS:
            raise _Stopped(f"str.{name} would make a value over {MAX_CHARS:,} characters")
        return _check_size(super().call(__context, __obj, *args, **kwargs), name or "a call")

    def wrap_str_format(self, value):
        fn = super().wrap_str_format(value)
        if fn is None:
            return None
        fmt = value.__self__

        @functools.wraps(fn)
        def bounded(*args, **kwargs):
            if _estimate("format", fmt, args, kwargs) > MAX_CHARS:
                raise _Stopped(f"str.format would make a value over {MAX_CHARS:,} characters")
            return _check_size(fn(*args, **kwargs), "str.format")
        return bounded

    def concat_bounded(self, parts: tuple) -> str:
        if sum(len(p) if isinstance(p, str) else 64 for p in parts) > MAX_CHARS:
            raise _Stopped(f"a ~ made a value over {MAX_CHARS:,} characters")
        return "".join(map(str, parts))

    def bounded_iter(self, iterable):
        _check_size(iterable, "a loop")
        for item in iterable:
            _budget.tick()
            yield item


class _CodeGen(jinja2.compiler.CodeGenerator):
    def visit_Concat(self, node, frame) -> None:  # `a ~ b` goes through the size check
        self.write("environment.concat_bounded((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


@functools.lru_cache(maxsize=1)
def _env() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.code_generator_class = _CodeGen
    env.filters["tojson"] = _tojson
    env.filters = {k: _bounded_filter(k, f) for k, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # paragraphs on demand: no chat template needs them
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = _env()
    ast = env.parse(template)
    for loop in ast.find_all(nodes.For):  # every loop step counts against the budget
        loop.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [loop.iter], [], None, None,
                               lineno=loop.lineno)
    return env.from_string(ast)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def render_chat(template: str | None, messages: list[dict], *, bos_token: str, eos_token: str,
                add_generation_prompt: bool = True, **variables: Any) -> str:
    """Render a conversation to prompt text. `variables` are passed to the template
    as well (tools, documents, enable_thinking, ...). A broken template or one that
    refuses the conversation is a UserError with a one-line message."""
    try:
        tmpl = _compile(template or CHATML)
        _budget.start()
        out: list[str] = []
        size = 0
        for piece in tmpl.generate(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                   add_generation_prompt=add_generation_prompt, **variables):
            size += len(piece)
            if size > MAX_CHARS:
                raise _Stopped(f"its output passed {MAX_CHARS:,} characters")
            out.append(piece)
        return "".join(out)
    except _Stopped as e:
        raise UserError(f"the chat template was stopped: {e} (a broken or hostile "
                        "tokenizer.chat_template in the model file)") from None
    except MemoryError:
        raise UserError("the chat template was stopped: it ran out of memory") from None
    except _TemplateRaised as e:
        raise UserError(f"the chat template refused the conversation: {_one_line(e)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template is invalid (line {e.lineno}): {_one_line(e.message)}") from None
    except jinja2.exceptions.SecurityError as e:
        raise UserError(f"the chat template tried something unsafe: {_one_line(e)}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError) as e:
        raise UserError(f"the chat template failed: {type(e).__name__}: {_one_line(e)}") from None
