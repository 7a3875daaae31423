"""The transcript pane: a bounded list of entries and a UIControl that renders only the rows
on screen.

A growing prompt-toolkit `Buffer` is O(n²) under a stream and redraws on every change; here
an append is a string operation, completed lines are rendered (markdown) and wrapped once
per width, and a frame walks back from the newest entry only as far as the screen needs.
A line that is still streaming is wrapped by slicing, so one 5 MB line costs no more per
frame than a short one.
"""

from __future__ import annotations

import difflib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, cast

from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.controls import UIContent, UIControl

from acp_host.session import (
    MessageChunk,
    PermissionResolved,
    SessionError,
    ThoughtChunk,
    ToolCallEvent,
    TurnEnded,
    UserChunk,
)
from crucible.events import ChildStatus
from crucible.terminal import sanitize
from crucible.tui.markdown import Fragment, Fragments, MarkdownState, peek_line, render_line, wrap

MAX_ENTRIES = 2000
MAX_LINES_PER_ENTRY = 20000
SECTION_LINES = 40  # of a tool call's diff / input / output shown in the transcript
_PEEK_LIMIT = 4000  # a streaming line longer than this is shown without markdown


class Entry:
    """Something in the transcript. `history` entries were replayed, not said now."""

    history = False

    def rows_reversed(self, width: int) -> Iterator[Fragments]:
        raise NotImplementedError


class TextEntry(Entry):
    """Streamed text (agent message, thought, the person's message)."""

    def __init__(self, kind: str, *, markdown: bool = True, history: bool = False) -> None:
        self.kind = kind
        self.base = f"class:{kind}" + (" class:history" if history else "")
        self.history = history
        self.markdown = markdown
        self.state = MarkdownState()
        # A rendered line, or a very long one kept as a plain string (wrapped by slicing).
        self.lines: deque[Fragments | str] = deque(maxlen=MAX_LINES_PER_ENTRY)
        self._pieces: list[str] = []  # the line still streaming; joined when drawn (no O(n²) +=)
        self.collapsed = False

    @property
    def partial(self) -> str:
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def append(self, text: str) -> None:
        text = sanitize(text)
        if "\n" not in text:
            if text:
                self._pieces.append(text)
            return
        parts = (self.partial + text).split("\n")
        last = parts.pop()
        self._pieces[:] = [last] if last else []
        for line in parts:
            self.lines.append(self._render(line))

    def _render(self, line: str) -> Fragments | str:
        if len(line) > _PEEK_LIMIT:
            return line
        if self.markdown:
            return render_line(line, self.state, self.base)
        return [(self.base, line)]

    def finish(self) -> None:
        if self.partial:
            self.lines.append(self._render(self.partial))
            self._pieces.clear()

    def text_lines(self) -> int:
        return len(self.lines) + (1 if self.partial else 0)

    def _sliced_reversed(self, text: str, width: int) -> Iterator[Fragments]:
        style = f"{self.base} class:md.code" if self.state.in_code else self.base
        if text.isascii():
            count = max(1, (len(text) + width - 1) // width)
            for i in range(count - 1, -1, -1):
                yield [(style, text[i * width:(i + 1) * width])]
            return
        yield from reversed(wrap([(style, text)], width))

    def rows_reversed(self, width: int) -> Iterator[Fragments]:
        width = max(1, width)
        if self.collapsed:
            label = f"▸ {self.kind} ({self.text_lines()} lines, Ctrl-T to show)"
            yield from reversed(wrap([(self.base, label)], width))
            return
        # No cache needed: a frame wraps only the lines it shows.
        if self.partial:
            if len(self.partial) > _PEEK_LIMIT:
                yield from self._sliced_reversed(self.partial, width)
            else:
                frags = peek_line(self.partial, self.state, self.base) if self.markdown else [(self.base, self.partial)]
                yield from reversed(wrap(frags, width))
        for i in range(len(self.lines) - 1, -1, -1):
            line = self.lines[i]
            if isinstance(line, str):
                yield from self._sliced_reversed(line, width)
            else:
                yield from reversed(wrap(line, width))


class BlockEntry(Entry):
    """A small entry rebuilt as a whole when it changes (tool calls, notices, errors)."""

    def __init__(self, lines: list[Fragments] | None = None, *, history: bool = False) -> None:
        self.lines: list[Fragments] = lines or []
        self.history = history
        self._cache: tuple[int, list[Fragments]] | None = None

    def set_lines(self, lines: list[Fragments]) -> None:
        self.lines = lines
        self._cache = None

    def rows_reversed(self, width: int) -> Iterator[Fragments]:
        if self._cache is None or self._cache[0] != width:
            rows: list[Fragments] = []
            for line in self.lines:
                rows.extend(wrap(line, width))
            self._cache = (width, rows)
        yield from reversed(self._cache[1])


# -- tool calls -----------------------------------------------------------------------------

_STATUS_STYLE = {"completed": "class:tool.ok", "failed": "class:tool.failed", "in_progress": "class:tool.running",
                 "pending": "class:tool.pending"}


def _capped(lines: list[Fragments], limit: int = SECTION_LINES) -> list[Fragments]:
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [[("class:dim", f"  … {len(lines) - limit} more lines")]]


def diff_lines(diff: dict[str, Any]) -> list[Fragments]:
    """A diff content block as red/green unified-diff lines."""
    old = diff.get("oldText") or ""
    new = diff.get("newText") or ""
    path = sanitize(str(diff.get("path", "")))
    out: list[Fragments] = []
    for line in difflib.unified_diff(str(old).splitlines(), str(new).splitlines(), fromfile=f"a/{path}",
                                     tofile=f"b/{path}", lineterm="", n=2):
        line = sanitize(line)
        if line.startswith(("+++", "---")):
            style = "class:diff.file"
        elif line.startswith("+"):
            style = "class:diff.add"
        elif line.startswith("-"):
            style = "class:diff.del"
        elif line.startswith("@@"):
            style = "class:diff.hunk"
        else:
            style = "class:diff.ctx"
        out.append([(style, "  " + line)])
    if not out:
        out.append([("class:dim", f"  {path}: no changes")])
    return _capped(out)


def text_block_lines(text: str, style: str = "class:tool.output", indent: str = "  ") -> list[Fragments]:
    lines = sanitize(text).split("\n")
    return _capped([[(style, indent + line)] for line in lines])


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_call_lines(call: Any, terminal_text: Callable[[str], str | None] | None = None) -> list[Fragments]:
    """A tool call: title, kind, status, then its diffs, terminal output or result."""
    status = call.status or "pending"
    mark = {"completed": "✓", "failed": "✗", "in_progress": "…"}.get(status, "•")
    head: Fragments = [
        (_STATUS_STYLE.get(status, "class:tool.pending"), f"{mark} "),
        ("class:tool.title", sanitize(call.title or call.tool_call_id)),
        ("class:dim", f"  [{sanitize(call.kind or 'other')}] "),
        (_STATUS_STYLE.get(status, "class:tool.pending"), status),
    ]
    lines: list[Fragments] = [head]
    for loc in call.locations[:3]:
        if isinstance(loc.get("path"), str):
            lines.append([("class:dim", "  at " + sanitize(loc["path"]))])
    shown_content = False
    for block in call.content:
        kind = block.get("type")
        if kind == "diff":
            lines.extend(diff_lines(block))
            shown_content = True
        elif kind == "terminal":
            term_id = str(block.get("terminalId", ""))
            out = terminal_text(term_id) if terminal_text else None
            lines.append([("class:dim", f"  $ terminal {sanitize(term_id)}")])
            if out:
                lines.extend(text_block_lines(out.rstrip("\n"), "class:terminal"))
            shown_content = True
        elif kind == "content":
            inner = block.get("content")
            if isinstance(inner, dict) and inner.get("type") == "text" and status in ("completed", "failed"):
                lines.extend(text_block_lines(str(inner.get("text", "")).rstrip("\n")))
                shown_content = True
    if not shown_content and call.raw_output is not None and status in ("completed", "failed"):
        lines.extend(text_block_lines(pretty(call.raw_output).rstrip("\n")))
    return lines


class TranscriptControl(UIControl):
    """Renders the visible rows of the entries; `scroll` rows up from the bottom."""

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self.scroll = 0
        self._height = 24

    def add(self, entry: Entry) -> Entry:
        self.entries.append(entry)
        return entry

    def insert_after(self, anchor: Entry | None, entry: Entry) -> Entry:
        """`entry` right after `anchor` (at the end when the anchor is gone or None)."""
        index = None
        if anchor is not None:
            for i in range(len(self.entries) - 1, -1, -1):  # the anchor is recent: look from the end
                if self.entries[i] is anchor:
                    index = i + 1
                    break
        if index is None or index >= len(self.entries):
            return self.add(entry)
        if len(self.entries) == self.entries.maxlen:
            self.entries.popleft()
            index -= 1
        self.entries.insert(index, entry)
        return entry

    def is_focusable(self) -> bool:
        return False

    def create_content(self, width: int, height: int | None) -> UIContent:
        height = height or self._height
        self._height = height
        want = height + self.scroll
        rows: list[Fragments] = []
        for entry in reversed(self.entries):
            for row in entry.rows_reversed(width):
                rows.append(row)
                if len(rows) >= want:
                    break
            if len(rows) >= want:
                break
            rows.append([])  # a blank row between entries
        if rows and rows[-1] == []:
            rows.pop()
        if self.scroll and len(rows) < want:  # scrolled past the top: clamp
            self.scroll = max(0, len(rows) - height)
        visible = rows[self.scroll:self.scroll + height]
        visible.reverse()
        if len(visible) < height:  # the newest text sits at the bottom, like a chat
            visible = [[] for _ in range(height - len(visible))] + visible
        lines = cast(list[StyleAndTextTuples], visible)
        return UIContent(get_line=lambda i: lines[i], line_count=len(lines), show_cursor=False)

    def page(self, direction: int) -> None:
        self.scroll = max(0, self.scroll + direction * max(1, self._height - 2))


# -- events as entries ----------------------------------------------------------------------


class Feed:
    """Session events as transcript entries: streamed text, tool calls, permission notices.
    The chat has one for its session and each child section one for its child, so a child's
    events are drawn exactly as the session's own, only nested."""

    def __init__(self, add: Callable[[Entry], object], *,
                 terminal_text: Callable[[str], str | None] | None = None,
                 on_thought: Callable[[TextEntry], None] | None = None) -> None:
        self.add = add
        self.terminal_text = terminal_text
        self.on_thought = on_thought
        self.history = False  # entries made now are replayed history
        self.current: TextEntry | None = None
        self.tools: dict[str, BlockEntry] = {}
        self.messages = 0  # agent message entries made

    def end_text(self) -> None:
        if self.current is not None:
            self.current.finish()
            self.current = None

    def text(self, kind: str, text: str, *, markdown: bool = True) -> None:
        cur = self.current
        if cur is None or cur.kind != kind or cur.history != self.history:
            self.end_text()
            cur = TextEntry(kind, markdown=markdown, history=self.history)
            if kind == "thought" and self.on_thought is not None:
                self.on_thought(cur)
            if kind == "agent":
                self.messages += 1
            self.add(cur)
            self.current = cur
        cur.append(text)

    def notice(self, text: str, style: str = "class:notice") -> None:
        self.end_text()
        self.add(BlockEntry([[(style, line)] for line in sanitize(text).split("\n")], history=self.history))

    def tool_call(self, call: Any) -> BlockEntry:
        self.end_text()
        entry = self.tools.get(call.tool_call_id)
        if entry is None:
            entry = BlockEntry(history=self.history)
            self.tools[call.tool_call_id] = entry
            self.add(entry)
        entry.set_lines(tool_call_lines(call, self.terminal_text))
        return entry

    def show(self, event: Any) -> bool:
        """Draw the events every session shows alike; False for the others."""
        if isinstance(event, MessageChunk):
            self.text("agent", event.text)
        elif isinstance(event, ThoughtChunk):
            self.text("thought", event.text, markdown=False)
        elif isinstance(event, UserChunk):
            self.text("user", event.text, markdown=False)
        elif isinstance(event, ToolCallEvent):
            self.tool_call(event.call)
        elif isinstance(event, PermissionResolved):
            decision = event.decision.kind if event.decision else event.outcome.get("outcome", "")
            title = event.request.tool_call.title or event.request.tool_call.tool_call_id
            reason = event.decision.reason if event.decision else event.note
            self.notice(f"permission: {title} → {decision}" + (f" ({reason})" if reason else ""))
        else:
            return False
        return True


# -- delegated children ---------------------------------------------------------------------

CHILD_INDENT = "  │ "
_CHILD_STATUS_STYLE = {"done": "class:tool.ok", "failed": "class:tool.failed", "timed out": "class:tool.failed",
                       "cancelled": "class:tool.failed", "running": "class:tool.running",
                       "queued": "class:tool.pending"}


def child_status_word(status: str, detail: str = "") -> str:
    """A `ChildStatus` (crucible/delegation.py) as the word on its section's header."""
    if status == "queued":
        return "queued"
    if status == "finished":
        outcome = detail.split(":", 1)[0].strip()
        return {"completed": "done", "timed_out": "timed out"}.get(outcome, outcome or "done")
    return "running"  # started, notices


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class ChildSection(Entry):
    """A delegated child session: a header (chain label and status) over its own events,
    drawn indented; collapsed, the header and a one-line summary. Expanded while it runs,
    collapsed when it ends well (a failed or cancelled child stays open so its error shows),
    unless the person chose otherwise for this section."""

    def __init__(self, label: str, job_id: str, *, on_thought: Callable[[TextEntry], None] | None = None) -> None:
        self.label = sanitize(label)
        self.job_id = job_id
        self.session_id: str | None = None  # the child's Crucible session, once started
        self.status = "queued"
        self.entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self.feed = Feed(self.entries.append, on_thought=on_thought)
        self.collapsed = False
        self.user_toggled = False
        self.started = time.monotonic()
        self.seconds: float | None = None

    @property
    def finished(self) -> bool:
        return self.seconds is not None

    @property
    def tool_calls(self) -> int:
        return len(self.feed.tools)

    def add_child(self, section: ChildSection) -> None:
        """A grandchild's section, nested in this one."""
        self.feed.end_text()
        self.entries.append(section)

    def set_collapsed(self, collapsed: bool, *, by_user: bool = True) -> None:
        self.collapsed = collapsed
        self.user_toggled = self.user_toggled or by_user

    def show(self, event: Any) -> None:
        """One of the child's events: an `acp_host.session` event or a `ChildStatus`."""
        if isinstance(event, ChildStatus):
            self.status = child_status_word(event.status, event.detail)
            if event.status == "started":
                self.feed.terminal_text = event.terminal_output  # read while the child runs
            elif event.status == "notice":
                self.feed.notice(event.detail)
            elif event.status == "finished":
                self.feed.terminal_text = None  # the child's session is closing: hold nothing of it
                self.feed.end_text()
                self.seconds = round(time.monotonic() - self.started, 1)
                _, _, error = event.detail.partition(":")
                if error.strip() and self.status != "done":
                    self.feed.notice(error.strip(), "class:error")
                if not self.user_toggled:
                    self.collapsed = self.status == "done"
        elif isinstance(event, TurnEnded):
            self.feed.end_text()
        elif isinstance(event, SessionError):
            self.feed.notice(event.message, "class:error")
        else:
            self.feed.show(event)  # plans, usage, modes of a child are not drawn

    def header(self) -> Fragments:
        return [("class:child.head", ("▸ " if self.collapsed else "▾ ") + self.label),
                ("class:dim", " — "), (_CHILD_STATUS_STYLE.get(self.status, "class:dim"), self.status)]

    def summary(self) -> str:
        ended = f"{self.status} in {self.seconds:g} s" if self.seconds is not None else self.status
        return f"{_plural(self.feed.messages, 'message')}, {_plural(self.tool_calls, 'tool call')} · {ended}"

    def rows_reversed(self, width: int) -> Iterator[Fragments]:
        width = max(1, width)
        if self.collapsed:
            yield from reversed(wrap([("class:child.bar", "  └ "), ("class:dim", self.summary())], width))
        else:
            inner = max(1, width - len(CHILD_INDENT))
            bar: Fragment = ("class:child.bar", CHILD_INDENT)
            first = True
            for entry in reversed(self.entries):
                if not first:
                    yield [("class:child.bar", CHILD_INDENT.rstrip())]
                first = False
                for row in entry.rows_reversed(inner):
                    yield [bar, *row]
        yield from reversed(wrap(self.header(), width))
