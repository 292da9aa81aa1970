"""Bringing text into the prompt from outside: a file as a fenced block, or
the prompt edited in the user's own editor."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

from textual.app import SuspendNotSupported

from ...engine.errors import UserError

MAX_ATTACH = 1 << 20  # bytes: more would not fit any context we run anyway


def fenced_file(path: str) -> str:
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()[: MAX_ATTACH + 1]
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}") from None
    if len(data) > MAX_ATTACH:
        raise UserError(f"{path}: larger than {MAX_ATTACH // 1024} KiB; attach a smaller file")
    if b"\0" in data:
        raise UserError(f"{path}: a binary file; only text can be attached")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    # a fence longer than any backtick run inside, so the file cannot close it early
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"`{p.name}`:\n{fence}{p.suffix.lstrip('.')}\n{text.rstrip()}\n{fence}\n"


def edit_in_editor(app, text: str) -> str:
    cmd = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False, encoding="utf-8") as f:
        f.write(text)
        path = f.name

    def run() -> int:
        try:
            return subprocess.call([*shlex.split(cmd), path])
        except OSError as e:
            raise UserError(f"cannot run the editor {cmd!r}: {e.strerror or e}") from None

    try:
        try:
            with app.suspend():  # the editor gets the terminal
                rc = run()
        except SuspendNotSupported:  # headless: nothing to hand over
            rc = run()
        if rc != 0:
            raise UserError(f"the editor {cmd!r} exited with status {rc}; prompt unchanged")
        return Path(path).read_text("utf-8").rstrip("\n")
    finally:
        os.unlink(path)
