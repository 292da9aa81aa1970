"""Split a (possibly still streaming) reply into its <think> part and its answer.

Reasoning models either write `<think> ... </think>` themselves or get the
opening tag from the chat template (DeepSeek-R1), so only `</think>` shows up.
"""
from __future__ import annotations

import re

OPEN, CLOSE = "<think>", "</think>"
_CODE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`:
    held back while streaming so a half-written tag never flashes on screen."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_think(text: str, streaming: bool = False) -> tuple[str, str, bool]:
    """-> (thinking, answer, still_thinking)."""
    stripped = text.lstrip()
    if stripped.startswith(OPEN):
        body = stripped[len(OPEN):]
        end = body.find(CLOSE)
        if end < 0:
            hold = partial_tag_len(body, CLOSE) if streaming else 0
            return body[:len(body) - hold].strip("\n"), "", True
        return body[:end].strip("\n"), body[end + len(CLOSE):].lstrip(), False
    end = text.find(CLOSE)
    if end >= 0:
        return text[:end].strip("\n"), text[end + len(CLOSE):].lstrip(), False
    if streaming and OPEN.startswith(stripped) and stripped:
        return "", "", False  # maybe the start of "<think>"
    hold = partial_tag_len(text, CLOSE) if streaming else 0
    return "", text[:len(text) - hold], False


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks, in order."""
    return [m.group(2) for m in _CODE.finditer(markdown)]
