"""Errors a user can act on. The CLI prints them as one line and exits 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an impossible request: shown as one line, exit status 2."""

    exit_code = 2


class SettingError(UserError):
    """A setting out of its range, in the engine's terms: `field` (a SamplingParams
    field) and `rule` ("must be > 0"). The app names the setting as its user wrote it
    (a flag, a config key) with `rule`."""

    def __init__(self, field: str, rule: str):
        self.field, self.rule = field, rule
        super().__init__(f"{field} {rule}")


class ModelFileError(UserError):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
