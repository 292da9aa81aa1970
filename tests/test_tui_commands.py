"""The chat screen's commands driven headlessly with Pilot: slash commands (Tab
completion, /set, /system, /rename, /export, /clear, copying replies and code blocks),
the command palette, /attach and the external editor, and /stats with the real engine on
a tiny synthetic model. Tests wait for events and states, never for a time."""
from __future__ import annotations

import asyncio
import json
import re

from rapidmoe.app.think import code_blocks
from scripted_engine import ScriptedBackend
from textual.command import CommandList, CommandPalette
from tui_helpers import (SIZE, chat_app, command, make_app, notes, ready, reply, run_after_reply, settle, views,
                         wait_for)


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
            await command(pilot, "/help")
            assert "/model" in notes(scr)[-1] and "/set" in notes(scr)[-1]
            for cmd in ("/set temperature 0.25", "/set stop END, STOP", "/system You are terse."):
                await command(pilot, cmd)
            assert app.store.get_chat(scr.chat.id).params == {"temperature": 0.25, "stop": ["END", "STOP"]}
            assert scr.params().temperature == 0.25 and scr.params().stop == ("END", "STOP")
            assert scr.engine_chat.messages[0] == {"role": "system", "content": "You are terse."}
            await command(pilot, "/set temprature 2")
            assert "unknown setting 'temprature'" in notes(scr)[-1]
            await command(pilot, "/bogus")
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
                await command(pilot, cmd)
            assert app.store.get_chat(scr.chat.id).title == "My [/plan]"
            assert "My [/plan]" in str(scr.query_one("#title").render())
            md = (tmp_path / "out.md").read_text()
            assert md.startswith("# My [/plan]") and "## You\n\ncode please" in md and "```sh\nls\n```" in md
            assert json.loads((tmp_path / "out.json").read_text())["messages"][0]["content"] == "code please"
            assert notes(scr)[-1].startswith("prompt ") and "tok/s" in notes(scr)[-1]
            await command(pilot, "/clear")
            assert views(scr) == [] and app.store.messages(scr.chat.id) == []
            assert scr.engine_chat.messages == [{"role": "system", "content": "You are terse."}]

    asyncio.run(main())


def test_command_palette_runs_our_commands(tmp_path):
    backend = ScriptedBackend(replies=["one", "two"])

    async def check(app, pilot, scr):
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

    run_after_reply(tmp_path, backend, "hi", check)


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
            await command(pilot, f"/attach {src}")
            assert scr.prompt.text == "`notes.py`:\n````py\nx = '```'\nprint(x)\n````\n"
            assert code_blocks(scr.prompt.text) == ["x = '```'\nprint(x)\n"]  # the fence survives
            await command(pilot, f"/attach {tmp_path / 'blob.bin'}")
            assert "binary" in notes(scr)[-1]
            scr.prompt.load_text("draft")
            await pilot.press("f4")
            await settle(pilot)
            assert scr.prompt.text == "draft and more"

    asyncio.run(main())


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
            await command(pilot, "/stats")
            assert "r not reported yet" in notes(scr)[-1]
            await reply(pilot, "hi")
            await command(pilot, "/stats")
            text = notes(scr)[-1]
            m = scr.model
            assert m.handle.plan.mode == "cpu"
            assert f"({m.spec}) · file " in text and f"context {m.n_ctx} tokens" in text
            assert f"placement (cpu plan): {m.placement}" in text
            assert "critical experts: fixed r = 1; last reply r 1.0 of k = 4 (per layer 1–1)" in text
            assert re.search(r"memory in use: DRAM \d+(\.\d+)? (MiB|GiB)", text), text

    asyncio.run(main())
