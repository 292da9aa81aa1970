"""Chat history in SQLite (WAL) under the user data dir: chats with their system
prompt and sampling settings, messages with their stats, a little app state
(the last used model), and a schema version with forward-only migrations.
A session that must leave no trace (--no-history) uses an in-memory copy."""
from __future__ import annotations

import functools
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.errors import UserError
from ..engine.paths import data_dir
from .store_sql import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Tx,
    check_schema,
    db_error,
    one_line,
    parse_params,
    parse_stats,
    statements,
)

DB_NAME = "history.db"


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
        """memory: a store that lives in memory only and is gone when closed (see scratch()).
        Every failure to open, check or use the file is a one-line UserError naming it."""
        self.path = None if memory else Path(path) if path else db_path()
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"{self.path.parent}: cannot hold the chat history ({e.strerror or e}); "
                                "set RAPIDMOE_DATA_DIR to a folder") from None
            if self.path.exists() and not self.path.is_file():
                raise UserError(f"{self.path}: the chat history is not a file; move it away")
        self.db = None
        try:
            self.db = sqlite3.connect(self.path or ":memory:", isolation_level=None, timeout=5.0)
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "schema_version" not in tables:  # someone else's database: leave it untouched
                raise UserError(f"{self.path}: not a rapidmoe-chat history (it holds tables "
                                f"{', '.join(sorted(tables)[:4])}); move it away to start a new one")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; one fsync per checkpoint
            if self.path is not None:  # damage shows now, not halfway through a later write
                bad = [r[0] for r in self.db.execute("PRAGMA quick_check").fetchall() if r[0] != "ok"]
                if bad:
                    raise UserError(f"{self.path}: the chat history is damaged ({one_line(bad[0])}); "
                                    "move it away to start a new one")
            self._migrate()
            check_schema(self.db, self.path)
        except (sqlite3.Error, UserError) as e:
            if self.db is not None:
                self.db.close()
            raise db_error(self.path, e, "cannot open") from None

    def check_writable(self) -> None:
        """Fail now, in one line, where a later write would (a read-only file or folder, a
        locked or damaged database): before a reply is generated, not after it."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("UPDATE schema_version SET version = version")
        finally:
            self.db.execute("ROLLBACK")

    # --- schema ---
    def schema_version(self) -> int:
        row = self.db.execute("SELECT version FROM schema_version").fetchone()
        if row is not None and (isinstance(row[0], bool) or not isinstance(row[0], int)):
            raise UserError(f"{self.path}: the chat history is damaged (schema version {str(row[0])[:20]!r}); "
                            "move it away to start a new one")
        return row[0] if row else 0

    def _migrate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        have = self.schema_version()
        if have > SCHEMA_VERSION:
            raise UserError(f"{self.path}: chat history has schema {have}, newer than this "
                            f"rapidmoe-chat understands ({SCHEMA_VERSION}); upgrade rapidmoe-chat")
        for v in range(have, SCHEMA_VERSION):
            with self._tx():  # executescript() would commit mid-way: run statements one by one
                for stmt in statements(MIGRATIONS[v]):
                    self.db.execute(stmt)
                self.db.execute("DELETE FROM schema_version")
                self.db.execute("INSERT INTO schema_version VALUES (?)", (v + 1,))

    def _tx(self):
        return Tx(self.db)

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
        return _chat(row, self.path)

    def has_chat(self, chat_id: int) -> bool:
        return self.db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is not None

    def list_chats(self) -> list[Chat]:
        """Every chat, most recently active first; one with damaged settings is listed with
        none (opening it says what is wrong)."""
        rows = self.db.execute("SELECT id, title, model, system, params, created, updated FROM chats "
                               "ORDER BY updated DESC, id DESC").fetchall()
        return [_chat(r, self.path, strict=False) for r in rows]

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

    def add_exchange(self, chat_id: int | None, prompt: str, reply: str | None,
                     stats: dict[str, Any] | None = None, *, title: str = "New chat",
                     model: str | None = None, system: str = "") -> Chat:
        """A prompt and its reply in one transaction (reply None: the prompt alone, left
        unanswered), in chat_id or, when None, a new chat made in the same transaction:
        a crash at any point leaves either all of it or none of it."""
        now = time.time()
        with self._tx():
            if chat_id is None:
                chat_id = self.db.execute(
                    "INSERT INTO chats (title, model, system, params, created, updated) VALUES (?,?,?,?,?,?)",
                    (title, model, system or "", "{}", now, now)).lastrowid
            elif self.db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
                raise UserError(f"no chat with id {chat_id}")
            rows = [(chat_id, "user", prompt, now, None)]
            if reply is not None:
                rows.append((chat_id, "assistant", reply, now, json.dumps(stats) if stats is not None else None))
            self.db.executemany("INSERT INTO messages (chat_id, role, content, created, stats) "
                                "VALUES (?,?,?,?,?)", rows)
            self.db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return self.get_chat(chat_id)

    def messages(self, chat_id: int) -> list[Message]:
        rows = self.db.execute("SELECT id, chat_id, role, content, created, stats FROM messages "
                               "WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        return [Message(r[0], r[1], r[2], r[3], r[4], parse_stats(r[5])) for r in rows]

    def context(self, chat_id: int) -> list[dict[str, str]]:
        """The chat as a model should see it: user and assistant turns alternating, each
        prompt with its reply. A prompt left unanswered (the app was killed while writing
        its reply, or the reply failed) is kept in the history but not sent, so a template
        that requires alternating roles never sees two user turns in a row."""
        msgs = self.messages(chat_id)
        out: list[dict[str, str]] = []
        for m, nxt in zip(msgs, msgs[1:] + [None]):
            if m.role == "user" and nxt is not None and nxt.role == "assistant":
                out.append({"role": "user", "content": m.content})
            elif m.role == "assistant" and out and out[-1]["role"] == "user":
                out.append({"role": "assistant", "content": m.content})
        return out

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


# Stored settings are sampling overrides: a name -> the JSON types its value may have.
def _chat(row, path: Path | None, strict: bool = True) -> Chat:
    try:
        params = parse_params(row[4])
    except ValueError as e:
        if strict:
            raise UserError(f"{path or 'history'}: chat {row[0]} has damaged settings ({e}); "
                            "start a new chat or delete this one") from None
        params = {}
    return Chat(row[0], row[1], row[2], row[3], params, row[5], row[6])


def _guard(fn):
    """SQLite failures inside a store method -> one UserError line naming the file."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kw):
        try:
            return fn(self, *args, **kw)
        except sqlite3.Error as e:
            raise db_error(self.path, e) from None
    return wrapper


for _name, _fn in list(vars(ChatStore).items()):
    if callable(_fn) and not _name.startswith("__") and not isinstance(_fn, (classmethod, staticmethod)):
        setattr(ChatStore, _name, _guard(_fn))


def _chat_dict(chat: Chat) -> dict[str, Any]:
    return {"id": chat.id, "title": chat.title, "model": chat.model, "system": chat.system,
            "params": chat.params, "created": chat.created, "updated": chat.updated}


