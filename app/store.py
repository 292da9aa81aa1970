"""Chat history in SQLite (WAL) under the user data dir: chats with their system
prompt and sampling settings, messages with their stats, a little app state
(the last used model), and a schema version with forward-only migrations.
A session that must leave no trace (--no-history) uses an in-memory copy."""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.errors import UserError
from ..engine.paths import data_dir

DB_NAME = "history.db"

# Each entry upgrades the schema by one version; never edit a shipped entry, append.
MIGRATIONS: list[str] = [
    # 1: chats, messages, state
    """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        model TEXT,
        system TEXT NOT NULL DEFAULT '',
        params TEXT NOT NULL DEFAULT '{}',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        created REAL NOT NULL
    );
    CREATE INDEX messages_by_chat ON messages(chat_id, id);
    CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 2: per-message generation stats (tok/s, TTFT, finish reason) as JSON
    "ALTER TABLE messages ADD COLUMN stats TEXT;",
]
SCHEMA_VERSION = len(MIGRATIONS)


def db_path() -> Path:
    return data_dir() / DB_NAME


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    model: str | None
    system: str
    params: dict[str, Any]
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    role: str
    content: str
    created: float
    stats: dict[str, Any] | None


class ChatStore:
    def __init__(self, path: Path | str | None = None, *, memory: bool = False):
        """memory: a store that lives in memory only and is gone when closed (see scratch())."""
        self.path = None if memory else Path(path) if path else db_path()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path or ":memory:", isolation_level=None, timeout=5.0)
            self.db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as e:
            raise UserError(f"{self.path}: cannot open the chat history ({e})") from None
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; one fsync per checkpoint
        self._migrate()

    # --- schema ---
    def schema_version(self) -> int:
        row = self.db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        have = self.schema_version()
        if have > SCHEMA_VERSION:
            raise UserError(f"{self.path}: chat history has schema {have}, newer than this "
                            f"rapidmoe-chat understands ({SCHEMA_VERSION}); upgrade rapidmoe-chat")
        for v in range(have, SCHEMA_VERSION):
            with self._tx():  # executescript() would commit mid-way: run statements one by one
                for stmt in _statements(MIGRATIONS[v]):
                    self.db.execute(stmt)
                self.db.execute("DELETE FROM schema_version")
                self.db.execute("INSERT INTO schema_version VALUES (?)", (v + 1,))

    def _tx(self):
        return _Tx(self.db)

    def close(self) -> None:
        self.db.close()

    @property
    def persistent(self) -> bool:
        return self.path is not None

    @classmethod
    def scratch(cls, source: "ChatStore", chat_id: int | None = None) -> "ChatStore":
        """A session that leaves no trace (--no-history): an in-memory store that starts
        with source's app state (the last used model) and, given chat_id, a copy of that
        chat to continue. source is closed; nothing is ever written to it."""
        s = cls(memory=True)
        for key, value in source.db.execute("SELECT key, value FROM state").fetchall():
            s.set_state(key, value)
        if chat_id is not None:
            s.copy_chat(source, chat_id)
        source.close()
        return s

    def copy_chat(self, source: "ChatStore", chat_id: int) -> Chat:
        """A copy of another store's chat, messages and their stats included."""
        c = source.get_chat(chat_id)
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO chats (title, model, system, params, created, updated) VALUES (?,?,?,?,?,?)",
                (c.title, c.model, c.system, json.dumps(c.params), c.created, c.updated))
            self.db.executemany(
                "INSERT INTO messages (chat_id, role, content, created, stats) VALUES (?,?,?,?,?)",
                [(cur.lastrowid, m.role, m.content, m.created, json.dumps(m.stats) if m.stats is not None else None)
                 for m in source.messages(chat_id)])
        return self.get_chat(cur.lastrowid)

    # --- chats ---
    def create_chat(self, title: str = "New chat", model: str | None = None, system: str = "",
                    params: dict[str, Any] | None = None) -> Chat:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO chats (title, model, system, params, created, updated) VALUES (?,?,?,?,?,?)",
            (title, model, system or "", json.dumps(params or {}), now, now))
        return self.get_chat(cur.lastrowid)

    def get_chat(self, chat_id: int) -> Chat:
        row = self.db.execute("SELECT id, title, model, system, params, created, updated FROM chats "
                              "WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise UserError(f"no chat with id {chat_id}")
        return Chat(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6])

    def list_chats(self) -> list[Chat]:
        rows = self.db.execute("SELECT id FROM chats ORDER BY updated DESC, id DESC").fetchall()
        return [self.get_chat(r[0]) for r in rows]

    def last_chat(self) -> Chat | None:
        row = self.db.execute("SELECT id FROM chats ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return self.get_chat(row[0]) if row else None

    def _set(self, chat_id: int, column: str, value) -> None:
        # settings do not bump `updated`: the chat list is ordered by conversation activity
        cur = self.db.execute(f"UPDATE chats SET {column} = ? WHERE id = ?", (value, chat_id))
        if cur.rowcount == 0:
            raise UserError(f"no chat with id {chat_id}")

    def rename_chat(self, chat_id: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise UserError("a chat title cannot be empty")
        self._set(chat_id, "title", title)

    def set_system(self, chat_id: int, system: str) -> None:
        self._set(chat_id, "system", system)

    def set_params(self, chat_id: int, params: dict[str, Any]) -> None:
        self._set(chat_id, "params", json.dumps(params))

    def set_model(self, chat_id: int, model: str | None) -> None:
        self._set(chat_id, "model", model)

    def delete_chat(self, chat_id: int) -> None:
        cur = self.db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
        if cur.rowcount == 0:
            raise UserError(f"no chat with id {chat_id}")

    # --- messages ---
    def add_message(self, chat_id: int, role: str, content: str,
                    stats: dict[str, Any] | None = None) -> Message:
        now = time.time()
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO messages (chat_id, role, content, created, stats) VALUES (?,?,?,?,?)",
                (chat_id, role, content, now, json.dumps(stats) if stats is not None else None))
            self.db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return Message(cur.lastrowid, chat_id, role, content, now, stats)

    def messages(self, chat_id: int) -> list[Message]:
        rows = self.db.execute("SELECT id, chat_id, role, content, created, stats FROM messages "
                               "WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        return [Message(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]) if r[5] else None) for r in rows]

    def delete_messages_from(self, chat_id: int, message_id: int) -> int:
        """Delete a message and every later one in its chat (edit / regenerate)."""
        cur = self.db.execute("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))
        return cur.rowcount

    def clear_messages(self, chat_id: int) -> None:
        self.db.execute("DELETE FROM messages WHERE chat_id = ?", (chat_id,))

    def prompt_history(self, limit: int = 200) -> list[str]:
        """The user's recent prompts across chats, oldest first (for Up/Down in the input)."""
        rows = self.db.execute("SELECT content FROM messages WHERE role = 'user' "
                               "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]

    # --- app state ---
    def get_state(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_state(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO state (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # --- export ---
    def export_markdown(self, chat_id: int) -> str:
        chat = self.get_chat(chat_id)
        out = [f"# {chat.title}", ""]
        meta = [f"- created: {time.strftime('%Y-%m-%d %H:%M', time.localtime(chat.created))}"]
        if chat.model:
            meta.append(f"- model: `{chat.model}`")
        if chat.params:
            meta.append("- sampling: " + ", ".join(f"{k}={v}" for k, v in sorted(chat.params.items())))
        out += meta + [""]
        if chat.system:
            out += ["## System", "", chat.system, ""]
        for m in self.messages(chat_id):
            out += ["## You" if m.role == "user" else "## Assistant", "", m.content.rstrip(), ""]
        return "\n".join(out)

    def export_json(self, chat_id: int) -> str:
        chat = self.get_chat(chat_id)
        msgs = [{"role": m.role, "content": m.content, "created": m.created, "stats": m.stats}
                for m in self.messages(chat_id)]
        return json.dumps({**_chat_dict(chat), "messages": msgs}, ensure_ascii=False, indent=1)


def _chat_dict(chat: Chat) -> dict[str, Any]:
    return {"id": chat.id, "title": chat.title, "model": chat.model, "system": chat.system,
            "params": chat.params, "created": chat.created, "updated": chat.updated}


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT / ROLLBACK on a connection in autocommit mode."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
