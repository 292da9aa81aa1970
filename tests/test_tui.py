"""The TUI's chat screens driven headlessly with Pilot, with the scripted backend
(timing must be controlled here). The real engine runs end to end in
test_tui_models.py."""
from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from textual import events
from textual.widgets import Collapsible, Markdown, OptionList

sys.path.insert(0, str(Path(__file__).parent))
from scripted_engine import ScriptedBackend  # noqa: E402

from rapidmoe.app.tui.context_meter import ContextMeter  # noqa: E402
from rapidmoe.app.tui.message import MessageView  # noqa: E402
from rapidmoe.app.tui.status_bar import sparkline  # noqa: E402
from rapidmoe.app.tui.think import code_blocks, split_think  # noqa: E402
from tui_helpers import SIZE, make_app, notes, ready, reply, send, views, wait_for  # noqa: E402


def test_streams_a_reply_in_batches_and_shows_tok_s(tmp_path):
    words = " ".join(f"w{i}" + ("\n\n" if i % 10 == 9 else "") for i in range(120))
    backend = ScriptedBackend(replies=[words], token_s=0.002, critical=(2, 4, 1, 8))

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
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
            await pilot.pause(0.05)
            assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y  # followed the reply
            # 120 tokens in ~0.25 s drawn at 25 Hz: a handful of redraws, not one per token
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
    backend = ScriptedBackend(replies=[full], token_s=0.03)

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await send(pilot, "a long story please")
            await wait_for(pilot, lambda: len(scr.query(MessageView).last().text) > 20)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not scr.generating)
            latency = scr.stop_latencies[-1]
            print(f"\nstop latency (scripted engine, 30 ms/token): {latency * 1000:.0f} ms")
            assert latency < 0.2
            partial = scr.query(MessageView).last().text
            assert 20 < len(partial) < len(full) and full.startswith(partial)
            assert "stopped" in str(scr.query(MessageView).last().query_one(".footer").render())
            stored = app.store.messages(scr.chat.id)[-1]
            assert stored.content == partial and stored.stats["finish_reason"] == "cancelled"
            assert scr.engine_chat.messages[-1] == {"role": "assistant", "content": partial}
            assert "stop latency" in scr.stats_text()

            # a new chat mid-reply: the reply stops and is kept in its own chat first
            first = scr.chat.id
            await send(pilot, "another story")
            await wait_for(pilot, lambda: len(scr.query(MessageView).last().text) > 10)
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: not scr.generating and scr.chat is None)
            assert views(scr) == []
            stored = app.store.messages(first)
            assert [m.role for m in stored] == ["user", "assistant"] * 2
            assert stored[-1].stats["finish_reason"] == "cancelled" and full.startswith(stored[-1].content)

    asyncio.run(main())


def test_input_keys_newlines_large_paste_and_history(tmp_path):
    backend = ScriptedBackend(replies=["ok"])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await pilot.press("l", "1", "shift+enter", "l", "2", "ctrl+j", "l", "3")
            assert scr.prompt.text == "l1\nl2\nl3" and not backend.calls
            big = "\n".join(f"line {i} " + "x" * 60 for i in range(3000))  # ~200 kB with newlines
            scr.prompt.load_text("")
            app.post_message(events.Paste(big))  # as the terminal driver delivers it
            await pilot.pause(0.1)
            assert scr.prompt.text == big and not backend.calls  # a pasted newline never sends
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.last_final is not None)
            assert backend.calls[-1][-1] == {"role": "user", "content": big}
            shown = scr.query(MessageView).first().query_one(".body", Markdown).source
            assert "2960 more lines" in shown and len(shown) < 5000  # drawn by its head, sent whole
            assert scr.prompt.text == ""
            await pilot.press("up")  # prompt history on an empty input
            assert scr.prompt.text == big
            await pilot.press("down")
            assert scr.prompt.text == ""

    asyncio.run(main())


def test_regenerate_and_edit_and_resend(tmp_path):
    backend = ScriptedBackend(replies=["first", "second", "third"])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await reply(pilot, "q1")
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: not scr.generating and views(scr)[-1] == ("assistant", "second"))
            assert views(scr) == [("user", "q1"), ("assistant", "second")]
            assert backend.calls[-1] == [{"role": "user", "content": "q1"}]  # the old reply is gone
            assert [m.content for m in app.store.messages(scr.chat.id)] == ["q1", "second"]
            await pilot.press("ctrl+g")
            await pilot.pause(0.05)
            assert scr.prompt.text == "q1" and views(scr) == []
            await pilot.press(*" edited", "enter")
            await wait_for(pilot, lambda: not scr.generating and len(views(scr)) == 2)
            assert backend.calls[-1] == [{"role": "user", "content": "q1 edited"}]
            assert [m.content for m in app.store.messages(scr.chat.id)] == ["q1 edited", "third"]

    asyncio.run(main())


def test_slash_commands(tmp_path, monkeypatch):
    backend = ScriptedBackend(replies=["Here:\n\n```py\nprint(1)\n```\n\nand\n\n```sh\nls\n```\n"])
    monkeypatch.chdir(tmp_path)

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await pilot.press(*"/reg", "tab")
            assert scr.prompt.text == "/regen "  # Tab completes the unique match
            scr.prompt.load_text("/set te")
            await pilot.press("end", "tab")
            assert scr.prompt.text == "/set temperature "  # ...and then the argument
            scr.prompt.load_text("/model de")
            await pilot.press("end", "tab")
            assert scr.prompt.text == "/model demo "
            scr.prompt.load_text("/s")
            await pilot.press("end", "tab")
            assert scr.prompt.text == "/s" and scr.prompt.has_focus  # /set /stats /system: no longer prefix
            scr.prompt.load_text("/help")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert "/model" in notes(scr)[-1] and "/set" in notes(scr)[-1]
            for cmd in ("/set temperature 0.25", "/set stop END, STOP", "/system You are terse."):
                scr.prompt.load_text(cmd)
                await pilot.press("enter")
                await pilot.pause(0.05)
            assert app.store.get_chat(scr.chat.id).params == {"temperature": 0.25, "stop": ["END", "STOP"]}
            assert scr.params().temperature == 0.25 and scr.params().stop == ("END", "STOP")
            assert scr.engine_chat.messages[0] == {"role": "system", "content": "You are terse."}
            scr.prompt.load_text("/set temprature 2")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert "unknown setting 'temprature'" in notes(scr)[-1]
            scr.prompt.load_text("/bogus")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert "unknown command /bogus" in notes(scr)[-1]
            await reply(pilot, "code please")
            assert backend.calls[-1][0] == {"role": "system", "content": "You are terse."}
            assert app.store.get_chat(scr.chat.id).title == "code please"  # named by its first prompt
            await pilot.press("ctrl+t")
            assert app.clipboard == backend.replies[0]
            await pilot.press("ctrl+b")
            assert app.clipboard == "print(1)\n"
            await pilot.press("ctrl+b")
            assert app.clipboard == "ls\n"
            # markup-like text stays text
            for cmd in ("/rename My [/plan]", "/export out.md", "/export out.json", "/stats"):
                scr.prompt.load_text(cmd)
                await pilot.press("enter")
                await pilot.pause(0.05)
            assert app.store.get_chat(scr.chat.id).title == "My [/plan]"
            assert "My [/plan]" in str(scr.query_one("#title").render())
            md = (tmp_path / "out.md").read_text()
            assert md.startswith("# My [/plan]") and "## You\n\ncode please" in md and "```sh\nls\n```" in md
            assert json.loads((tmp_path / "out.json").read_text())["messages"][0]["content"] == "code please"
            assert notes(scr)[-1].startswith("prompt ") and "tok/s" in notes(scr)[-1]
            scr.prompt.load_text("/clear")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert views(scr) == [] and app.store.messages(scr.chat.id) == []
            assert scr.engine_chat.messages == [{"role": "system", "content": "You are terse."}]

    asyncio.run(main())


def test_think_block_is_collapsible(tmp_path):
    backend = ScriptedBackend(replies=["<think>\nweigh the options carefully\n</think>\n\nThe answer is **4**."])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await reply(pilot, "2+2?")
            view = scr.query(MessageView).last()
            box = view.query_one(Collapsible)
            assert box.display and box.collapsed and box.title == "Thought (4 words)"
            assert view.query_one(".think-body", Markdown).source == "weigh the options carefully"
            assert view.query_one(".body", Markdown).source == "The answer is **4**."
            box.collapsed = False
            await pilot.pause(0.05)
            assert view.query_one(".think-body", Markdown).region.height > 0

    asyncio.run(main())


def test_split_think_streaming_cases():
    assert split_think("<think>a b") == ("a b", "", True)
    assert split_think("<think>a b</thi", streaming=True) == ("a b", "", True)  # half a tag is held back
    assert split_think("<think>x</think>\n\nans") == ("x", "ans", False)
    assert split_think("reasoning from the template</think>answer") == ("reasoning from the template",
                                                                      "answer", False)
    assert split_think("<thi", streaming=True) == ("", "", False)
    assert split_think("plain text") == ("", "plain text", False)
    assert code_blocks("a\n```py\nx = 1\n```\ntext\n~~~\ny\n~~~\n") == ["x = 1\n", "y\n"]


def test_context_meter_warns_before_truncation(tmp_path):
    backend = ScriptedBackend(replies=["a b c d e f g h i j"], n_ctx=40)

    async def main():
        app = make_app(tmp_path, backend, overrides={"max_tokens": 16})
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            scr = await ready(pilot)
            meter = scr.query_one(ContextMeter)
            assert meter.level == "ok"
            await reply(pilot, "one two three four five six seven eight nine ten eleven twelve")
            assert meter.ctx_used == scr.last_final.context_used and meter.ctx_size == 40
            assert meter.level == "warn" and meter.has_class("-warn")
            assert any("nearly full" in str(n.message) for n in app._notifications)

    asyncio.run(main())


def test_chats_screen_rename_delete_open(tmp_path):
    async def main():
        app = make_app(tmp_path, ScriptedBackend(replies=["r"]))
        store = app.store
        a = store.create_chat("alpha")
        store.add_message(a.id, "user", "from alpha")
        store.add_message(a.id, "assistant", "alpha reply")
        b = store.create_chat("beta")
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await pilot.press("ctrl+o")
            await pilot.pause(0.05)
            ol = app.screen.query_one(OptionList)
            assert ol.option_count == 2
            await pilot.press("r")
            await pilot.press(*"2", "enter")  # rename "beta" (newest first) to "beta2"
            await pilot.pause(0.05)
            assert store.get_chat(b.id).title == "beta2"
            await pilot.press("d", "d")  # delete needs a second press
            await pilot.pause(0.05)
            assert [c.id for c in store.list_chats()] == [a.id]
            await pilot.press("enter")  # open alpha
            await wait_for(pilot, lambda: scr.chat is not None and scr.chat.id == a.id)
            await pilot.pause(0.05)
            assert views(scr) == [("user", "from alpha"), ("assistant", "alpha reply")]
            assert scr.engine_chat.messages == [{"role": "user", "content": "from alpha"},
                                                {"role": "assistant", "content": "alpha reply"}]

    asyncio.run(main())


def test_screenshots_of_the_main_screens(tmp_path):
    """SVG screenshots: what a person sees on each screen."""
    backend = ScriptedBackend(replies=["Sure: **bold** and `code`."])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await reply(pilot, "show me")
            shots = {"chat": app.export_screenshot()}
            for key, name in (("ctrl+o", "chats"), ("ctrl+s", "settings"), ("ctrl+l", "models")):
                await pilot.press(key)
                await pilot.pause(0.1)
                shots[name] = app.export_screenshot()
                await pilot.press("escape")
                await pilot.pause(0.05)
            path = app.save_screenshot(path=str(tmp_path), filename="chat.svg")
            assert Path(path).read_text().startswith("<svg")

        def text(svg):
            return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", svg).replace("&#160;", " "))

        chat = text(shots["chat"])
        for s in ("You", "show me", "Sure:", "decode", "tok/s", "TTFT", "CPU-centric", "ctx", "Regen"):
            assert s in chat, s
        assert "Chats" in text(shots["chats"]) and "show me" in text(shots["chats"])
        assert "System prompt" in text(shots["settings"]) and "temperature" in text(shots["settings"])
        assert "demo" in text(shots["models"]) and "REPO[:QUANT]" in text(shots["models"])

    asyncio.run(main())


def test_command_palette_runs_our_commands(tmp_path):
    backend = ScriptedBackend(replies=["one", "two"])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await reply(pilot, "hi")
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            await pilot.press(*"regenerate")
            await pilot.pause(0.3)  # the palette searches asynchronously
            await pilot.press("enter")
            await wait_for(pilot, lambda: not scr.generating and views(scr)[-1] == ("assistant", "two"))
            assert len(backend.calls) == 2 and app.screen is scr

    asyncio.run(main())


def test_attach_a_file_and_edit_in_editor(tmp_path, monkeypatch):
    src = tmp_path / "notes.py"
    src.write_text("x = '```'\nprint(x)\n")
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2")
    editor = tmp_path / "ed.sh"
    editor.write_text('#!/bin/sh\nprintf " and more" >> "$1"\n')
    editor.chmod(0o755)
    monkeypatch.setenv("VISUAL", str(editor))

    async def main():
        app = make_app(tmp_path, ScriptedBackend())
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            scr.prompt.load_text(f"/attach {src}")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert scr.prompt.text == "`notes.py`:\n````py\nx = '```'\nprint(x)\n````\n"
            assert code_blocks(scr.prompt.text) == ["x = '```'\nprint(x)\n"]  # the fence survives
            scr.prompt.load_text(f"/attach {tmp_path / 'blob.bin'}")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert "binary" in notes(scr)[-1]
            scr.prompt.load_text("draft")
            await pilot.press("f4")
            await pilot.pause(0.05)
            assert scr.prompt.text == "draft and more"

    asyncio.run(main())
