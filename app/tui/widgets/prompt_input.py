"""The prompt box: a TextArea where Enter sends, Shift+Enter / Ctrl+J / Alt+Enter
insert a newline (all rebindable), Up/Down on an empty or untouched box walk the
prompt history, Tab completes `/` commands. Pastes arrive as one Paste event,
so a pasted newline never sends (paste_parser.py keeps that true when a
terminal splits a long paste). Its placeholder says how to send, and that a
message typed while the model loads waits for it."""
from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from ..commands import candidates, complete


class PromptInput(TextArea):
    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, send_keys=("enter",), newline_keys=("shift+enter", "ctrl+j"), **kw):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kw)
        self.send_keys = set(send_keys)
        self.newline_keys = set(newline_keys)
        # Ctrl+J is a plain line feed: the one newline key every terminal passes on
        nl = "ctrl+j" if "ctrl+j" in newline_keys else (newline_keys[0] if newline_keys else "")
        hint = f"{key_label(send_keys[0]) if send_keys else 'Enter'} sends"
        hint += f" · {key_label(nl)} new line" if nl else ""
        self._placeholders = {False: f"Message · {hint} · /help",  # short: 80 columns show it whole
                              True: "Type now: it is sent once the model is ready"}
        self.placeholder = self._placeholders[False]
        self.prompt_history: list[str] = []
        self.arg_choices = None  # command -> values for Tab completion of its argument
        self._hist_pos: int | None = None

    def edit_text(self, text: str, *, focus: bool = False) -> None:
        """Put text in the box, the cursor at its end."""
        self.load_text(text)
        self.move_cursor(self.document.end)
        if focus:
            self.focus()

    def set_waiting(self, loading: bool) -> None:
        self.placeholder = self._placeholders[loading]

    def submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.post_message(self.Submitted(text))

    def _walk_history(self, step: int) -> bool:
        if not self.prompt_history or (self.text and self._hist_pos is None):
            return False
        pos = len(self.prompt_history) if self._hist_pos is None else self._hist_pos
        pos = max(0, min(len(self.prompt_history), pos + step))
        self._hist_pos = None if pos == len(self.prompt_history) else pos
        self.load_text("" if self._hist_pos is None else self.prompt_history[pos])
        self.move_cursor(self.document.end)
        return True

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key in self.send_keys:
            event.stop()
            event.prevent_default()
            self.submit()
            return
        if key in self.newline_keys:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if key == "tab" and self.text.startswith("/") and "\n" not in self.text:
            event.stop()  # in a command Tab completes, it never moves the focus away
            event.prevent_default()
            done = complete(self.text, self.arg_choices)
            if done and done != self.text:
                self.load_text(done)
                self.move_cursor(self.document.end)
            else:
                options = candidates(self.text, self.arg_choices)
                if options:
                    self.app.notify("  ".join(options[:30]), timeout=4, markup=False)
            return
        if key in ("up", "down") and self.cursor_location[0] in (0, self.document.line_count - 1):
            first, last = self.cursor_location[0] == 0, self.cursor_location[0] == self.document.line_count - 1
            if (key == "up" and first) or (key == "down" and last):
                if self._walk_history(-1 if key == "up" else 1):
                    event.stop()
                    event.prevent_default()
                    return
        if event.is_printable or key in ("backspace", "delete"):
            self._hist_pos = None
        await super()._on_key(event)


def key_label(keys: str) -> str:
    """The first of "ctrl+l,f2" as people write it: "Ctrl+L"."""
    first = next((k.strip() for k in keys.split(",") if k.strip()), keys)
    return "+".join(p.upper() if len(p) == 1 else p.capitalize() for p in first.split("+"))
