"""An upstream MCP server's question to the person (elicitation/create), in the chat's
permission dialog: the session's `Elicitor` for the terminal chat.

The question waits in a FIFO queue like a permission request; the dialog shows the server,
its message and the fields it wants (with their defaults). The person types the answer in the
input box and presses Enter (one field: the value; several: `name=value; other=value`; empty:
the defaults), or Esc to decline. A question leaves the queue once: answered, declined, or
withdrawn when the tool call that asked is cancelled.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from crucible.sessions import ElicitAnswer, ElicitationAsk
from crucible.terminal import sanitize

Fragments = list[tuple[str, str]]


@dataclass(eq=False)
class PendingQuestion:
    ask: ElicitationAsk
    answered: trio.Event = field(default_factory=trio.Event)
    answer: ElicitAnswer | None = None


def _fields(ask: ElicitationAsk) -> dict[str, dict[str, Any]]:
    props = (ask.schema or {}).get("properties") or {}
    return {k: v for k, v in props.items() if isinstance(v, dict)}


def _coerce(name: str, prop: dict[str, Any], raw: str) -> Any:
    kind = prop.get("type")
    text = raw.strip()
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {text!r}") from None
    if kind == "number":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError(f"{name} must be yes or no, got {text!r}")
    options = prop.get("enum")
    if isinstance(options, list) and text not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(str, options))}")
    return text


def parse_answer(ask: ElicitationAsk, text: str) -> dict[str, Any]:
    """The content for `ask` from what the person typed; ValueError says what is wrong."""
    fields = _fields(ask)
    given: dict[str, str] = {}
    text = text.strip()
    if text:
        if len(fields) == 1 and "=" not in text:
            given[next(iter(fields))] = text
        else:
            for part in text.split(";"):
                if not part.strip():
                    continue
                name, eq, value = part.partition("=")
                if not eq or name.strip() not in fields:
                    raise ValueError(f"write name=value; the fields are {', '.join(fields)}")
                given[name.strip()] = value
    content = {k: v["default"] for k, v in fields.items() if "default" in v}
    for name, value in given.items():
        content[name] = _coerce(name, fields[name], value)
    missing = [k for k in (ask.schema or {}).get("required") or [] if k not in content]
    if missing:
        raise ValueError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed")
    return content


class ElicitationQueue:
    """The TUI's `Elicitor`: `await queue(ask)` waits for the person's answer."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.items: deque[PendingQuestion] = deque()
        self.on_change = on_change

    async def __call__(self, ask: ElicitationAsk) -> ElicitAnswer:
        pending = PendingQuestion(ask)
        self.items.append(pending)
        self.on_change()
        try:
            await pending.answered.wait()
        finally:
            if pending in self.items:  # withdrawn (the call was cancelled) before an answer
                self.items.remove(pending)
                self.on_change()
        assert pending.answer is not None
        return pending.answer

    @property
    def current(self) -> PendingQuestion | None:
        return self.items[0] if self.items else None

    def _settle(self, answer: ElicitAnswer) -> None:
        pending = self.items.popleft()
        pending.answer = answer
        pending.answered.set()
        self.on_change()

    def answer(self, text: str) -> str | None:
        """Answer the first question with the typed text; returns what is wrong, or None."""
        pending = self.current
        if pending is None:
            return "no question is waiting"
        if pending.ask.url is not None:  # the person went to the link (or not): they say so
            self._settle(ElicitAnswer("accept", {}, note="the person answered"))
            return None
        try:
            content = parse_answer(pending.ask, text)
        except ValueError as exc:
            return str(exc)
        self._settle(ElicitAnswer("accept", content, note="the person answered"))
        return None

    def decline(self) -> None:
        if self.current is not None:
            self._settle(ElicitAnswer("decline", note="the person declined"))

    def dialog_lines(self) -> list[Fragments]:
        pending = self.current
        if pending is None:
            return []
        ask = pending.ask
        lines: list[Fragments] = [[
            ("class:dialog.title", f"Question from MCP server {sanitize(ask.server)} ({sanitize(ask.label)}): "),
            ("class:tool.title", sanitize(ask.message)[:300]),
        ]]
        if ask.url is not None:
            lines.append([("", "  open: "), ("class:tool.title", sanitize(ask.url))])
        for name, prop in list(_fields(ask).items())[:5]:
            default = f" (default {json.dumps(prop['default'])})" if "default" in prop else ""
            kind = prop.get("type", "text")
            desc = f" — {sanitize(str(prop.get('description', '')))[:80]}" if prop.get("description") else ""
            lines.append([("class:dim", f"  {sanitize(name)}: {kind}{default}{desc}")])
        how = "Enter: done" if ask.url is not None else "type the answer, Enter: send (empty: the defaults)"
        more = len(self.items) - 1
        lines.append([("class:dialog.key", " Enter "), ("", f" {how}  "), ("class:dialog.key", " Esc "),
                      ("", " decline  ")] + ([("class:dim", f"(+{more} waiting)")] if more else []))
        return lines
