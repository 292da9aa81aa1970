"""Terminal input that a chat needs and Textual's parser gets wrong in two cases:

* a long paste that the terminal (tmux, ssh) delivers in pieces: when a read
  ends inside the closing ESC[201~ and the rest comes more than ESCDELAY
  (0.1 s) later, Textual gives up on the sequence, never leaves paste mode and
  swallows every later key, Enter included. Inside a paste we wait for the
  rest instead (up to PASTE_STALL_S without input).
* Alt+Enter in terminals that send Alt as an ESC prefix (tmux, most xterms):
  ESC CR reaches the app as a plain "enter" and would send the message. It is
  reported as "alt+enter", as terminals with the kitty protocol report it.

`install()` makes Textual's terminal drivers use this parser; the TUI calls it
when it runs in a real terminal.
"""
from __future__ import annotations

import importlib
import re
import sys
import time

from textual import events
from textual._xterm_parser import XTermParser

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
PASTE_STALL_S = 2.0  # no input for this long inside a paste: let Textual's own timeout act
_SCAN = re.compile(r"\x1b\[20[01]~|\x1b\r")


class ChatInputParser(XTermParser):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._in_paste = False
        self._tail = ""  # the last few characters fed: a marker may straddle two reads
        self._fed_at = 0.0

    def feed(self, data: str):
        if not data:  # end of input
            yield from super().feed(data)
            return
        self._fed_at = time.monotonic()
        seen = self._tail + data
        off = len(self._tail)
        start = 0  # data[:start] has been handed on
        for m in _SCAN.finditer(seen):
            if m.end() <= off:
                continue  # wholly in the previous read: already counted
            token = m.group()
            if token == PASTE_START:
                self._in_paste = True
            elif token == PASTE_END:
                self._in_paste = False
            elif not self._in_paste and m.start() >= off:  # ESC CR: Alt+Enter
                at = m.start() - off
                yield from super().feed(data[start:at]) if at > start else ()
                yield events.Key("alt+enter", None)
                start = at + 2
        if start < len(data):
            yield from super().feed(data[start:])
        self._tail = seen[-(len(PASTE_END) - 1):]

    def tick(self):
        if self._in_paste and time.monotonic() - self._fed_at < PASTE_STALL_S:
            return ()  # the rest of a split ESC[201~ is on its way
        return super().tick()


def _driver_modules() -> list[str]:
    if sys.platform == "win32":
        return ["textual.drivers.win32"]
    return ["textual.drivers.linux_driver", "textual.drivers.linux_inline_driver"]


def install() -> bool:
    """Make Textual's terminal drivers parse input with ChatInputParser; False (and
    Textual's own parser) where a driver no longer looks the way this expects."""
    done = False
    for name in _driver_modules():
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(mod, "XTermParser", None) in (XTermParser, ChatInputParser):
            mod.XTermParser = ChatInputParser
            done = True
    return done
