"""The TUI's chat screen driven headlessly with Pilot, with the scripted backend
(timing must be controlled here): a reply streamed, stopped, cut by quitting,
regenerated and edited, its think block, the first screen, and --no-history. Slash
commands are in test_tui_commands.py, the other screens and the status line in
test_tui_screens.py, the real engine end to end in test_tui_models.py. Tests wait for
events and states, never for a time: a busy machine stretches every step, and nothing
here asserts how long one took."""
from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from textual.widgets import Collapsible, Markdown

sys.path.insert(0, str(Path(__file__).parent))
from rapidmoe.app.think import code_blocks, split_think  # noqa: E402
from rapidmoe.app.tui.widgets.message import MessageView  # noqa: E402
from rapidmoe.app.tui.widgets.status_bar import sparkline  # noqa: E402
from scripted_engine import ScriptedBackend  # noqa: E402
from tui_helpers import (SIZE, chat_app, make_app, notes, ready, reply, run_after_reply, send,  # noqa: E402
                         settle, views, wait_for)


def test_streams_a_reply_in_batches_and_shows_tok_s(tmp_path):
    words = " ".join(f"w{i}" + ("\n\n" if i % 10 == 9 else "") for i in range(120))
    backend = ScriptedBackend(replies=[words], token_s=0.002, critical=(2, 4, 1, 8))  # reports 500 tok/s

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            assert backend.loaded == ["demo"]  # first run: the demo
            flushes = []
            orig = MessageView.flush

            async def counting(self):
                flushes.append(len(self.text))
                await orig(self)

            MessageView.flush = counting
            try:
                await reply(pilot, "count for me")
            finally:
                MessageView.flush = orig
            assert views(scr) == [("user", "count for me"), ("assistant", words)]
            body = scr.query(MessageView).last().query_one(".body", Markdown)
            assert body.source == words
            log = scr.log_view
            await wait_for(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)  # followed
            # the engine emits the 120 tokens at once; the 25 Hz timer draws them in a few batches
            print(f"\n{len(flushes)} redraws for 120 tokens")
            assert 1 <= len(flushes) <= 30
            line = str(scr.status.line_text())
            assert re.search(r"decode 500\.0 tok/s", line) and "TTFT 0.01 s" in line
            assert "r 3.8 " in line and sparkline((2, 4, 1, 8)) in line  # mean and per-layer r
            msgs = app.store.messages(scr.chat.id)
            assert [m.role for m in msgs] == ["user", "assistant"]
            assert msgs[1].stats["finish_reason"] == "stop" and msgs[1].stats["completion_tokens"] == 120
            assert app.store.get_chat(scr.chat.id).title == "count for me"

    asyncio.run(main())


def test_escape_stops_generation_and_keeps_the_partial_reply(tmp_path):
    full = " ".join(f"t{i}" for i in range(400))
    backend = ScriptedBackend(replies=[full], hold_after=10)  # each reply waits after 10 tokens

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await send(pilot, "a long story please")
            head = " ".join(f"t{i}" for i in range(10))
            await wait_for(pilot, lambda: scr.query(MessageView).last().text == head)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not scr.generating)
            print(f"\nstop latency (scripted engine): {scr.stop_latencies[-1] * 1000:.0f} ms")
            assert scr.last_final.finish_reason == "cancelled" and scr.last_final.completion_tokens == 10
            assert scr.query(MessageView).last().text == head  # nothing after the stop
            assert "stopped" in str(scr.query(MessageView).last().query_one(".footer").render())
            stored = app.store.messages(scr.chat.id)[-1]
            assert stored.content == head and stored.stats["finish_reason"] == "cancelled"
            assert scr.engine_chat.messages[-1] == {"role": "assistant", "content": head}
            assert "stop latency" in scr.stats_text()

            # a new chat mid-reply: the reply stops and is kept in its own chat first
            first = scr.chat.id
            await send(pilot, "another story")
            await wait_for(pilot, lambda: scr.query(MessageView).last().text == head)
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: not scr.generating and scr.chat is None)
            assert views(scr) == []
            stored = app.store.messages(first)
            assert [m.role for m in stored] == ["user", "assistant"] * 2
            assert stored[-1].stats["finish_reason"] == "cancelled" and stored[-1].content == head

    asyncio.run(main())


def test_ctrl_c_stops_a_reply_and_quits_only_when_idle(tmp_path):
    backend = ScriptedBackend(replies=["a b c d e f g h"], hold_after=3)

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            scr = await ready(pilot)
            await send(pilot, "go")
            await wait_for(pilot, lambda: scr.query(MessageView).last().text == "a b c")
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: not scr.generating)
            assert app.is_running and app.screen is scr
            assert not any("quit" in str(n.message) for n in app._notifications)  # no "press ctrl+q" hint
            assert scr.last_final.finish_reason == "cancelled"
            assert app.store.messages(scr.chat.id)[-1].content == "a b c"
            # with text selected in the input, Ctrl+C copies it and nothing stops or quits
            scr.prompt.load_text("keep me")
            scr.prompt.select_all()
            await pilot.press("ctrl+c")
            assert app.clipboard == "keep me" and app.is_running
            scr.prompt.load_text("")
            await pilot.press("ctrl+c")  # idle: quits
            await wait_for(pilot, lambda: not app.is_running)

    asyncio.run(main())


def test_quitting_mid_reply_keeps_the_partial_reply_marked_cut(tmp_path):
    backend = ScriptedBackend(replies=["one two three four five six"], hold_after=4)

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await send(pilot, "tell me")
            await wait_for(pilot, backend.holding.is_set)
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: not app.is_running)
        return scr.chat.id

    chat_id = asyncio.run(main())
    app = make_app(tmp_path, ScriptedBackend())  # the same history file, opened again
    user, cut = app.store.messages(chat_id)
    assert (user.role, user.content) == ("user", "tell me")
    assert cut.role == "assistant" and cut.content == "one two three four"
    assert cut.stats["finish_reason"] == "cancelled" and cut.stats["cut"] == "quit"
    assert cut.stats["completion_tokens"] == 4

    async def reopen():
        app.open_chat_id = chat_id
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert views(scr) == [("user", "tell me"), ("assistant", "one two three four")]
            footer = str(scr.query(MessageView).last().query_one(".footer").render())
            assert "cut off: the app was closed" in footer
            assert [m["role"] for m in scr.engine_chat.messages] == ["user", "assistant"]

    asyncio.run(reopen())


def test_regenerate_and_edit_and_resend(tmp_path):
    backend = ScriptedBackend(replies=["first", "second", "third"])

    async def check(app, pilot, scr):
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not scr.generating and views(scr)[-1] == ("assistant", "second"))
        assert views(scr) == [("user", "q1"), ("assistant", "second")]
        assert backend.calls[-1] == [{"role": "user", "content": "q1"}]  # the old reply is gone
        assert [m.content for m in app.store.messages(scr.chat.id)] == ["q1", "second"]
        await pilot.press("ctrl+g")
        await settle(pilot)
        assert scr.prompt.text == "q1" and views(scr) == []
        await pilot.press(*" edited", "enter")
        await wait_for(pilot, lambda: not scr.generating and len(views(scr)) == 2)
        assert backend.calls[-1] == [{"role": "user", "content": "q1 edited"}]
        assert [m.content for m in app.store.messages(scr.chat.id)] == ["q1 edited", "third"]

    run_after_reply(tmp_path, backend, "q1", check)


def test_think_block_is_collapsible(tmp_path):
    backend = ScriptedBackend(replies=["<think>\nweigh the options carefully\n</think>\n\nThe answer is **4**."])

    async def check(app, pilot, scr):
        view = scr.query(MessageView).last()
        box = view.query_one(Collapsible)
        assert box.display and box.collapsed and box.title == "Thought (4 words)"
        assert view.query_one(".think-body", Markdown).source == "weigh the options carefully"
        assert view.query_one(".body", Markdown).source == "The answer is **4**."
        box.collapsed = False
        await wait_for(pilot, lambda: view.query_one(".think-body", Markdown).region.height > 0)

    run_after_reply(tmp_path, backend, "2+2?", check)


def test_split_think_streaming_cases():
    assert split_think("<think>a b") == ("a b", "", True)
    assert split_think("<think>a b</thi", streaming=True) == ("a b", "", True)  # half a tag is held back
    assert split_think("<think>x</think>\n\nans") == ("x", "ans", False)
    assert split_think("reasoning from the template</think>answer") == ("reasoning from the template",
                                                                      "answer", False)
    assert split_think("<thi", streaming=True) == ("", "", False)
    assert split_think("plain text") == ("", "plain text", False)
    assert code_blocks("a\n```py\nx = 1\n```\ntext\n~~~\ny\n~~~\n") == ["x = 1\n", "y\n"]


def test_first_screen_speaks_plainly(tmp_path):
    """A new user's first screen: a welcome that says what is happening and what to do,
    a placeholder in the input, and the engine's load notes in plain words (the notes
    here are the ones engine/loader.py and engine/pack/convert.py log on the demo's first start)."""
    engine_notes = ["UMIA: default profile (`rapidmoe-chat calibrate` fits one to this model and machine)",
                    "converted 79.6 M expert weights in 16.9 s (4.7 M weights/s on 2 threads, source type Q4_1)"]
    backend = ScriptedBackend(notes=engine_notes, held={"demo"})

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.is_loading and notes(scr))
            assert "loading the model: layer 1 of 5" in str(scr.query_one("#load-what").render())
            welcome = notes(scr)[0]
            assert welcome.startswith("Welcome to rapidmoe-chat. A small demo model")
            assert "you can type meanwhile" in welcome and "Enter sends" in welcome and "/help" in welcome
            assert scr.prompt.placeholder == "Type now: it is sent once the model is ready"
            backend.release("demo")
            await ready(pilot)
            shown = notes(scr)[1:]
            assert shown == ["Using standard speed settings for this model. Optional: `rapidmoe-chat calibrate` "
                             "tunes them to this model and computer.",
                             "Prepared the model for fast CPU use in 16.9 s. This happens once: later starts skip it."]
            assert scr.prompt.placeholder == "Message · Enter sends · Ctrl+J new line · /help"
            await reply(pilot, "hi")
        # a returning user is not welcomed again
        app2 = make_app(tmp_path, ScriptedBackend())
        async with app2.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert not any(n.startswith("Welcome") for n in notes(scr))

    asyncio.run(main())


def test_no_history_stores_nothing(tmp_path, monkeypatch):
    import argparse

    from rapidmoe.app import cmd_chat
    from rapidmoe.app.store import ChatStore
    from rapidmoe.app.tui.app import app_from_args

    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(tmp_path / "data"))
    disk = ChatStore()
    old = disk.create_chat("earlier")
    disk.add_message(old.id, "user", "from before")
    disk.add_message(old.id, "assistant", "answer from before")
    disk.set_state("last_model", "used.gguf")
    disk.close()
    p = argparse.ArgumentParser()
    cmd_chat.add_arguments(p)
    backend = ScriptedBackend(replies=["fresh reply"])

    async def session(argv):
        app = app_from_args(p.parse_args(argv), backend=backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert "not saved" in str(scr.query_one("#title").render())
            await reply(pilot, "a private question")
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: not app.is_running)
        return scr

    asyncio.run(session(["--no-history", "-m", "other.gguf"]))
    asyncio.run(session(["--no-history", "--continue"]))
    assert backend.loaded == ["other.gguf", "used.gguf"]  # the last used model is still read
    assert backend.calls[-1][:2] == [{"role": "user", "content": "from before"},
                                     {"role": "assistant", "content": "answer from before"}]
    disk = ChatStore()
    assert [c.title for c in disk.list_chats()] == ["earlier"]
    assert [m.content for m in disk.messages(old.id)] == ["from before", "answer from before"]
    assert disk.get_state("last_model") == "used.gguf"
