"""The TUI's chat screens driven headlessly with Pilot, with the scripted backend
(timing must be controlled here). The real engine runs end to end in
test_tui_models.py. Tests wait for events and states, never for a time: a
busy machine stretches every step, and nothing here asserts how long one took."""
from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from textual.command import CommandList, CommandPalette
from textual.widgets import Collapsible, Markdown, OptionList

sys.path.insert(0, str(Path(__file__).parent))
from rapidmoe.app.think import code_blocks, split_think  # noqa: E402
from rapidmoe.app.tui.widgets.context_meter import ContextMeter  # noqa: E402
from rapidmoe.app.tui.widgets.message import MessageView  # noqa: E402
from rapidmoe.app.tui.widgets.status_bar import sparkline  # noqa: E402
from scripted_engine import ScriptedBackend  # noqa: E402
from tui_helpers import SIZE, chat_app, make_app, notes, ready, reply, send, settle, views, wait_for  # noqa: E402


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

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await reply(pilot, "q1")
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

    asyncio.run(main())


def test_slash_commands(tmp_path, monkeypatch):
    backend = ScriptedBackend(replies=["Here:\n\n```py\nprint(1)\n```\n\nand\n\n```sh\nls\n```\n"])
    monkeypatch.chdir(tmp_path)

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
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
            await settle(pilot)
            assert "/model" in notes(scr)[-1] and "/set" in notes(scr)[-1]
            for cmd in ("/set temperature 0.25", "/set stop END, STOP", "/system You are terse."):
                scr.prompt.load_text(cmd)
                await pilot.press("enter")
                await settle(pilot)
            assert app.store.get_chat(scr.chat.id).params == {"temperature": 0.25, "stop": ["END", "STOP"]}
            assert scr.params().temperature == 0.25 and scr.params().stop == ("END", "STOP")
            assert scr.engine_chat.messages[0] == {"role": "system", "content": "You are terse."}
            scr.prompt.load_text("/set temprature 2")
            await pilot.press("enter")
            await settle(pilot)
            assert "unknown setting 'temprature'" in notes(scr)[-1]
            scr.prompt.load_text("/bogus")
            await pilot.press("enter")
            await settle(pilot)
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
                await settle(pilot)
            assert app.store.get_chat(scr.chat.id).title == "My [/plan]"
            assert "My [/plan]" in str(scr.query_one("#title").render())
            md = (tmp_path / "out.md").read_text()
            assert md.startswith("# My [/plan]") and "## You\n\ncode please" in md and "```sh\nls\n```" in md
            assert json.loads((tmp_path / "out.json").read_text())["messages"][0]["content"] == "code please"
            assert notes(scr)[-1].startswith("prompt ") and "tok/s" in notes(scr)[-1]
            scr.prompt.load_text("/clear")
            await pilot.press("enter")
            await settle(pilot)
            assert views(scr) == [] and app.store.messages(scr.chat.id) == []
            assert scr.engine_chat.messages == [{"role": "system", "content": "You are terse."}]

    asyncio.run(main())


def test_think_block_is_collapsible(tmp_path):
    backend = ScriptedBackend(replies=["<think>\nweigh the options carefully\n</think>\n\nThe answer is **4**."])

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await reply(pilot, "2+2?")
            view = scr.query(MessageView).last()
            box = view.query_one(Collapsible)
            assert box.display and box.collapsed and box.title == "Thought (4 words)"
            assert view.query_one(".think-body", Markdown).source == "weigh the options carefully"
            assert view.query_one(".body", Markdown).source == "The answer is **4**."
            box.collapsed = False
            await wait_for(pilot, lambda: view.query_one(".think-body", Markdown).region.height > 0)

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
            await settle(pilot)
            ol = app.screen.query_one(OptionList)
            assert ol.option_count == 2
            await pilot.press("r")
            await pilot.press(*"2", "enter")  # rename "beta" (newest first) to "beta2"
            await settle(pilot)
            assert store.get_chat(b.id).title == "beta2"
            await pilot.press("d", "d")  # delete needs a second press
            await settle(pilot)
            assert [c.id for c in store.list_chats()] == [a.id]
            await pilot.press("enter")  # open alpha
            await wait_for(pilot, lambda: scr.chat is not None and scr.chat.id == a.id)
            await settle(pilot)
            assert views(scr) == [("user", "from alpha"), ("assistant", "alpha reply")]
            assert scr.engine_chat.messages == [{"role": "user", "content": "from alpha"},
                                                {"role": "assistant", "content": "alpha reply"}]

    asyncio.run(main())


def test_screenshots_of_the_main_screens(tmp_path):
    """SVG screenshots: what a person sees on each screen."""
    backend = ScriptedBackend(replies=["Sure: **bold** and `code`."])

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await reply(pilot, "show me")
            shots = {"chat": app.export_screenshot()}
            for key, name in (("ctrl+o", "chats"), ("ctrl+s", "settings"), ("ctrl+l", "models")):
                await pilot.press(key)
                await wait_for(pilot, lambda: app.screen is not scr)
                await settle(pilot)
                shots[name] = app.export_screenshot()
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is scr)
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
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            await reply(pilot, "hi")
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
            await pilot.press(*"regenerate")
            # the palette searches asynchronously: wait for the hit to be highlighted
            hits = app.screen.query_one(CommandList)
            await wait_for(pilot, lambda: hits.highlighted is not None and "Regenerate" in str(
                hits.get_option_at_index(hits.highlighted).prompt))
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
            await settle(pilot)
            assert scr.prompt.text == "`notes.py`:\n````py\nx = '```'\nprint(x)\n````\n"
            assert code_blocks(scr.prompt.text) == ["x = '```'\nprint(x)\n"]  # the fence survives
            scr.prompt.load_text(f"/attach {tmp_path / 'blob.bin'}")
            await pilot.press("enter")
            await settle(pilot)
            assert "binary" in notes(scr)[-1]
            scr.prompt.load_text("draft")
            await pilot.press("f4")
            await settle(pilot)
            assert scr.prompt.text == "draft and more"

    asyncio.run(main())


def test_status_bar_keeps_the_important_fields_at_80_columns(tmp_path, monkeypatch):
    from rapidmoe.app.tui.widgets import status_bar

    monkeypatch.setattr(status_bar, "_vram", lambda: "3.2 GiB")  # as on a machine with a GPU
    place = "GPU 0: attention + KV + W_Q 83% (121 GB) · CPU: residuals + all experts"
    backend = ScriptedBackend(replies=["a b c"], critical=(2, 4, 1, 8) * 12, placement=place)

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=(80, 24)) as pilot:
            scr = await ready(pilot)
            await reply(pilot, "hi")
            bar = scr.status
            await settle(pilot)
            line = str(bar.render())
            assert bar.size.width == 80 and len(line) <= 80
            for field in ("500.0 tok/s", "r 3.8", "RAM ", "GPU 3.2 GiB", "GPU 0: attention"):
                assert field in line, (field, line)
            # the widest layout where there is room, every width in between still fits
            assert "prompt" in str(bar.line_text(200)) and "TTFT" in str(bar.line_text(200))
            for width in range(60, 201, 7):
                assert bar.line_text(width).cell_len <= width

    asyncio.run(main())


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


def test_stats_shows_what_is_loaded_and_where_with_the_real_engine(tmp_path):
    """/stats as `ps` for this app: the model, its plan and placement, the critical-set
    policy with the r the engine reported, and memory in use. The real engine on a tiny
    synthetic model (its timing is not under test here)."""
    from rapidmoe.app.tui.backend import EngineBackend
    from rapidmoe.engine.synth.model import write_synthetic

    src = write_synthetic(tmp_path / "s.gguf", "qwen3moe", seed=3, dtype="f16", n_layer=2)

    async def main():
        app = make_app(tmp_path, EngineBackend(critical=1), model=str(src),
                       overrides={"temperature": 0.0, "max_tokens": 3})
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            scr.prompt.load_text("/stats")
            await pilot.press("enter")
            await settle(pilot)
            assert "r not reported yet" in notes(scr)[-1]
            await reply(pilot, "hi")
            scr.prompt.load_text("/stats")
            await pilot.press("enter")
            await settle(pilot)
            text = notes(scr)[-1]
            m = scr.model
            assert m.handle.plan.mode == "cpu"
            assert f"({m.spec}) · file " in text and f"context {m.n_ctx} tokens" in text
            assert f"placement (cpu plan): {m.placement}" in text
            assert "critical experts: fixed r = 1; last reply r 1.0 of k = 4 (per layer 1–1)" in text
            assert re.search(r"memory in use: DRAM \d+(\.\d+)? (MiB|GiB)", text), text

    asyncio.run(main())
