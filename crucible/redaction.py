"""Secrets never shown or saved in the clear.

A secret is every value that came from `{env:VAR}` (config, profiles, cards' MCP servers) and
every bearer token Crucible makes or is given. They are remembered here, for this process,
as they are made or filled in; `redact(text)` puts `***` in their place (their JSON-escaped
form too, so a recorded frame is covered). `crucible.terminal.sanitize` redacts, so every
line that reaches a terminal does; recordings and the log redact through it as well.

Values shorter than `MIN_SECRET_LENGTH` are not remembered: replacing "1" or "on" everywhere
would garble every line and hides nothing worth hiding.

Text that arrives in pieces (an agent streams a message a token at a time) goes through a
`StreamRedactor`: a secret cut between two pieces is masked too, because the end of a piece
that could begin a secret waits for the next piece.
"""

from __future__ import annotations

import json
import threading

__all__ = ["MIN_SECRET_LENGTH", "MASK", "StreamRedactor", "forget_all", "held_length", "redact", "remember_secret"]

MIN_SECRET_LENGTH = 6
MASK = "***"

_lock = threading.Lock()
_secrets: set[str] = set()
_forms: list[str] = []  # every secret and its JSON-escaped form, longest first
_prefixes: frozenset[str] = frozenset()  # every proper prefix of every form (for `held_length`)
_firsts: frozenset[str] = frozenset()  # their first characters


def remember_secret(value: str) -> None:
    """Redact `value` from now on, wherever `redact` is applied."""
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH or value in _secrets:
        return
    global _prefixes, _firsts
    with _lock:
        _secrets.add(value)
        forms = set(_forms) | {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
        _forms[:] = sorted(forms, key=len, reverse=True)
        _prefixes = frozenset(form[:n] for form in forms for n in range(1, len(form)))
        _firsts = frozenset(form[0] for form in forms)


def redact(text: str) -> str:
    """`text` with every remembered secret replaced by `***`."""
    if not _forms:
        return text
    for form in _forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def held_length(text: str) -> int:
    """How many characters at the end of `text` (already redacted) could be the start of a
    secret: they must wait for what comes next before being shown or saved."""
    if not _forms or not text:
        return 0
    prefixes, firsts, end = _prefixes, _firsts, len(text)
    # Set lookups at each place a secret could start (the last len(longest) - 1 characters),
    # however many secrets there are: this runs once per streamed chunk.
    for start in range(max(0, end - len(_forms[0]) + 1), end):
        if text[start] in firsts and text[start:] in prefixes:
            return end - start
    return 0


class StreamRedactor:
    """`redact` for a text that comes in pieces: `feed(piece)` returns what can be shown now,
    `end()` what was held back when the text is over."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        if not _forms:
            out, self._held = self._held + piece, ""
            return out
        text = redact(self._held + piece)
        keep = held_length(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def end(self) -> str:
        out, self._held = self._held, ""
        return out


def forget_all() -> None:
    """For tests: an empty registry."""
    global _prefixes, _firsts
    with _lock:
        _secrets.clear()
        _forms.clear()
        _prefixes = _firsts = frozenset()
