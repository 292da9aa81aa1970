"""The TUI against OpenAI-compatible servers that are not our `serve`: a real local
HTTP server stands in (serve_helpers.StandIn). --endpoint URL in the TUI, the
critical-set size our serve reports reaching the status bar, and the model picker
asking providers in the background."""
from __future__ import annotations

import argparse
import asyncio
import re
import threading

import pytest
from serve_helpers import StandIn
from tui_helpers import SIZE, notes, ready, reply, views, wait_for

QUESTION = "What is the capital of France?"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Config and history of their own."""
    (tmp_path / "config").mkdir()
    monkeypatch.setenv("RAPIDMOE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def tui_args(*argv: str):
    from rapidmoe.app import cmd_chat

    p = argparse.ArgumentParser()
    cmd_chat.add_arguments(p)
    return p.parse_args(list(argv))


def test_the_tui_chats_through_an_endpoint(home, monkeypatch):
    """--endpoint URL -m MODEL, the key in RAPIDMOE_ENDPOINT_KEY, as with -p: the chat screen
    talks to the server, shows its speed, and the history says who answered."""
    from rapidmoe.app.tui.app import app_from_args
    from rapidmoe.engine.errors import UserError

    stand = StandIn(models=("big-moe", "other"), key="endpoint-key", reply="Paris is the capital of France.")
    monkeypatch.setenv("RAPIDMOE_ENDPOINT_KEY", "endpoint-key")
    try:
        async def main(argv, model):
            app = app_from_args(tui_args("--endpoint", stand.base_url, *argv, "--temp", "0"))
            async with app.run_test(size=SIZE) as pilot:
                scr = await ready(pilot)
                assert scr.model.name == f"{model} @ {stand.base_url}"
                await reply(pilot, QUESTION)
                assert views(scr)[-2:] == [("user", QUESTION), ("assistant", "Paris is the capital of France.")]
                sent = stand.requests[-1]
                assert sent["model"] == model and sent["messages"][-1] == {"role": "user", "content": QUESTION}
                assert sent["temperature"] == 0
                assert scr.last_final.decode_tok_s > 0
                assert re.search(r"decode \d+\.\d tok/s", str(scr.status.line_text()))
                stats = app.store.messages(scr.chat.id)[-1].stats
                assert stats["answered_by"] == f"provider:{stand.base_url}/{model}"
                assert app.store.get_state("last_model") == f"{argv[1] if argv else ''}@{stand.base_url}"

        asyncio.run(main(["-m", "other"], "other"))
        asyncio.run(main([], "big-moe"))  # no -m: the server's first model
        with pytest.raises(UserError, match="local models only"):
            app_from_args(tui_args("--endpoint", stand.base_url, "-m", "other", "--critical", "2"))
        monkeypatch.setenv("RAPIDMOE_ENDPOINT_KEY", "wrong")

        async def refused():
            app = app_from_args(tui_args("--endpoint", stand.base_url, "-m", "other"))
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: any("(401)" in n for n in notes(app.screen)))
                assert app.screen.model is None and any("refused the API key (401)" in n for n in notes(app.screen))

        asyncio.run(refused())
    finally:
        stand.stop()


def test_the_status_bar_shows_the_critical_set_size_our_serve_reports(home):
    """Our serve adds a `rapidmoe` object (critical-set size per MoE layer) to its last chunk:
    through a provider, the status bar shows r and its sparkline as for a local model."""
    from rapidmoe.app.tui.app import app_from_args
    from rapidmoe.app.tui.widgets.status_bar import sparkline

    per_layer = [1.0, 2.5, 4.0, 0.5]
    stand = StandIn(models=("demo",), rapidmoe={"critical_mean": 2.0, "critical_per_layer": per_layer,
                                                "decode_steps": 5, "placement": "CPU", "critical_setting": "auto"})
    (home / "config" / "config.toml").write_text(f'[providers.ours]\nbase_url = "{stand.base_url}"\n')
    try:
        async def main():
            app = app_from_args(tui_args("-m", "ours:demo"))
            async with app.run_test(size=SIZE) as pilot:
                scr = await ready(pilot)
                assert "r —" in str(scr.status.line_text())  # nothing reported yet
                await reply(pilot, QUESTION)
                assert scr.status.critical == tuple(per_layer)
                line = str(scr.status.line_text())
                assert "r 2.0" in line and sparkline(per_layer) in line

        asyncio.run(main())
    finally:
        stand.stop()


def test_the_model_picker_opens_at_once_and_fills_providers_as_they_answer(home):
    """Providers are asked in workers: a slow one leaves the picker usable, its line says
    it is being asked, and its models take that place when they come; an unreachable one
    is one line. Closing the picker while one is still asked is harmless."""
    from rapidmoe.app.tui.screens.model_picker import ModelPicker
    from scripted_engine import ScriptedBackend
    from textual.widgets import OptionList
    from tui_helpers import make_app

    slow, fast = StandIn(models=("a-model", "b-model"), slow=True), StandIn(models=("quick",))
    (home / "config" / "config.toml").write_text(
        f'[providers.slow]\nbase_url = "{slow.base_url}"\n[providers.fast]\nbase_url = "{fast.base_url}"\n'
        '[providers.gone]\nbase_url = "http://127.0.0.1:9/v1"\n')

    def lines(app) -> dict[str, str]:
        ol = app.screen.query_one(OptionList)
        opts = [ol.get_option_at_index(i) for i in range(ol.option_count)]
        return {o.id or str(o.prompt).strip(): str(o.prompt).strip() for o in opts}

    try:
        async def main():
            app = make_app(home, ScriptedBackend())
            async with app.run_test(size=SIZE) as pilot:
                scr = await ready(pilot)
                await pilot.press("ctrl+l")
                await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker))
                assert f"slow · {slow.base_url} · asking…" in lines(app)  # open, the slow one still asked
                await wait_for(pilot, lambda: "fast:quick" in lines(app)
                               and not any(k.startswith("gone ·") and k.endswith("asking…") for k in lines(app)))
                assert slow.asked.is_set() and f"slow · {slow.base_url} · asking…" in lines(app)
                gone = [k for k in lines(app) if k.startswith("gone · ")]
                assert len(gone) == 1 and "cannot reach" in gone[0] and "\n" not in gone[0]
                ol = app.screen.query_one(OptionList)
                ol.highlighted = ol.get_option_index("fast:quick")
                slow.release.set()
                await wait_for(pilot, lambda: "slow:a-model" in lines(app))
                ids = [k for k in lines(app) if ":" in k and not k.startswith(("slow ·", "gone ·"))]
                assert ids.index("slow:a-model") < ids.index("slow:b-model") < ids.index("fast:quick")
                assert not any("asking…" in v for v in lines(app).values())
                assert ol.highlighted_option.id == "fast:quick"  # where the user was stays
                ol.focus()
                await pilot.press("enter")
                await wait_for(pilot, lambda: app.screen is scr and scr.model.spec == "fast:quick")
                # closed while a provider is still asked: its answer finds no picker, and nothing breaks
                slow.release.clear()
                slow.asked.clear()
                await pilot.press("ctrl+l")
                await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker) and slow.asked.is_set())
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is scr)
                # the request still waits on a daemon thread: quitting now would not wait for it
                assert [t.daemon for t in threading.enumerate() if t.name == "provider-slow"] == [True]
                slow.release.set()
                await pilot.pause(0.2)
                assert app.screen is scr and app.is_running

        asyncio.run(main())
    finally:
        slow.stop()
        fast.stop()
