"""The chat's scrolling log: its messages (MessageView, a ReplyStream while one is
written) and the app's notes between them. It follows new text unless the user
scrolls up."""
from __future__ import annotations

from textual.containers import VerticalScroll

from .message import MessageView, Note, stored_footer


class ChatLog(VerticalScroll):
    def on_mount(self) -> None:
        self.anchor()

    def note(self, text: str, kind: str = "info") -> Note:
        n = Note(text, kind)
        self.mount(n)
        return n

    async def show(self, messages, label: str) -> None:
        """Replace what is shown by stored messages (store.Message); label: who answered."""
        await self.remove_children()
        await self.mount_all([MessageView(m.role, m.content, message_id=m.id, footer=stored_footer(m.stats),
                                          label=None if m.role == "user" else label) for m in messages])

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    async def remove_last(self, role: str) -> None:
        """Remove the last message if it is one of `role`'s."""
        views = self.views()
        if views and views[-1].role == role:
            await views[-1].remove()

    async def remove_from(self, message_id: int) -> None:
        """Remove a stored message and all after it."""
        for v in self.views():
            if v.message_id is not None and v.message_id >= message_id:
                await v.remove()

    def last_reply(self) -> MessageView | None:
        views = [v for v in self.views() if v.role == "assistant"]
        return views[-1] if views else None
