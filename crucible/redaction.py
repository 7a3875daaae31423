"""Secrets never shown or saved in the clear.

A secret is every value that came from `{env:VAR}` (config, profiles, cards' MCP servers) and
every bearer token Crucible makes or is given. They are remembered here, for this process,
as they are made or filled in; `redact(text)` puts `***` in their place (their JSON-escaped
form too, so a recorded frame is covered). `crucible.terminal.sanitize` redacts, so every
line that reaches a terminal does; recordings and the log redact through it as well.

Values shorter than `MIN_SECRET_LENGTH` are not remembered: replacing "1" or "on" everywhere
would garble every line and hides nothing worth hiding.
"""

from __future__ import annotations

import json
import threading

__all__ = ["MIN_SECRET_LENGTH", "MASK", "forget_all", "redact", "remember_secret"]

MIN_SECRET_LENGTH = 6
MASK = "***"

_lock = threading.Lock()
_secrets: set[str] = set()
_forms: list[str] = []  # every secret and its JSON-escaped form, longest first


def remember_secret(value: str) -> None:
    """Redact `value` from now on, wherever `redact` is applied."""
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH or value in _secrets:
        return
    with _lock:
        _secrets.add(value)
        forms = set(_forms) | {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
        _forms[:] = sorted(forms, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every remembered secret replaced by `***`."""
    if not _forms:
        return text
    for form in _forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def forget_all() -> None:
    """For tests: an empty registry."""
    with _lock:
        _secrets.clear()
        _forms.clear()
