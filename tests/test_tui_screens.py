"""The TUI's other screens and its status line driven headlessly with Pilot, with the
scripted backend: the context meter's warning before the context fills, the chats
screen (rename, delete, open), SVG screenshots of each main screen, and the status bar
keeping its important fields at 80 columns. Tests wait for events and states, never
for a time."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

from rapidmoe.app.tui.widgets.context_meter import ContextMeter
from scripted_engine import ScriptedBackend
from textual.widgets import OptionList
from tui_helpers import SIZE, make_app, ready, reply, run_after_reply, settle, views, wait_for


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

    async def check(app, pilot, scr):
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
        return shots

    def text(svg):
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", svg).replace("&#160;", " "))

    shots = run_after_reply(tmp_path, backend, "show me", check)
    chat = text(shots["chat"])
    for s in ("You", "show me", "Sure:", "decode", "tok/s", "TTFT", "CPU-centric", "ctx", "Regen"):
        assert s in chat, s
    assert "Chats" in text(shots["chats"]) and "show me" in text(shots["chats"])
    assert "System prompt" in text(shots["settings"]) and "temperature" in text(shots["settings"])
    assert "demo" in text(shots["models"]) and "REPO[:QUANT]" in text(shots["models"])


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
