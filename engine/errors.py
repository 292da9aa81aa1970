"""Errors a user can act on. The CLI prints them as one line and exits 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an impossible request: shown as one line, exit status 2."""

    exit_code = 2


class ModelFileError(UserError):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
