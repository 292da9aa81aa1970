"""Shared Pilot helpers for the TUI tests."""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from rapidmoe.app.config import load_config
from rapidmoe.app.store import ChatStore
from rapidmoe.app.tui.app import ChatApp
from rapidmoe.app.tui.widgets.message import MessageView, Note
from scripted_engine import ScriptedBackend

SIZE = (110, 32)


def make_app(tmp_path, backend=None, config_text="", **kw) -> ChatApp:
    cfg_path = tmp_path / "config.toml"
    if config_text:
        cfg_path.write_text(config_text)
    return ChatApp(backend=backend or ScriptedBackend(), config=load_config(cfg_path, env={}),
                   store=ChatStore(tmp_path / "history.db"), **kw)


async def wait_for(pilot, cond, timeout=60.0, step=0.01):
    """Let the app run until cond() holds. The deadline only bounds a failure: a
    test never asserts how long something took (a busy machine stretches all)."""
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            raise AssertionError("timed out waiting")
        await pilot.pause(step)


async def settle(pilot):
    """Let the app handle what is already posted to it (messages from a worker that
    has ended, say)."""
    await pilot.pause()
    await pilot.pause()


@asynccontextmanager
async def chat_app(tmp_path, backend, **kw):
    """The chat app on `backend`, run headless, once its model is ready: (app, pilot, screen)."""
    app = make_app(tmp_path, backend, **kw)
    async with app.run_test(size=SIZE) as pilot:
        yield app, pilot, await ready(pilot)


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


async def reply(pilot, text):
    """Send a prompt and wait until its reply has finished."""
    await send(pilot, text)
    await wait_for(pilot, lambda: not pilot.app.screen.generating)


async def command(pilot, text):
    """Type `text` into the prompt, press Enter and let the app handle it (a slash
    command, say)."""
    pilot.app.screen.prompt.load_text(text)
    await pilot.press("enter")
    await settle(pilot)


def run_after_reply(tmp_path, backend, prompt, check, **kw):
    """Run the chat app on `backend`, send `prompt`, wait for its reply, then
    `await check(app, pilot, screen)`; returns what check returns, once the app is closed."""
    async def main():
        async with chat_app(tmp_path, backend, **kw) as (app, pilot, scr):
            await reply(pilot, prompt)
            return await check(app, pilot, scr)

    return asyncio.run(main())
