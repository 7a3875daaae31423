"""The transcript pane: a bounded list of entries and a UIControl that renders only the rows
on screen.

A growing prompt-toolkit `Buffer` is O(n²) under a stream and redraws on every change; here
an append is a string operation, completed lines are rendered (markdown) and wrapped once
per width, and a frame walks back from the newest entry only as far as the screen needs.
A line that is still streaming is wrapped by slicing, so one 5 MB line costs no more per
frame than a short one.

Each text entry also keeps its lines as they came (markdown source), for `/copy`; the whole
transcript can be written out as rows (`rows_for_scrollback`) when the chat ends, so the
conversation stays in the terminal's own scrollback.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from typing import cast

from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.controls import UIContent, UIControl
from prompt_toolkit.mouse_events import MouseEvent, MouseEventType

from crucible.redaction import held_length, redact
from crucible.terminal import sanitize
from crucible.tui.markdown import (
    Fragments,
    MarkdownState,
    is_table_row,
    peek_line,
    render_line,
    table_rows,
    wrap,
    wrap_indented,
)

MAX_ENTRIES = 2000
MAX_LINES_PER_ENTRY = 20000
_PEEK_LIMIT = 4000  # a streaming line longer than this is shown without markdown
WHEEL_ROWS = 3  # rows scrolled by one notch of the mouse wheel
_FENCE_LINE = re.compile(r"^\s*(```|~~~)")


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
        self.lines: deque[Fragments | str | DrawnTable] = deque(maxlen=MAX_LINES_PER_ENTRY)
        self._pieces: list[str] = []  # the line still streaming; joined when drawn (no O(n²) +=)
        self.source: deque[str] = deque(maxlen=MAX_LINES_PER_ENTRY)  # the lines as they came, for /copy
        self._table: list[str] = []  # the rows of a table still coming (shown as they came until it ends)
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
            self._add_line(line)

    def _add_line(self, line: str) -> None:
        line = redact(line)  # whole: a secret the agent streamed in pieces is masked too
        self.source.append(line)
        if self.markdown and not self.state.in_code and len(line) <= _PEEK_LIMIT and is_table_row(line):
            self._table.append(line)
        elif self._table:
            self._end_table()
        self.lines.append(self._render(line))

    def _end_table(self) -> None:
        """The rows of a table, shown as they came, are drawn as a table now that it ended."""
        rows, self._table = self._table, []
        if table_rows(rows, self.base) is None or len(self.lines) < len(rows):
            return
        for _ in rows:
            self.lines.pop()
        self.lines.append(DrawnTable(rows, self.base))

    def _render(self, line: str) -> Fragments | str:
        if len(line) > _PEEK_LIMIT:
            return line
        if self.markdown:
            return render_line(line, self.state, self.base)
        return [(self.base, line)]

    def finish(self) -> None:
        if self.partial:
            self._add_line(self.partial)
            self._pieces.clear()
        if self._table:
            self._end_table()

    def text(self) -> str:
        """The entry's text as it came (markdown source), for copying."""
        lines = list(self.source)
        if self.partial:
            lines.append(self._streaming_line())
        return "\n".join(lines)

    def _streaming_line(self) -> str:
        """The line still streaming, redacted, less its end while that could begin a secret:
        the first characters of a secret the agent streams in pieces never show either. The
        end shows with the next piece, or when the message ends (`finish`)."""
        partial = redact(self.partial)
        return partial[:len(partial) - held_length(partial)]

    def code_blocks(self) -> list[str]:
        """The fenced code blocks in the text, without their fences (an unclosed one to its end)."""
        blocks: list[str] = []
        current: list[str] | None = None
        for line in self.text().split("\n"):
            if _FENCE_LINE.match(line):
                if current is None:
                    current = []
                else:
                    blocks.append("\n".join(current))
                    current = None
            elif current is not None:
                current.append(line)
        if current:
            blocks.append("\n".join(current))
        return blocks

    def text_lines(self) -> int:
        return len(self.source) + (1 if self.partial else 0)  # (a drawn table is one of `lines`)

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
        partial = self._streaming_line()
        if partial:
            if len(partial) > _PEEK_LIMIT:
                yield from self._sliced_reversed(partial, width)
            else:
                frags = peek_line(partial, self.state, self.base) if self.markdown else [(self.base, partial)]
                yield from reversed(wrap(frags, width))
        for i in range(len(self.lines) - 1, -1, -1):
            line = self.lines[i]
            if isinstance(line, str):
                yield from self._sliced_reversed(line, width)
            elif isinstance(line, DrawnTable):
                for row in reversed(line.rows(width)):
                    yield from reversed(wrap(row, width))
            else:
                yield from reversed(wrap(line, width))


class DrawnTable:
    """A table that ended, drawn for the width it is shown at: its columns fit the screen."""

    def __init__(self, lines: list[str], base: str) -> None:
        self.source, self.base = lines, base
        self._cache: tuple[int, list[Fragments]] | None = None

    def rows(self, width: int) -> list[Fragments]:
        if self._cache is None or self._cache[0] != width:
            self._cache = (width, table_rows(self.source, self.base, width) or [])
        return self._cache[1]


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
                rows.extend(wrap_indented(line, width))
            self._cache = (width, rows)
        yield from reversed(self._cache[1])


class TranscriptControl(UIControl):
    """Renders the visible rows of the entries; `scroll` rows up from the bottom."""

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self._scroll = 0
        # Scrolled up: the bottom row on screen, as (its entry, its row from the entry's top),
        # so rows added below (the answer streaming on) do not move what the person reads.
        self._anchor: tuple[Entry, int, int] | None = None  # (+ its row on screen, from the bottom)
        self._height = 24
        self._width = 80

    @property
    def scroll(self) -> int:
        """Rows up from the bottom; set by the person (wheel, page keys, focus, typing)."""
        return self._scroll

    @scroll.setter
    def scroll(self, rows: int) -> None:
        self._scroll = rows
        self._anchor = None  # the next frame anchors where the person put the view

    def _follow_anchor(self, width: int) -> None:
        """Scrolled up: the scroll that keeps the anchored row at the bottom of the screen."""
        if not self._scroll or self._anchor is None:
            return
        anchored, from_top, on_screen = self._anchor
        below = 0
        for entry in reversed(self.entries):
            count = sum(1 for _ in entry.rows_reversed(width))
            if entry is anchored:
                self._scroll = max(0, below + max(0, count - 1 - from_top) - on_screen)
                return
            below += count + 1  # and the blank row between entries
        self._anchor = None  # its entry is gone (the oldest dropped): stay where the scroll is

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

    def mouse_handler(self, mouse_event: MouseEvent) -> object:
        """The wheel scrolls the transcript (the application runs with mouse support)."""
        if mouse_event.event_type == MouseEventType.SCROLL_UP:
            self.scroll += WHEEL_ROWS
        elif mouse_event.event_type == MouseEventType.SCROLL_DOWN:
            self.scroll = max(0, self.scroll - WHEEL_ROWS)
        else:
            return NotImplemented
        return None

    def scroll_to(self, entry: Entry) -> None:
        """Scroll so `entry` is on screen (its top row when it is taller than the screen)."""
        width = self._width
        below = 0
        for other in reversed(self.entries):
            if other is entry:
                top = below + sum(1 for _ in entry.rows_reversed(width))  # its top row, from the bottom
                if top - below >= self._height or top > self.scroll + self._height:
                    self.scroll = max(0, top - self._height)
                elif below < self.scroll:
                    self.scroll = below
                return
            below += sum(1 for _ in other.rows_reversed(width)) + 1

    def rows_for_scrollback(self, width: int, limit: int) -> list[Fragments]:
        """The whole transcript as rows of `width`, oldest first (at most the newest `limit`)."""
        rows: list[Fragments] = []
        for entry in reversed(self.entries):
            if rows:
                rows.append([])
            for row in entry.rows_reversed(width):
                rows.append(row)
                if len(rows) >= limit:
                    break
            if len(rows) >= limit:
                break
        rows.reverse()
        return rows

    def create_content(self, width: int, height: int | None) -> UIContent:
        height = height or self._height
        self._height = height
        self._width = width
        self._follow_anchor(width)
        want = height + self._scroll
        rows: list[Fragments] = []
        owners: list[tuple[Entry, int] | None] = []  # each row's entry and place from its bottom
        for entry in reversed(self.entries):
            for place, row in enumerate(entry.rows_reversed(width)):
                rows.append(row)
                owners.append((entry, place))
                if len(rows) >= want:
                    break
            if len(rows) >= want:
                break
            rows.append([])  # a blank row between entries
            owners.append(None)
        if rows and rows[-1] == []:
            rows.pop()
            owners.pop()
        if self._scroll and len(rows) < want:  # scrolled past the top: clamp
            self._scroll = max(0, len(rows) - height)
        self._anchor = None
        if self._scroll:  # the lowest row on screen that belongs to an entry (not a blank one)
            lowest = next(((i, o) for i, o in enumerate(owners[self._scroll:self._scroll + height]) if o), None)
            if lowest is not None:
                on_screen, (entry, place) = lowest
                self._anchor = (entry, sum(1 for _ in entry.rows_reversed(width)) - 1 - place, on_screen)
        visible = rows[self._scroll:self._scroll + height]
        visible.reverse()
        if len(visible) < height:  # the newest text sits at the bottom, like a chat
            visible = [[] for _ in range(height - len(visible))] + visible
        lines = cast(list[StyleAndTextTuples], visible)
        return UIContent(get_line=lambda i: lines[i], line_count=len(lines), show_cursor=False)

    def page(self, direction: int) -> None:
        self.scroll = max(0, self.scroll + direction * max(1, self._height - 2))
