"""Errors a user can act on. The CLI prints them as one line and exits 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an impossible request: shown as one line, exit status 2. setting:
    the load_model argument that would fix it ("n_ctx"), which the app may
    name as its user sets it (a flag)."""

    exit_code = 2

    def __init__(self, *args, setting: str | None = None):
        super().__init__(*args)
        self.setting = setting


class SettingError(UserError):
    """A setting out of its range, in the engine's terms: `field` (a SamplingParams
    field) and `rule` ("must be > 0"). The app names the setting as its user wrote it
    (a flag, a config key) with `rule`."""

    def __init__(self, field: str, rule: str):
        self.field, self.rule = field, rule
        super().__init__(f"{field} {rule}")


class ContextError(UserError):
    """A text longer than the context holds, in the engine's terms: `what` ("the
    prompt") is `n_tokens` tokens, the context `n_ctx`; the setting that makes room
    is n_ctx, which the app names as its user raises it (a flag, a setting)."""

    def __init__(self, what: str, n_tokens: int, n_ctx: int):
        self.what, self.n_tokens, self.n_ctx = what, n_tokens, n_ctx
        super().__init__(f"{what} is {n_tokens} tokens but the context holds {n_ctx}", setting="n_ctx")


class SettingNote(str):
    """A one-off note (a `log` line) on a setting the engine changed, readable as it
    is: `field` (load_model's argument), `name` (what it means), `value`, `rest`
    ("is more than ..."). The app names the setting as its user wrote it, as with
    SettingError."""

    field: str
    name: str
    value: object
    rest: str

    def __new__(cls, field: str, name: str, value: object, rest: str):
        note = super().__new__(cls, f"{name} {value} {rest}")
        note.field, note.name, note.value, note.rest = field, name, value, rest
        return note


class ModelFileError(UserError):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
