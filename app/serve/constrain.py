"""tool_choice "required" or a named function: the reply is made to be a tool call.

As llama-server does with a grammar that is active from the first token, the
reply cannot be anything else: the prompt ends with the template's tool-call
opener (Hermes/Qwen `<tool_call>` or DeepSeek's; with a named function, its name
too), then each step allows only the tokens that keep the text a call (one of
the offered names, then one JSON object as the arguments), and once the object
closes the next token is end-of-generation. Among the allowed tokens the
sampler draws as usual. A reasoning template's open `<think>` is closed first:
a forced call has no reasoning.

A reply cut before its call is complete (max_tokens) is an error, never a
reply without a call."""
from __future__ import annotations

from dataclasses import dataclass

import torch

WS = " \t\n\r"
TOP = 64  # the most likely tokens checked first; the rest only when none of them fits
MASKED = -1e9  # finite: the sampler refuses infinite logits, and exp() of it is 0 all the same
_NUMBER = {  # a JSON number, one state per prefix kind
    "": {"-": "sign", "0": "zero", **dict.fromkeys("123456789", "int")},
    "sign": {"0": "zero", **dict.fromkeys("123456789", "int")},
    "zero": {".": "dot", "e": "e", "E": "e"},
    "int": {**dict.fromkeys("0123456789", "int"), ".": "dot", "e": "e", "E": "e"},
    "dot": dict.fromkeys("0123456789", "frac"),
    "frac": {**dict.fromkeys("0123456789", "frac"), "e": "e", "E": "e"},
    "e": {"+": "esign", "-": "esign", **dict.fromkeys("0123456789", "exp")},
    "esign": dict.fromkeys("0123456789", "exp"),
    "exp": dict.fromkeys("0123456789", "exp"),
}
_NUMBER_ENDS = {"zero", "int", "frac", "exp"}
_HEX = set("0123456789abcdefABCDEF")


class JsonObject:
    """Is the text so far the start of one JSON object? Fed one character at a time.
    Outside strings, whitespace comes one character at a time (a model cannot pad forever)."""

    def __init__(self):
        self.stack: list[str] = []  # open containers, "{" or "["
        self.mode = "start"
        self.sub = ""  # in a string: "", "esc" or "u0".."u3"; a number's state; a literal's remaining letters
        self.key = False  # the string is an object's key
        self.ws = False  # the last character was whitespace between tokens

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def clone(self) -> "JsonObject":
        c = JsonObject.__new__(JsonObject)
        c.__dict__.update(self.__dict__)
        c.stack = list(self.stack)
        return c

    def _closed_value(self) -> None:
        self.mode = "after" if self.stack else "done"

    def feed(self, ch: str) -> bool:
        m = self.mode
        if m == "string":
            return self._string(ch)
        if m == "number":
            nxt = _NUMBER[self.sub].get(ch)
            if nxt is not None:
                self.sub = nxt
                return True
            if self.sub not in _NUMBER_ENDS:
                return False
            self._closed_value()  # the number ended: this character follows it
            m = self.mode
        elif m == "literal":
            if ch != self.sub[0]:
                return False
            self.sub = self.sub[1:]
            if not self.sub:
                self._closed_value()
            return True
        if m == "done":
            return False
        if ch in WS:
            if self.ws:
                return False
            self.ws = True
            return True
        self.ws = False
        if m == "start":
            return self._open(ch) if ch == "{" else False
        if m in ("value", "value_or_end"):
            if m == "value_or_end" and ch == "]":
                return self._close("[")
            return self._value(ch)
        if m in ("key_or_end", "key"):
            if m == "key_or_end" and ch == "}":
                return self._close("{")
            if ch != '"':
                return False
            self.mode, self.sub, self.key = "string", "", True
            return True
        if m == "colon":
            if ch != ":":
                return False
            self.mode = "value"
            return True
        # after a value inside a container
        if ch == ",":
            self.mode = "key" if self.stack[-1] == "{" else "value"
            return True
        if ch in "}]":
            return self._close("{" if ch == "}" else "[")
        return False

    def _open(self, ch: str) -> bool:
        self.stack.append(ch)
        self.mode = "key_or_end" if ch == "{" else "value_or_end"
        return True

    def _close(self, opener: str) -> bool:
        if not self.stack or self.stack[-1] != opener:
            return False
        self.stack.pop()
        self._closed_value()
        return True

    def _value(self, ch: str) -> bool:
        if ch in "{[":
            return self._open(ch)
        if ch == '"':
            self.mode, self.sub, self.key = "string", "", False
            return True
        if ch in _NUMBER[""]:
            self.mode, self.sub = "number", _NUMBER[""][ch]
            return True
        rest = {"t": "rue", "f": "alse", "n": "ull"}.get(ch)
        if rest is None:
            return False
        self.mode, self.sub = "literal", rest
        return True

    def _string(self, ch: str) -> bool:
        s = self.sub
        if s == "":
            if ch == '"':
                if self.key:
                    self.mode = "colon"
                else:
                    self._closed_value()
            elif ch == "\\":
                self.sub = "esc"
            elif ord(ch) < 0x20:
                return False
            return True
        if s == "esc":
            if ch == "u":
                self.sub = "u0"
            elif ch in '"\\/bfnrt':
                self.sub = ""
            else:
                return False
            return True
        if ch not in _HEX:  # "u0".."u3": the four hex digits of \\uXXXX
            return False
        n = int(s[1]) + 1
        self.sub = "" if n == 4 else f"u{n}"
        return True


@dataclass(frozen=True)
class CallFormat:
    opener: str  # what the prompt ends with, before the function's name
    mid: str  # between the name and the JSON arguments


HERMES = CallFormat('<tool_call>\n{"name": "', '", "arguments": ')
DEEPSEEK_V3 = CallFormat("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n")
DEEPSEEK_V31 = CallFormat("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁sep｜>")


def call_format(template: str) -> CallFormat | None:
    """The tool-call format a chat template writes (the ones reply.py reads), or None."""
    if "<tool_call>" in template:
        return HERMES
    if "tool▁call▁begin" in template:
        return DEEPSEEK_V3 if "```json" in template else DEEPSEEK_V31
    return None


class CallText:
    """The text of a forced call after the prompt's opener: one of `names` and the
    format's `mid` (skipped when the name is given), then the JSON arguments."""

    def __init__(self, mid: str, names: list[str] | None = None, name: str | None = None):
        self.heads = [n + mid for n in names] if names else None
        self.mid, self.head, self.name = mid, "", name
        self.args = JsonObject()
        self.args_text = ""

    @property
    def done(self) -> bool:
        return self.args.done

    def clone(self) -> "CallText":
        c = CallText.__new__(CallText)
        c.__dict__.update(self.__dict__)
        c.args = self.args.clone()
        return c

    def feed(self, text: str) -> bool:
        for ch in text:
            if self.heads is not None:
                head = self.head + ch
                self.heads = [h for h in self.heads if h.startswith(head)]
                if not self.heads:
                    return False
                self.head = head
                if head in self.heads:  # a whole name and the separator after it
                    self.name, self.heads = head[:-len(self.mid)], None
            elif self.args.feed(ch):
                self.args_text += ch
            else:
                return False
        return True


class CallConstraint:
    """CallText over a tokenizer: masks each step's logits to the tokens that fit."""

    def __init__(self, tokenizer, text: CallText):
        self.tok, self.text = tokenizer, text
        self.end_id = tokenizer.eos_id if tokenizer.eos_id in tokenizer.eog_ids else min(tokenizer.eog_ids)
        self._texts: dict[int, tuple[str | None, bool]] = {}

    def _token(self, id: int) -> tuple[str | None, bool]:
        """(its text, whether it is a control token); None: never part of a call."""
        got = self._texts.get(id)
        if got is None:
            t = None
            if id not in self.tok.eog_ids:
                try:
                    t = self.tok.token_bytes(id).decode("utf-8") or None
                except UnicodeDecodeError:  # a piece of a character: only whole characters are checked
                    pass
            got = self._texts[id] = (t, self.tok.is_control(id))
        return got

    def _fits(self, id: int) -> bool:
        t, control = self._token(id)
        # a control token (DeepSeek's <｜tool▁sep｜>, say) may spell the format, never the arguments
        return t is not None and not (control and self.text.heads is None) and self.text.clone().feed(t)

    def advance(self, id: int) -> None:
        t, _ = self._token(id)
        if t is not None:
            self.text.feed(t)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.text.done:
            ok = [self.end_id]
        else:
            top = torch.topk(logits, min(TOP, logits.numel())).indices.tolist()
            ok = [i for i in top if self._fits(i)]
            if not ok:  # rare: the whole vocabulary, most likely first, until one fits
                order = torch.argsort(logits, descending=True).tolist()
                ok = next(([i] for i in order[TOP:] if self._fits(i)), [self.end_id])
        out = torch.full_like(logits, MASKED)
        idx = torch.tensor(ok, dtype=torch.long)
        out[idx] = logits[idx]
        return out

    def result(self) -> tuple[str, str] | None:
        """(name, arguments JSON) once the call is complete."""
        return (self.text.name, self.text.args_text) if self.text.done else None
