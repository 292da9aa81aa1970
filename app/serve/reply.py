"""A streamed reply -> reasoning, answer and tool calls, as OpenAI fields.

Reasoning: `<think>...</think>` at the start of the reply, or everything up to
`</think>` when the chat template already opened `<think>` (DeepSeek-R1, Qwen3);
split as the TUI splits it (app/think.py). Tool calls: Hermes/Qwen
`<tool_call>{json}</tool_call>` and DeepSeek's `<｜tool▁call▁begin｜>` blocks.
Text that could still become a tag or a tool call is held back while streaming.
"""
from __future__ import annotations

import json
import re
import secrets

from ..think import CLOSE, OPEN, partial_tag_len, split_think

CALL_MARKERS = ("<tool_call>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_DS_BLOCK = re.compile(r"<｜tool▁calls▁begin｜>.*?(?:<｜tool▁calls▁end｜>|$)", re.S)
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>(?P<n1>[^\n<]+)\n```(?:json)?\n(?P<a1>.*?)\n```"
                      r"|(?P<n2>[^<]+?)<｜tool▁sep｜>(?P<a2>.*?))\s*(?:<｜tool▁call▁end｜>|$)", re.S)


def template_opens_think(prompt_text: str) -> bool:
    return prompt_text.rstrip().endswith(OPEN)


def make_call(name: str, args) -> dict | None:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
        return None
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name.strip(), "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """-> (the text without the calls, the calls). A block that does not parse stays text."""
    calls: list[dict] = []

    def hermes(m: re.Match) -> str:
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            return m.group(0)
        c = (make_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})))
             if isinstance(obj, dict) else None)
        if c is None:
            return m.group(0)
        calls.append(c)
        return ""

    def deepseek(block: re.Match) -> str:
        found = []
        for m in _DS_CALL.finditer(block.group(0)):
            c = make_call(m.group("n1") or m.group("n2"), m.group("a1") if m.group("n1") else m.group("a2"))
            if c is None:
                return block.group(0)
            found.append(c)
        if not found:
            return block.group(0)
        calls.extend(found)
        return ""

    text = _HERMES.sub(hermes, text)
    text = _DS_BLOCK.sub(deepseek, text)
    return text.strip() if calls else text, calls


class ReplyView:
    """Feed the reply's text as it grows; get (reasoning, content) deltas back.
    split: reasoning goes to its own field; else it stays in the content
    (with the template's `<think>` put back in front). tools: hold tool calls back."""

    def __init__(self, opened: bool = False, split: bool = True, tools: bool = False):
        self.opened, self.split, self.tools = opened, split, tools
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""
        self.tool_calls: list[dict] = []

    def _view(self, streaming: bool) -> tuple[str, str]:
        t = self.text
        if not self.split:
            return "", (OPEN + "\n" if self.opened else "") + t
        if self.opened:
            return split_think(OPEN + t, streaming)[:2]
        s = t.lstrip()
        if s.startswith(OPEN):
            return split_think(t, streaming)[:2]
        if streaming and OPEN.startswith(s):  # empty so far, or maybe the start of "<think>"
            return "", ""
        return "", t

    def _hold_calls(self, content: str) -> str:
        cut = min((i for i in (content.find(m) for m in CALL_MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            return content[:cut]
        hold = max(partial_tag_len(content, m) for m in CALL_MARKERS)
        return content[:len(content) - hold]

    def _delta(self, reasoning: str, content: str) -> tuple[str, str]:
        dr = dc = ""
        if reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            dr, self.sent_reasoning = reasoning[len(self.sent_reasoning):], reasoning
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            dc, self.sent_content = content[len(self.sent_content):], content
        return dr, dc

    def push(self, delta: str) -> tuple[str, str]:
        self.text += delta
        reasoning, content = self._view(streaming=True)
        if self.tools:
            content = self._hold_calls(content)
        return self._delta(reasoning, content)

    def finish(self) -> tuple[str, str]:
        """The rest of the reply, once it ended; tool calls land in self.tool_calls."""
        reasoning, content = self._view(streaming=False)
        if self.tools:
            content, self.tool_calls = parse_tool_calls(content)
        return self._delta(reasoning, content)

    @property
    def reasoning(self) -> str:
        return self.sent_reasoning

    @property
    def content(self) -> str:
        return self.sent_content


class ForcedCall:
    """ReplyView's part for a reply held to one tool call (constrain.py): no text
    streams; at the end the call, when the constraint saw it complete."""

    reasoning = content = ""

    def __init__(self, constraint):
        self.constraint = constraint
        self.tool_calls: list[dict] = []

    def push(self, delta: str) -> tuple[str, str]:
        return "", ""

    def finish(self) -> tuple[str, str]:
        got = self.constraint.result()
        call = make_call(*got) if got else None
        self.tool_calls = [call] if call else []
        return "", ""


__all__ = ["CLOSE", "OPEN", "ForcedCall", "ReplyView", "make_call", "parse_tool_calls", "template_opens_think"]
