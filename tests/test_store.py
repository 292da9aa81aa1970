"""Chat history on a real SQLite file: CRUD, WAL, schema version and migration, export."""
from __future__ import annotations

import json
import sqlite3

import pytest

from rapidmoe.app.store import MIGRATIONS, SCHEMA_VERSION, ChatStore
from rapidmoe.engine.errors import UserError


def test_chats_and_messages_round_trip(tmp_path):
    path = tmp_path / "h.db"
    s = ChatStore(path)
    a = s.create_chat("first", model="demo", system="be brief", params={"temperature": 0.2})
    b = s.create_chat("second")
    s.add_message(a.id, "user", "hi")
    m = s.add_message(a.id, "assistant", "hello", stats={"decode_tok_s": 12.5, "finish_reason": "stop"})
    s.rename_chat(b.id, "  renamed   chat ")
    s.close()

    s = ChatStore(path)  # reopened from disk
    assert [c.title for c in s.list_chats()] == ["first", "renamed chat"]  # most recently updated first
    assert s.last_chat().id == a.id
    got = s.messages(a.id)
    assert [(x.role, x.content) for x in got] == [("user", "hi"), ("assistant", "hello")]
    assert got[1].stats == {"decode_tok_s": 12.5, "finish_reason": "stop"} and got[1].id == m.id
    c = s.get_chat(a.id)
    assert (c.model, c.system, c.params) == ("demo", "be brief", {"temperature": 0.2})
    s.set_params(a.id, {"top_k": 5})
    s.set_system(a.id, "")
    assert s.get_chat(a.id).params == {"top_k": 5} and s.get_chat(a.id).system == ""

    # edit/regenerate: delete a message and all later ones
    s.add_message(a.id, "user", "again")
    assert s.delete_messages_from(a.id, m.id) == 2
    assert [x.content for x in s.messages(a.id)] == ["hi"]
    assert s.prompt_history() == ["hi"]

    s.delete_chat(a.id)
    assert [c.id for c in s.list_chats()] == [b.id]
    # cascade removed the messages too
    assert s.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    with pytest.raises(UserError):
        s.get_chat(a.id)
    with pytest.raises(UserError):
        s.rename_chat(b.id, "   ")
    with pytest.raises(UserError):
        s.delete_chat(9999)


def test_wal_and_schema_version(tmp_path):
    path = tmp_path / "h.db"
    s = ChatStore(path)
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.schema_version() == SCHEMA_VERSION == len(MIGRATIONS)
    s.set_state("last_model", "demo")
    s.close()
    # a second connection (another process) sees the committed state
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT value FROM state WHERE key='last_model'").fetchone()[0] == "demo"
    assert raw.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def test_migrates_a_version_1_database(tmp_path):
    path = tmp_path / "old.db"
    raw = sqlite3.connect(path)
    raw.executescript(MIGRATIONS[0])
    raw.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    raw.execute("INSERT INTO schema_version VALUES (1)")
    raw.execute("INSERT INTO chats (title, created, updated) VALUES ('old', 1, 1)")
    raw.execute("INSERT INTO messages (chat_id, role, content, created) VALUES (1, 'user', 'kept', 1)")
    raw.commit()
    raw.close()
    s = ChatStore(path)
    assert s.schema_version() == SCHEMA_VERSION
    [m] = s.messages(1)
    assert m.content == "kept" and m.stats is None
    s.add_message(1, "assistant", "new", stats={"x": 1})
    assert s.messages(1)[1].stats == {"x": 1}


def test_refuses_a_newer_schema(tmp_path):
    path = tmp_path / "new.db"
    ChatStore(path).db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(UserError, match="newer"):
        ChatStore(path)


def test_not_a_database_is_a_user_error(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="cannot open"):
        ChatStore(path)


def test_export_markdown(tmp_path):
    s = ChatStore(tmp_path / "h.db")
    c = s.create_chat("Plans", model="demo", system="You are terse.", params={"temperature": 0.5})
    s.add_message(c.id, "user", "List two fruits")
    s.add_message(c.id, "assistant", "- apple\n- pear\n\n```py\nprint(1)\n```\n")
    md = s.export_markdown(c.id)
    assert md.startswith("# Plans\n")
    assert "- model: `demo`" in md and "temperature=0.5" in md
    assert "## System\n\nYou are terse.\n" in md
    data = json.loads(s.export_json(c.id))
    assert (data["title"], data["model"], data["system"], data["params"]) == ("Plans", "demo", "You are terse.",
                                                                             {"temperature": 0.5})
    assert [(m["role"], m["content"][:7]) for m in data["messages"]] == [("user", "List tw"), ("assistant", "- apple")]
    assert md.index("## You\n\nList two fruits") < md.index("## Assistant\n\n- apple\n- pear\n\n```py\nprint(1)\n```")


def test_a_scratch_store_reads_the_history_and_writes_nothing(tmp_path):
    path = tmp_path / "h.db"
    disk = ChatStore(path)
    c = disk.create_chat("kept", model="demo", system="be brief", params={"top_k": 3})
    disk.add_message(c.id, "user", "q")
    disk.add_message(c.id, "assistant", "a", stats={"finish_reason": "stop"})
    disk.set_state("last_model", "demo")

    s = ChatStore.scratch(disk, chat_id=c.id)  # closes disk
    assert not s.persistent and disk.persistent
    [copy] = s.list_chats()
    assert (copy.title, copy.model, copy.system, copy.params) == ("kept", "demo", "be brief", {"top_k": 3})
    assert [(m.role, m.content, m.stats) for m in s.messages(copy.id)] == [
        ("user", "q", None), ("assistant", "a", {"finish_reason": "stop"})]
    assert s.get_state("last_model") == "demo"
    s.add_message(copy.id, "user", "private")
    s.create_chat("new one")
    s.set_state("last_model", "other")
    s.close()
    reopened = ChatStore(path)
    assert [x.title for x in reopened.list_chats()] == ["kept"] and reopened.get_state("last_model") == "demo"
    assert [m.content for m in reopened.messages(c.id)] == ["q", "a"]


def test_every_sampling_setting_is_stored_and_read_back(tmp_path):
    """What /set accepts (any SamplingParams field) reads back as it was saved, not as damaged settings."""
    from dataclasses import fields

    from rapidmoe.engine.sampling import SamplingParams

    values = {"stop": ["END"], "seed": 7, "top_k": 5, "repeat_last_n": 32, "max_tokens": 9}
    params = {f.name: values.get(f.name, 0.5) for f in fields(SamplingParams)}
    s = ChatStore(tmp_path / "h.db")
    c = s.create_chat("all", model="demo", params=params)
    assert ChatStore(tmp_path / "h.db").get_chat(c.id).params == params
