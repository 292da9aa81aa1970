"""The SQLite side of the chat history (app/store.py): the schema and its
forward-only migrations, the check that a database is ours, stored values
decoded, SQLite failures as one line naming the file, and transactions."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from ..engine.errors import UserError

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


PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float), "top_k": (int,), "top_p": (int, float), "min_p": (int, float),
    "repeat_penalty": (int, float), "repeat_last_n": (int,), "frequency_penalty": (int, float),
    "presence_penalty": (int, float), "seed": (int, type(None)),
    "max_tokens": (int,), "stop": (list,),
}


def parse_params(text: str) -> dict[str, Any]:
    """A chat's stored settings -> dict; ValueError saying what is wrong."""
    try:
        p = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError("not JSON") from None
    if not isinstance(p, dict):
        raise ValueError(f"a JSON {type(p).__name__}, not an object")
    for k, v in p.items():
        kinds = PARAM_TYPES.get(k)
        if kinds is None:
            raise ValueError(f"unknown setting {k!r}")
        if isinstance(v, bool) or not isinstance(v, kinds) or (
                k == "stop" and not all(isinstance(x, str) for x in v)):
            raise ValueError(f"{k} = {one_line(json.dumps(v))[:40]}")
        if isinstance(v, float) and v != v:
            raise ValueError(f"{k} is NaN")
    return p


def parse_stats(text: str | None) -> dict[str, Any] | None:
    """A message's stats are informative: unreadable ones are dropped, not fatal."""
    if not text:
        return None
    try:
        s = json.loads(text)
    except ValueError:
        return None
    return s if isinstance(s, dict) else None


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def check_schema(db: sqlite3.Connection, path: Path | None) -> None:
    """A database that is not ours (same file name, other tables or columns): say so now."""
    want = {"chats": {"id", "title", "model", "system", "params", "created", "updated"},
            "messages": {"id", "chat_id", "role", "content", "created", "stats"},
            "state": {"key", "value"}}
    for table, cols in want.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})").fetchall()}
        if not cols <= have:
            raise UserError(f"{path}: not a rapidmoe-chat history (table {table} lacks "
                            f"{', '.join(sorted(cols - have))}); move it away to start a new one")


def db_error(path: Path | None, e: Exception, doing: str = "cannot use") -> UserError:
    if isinstance(e, UserError):
        return e
    msg = one_line(e)
    ro = path is not None and not (os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK)))
    if ro or "readonly" in msg or "read-only" in msg:
        hint = "the file or its folder is read-only; make it writable or use --no-history"
    elif "locked" in msg or "busy" in msg:
        hint = "another rapidmoe-chat holds it; try again when it is done"
    elif "not a database" in msg or "malformed" in msg or "corrupt" in msg:
        hint = "the file is damaged or not a chat history; move it away to start a new one"
    elif "already exists" in msg or "no such" in msg:
        hint = "not a rapidmoe-chat history; move it away to start a new one"
    else:
        hint = "check the file and its folder"
    return UserError(f"{path or 'chat history'}: {doing} the chat history: {msg} ({hint})")


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


class Tx:
    """BEGIN IMMEDIATE ... COMMIT / ROLLBACK on a connection in autocommit mode."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
