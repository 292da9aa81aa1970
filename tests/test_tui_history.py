"""The TUI on a history that a crash or a hand edit left behind: a prompt killed before
its reply is shown but never sent with the next one (two user turns in a row are what
alternating-role templates refuse), and a chat with damaged settings is one notice."""
from __future__ import annotations

import asyncio

from scripted_engine import ScriptedBackend
from tui_helpers import SIZE, make_app, ready, send, wait_for

from rapidmoe.app.store import ChatStore


def test_an_unanswered_prompt_is_shown_and_never_sent(tmp_path):
    s = ChatStore(tmp_path / "history.db")
    c = s.add_exchange(None, "q1", "a1", title="t")
    s.add_message(c.id, "user", "killed before its reply")
    s.close()
    backend = ScriptedBackend(replies=["a2"])
    app = make_app(tmp_path, backend)
    app.open_chat_id = c.id

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert [m.content for m in app.store.messages(c.id)][-1] == "killed before its reply"
            assert [m["content"] for m in scr.engine_chat.messages] == ["q1", "a1"]
            await send(pilot, "q2")
            await wait_for(pilot, lambda: scr.last_final is not None and not scr.generating)
            roles = [m["role"] for m in backend.calls[-1]]
            assert roles == ["user", "assistant", "user"] and backend.calls[-1][-1]["content"] == "q2"
            assert [t["content"] for t in app.store.context(c.id)] == ["q1", "a1", "q2", "a2"]

    asyncio.run(main())


def test_a_chat_with_damaged_settings_is_one_notice(tmp_path):
    s = ChatStore(tmp_path / "history.db")
    good = s.add_exchange(None, "q", "a", title="good")
    bad = s.add_exchange(None, "q", "a", title="bad")
    s.db.execute("UPDATE chats SET params = 'oops' WHERE id = ?", (bad.id,))
    s.close()
    app = make_app(tmp_path, ScriptedBackend())
    app.open_chat_id = good.id

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await scr.show_chat(bad.id)
            await wait_for(pilot, lambda: any("damaged settings" in str(n.message) for n in app._notifications))
            assert scr.chat.id == good.id  # still on the chat it was showing
            assert {c.title for c in app.store.list_chats()} == {"good", "bad"}

    asyncio.run(main())
