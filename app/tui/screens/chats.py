"""The saved chats: open, rename, delete (press twice), export to Markdown."""
from __future__ import annotations

import time
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ....engine.errors import UserError


class ChatsScreen(ModalScreen[tuple[str, int] | None]):
    """Dismisses with ("open", chat id), ("changed", 0) after renames/deletes, or None."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, current: int | None = None):
        super().__init__()
        self.current = current
        self._confirm_delete: int | None = None
        self._changed = False

    def compose(self) -> ComposeResult:
        with Vertical(id="chats", classes="dialog"):
            yield Static("Chats", classes="dialog-title")
            yield OptionList(id="chat-list")
            yield Input(placeholder="new title, Enter to save", id="rename", select_on_focus=False)
            yield Static("Enter opens · r rename · d delete · e export · Esc closes", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#rename").display = False
        self.refresh_list()

    def refresh_list(self, keep: int | None = None) -> None:
        ol = self.query_one(OptionList)
        ol.clear_options()
        for c in self.app.store.list_chats():
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
            mark = "● " if c.id == self.current else "  "
            ol.add_option(Option(f"{mark}{c.title}  ·  {when}", id=str(c.id)))
        if ol.option_count:
            idx = 0
            if keep is not None:
                idx = next((i for i in range(ol.option_count) if ol.get_option_at_index(i).id == str(keep)), 0)
            ol.highlighted = idx
        ol.focus()

    def _selected(self) -> int | None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            return None
        return int(ol.get_option_at_index(ol.highlighted).id)

    @on(OptionList.OptionSelected)
    def _open(self, ev: OptionList.OptionSelected) -> None:
        self.dismiss(("open", int(ev.option.id)))

    def action_close(self) -> None:
        inp = self.query_one("#rename", Input)
        if inp.display:
            inp.display = False
            self.query_one(OptionList).focus()
            return
        self.dismiss(("changed", 0) if self._changed else None)

    def action_rename(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        inp = self.query_one("#rename", Input)
        inp.value = self.app.store.get_chat(cid).title
        inp.cursor_position = len(inp.value)
        inp.display = True
        inp.focus()

    @on(Input.Submitted, "#rename")
    def _renamed(self, ev: Input.Submitted) -> None:
        cid = self._selected()
        try:
            self.app.store.rename_chat(cid, ev.value)
        except UserError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        ev.input.display = False
        self._changed = True
        self.refresh_list(keep=cid)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        if self._confirm_delete != cid:
            self._confirm_delete = cid
            self.notify("Press d again to delete this chat", severity="warning", timeout=3)
            return
        self.app.store.delete_chat(cid)
        self._confirm_delete = None
        self._changed = True
        self.notify("Chat deleted")
        self.refresh_list()

    def action_export(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        out = Path.cwd() / f"chat-{cid}.md"
        try:
            out.write_text(self.app.store.export_markdown(cid), "utf-8")
        except OSError as e:
            self.notify(f"cannot write {out}: {e.strerror}", severity="error", markup=False)
            return
        self.notify(f"Exported to {out}", markup=False)
