"""The chat input: keys that add a newline or send, bracketed pastes (whole, however the
terminal splits them), Alt+Enter from ESC-prefix terminals, prompt history."""
from __future__ import annotations

import asyncio

from rapidmoe.app.tui.widgets.message import MessageView
from scripted_engine import ScriptedBackend
from textual import events
from tui_helpers import chat_app, notes, settle, wait_for


def test_input_keys_newlines_large_paste_and_history(tmp_path):
    backend = ScriptedBackend(replies=["ok"])

    async def main():
        async with chat_app(tmp_path, backend) as (app, pilot, scr):
            # alt+enter as kitty-protocol terminals report it, and as paste_parser.py reports
            # the ESC CR of the others (test_terminal_input_* below)
            await pilot.press("l", "1", "shift+enter", "l", "2", "ctrl+j", "l", "3", "alt+enter", "l", "4")
            assert scr.prompt.text == "l1\nl2\nl3\nl4" and not backend.calls
            scr.action_help()  # and help says so
            assert "newline      shift+enter,ctrl+j,alt+enter" in notes(scr)[-1]
            await pilot.press("enter")
            await wait_for(pilot, lambda: scr.last_final is not None)
            body = scr.query(MessageView).first().query_one(".body")
            assert str(body.render()) == "l1\nl2\nl3\nl4" and body.size.height == 4  # shown as typed, 4 lines
            assert app.store.messages(scr.chat.id)[0].content == "l1\nl2\nl3\nl4"
            big = "\n".join(f"line {i} " + "x" * 60 for i in range(3000))  # ~200 kB with newlines
            app.post_message(events.Paste(big))  # as the terminal driver delivers it
            await wait_for(pilot, lambda: scr.prompt.text == big)
            await settle(pilot)
            assert len(backend.calls) == 1  # a pasted newline never sends
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(backend.calls) == 2 and not scr.generating)
            assert backend.calls[-1][-1] == {"role": "user", "content": big}
            shown = str(scr.query(MessageView)[2].query_one(".body").render())
            assert "2960 more lines" in shown and len(shown) < 5000  # drawn by its head, sent whole
            assert scr.prompt.text == ""
            await pilot.press("up")  # prompt history on an empty input
            assert scr.prompt.text == big
            await pilot.press("down")
            assert scr.prompt.text == ""

    asyncio.run(main())


def _parse(parser, *reads, timeout_between=True, monkeypatch=None):
    """Feed reads to a parser as a terminal driver does, with Textual's escape timeout
    passing between two reads (as when tmux delivers a long paste in pieces)."""
    import textual._parser

    out = []
    for i, data in enumerate(reads):
        out += list(parser.feed(data))
        if timeout_between and i < len(reads) - 1:
            with monkeypatch.context() as m:
                m.setattr(textual._parser, "get_time", lambda: float("inf"))
                out += list(parser.tick())
    return [(type(e).__name__, getattr(e, "key", None) or e.text) for e in out]


def test_terminal_input_keeps_a_split_paste_whole(monkeypatch):
    from rapidmoe.app.tui.paste_parser import ChatInputParser
    from textual._xterm_parser import XTermParser

    text = "\r".join(f"line {i}" for i in range(300))  # terminals send a pasted newline as CR
    data = "\x1b[200~" + text + "\x1b[201~"
    for cut in (1, 3, 5):  # the read ends inside the closing ESC[201~
        got = _parse(ChatInputParser(), data[:-cut], data[-cut:] + "\r", monkeypatch=monkeypatch)
        assert got == [("Paste", text), ("Key", "enter")], cut
        # Textual's own parser never leaves paste mode: the Enter after it is swallowed
        lost = _parse(XTermParser(), data[:-cut], data[-cut:] + "\r", monkeypatch=monkeypatch)
        assert ("Key", "enter") not in lost and not any(k == "Paste" for k, _ in lost)
    # a paste split anywhere else, and one in a single read
    assert _parse(ChatInputParser(), data[:1000], data[1000:], monkeypatch=monkeypatch) == [("Paste", text)]
    assert _parse(ChatInputParser(), data, monkeypatch=monkeypatch) == [("Paste", text)]


def test_terminal_input_reads_esc_cr_as_alt_enter(monkeypatch):
    from rapidmoe.app.tui import paste_parser
    from rapidmoe.app.tui.paste_parser import ChatInputParser

    # Alt+Enter in an ESC-prefix terminal (tmux): Textual alone reports a plain "enter"
    assert _parse(ChatInputParser(), "ab\x1b\rc", "\r", monkeypatch=monkeypatch) == [
        ("Key", "a"), ("Key", "b"), ("Key", "alt+enter"), ("Key", "c"), ("Key", "enter")]
    # a lone Escape stays Escape
    assert _parse(ChatInputParser(), "\x1b", "z", monkeypatch=monkeypatch) == [("Key", "escape"), ("Key", "z")]
    # the TUI makes Textual's terminal drivers use it
    import textual.drivers.linux_driver as linux_driver

    monkeypatch.setattr(linux_driver, "XTermParser", linux_driver.XTermParser)
    assert paste_parser.install() and linux_driver.XTermParser is ChatInputParser
