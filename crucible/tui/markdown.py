"""A light, line-at-a-time markdown renderer for streamed agent text.

Streaming means a line is rendered when it is complete (the line in progress is rendered
on its own, without knowledge of what follows). The only state carried across lines is
whether we are inside a fenced code block. Output is prompt-toolkit style fragments;
every text has already been through `crucible.terminal.sanitize`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prompt_toolkit.utils import get_cwidth

Fragment = tuple[str, str]
Fragments = list[Fragment]

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^(\s*)(\d+[.)])\s+(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")
# `code`, **bold**, __bold__, *italic*, _italic_ (not inside words for _).
_INLINE = re.compile(r"(`[^`]+`|\*\*[^*]+\*\*|__[^_]+__|\*[^*\s][^*]*\*|(?<!\w)_[^_\s][^_]*_(?!\w))")


@dataclass
class MarkdownState:
    in_code: bool = False


def inline(text: str, base: str) -> Fragments:
    """Inline code, bold and italic within one line."""
    out: Fragments = []
    pos = 0
    for m in _INLINE.finditer(text):
        if m.start() > pos:
            out.append((base, text[pos:m.start()]))
        token = m.group()
        if token.startswith("`"):
            out.append((f"{base} class:md.code", token[1:-1]))
        elif token.startswith(("**", "__")):
            out.append((f"{base} class:md.bold", token[2:-2]))
        else:
            out.append((f"{base} class:md.italic", token[1:-1]))
        pos = m.end()
    if pos < len(text):
        out.append((base, text[pos:]))
    return out


def render_line(line: str, state: MarkdownState, base: str = "") -> Fragments:
    """One complete line; updates `state` (code fences)."""
    if _FENCE.match(line):
        state.in_code = not state.in_code
        return [(f"{base} class:md.fence", line)]
    if state.in_code:
        return [(f"{base} class:md.code", line)]
    return peek_line(line, state, base)


def peek_line(line: str, state: MarkdownState, base: str = "") -> Fragments:
    """A line without changing the state (also used for the line still streaming)."""
    if state.in_code or _FENCE.match(line):
        return [(f"{base} class:md.code", line)]
    m = _HEADING.match(line)
    if m:
        return [(f"{base} class:md.heading", m.group(2))]
    m = _BULLET.match(line)
    if m:
        return [(base, m.group(1)), (f"{base} class:md.bullet", "• "), *inline(m.group(2), base)]
    m = _NUMBERED.match(line)
    if m:
        return [(base, m.group(1)), (f"{base} class:md.bullet", m.group(2) + " "), *inline(m.group(3), base)]
    if line.startswith(">"):
        return [(f"{base} class:md.quote", "│ "), *inline(line[1:].lstrip(), f"{base} class:md.quote")]
    return inline(line, base)


def cut(text: str, room: int) -> tuple[str, str, int]:
    """The longest head of `text` that fits in `room` terminal cells (at least one character,
    so a wide character in a 1-cell room still moves on), the rest, and the cells used.
    Wide (CJK, emoji) characters take two cells, combining marks none."""
    if text.isascii():
        return text[:room], text[room:], min(room, len(text))
    used = 0
    for i, ch in enumerate(text):
        w = get_cwidth(ch)
        if used + w > room and i > 0:
            return text[:i], text[i:], used
        used += w
    return text, "", used


def wrap(fragments: Fragments, width: int) -> list[Fragments]:
    """Rows of at most `width` terminal cells (an empty line is one empty row)."""
    width = max(1, width)
    rows: list[Fragments] = []
    row: Fragments = []
    used = 0
    for style, text in fragments:
        while text:
            room = width - used
            if room <= 0:
                rows.append(row)
                row, used = [], 0
                room = width
            piece, rest, cells = cut(text, room)
            if cells > room and row:  # a wide character that does not fit: next row
                rows.append(row)
                row, used = [], 0
                continue
            text = rest
            row.append((style, piece))
            used += cells
    rows.append(row)
    return rows
