"""Errors the person sees: a message and the fix, never a traceback."""

from __future__ import annotations


class CrucibleError(Exception):
    """An error with a message for the person and, when known, what to do about it."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message
