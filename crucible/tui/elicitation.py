"""An upstream MCP server's question to the person (elicitation/create), in the chat's
permission dialog: the session's `Elicitor` for the terminal chat.

The question waits in a FIFO queue like a permission request; the dialog shows the server,
its message and the fields it wants (with their defaults). The person types the answer in the
input box and presses Enter (one field, or the one required field without a default: the
value; several: `name=value; other=value`; empty: the defaults; a choice by its value or its
title, a multi-select's with commas), or Esc to decline. A question leaves the queue once:
answered, declined, or withdrawn when the tool call that asked is cancelled.
"""

from __future__ import annotations

import datetime as dt
import json
import re
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
    # The input box is this question's answer: it was empty when the question came first, or has
    # been emptied since. Until then Enter sends the person's draft as a prompt, as they meant
    # it, and Esc is theirs (Esc-Enter): a sentence typed for the agent never answers a server.
    takes_box: bool = False


def _fields(ask: ElicitationAsk) -> dict[str, dict[str, Any]]:
    props = (ask.schema or {}).get("properties") or {}
    return {k: v for k, v in props.items() if isinstance(v, dict)} if isinstance(props, dict) else {}


# The most choices of one field read from a server's schema (it is the server's to send, and a
# person picks from a handful); the most fields drawn in the dialog before "… and N more".
MAX_CHOICES = 200
MAX_FIELDS_SHOWN = 10
# Formats the MCP spec allows for a string field, checked before the answer is sent. The
# patterns have no nested repetition: linear in the answer's length.
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+")


def _required(ask: ElicitationAsk) -> list[str]:
    wanted = (ask.schema or {}).get("required")
    return [k for k in wanted if isinstance(k, str)] if isinstance(wanted, list) else []


def _lone_required(ask: ElicitationAsk, fields: dict[str, dict[str, Any]]) -> str | None:
    """The one field the person must answer (required, no default), if there is exactly one:
    typed text without `=` is its value."""
    unset = [k for k in _required(ask) if k in fields and "default" not in fields[k]]
    return unset[0] if len(unset) == 1 else None


def _choices(prop: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A select field's choices as (value, title): `oneOf`/`anyOf` of {const, title}, or `enum`
    (with the older `enumNames` as titles); for a multi-select, its `items`'. None: free text."""
    source = prop.get("items") if prop.get("type") == "array" else prop
    if not isinstance(source, dict):
        return None
    titled = source.get("oneOf") or source.get("anyOf")
    if isinstance(titled, list):
        out = [(str(c["const"]), str(c.get("title") or c["const"]))
               for c in titled[:MAX_CHOICES] if isinstance(c, dict) and "const" in c]
        return out or None
    enum = source.get("enum")
    if isinstance(enum, list) and enum:
        given = source.get("enumNames")
        names: list[Any] = given if isinstance(given, list) else []
        return [(str(v), str(names[i]) if i < len(names) else str(v)) for i, v in enumerate(enum[:MAX_CHOICES])]
    return None


def _pick(name: str, choices: list[tuple[str, str]], text: str) -> str:
    """The value of the choice the person typed: its value or its title, in any case."""
    for value, _ in choices:
        if text == value:
            return value
    folded = text.casefold()
    for value, title in choices:
        if folded in (value.casefold(), title.casefold()):
            return value
    raise ValueError(f"{name} must be one of {_choice_list(choices)}")


def _choice_list(choices: list[tuple[str, str]], limit: int = 8) -> str:
    shown = ", ".join(title for _, title in choices[:limit])
    if len(choices) <= limit:
        return shown
    return shown + (f", … ({len(choices)} in all)" if len(choices) < MAX_CHOICES else f", … ({MAX_CHOICES} or more)")


def _bounds(name: str, prop: dict[str, Any], value: float) -> None:
    low, high = prop.get("minimum"), prop.get("maximum")
    if isinstance(low, int | float) and value < low:
        raise ValueError(f"{name} must be at least {low}")
    if isinstance(high, int | float) and value > high:
        raise ValueError(f"{name} must be at most {high}")


def _coerce(name: str, prop: dict[str, Any], raw: str) -> Any:
    kind = prop.get("type")
    text = raw.strip()
    choices = _choices(prop)
    if kind == "array":  # a multi-select: comma-separated choices
        picked = [_pick(name, choices, part.strip()) if choices else part.strip()
                  for part in text.split(",") if part.strip()]
        fewest, most = prop.get("minItems"), prop.get("maxItems")
        if isinstance(fewest, int) and len(picked) < fewest:
            raise ValueError(f"{name} needs at least {fewest} of {_choice_list(choices or [])}")
        if isinstance(most, int) and len(picked) > most:
            raise ValueError(f"{name} takes at most {most}")
        return list(dict.fromkeys(picked))
    if kind == "integer":
        try:
            number: float = int(text)
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {text!r}") from None
        _bounds(name, prop, number)
        return number
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
        _bounds(name, prop, number)
        return number
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError(f"{name} must be yes or no, got {text!r}")
    if choices:
        return _pick(name, choices, text)
    shortest, longest = prop.get("minLength"), prop.get("maxLength")
    if isinstance(shortest, int) and len(text) < shortest:
        raise ValueError(f"{name} needs at least {shortest} characters")
    if isinstance(longest, int) and len(text) > longest:
        raise ValueError(f"{name} takes at most {longest} characters")
    form = prop.get("format")
    if form == "email" and not _EMAIL.fullmatch(text):
        raise ValueError(f"{name} must be an email address, got {text!r}")
    if form == "uri" and not _URI.fullmatch(text):
        raise ValueError(f"{name} must be a link such as https://example.org, got {text!r}")
    if form in ("date", "date-time"):
        try:
            (dt.date if form == "date" else dt.datetime).fromisoformat(text)
        except ValueError:
            example = "2026-12-31" if form == "date" else "2026-12-31T09:30"
            raise ValueError(f"{name} must be a {form.replace('-', ' and ')} such as {example}, "
                             f"got {text!r}") from None
    return text


def _field_named(fields: dict[str, dict[str, Any]], typed: str) -> str:
    name = typed.strip()
    if name in fields:
        return name
    same = [k for k in fields if k.casefold() == name.casefold()]
    if len(same) == 1:
        return same[0]
    raise ValueError(f"no field {name!r}: write name=value; name=value with the names shown")


def _parts(text: str) -> list[str]:
    """`name=value; name=value` cut at its semicolons, but not inside a value in double quotes
    (`note="a; b"`): a quote counts only where a value starts, so `size=5" screen` is a value."""
    parts: list[str] = []
    cur: list[str] = []
    state = "name"  # name -> (after '=') start -> value | quoted -> value
    for ch in text:
        if state == "quoted":
            cur.append(ch)
            state = "value" if ch == '"' else state
            continue
        if ch == ";":
            parts.append("".join(cur))
            cur, state = [], "name"
            continue
        cur.append(ch)
        if state == "name" and ch == "=":
            state = "start"
        elif state == "start" and not ch.isspace():
            state = "quoted" if ch == '"' else "value"
    parts.append("".join(cur))
    return parts


def _name_and_value(fields: dict[str, dict[str, Any]], part: str) -> tuple[str, str]:
    """The field a part names and its value (unquoted). A field's name may hold `=` itself: the
    longest name the part starts with, then `=`, is the one."""
    typed = part.lstrip()
    for name in sorted(fields, key=len, reverse=True):
        rest = typed[len(name):].lstrip()
        if typed[:len(name)].casefold() == name.casefold() and rest.startswith("="):
            value = rest[1:].strip()
            break
    else:
        said, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"write name=value; name=value (the fields: {', '.join(list(fields)[:8])}"
                             f"{', …' if len(fields) > 8 else ''})")
        name, value = _field_named(fields, said), value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return name, value


def parse_answer(ask: ElicitationAsk, text: str) -> dict[str, Any]:
    """The content for `ask` from what the person typed; ValueError says what is wrong.

    One field: its value (or `name=value`). Several: `name=value; name=value`, the others keep
    their defaults; a value holding `;` in double quotes (`note="a; b"`). A multi-select's value
    is its choices separated by commas; a choice may be typed by its value or its title."""
    fields = _fields(ask)
    given: dict[str, str] = {}
    text = text.strip()
    if text:
        only = next(iter(fields)) if len(fields) == 1 else None
        if only is None and "=" not in text:  # several fields, one of them needs an answer: that one
            only = _lone_required(ask, fields)
        if only is not None and not text.casefold().startswith(only.casefold() + "="):
            given[only] = text  # the whole text, `=` and `;` included (a link's query, say)
        else:
            for part in _parts(text):
                if part.strip():
                    name, value = _name_and_value(fields, part)
                    given[name] = value
    content = {k: v["default"] for k, v in fields.items() if "default" in v}
    for name, value in given.items():
        content[name] = _coerce(name, fields[name], value)
    missing = [k for k in _required(ask) if k not in content]
    if missing:
        raise ValueError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed")
    return content


def _shown_default(prop: dict[str, Any]) -> str:
    default = prop["default"]
    choices = dict(_choices(prop) or [])
    if isinstance(default, list):
        shown = ", ".join(choices.get(str(v), str(v)) for v in default[:20]) if choices else json.dumps(default[:20])
    elif isinstance(default, bool):
        shown = "yes" if default else "no"
    else:
        shown = choices.get(str(default)) or json.dumps(default, ensure_ascii=False)[:200]
    return _cut(shown, 60)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most] + "…"


def field_line(name: str, prop: dict[str, Any], required: bool) -> str:
    """One field of a question as the dialog shows it: what to type, its default, what it is for."""
    kind = prop.get("type")
    choices = _choices(prop)
    if kind == "array":
        what = f"one or more of {_choice_list(choices)}, with commas" if choices else "a list, with commas"
    elif choices:
        what = f"one of {_choice_list(choices)}"
    else:
        what = {"boolean": "yes or no", "integer": "a whole number", "number": "a number"}.get(str(kind)) or {
            "email": "an email address", "uri": "a link", "date": "a date (2026-12-31)",
            "date-time": "a date and time (2026-12-31T09:30)"}.get(str(prop.get("format")), "text")
        low, high = prop.get("minimum"), prop.get("maximum")
        if isinstance(low, int | float) and isinstance(high, int | float):
            what += f" from {low} to {high}"
    extra = "required" if required and "default" not in prop else ""
    if "default" in prop:
        extra = f"default {_shown_default(prop)}"
    desc = str(prop.get("description") or prop.get("title") or "")
    return f"  {_cut(name, 60)}: {what}" + (f" ({extra})" if extra else "") + (f" — {_cut(desc, 80)}" if desc else "")


class ElicitationQueue:
    """The TUI's `Elicitor`: `await queue(ask)` waits for the person's answer."""

    def __init__(self, on_change: Callable[[], None], box_empty: Callable[[], bool] = lambda: True) -> None:
        self.items: deque[PendingQuestion] = deque()
        self.on_change = on_change
        self.box_empty = box_empty  # whether the input box holds nothing

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

    @property
    def answering(self) -> bool:
        """Enter and Esc go to the first question (its answer is in the input box). Looked at
        each frame and key: a box emptied without a text-changed event (a prompt sent, which
        resets it) counts as soon as it is seen."""
        pending = self.current
        if pending is not None and not pending.takes_box and self.box_empty():
            pending.takes_box = True
        return pending is not None and pending.takes_box

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
        fields = _fields(ask)
        required = set(_required(ask))
        for name, prop in list(fields.items())[:MAX_FIELDS_SHOWN]:
            lines.append([("class:dim", sanitize(field_line(name, prop, name in required)))])
        if len(fields) > MAX_FIELDS_SHOWN:
            rest = list(fields)[MAX_FIELDS_SHOWN:]
            lines.append([("class:dim", sanitize(f"  … and {len(rest)} more: {', '.join(rest)[:200]}"))])
        if ask.url is not None:
            how = "Enter: done"
        elif len(fields) > 1:
            lone = _lone_required(ask, fields)
            lead = f"type {sanitize(lone)}, or " if lone is not None else "type "
            how = lead + "name=value; name=value, Enter: send (the others: their defaults)"
        else:
            how = "type the answer, Enter: send" + (" (empty: the default)" if fields and "default" in
                                                   next(iter(fields.values())) else "")
        more = len(self.items) - 1
        waiting = [("class:dim", f"(+{more} waiting)")] if more else []
        if not self.answering:  # the person's draft is in the box: theirs to send first
            lines.append([("class:dialog.key", " Enter "),
                          ("", " sends what you typed as a prompt (it waits its turn); then answer here  ")]
                         + waiting)
            return lines
        lines.append([("class:dialog.key", " Enter "), ("", f" {how}  "), ("class:dialog.key", " Esc "),
                      ("", " decline  ")] + waiting)
        return lines
