"""Chat history under faults, on real SQLite files and real processes: kill -9 at random
points of a chat write, then the next run and --continue work; a foreign, damaged,
misplaced, read-only or badly edited history is one line (exit 2) before any reply."""
from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rapidmoe.app.cli import main
from rapidmoe.app.store import ChatStore
from rapidmoe.engine.text.chat_template import render_chat
from rapidmoe.engine.errors import UserError

HERE = Path(__file__).parent
# Mistral-style: a template that refuses anything but system? (user assistant)* user
ALTERNATING = (
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if (m['role'] == 'user') != loop.index0 is even %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}")


def cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, **kw)


def writer(db: Path, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "history_writer.py"), str(db), str(kill_at)],
                          capture_output=True, text=True, timeout=60)


def assert_usable(db: Path) -> None:
    """What the next run does: open, continue the last chat through a strict template, write."""
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    raw.close()
    s = ChatStore(db)
    for chat in s.list_chats():
        turns = s.context(chat.id) + [{"role": "user", "content": "next"}]
        render_chat(ALTERNATING, turns, bos_token="", eos_token="")  # raises if two user turns meet
    last = s.last_chat()
    if last is not None:
        s.add_exchange(last.id, "continued", "fine", {"finish_reason": "stop"})
        assert [t["content"] for t in s.context(last.id)[-2:]] == ["continued", "fine"]
    s.close()


def test_context_alternates_and_skips_unanswered_prompts(tmp_path):
    s = ChatStore(tmp_path / "h.db")
    c = s.add_exchange(None, "q1", "a1", title="t")
    s.add_message(c.id, "user", "lost")      # killed before its reply
    s.add_message(c.id, "user", "q2")
    s.add_message(c.id, "assistant", "a2")
    s.add_exchange(c.id, "q3", None)          # a prompt stored alone, unanswered
    assert [m.content for m in s.messages(c.id)] == ["q1", "a1", "lost", "q2", "a2", "q3"]  # all kept
    assert s.context(c.id) == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                               {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    with pytest.raises(UserError, match="refused.*alternate"):
        render_chat(ALTERNATING, [{"role": "user", "content": m.content} for m in s.messages(c.id)[2:4]],
                    bos_token="", eos_token="")
    with pytest.raises(UserError, match="no chat with id 99"):
        s.add_exchange(99, "q", "a")
    assert len(s.list_chats()) == 1  # a failed exchange leaves nothing behind


def test_kill_9_at_random_points_of_chat_writes(tmp_path):
    full = int(writer(tmp_path / "count.db", 0).stdout)  # steps of one run on a new file
    assert full > 50
    rng = random.Random(20)
    db = tmp_path / "history.db"
    killed = 0
    for i in range(20):
        if i % 7 == 0:  # now and then a first run on a new file (killed mid-migration too)
            for p in tmp_path.glob("history.db*"):
                p.unlink()
        # the last kill lands after the first exchange, so that there is a chat to continue
        r = writer(db, rng.randint(full // 2 if i == 19 else 1, full))
        killed += r.returncode == -9
        assert r.returncode in (0, -9), r.stderr
        assert_usable(db)
    assert killed >= 15
    # and the real CLI continues the chat the last kill left behind
    env = {"RAPIDMOE_DATA_DIR": str(tmp_path)}
    r = cli("-m", "demo", "-p", "Say hi", "--continue", "--precision", "full", "--temp", "0", "-n", "3", env=env)
    assert r.returncode == 0, r.stderr
    s = ChatStore(db)
    msgs = s.messages(s.last_chat().id)
    assert [m.role for m in msgs[-2:]] == ["user", "assistant"] and msgs[-2].content == "Say hi"
    assert msgs[-1].content.strip() and msgs[-1].content in r.stdout


def _bad_history(kind: str, data: Path) -> None:
    db = data / "history.db"
    if kind == "foreign":
        raw = sqlite3.connect(db)
        raw.execute("CREATE TABLE chats (id INTEGER PRIMARY KEY, name TEXT)")
        raw.commit()
        raw.close()
    elif kind == "damaged":
        s = ChatStore(db)
        c = s.create_chat("big")
        for i in range(300):
            s.add_message(c.id, "user", f"message {i} " + "x" * 200)
        s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        s.close()
        with open(db, "r+b") as f:
            f.seek(4096 * 3)
            f.write(bytes(range(256)) * 32)
    elif kind == "not-a-database":
        db.write_bytes(b"SQLite format 3\0" + b"\xff" * 5000)
    elif kind == "a-folder":
        db.mkdir()
    elif kind == "version":
        s = ChatStore(db)
        s.db.execute("UPDATE schema_version SET version = 'two'")
        s.close()
    elif kind == "params":
        s = ChatStore(db)
        c = s.add_exchange(None, "q", "a", title="t")
        s.db.execute("UPDATE chats SET params = ? WHERE id = ?", ('{"temperature": "hot"}', c.id))
        s.close()


def run_main(capsys, *args) -> str:
    """The CLI entry in this process (the failures come before any model loads) -> its one line."""
    rc = main(list(args))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("rapidmoe-chat: error: "), (rc, err)
    assert out == ""  # failed before a reply was generated
    return lines[0]


@pytest.mark.parametrize("kind, message", [
    ("foreign", "not a rapidmoe-chat history \\(it holds tables chats\\)"),
    ("damaged", "damaged"),
    ("not-a-database", "cannot open the chat history"),
    ("a-folder", "not a file"),
    ("version", "damaged \\(schema version 'two'\\)"),
    ("params", "chat 1 has damaged settings \\(temperature"),
])
def test_a_bad_history_is_one_line_before_the_reply(tmp_path, monkeypatch, capsys, kind, message):
    data = tmp_path / "data"
    data.mkdir()
    _bad_history(kind, data)
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(data))
    line = run_main(capsys, "-m", "demo", "-p", "hi", "-n", "2", *(["--continue"] if kind == "params" else []))
    assert "history.db" in line and re.search(message, line), line
    if kind in ("foreign", "not-a-database"):  # someone else's file is left as it was
        assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before


def test_a_data_dir_that_is_a_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "data"
    f.write_text("not a folder")
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(f))
    line = run_main(capsys, "-m", "demo", "-p", "hi")
    assert "cannot hold the chat history" in line and "RAPIDMOE_DATA_DIR" in line


def _read_only(db: Path) -> bool:
    """Make db read-only for this process: chmod, or for root (who writes anyway) the
    immutable attribute where the file system has one."""
    if os.geteuid() != 0:
        db.chmod(0o444)
        db.parent.chmod(0o555)
        return True
    r = subprocess.run(["chattr", "+i", str(db)], capture_output=True)
    return r.returncode == 0


def _writable(db: Path) -> None:
    if os.geteuid() != 0:
        db.parent.chmod(0o755)
        db.chmod(0o644)
    else:
        subprocess.run(["chattr", "-i", str(db)], capture_output=True)


def test_a_read_only_history_is_one_line_before_the_reply(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    db = data / "history.db"
    s = ChatStore(db)
    s.add_exchange(None, "q", "a", title="kept")
    s.close()
    if not _read_only(db):
        pytest.skip("no way to make a file read-only for root here (chattr)")
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(data))
    try:
        for args in ((), ("--continue",)):
            line = run_main(capsys, "-m", "demo", "-p", "hi", "-n", "2", *args)
            assert "history.db" in line and "read-only" in line, line
    finally:
        _writable(db)
    assert [m.content for m in ChatStore(db).messages(1)] == ["q", "a"]


def test_damaged_stats_are_dropped_not_fatal(tmp_path):
    s = ChatStore(tmp_path / "h.db")
    c = s.add_exchange(None, "q", "a", {"x": 1}, title="t")
    s.db.execute("UPDATE messages SET stats = '{oops' WHERE role = 'assistant'")
    s.db.execute("UPDATE chats SET params = '[1]' WHERE id = ?", (c.id,))
    assert [m.stats for m in s.messages(c.id)] == [None, None]
    assert [x.params for x in s.list_chats()] == [{}]  # listed; opening it says what is wrong
    with pytest.raises(UserError, match="damaged settings \\(a JSON list"):
        s.get_chat(c.id)
    s.db.execute("UPDATE chats SET params = '{}'")
    assert json.loads(s.export_json(c.id))["messages"][1]["stats"] is None


def test_a_reply_is_kept_when_its_chat_goes_away_meanwhile(tmp_path):
    """-p --continue prints the reply, then stores it: the chat deleted (in the TUI) while the
    reply streams, the exchange is kept as a new chat rather than lost."""
    s = ChatStore(tmp_path / "history.db")
    old = s.add_exchange(None, "q", "a", title="old")
    proc = subprocess.Popen([sys.executable, "-m", "rapidmoe.app.cli", "-m", "demo", "-p", "Say hi", "--continue",
                             "--precision", "full", "--temp", "0", "-n", "6"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "RAPIDMOE_DATA_DIR": str(tmp_path)})
    first = proc.stdout.read(1)  # the reply has started: the history was checked and read
    s.delete_chat(old.id)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    [chat] = s.list_chats()
    reply = (first + out).strip()
    assert [(m.role, m.content) for m in s.messages(chat.id)] == [("user", "Say hi"), ("assistant", reply)]
