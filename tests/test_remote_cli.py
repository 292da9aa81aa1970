"""-p through a provider: our own `serve` on the demo model named in config.toml (or
given by --endpoint); the reply streams, its speed is shown, and the history records
which provider and model answered, a reply cut by a dying server included."""
from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest
from serve_helpers import Server
from test_cli import cli, one_line_error

KEY = "remote-cli-key"
ARGS = ("--temp", "0", "--max-tokens", "6")


@pytest.fixture(scope="module")
def srv():
    s = Server("-m", "demo", "--precision", "full", "--api-key", KEY)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture
def home(tmp_path, srv):
    """Config and history of their own; the provider `local` is the server, its key in LOCAL_KEY."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text(
        f'[providers.local]\nbase_url = "{srv.base_url}"\napi_key_env = "LOCAL_KEY"\nmodel = "demo"\n')
    return tmp_path, {"RAPIDMOE_CONFIG_DIR": str(tmp_path / "config"), "RAPIDMOE_DATA_DIR": str(tmp_path / "data"),
                      "LOCAL_KEY": KEY}


def history(tmp_path):
    db = sqlite3.connect(next((tmp_path / "data").rglob("*.db")))
    try:
        chats = db.execute("SELECT id, model FROM chats ORDER BY id").fetchall()
        msgs = db.execute("SELECT chat_id, role, content, stats FROM messages ORDER BY id").fetchall()
    finally:
        db.close()
    return chats, [(c, r, t, json.loads(s) if s else None) for c, r, t, s in msgs]


def test_prompt_through_a_provider_streams_and_is_recorded(home, srv):
    tmp_path, env = home
    a = cli("-m", "local:demo", "-p", "Say hi", *ARGS, "--json", env=env)
    assert a.returncode == 0, a.stderr
    first = json.loads(a.stdout)
    assert first["answered_by"] == "provider:local/demo" and first["completion_tokens"] == 6
    assert first["finish_reason"] == "length" and first["ttft_s"] > 0 and first["placement"] is None
    _, body = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}],
                                                           "max_tokens": 6, "temperature": 0},
                          {"Authorization": f"Bearer {KEY}"})
    assert first["text"] == body["choices"][0]["message"]["content"]  # the server's reply, as it gives it
    # the default model of the provider, a continued chat, streamed text and the speed on stderr
    b = cli("-m", "local", "-p", "And again", "--continue", *ARGS, "--verbose", env=env)
    assert b.returncode == 0, b.stderr
    assert re.search(r"prompt: \d+ tokens, [\d.]+ tok/s \| decode: 6 tokens, [\d.]+ tok/s \| TTFT", b.stderr)
    assert "answered by: provider:local/demo" in b.stderr
    chats, msgs = history(tmp_path)
    assert chats == [(chats[0][0], "provider:local/demo")]
    assert [(r, t) for _, r, t, _ in msgs][:2] == [("user", "Say hi"), ("assistant", first["text"])]
    assert msgs[3][2] + "\n" == b.stdout
    assert [m[3]["answered_by"] for m in msgs if m[1] == "assistant"] == ["provider:local/demo"] * 2
    assert json.loads(a.stdout)["prompt_tokens"] < int(b.stderr.split("prompt: ")[1].split()[0])  # history sent


def test_endpoint_flag_and_refusals_are_one_line(home, srv):
    tmp_path, env = home
    r = cli("--endpoint", srv.base_url, "-m", "demo", "-p", "Say hi", *ARGS, "--json", "--no-history",
            env={**env, "RAPIDMOE_ENDPOINT_KEY": KEY})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["answered_by"] == f"provider:{srv.base_url}/demo"
    assert "local models only" in one_line_error(cli("-m", "local", "--critical", "2", "-p", "hi", env=env))
    (tmp_path / "config" / "config.toml").write_text('[providers.gone]\nbase_url = "http://127.0.0.1:9/v1"\n')
    assert "cannot reach" in one_line_error(cli("-m", "gone:x", "-p", "hi", env=env))


@pytest.fixture
def bare_server():
    """A server that streams a reply with no `usage` and no `timings` (as
    llama-cpp-python's does): its base URL."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # /v1/models
            body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            chunks = ['{"choices": [{"delta": {"content": "Paris"}}]}',
                      '{"choices": [{"delta": {"content": "."}, "finish_reason": "stop"}]}', "[DONE]"]
            body = "".join(f"data: {c}\n\n" for c in chunks).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()


def test_a_server_without_token_counts_is_not_said_to_have_read_none(tmp_path, bare_server):
    """`--verbose` says the prompt's count was not reported instead of printing 0 tokens."""
    r = cli("--endpoint", bare_server, "-m", "m", "-p", "hi", "--verbose", "--no-history",
            env={"RAPIDMOE_CONFIG_DIR": str(tmp_path / "c"), "RAPIDMOE_DATA_DIR": str(tmp_path / "d")})
    assert r.returncode == 0 and r.stdout.strip() == "Paris.", r.stderr
    assert "prompt: not reported by the server | decode: 2 tokens" in r.stderr, r.stderr


def provider_app(tmp_path, model: str, max_tokens: int):
    """The TUI on a provider's model, greedy, its history and config under tmp_path."""
    from rapidmoe.app.config import load_config
    from rapidmoe.app.store import ChatStore
    from rapidmoe.app.tui.app import ChatApp
    from rapidmoe.app.tui.backend import EngineBackend

    return ChatApp(backend=EngineBackend(critical=None), config=load_config(tmp_path / "c.toml", env={}),
                   store=ChatStore(tmp_path / "h.db"), model=model,
                   overrides={"temperature": 0.0, "max_tokens": max_tokens})


def test_the_tui_chats_through_a_provider(home, srv, monkeypatch):
    """A provider's model loads as the TUI's model: the picker lists what the server serves,
    the reply streams with its tok/s, and the history says who answered."""
    from textual.widgets import OptionList
    from tui_helpers import SIZE, ready, send, wait_for

    tmp_path, env = home
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    async def main():
        app = provider_app(tmp_path, "local:demo", 6)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            assert scr.model.name == "demo @ local" and scr.model.n_ctx == 4096
            # our own serve says where its model lives: the status bar shows it
            assert scr.model.placement.startswith("local · ") and len(scr.model.placement) > 10
            assert scr.model.placement in str(scr.status.line_text())
            await send(pilot, "Say hi")
            await wait_for(pilot, lambda: not scr.generating)
            f = scr.last_final
            assert f.completion_tokens == 6 and f.decode_tok_s > 0 and f.prompt_tok_s > 0  # the server's timings
            assert re.search(r"decode \d+\.\d tok/s", str(scr.status.line_text()))
            msgs = app.store.messages(scr.chat.id)
            assert msgs[-1].stats["answered_by"] == "provider:local/demo" and msgs[-1].content == f.text
            assert f"served by {srv.base_url}" in scr.loaded_text()
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: app.screen is not scr)
            ids = lambda: [o.id for o in app.screen.query_one(OptionList).options]  # noqa: E731
            await wait_for(pilot, lambda: "local:demo" in ids())  # asked in the background
            assert "demo" in ids()
            await pilot.press("escape")

    asyncio.run(main())


def test_the_tui_shows_no_prompt_speed_a_server_did_not_report(tmp_path, bare_server, monkeypatch):
    """Status bar and the reply's footer: no "prompt 0 tok/s" from a server without timings."""
    from rapidmoe.app.tui.widgets.message import MessageView
    from tui_helpers import SIZE, ready, send, wait_for

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text(f'[providers.bare]\nbase_url = "{bare_server}"\n')
    monkeypatch.setenv("RAPIDMOE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(tmp_path / "data"))

    async def main():
        app = provider_app(tmp_path, "bare:m", 6)
        async with app.run_test(size=SIZE) as pilot:
            scr = await ready(pilot)
            await send(pilot, "hi")
            await wait_for(pilot, lambda: not scr.generating)
            assert scr.last_final.text == "Paris." and scr.last_final.prompt_tok_s == 0.0
            line = str(scr.status.line_text())
            assert re.search(r"decode \d+\.\d tok/s", line) and "prompt 0 tok/s" not in line, line
            footer = str(scr.query(MessageView).last().query_one(".footer").render())
            assert "tok/s" in footer and "prompt" not in footer, footer

    asyncio.run(main())


def test_the_tui_keeps_a_reply_cut_by_a_dying_server(tmp_path, monkeypatch):
    """A server of its own, killed while the TUI's reply streams: what came stays, marked cut."""
    from rapidmoe.app.tui.widgets.message import MessageView
    from tui_helpers import SIZE, notes, ready, send, wait_for

    doomed = Server("-m", "demo", "--precision", "full")
    try:
        doomed.wait_ready()
        (tmp_path / "config.toml").write_text(f'[providers.doomed]\nbase_url = "{doomed.base_url}"\n')
        monkeypatch.setenv("RAPIDMOE_CONFIG_DIR", str(tmp_path))

        async def main():
            app = provider_app(tmp_path, "doomed:demo", 3000)
            async with app.run_test(size=SIZE) as pilot:
                scr = await ready(pilot)
                await send(pilot, "Count from 1 to 500, separated by commas.")
                await wait_for(pilot, lambda: len(scr.query(MessageView).last().text) > 4)
                doomed.proc.kill()
                await wait_for(pilot, lambda: not scr.generating)
                last = app.store.messages(scr.chat.id)[-1]
                assert last.role == "assistant" and last.stats["finish_reason"] == "cut" and len(last.content) > 4
                assert last.stats["answered_by"] == "provider:doomed/demo"
                assert "ended before the reply" in notes(scr)[-1]
                assert scr.query(MessageView).last().text == last.content

        asyncio.run(main())
    finally:
        doomed.stop()


def test_a_reply_cut_by_the_server_is_kept_marked(home, srv):
    """Last: it ends the module's server."""
    tmp_path, env = home
    proc = subprocess.Popen([sys.executable, "-m", "rapidmoe.app.cli", "-m", "local", "-p",
                             "Count from 1 to 500, separated by commas.", "--temp", "0", "--max-tokens", "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
    got = b""
    while len(got) < 5:  # the reply is streaming: the server dies under it
        chunk = os.read(proc.stdout.fileno(), 256)
        assert chunk, proc.stderr.read()
        got += chunk
    srv.proc.kill()
    out, err = proc.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "ended before the reply" in lines[0], err
    _, msgs = history(tmp_path)
    assert msgs[-1][1] == "assistant" and msgs[-1][3]["finish_reason"] == "cut"
    assert msgs[-1][2].startswith(got.decode()) and (got + out).decode().startswith(msgs[-1][2])
