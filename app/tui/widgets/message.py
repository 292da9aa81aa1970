"""One chat message: a role line, a collapsible <think> block, the body (a reply
as Markdown, a prompt as typed) and a stats footer. Streamed text is buffered
by `feed()` and drawn by `flush()`, which the reply stream calls on its timer
(~25 Hz, tui/reply_stream.py), appending only the new tail to the Markdown
widgets instead of re-rendering the whole reply."""
from __future__ import annotations

import asyncio

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Collapsible, Markdown, Static

from ...think import code_blocks, split_think

LONG_PROMPT_LINES = 80


class MessageView(Vertical, can_focus=True):
    BINDINGS = [
        Binding("c", "copy", "Copy message"),
        Binding("k", "copy_code", "Copy code block"),
    ]

    def __init__(self, role: str, text: str = "", *, label: str | None = None,
                 streaming: bool = False, footer: str = "", message_id: int | None = None):
        super().__init__(classes=f"message {role}")
        self.role = role
        self.label = label or ("You" if role == "user" else role.capitalize())
        self.message_id = message_id
        self.streaming = streaming
        self._text = text
        self._footer = footer
        self._shown = {"think": "", "answer": ""}
        self._lock = asyncio.Lock()
        self._code_index = 0

    @property
    def text(self) -> str:
        return self._text

    def _parts(self) -> tuple[str, str, bool]:
        if self.role == "user":  # a prompt is shown as written; a huge paste only by its head
            lines = self._text.split("\n")
            if len(lines) <= LONG_PROMPT_LINES:
                return "", self._text, False
            head = "\n".join(lines[:LONG_PROMPT_LINES // 2])
            more = len(lines) - LONG_PROMPT_LINES // 2
            return "", f"{head}\n\n… {more} more lines ({len(self._text) // 1024} KiB in all; c copies it)", False
        return split_think(self._text, streaming=self.streaming)

    def compose(self) -> ComposeResult:
        think, answer, thinking = self._parts()
        self._shown = {"think": think, "answer": answer}
        yield Static(self.label, classes="role", markup=False)
        box = Collapsible(title=_think_title(think, thinking), collapsed=True, classes="think")
        box.display = bool(think) or thinking
        with box:
            yield Markdown(think, classes="think-body")
        if self.role == "user":  # as typed: Markdown would join its lines into one paragraph
            yield Static(answer, classes="body", markup=False)
        else:
            yield Markdown(answer, classes="body")
        footer = Static(self._footer, classes="footer", markup=False)
        footer.display = bool(self._footer)
        yield footer

    def feed(self, delta: str) -> None:
        self._text += delta

    async def set_text(self, text: str) -> None:
        self._text = text
        await self.flush()

    async def finish(self, text: str, footer: str = "") -> None:
        self.streaming = False
        self._text = text
        await self.flush()
        self.set_footer(footer)

    def set_footer(self, footer: str) -> None:
        self._footer = footer
        if self.is_mounted:
            self.query_one(".footer", Static).update(footer)
            self.query_one(".footer", Static).display = bool(footer)

    async def flush(self) -> None:
        if not self.is_mounted:
            return
        think, answer, thinking = self._parts()
        if self.role == "user":
            self.query_one(".body", Static).update(answer)
            self._shown["answer"] = answer
            return
        async with self._lock:  # Markdown.append must not interleave
            for part, text, md in (("think", think, self.query_one(".think-body", Markdown)),
                                   ("answer", answer, self.query_one(".body", Markdown))):
                old = self._shown[part]
                if text == old:
                    continue
                if text.startswith(old) and old:
                    await md.append(text[len(old):])
                else:
                    await md.update(text)
                self._shown[part] = text
        box = self.query_one(Collapsible)
        box.display = bool(think) or thinking
        box.title = _think_title(think, thinking)
        self.query_one(".footer", Static).display = bool(self._footer)

    # --- copy ---
    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self._text)
        self.app.notify("Message copied", timeout=2)

    def action_copy_code(self) -> None:
        """Copies the code blocks one after the other on repeated presses."""
        blocks = code_blocks(split_think(self._text)[1])
        if not blocks:
            self.app.notify("No code block in this message", severity="warning", timeout=2)
            return
        block = blocks[self._code_index % len(blocks)]
        self._code_index += 1
        self.app.copy_to_clipboard(block)
        self.app.notify(f"Code block {(self._code_index - 1) % len(blocks) + 1}/{len(blocks)} copied",
                        timeout=2)


def _think_title(think: str, thinking: bool) -> str:
    return "Thinking…" if thinking else f"Thought ({len(think.split())} words)"


def reply_footer(f) -> str:
    """The footer of a reply just written; f: its engine.events.Finished."""
    tail = {"stop": "", "cancelled": " · stopped", "length": " · max tokens reached",
            "context": " · context full"}.get(f.finish_reason, f" · {f.finish_reason}")
    prompt = f"prompt {f.prompt_tok_s:.0f} tok/s · " if f.prompt_tok_s else ""  # 0: a server that reports none
    return f"{f.completion_tokens} tok · {f.decode_tok_s:.1f} tok/s · {prompt}TTFT {f.ttft_s:.2f} s{tail}"


def stored_footer(stats: dict | None) -> str:
    """The footer of a reply read back from the history."""
    if not stats:
        return ""
    tail = (" · cut off: the app was closed" if stats.get("cut") == "quit" else
            " · stopped" if stats.get("finish_reason") == "cancelled" else "")
    return (f"{stats.get('completion_tokens', 0)} tok · {stats.get('decode_tok_s', 0):.1f} tok/s · "
            f"TTFT {stats.get('ttft_s', 0):.2f} s{tail}")


class Note(Static):
    """A line from the app (help, stats, errors) between messages; not part of the chat."""

    def __init__(self, text: str, kind: str = "info"):
        super().__init__(text, classes=f"note {kind}", markup=False)
