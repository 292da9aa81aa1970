"""A process that writes chat history the way the app does, for kill -9 tests:
`python history_writer.py DB KILL_AT` runs the writes of one `-p` exchange (a new chat,
then one continued with --continue) and of one TUI exchange (a new chat, its prompt
when sent, its reply when done), and kills itself with SIGKILL at the KILL_AT-th step
of SQLite's virtual machine (0: never; then it prints the number of steps it took).
Each step is a point inside a statement, so the kill lands mid-transaction, between
statements and between transactions alike."""
from __future__ import annotations

import os
import signal
import sqlite3
import sys

from rapidmoe.app.store import ChatStore

STEP = 5  # SQLite VM instructions per step


def main(db: str, kill_at: int) -> None:
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return 0

    real_connect = sqlite3.connect

    def connect(*a, **kw):
        conn = real_connect(*a, **kw)
        conn.set_progress_handler(tick, STEP)
        return conn

    sqlite3.connect = connect
    store = ChatStore(db)
    stats = {"finish_reason": "stop", "completion_tokens": 3}
    # -p: a new chat, then --continue of the last one (prompt and reply in one transaction)
    store.check_writable()
    chat = store.add_exchange(None, "first question", "first answer", stats, title="first question",
                              model="demo")
    last = store.last_chat()
    store.context(last.id)
    store.add_exchange(last.id, "second question", "second answer", stats)
    # the TUI: the chat when the first prompt is sent, the prompt, later its reply
    tui = store.create_chat("tui chat", model="demo", system="be brief", params={"temperature": 0.2})
    store.add_message(tui.id, "user", "tui question")
    store.add_message(tui.id, "assistant", "tui answer", stats)
    store.add_message(chat.id, "user", "asked, never answered")
    store.close()
    print(steps)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
