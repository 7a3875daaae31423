"""A light, line-at-a-time markdown renderer for streamed agent text.

Streaming means a line is rendered when it is complete (the line in progress is rendered
on its own, without knowledge of what follows). The state carried across lines is whether
we are inside a fenced code block, and its language (code is highlighted a line at a time
by pygments). A table is a run of `|` rows: each row shows as it streams, and the run is
drawn as a table once it ends (`table_rows`, called by the transcript). Output is
prompt-toolkit style fragments; every text has already been through
`crucible.terminal.sanitize`.

Rows are wrapped at word boundaries (`wrap`): a word moves to the next row whole unless it is
longer than a row, so what is copied from the screen keeps its words and paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from prompt_toolkit.styles.pygments import pygments_token_to_classname, style_from_pygments_cls
from prompt_toolkit.utils import get_cwidth
from pygments.styles import get_style_by_name

Fragment = tuple[str, str]
Fragments = list[Fragment]

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^(\s*)(\d+[.)])\s+(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+#.-]*)")
# `code`, **bold**, __bold__, *italic*, _italic_ (not inside words for _).
_INLINE = re.compile(r"(`[^`]+`|\*\*[^*]+\*\*|__[^_]+__|\*[^*\s][^*]*\*|(?<!\w)_[^_\s][^_]*_(?!\w))")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$")
_CODE_LINE_LIMIT = 1000  # longer code lines are not highlighted (one frame must stay cheap)


@dataclass
class MarkdownState:
    in_code: bool = False
    lang: str = ""  # the open fence's language, "" when none was given


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
    m = _FENCE.match(line)
    if m:
        state.in_code = not state.in_code
        state.lang = m.group(2).lower() if state.in_code else ""
        return [(f"{base} class:md.fence", line)]
    if state.in_code:
        return code_line(line, state.lang, base)
    return peek_line(line, state, base)


def peek_line(line: str, state: MarkdownState, base: str = "") -> Fragments:
    """A line without changing the state (also used for the line still streaming)."""
    if state.in_code:
        return code_line(line, state.lang, base)
    if _FENCE.match(line):
        return [(f"{base} class:md.fence", line)]
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


# -- code -------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _lexer(lang: str) -> Any:
    """The pygments lexer for a fence's language, or None (unknown, or none given)."""
    if not lang:
        return None
    # pygments' lexers, only once code with a language shows up
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def code_line(line: str, lang: str, base: str = "") -> Fragments:
    """A line of a fenced code block, highlighted by pygments when the fence named a language it
    knows (a line at a time: a construct spanning lines, like a docstring, is coloured per line)."""
    style = f"{base} class:md.code"
    lexer = _lexer(lang)
    if lexer is None or not line or len(line) > _CODE_LINE_LIMIT:
        return [(style, line)]
    out: Fragments = []
    for token, text in lexer.get_tokens(line):
        if text:
            out.append((f"{style} class:{pygments_token_to_classname(token)}", text))
    return out or [(style, line)]


def code_style_rules() -> list[tuple[str, str]]:
    """Colours for highlighted code: a pygments style's, without backgrounds (the chat's own
    background stays) and without its default colour (md.code's is used)."""
    rules = []
    for name, value in style_from_pygments_cls(get_style_by_name("monokai")).style_rules:
        if name == "pygments":
            continue
        kept = " ".join(part for part in value.split() if not part.startswith("bg:"))
        if kept:
            rules.append((name, kept))
    return rules


# -- tables -----------------------------------------------------------------------------------


def is_table_row(line: str) -> bool:
    return _TABLE_ROW.match(line) is not None


def _cells(row: str) -> list[str]:
    inner = row.strip()
    if inner.startswith("|"):
        inner = inner[1:]
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", inner)]


def _width(fragments: Fragments) -> int:
    return sum(get_cwidth(text) for _, text in fragments)


def table_rows(lines: list[str], base: str = "", width: int | None = None) -> list[Fragments] | None:
    """A markdown table (header, rule, rows) drawn with box lines; None when `lines` is not one
    (no rule under the header), so the caller keeps them as they are. With `width`, a table
    wider than that many cells has its widest columns narrowed and their cells wrapped inside
    them (a table too narrow even so is drawn as it is, and the screen wraps its rows)."""
    if len(lines) < 2 or _TABLE_RULE.match(lines[1]) is None:
        return None
    rule = _cells(lines[1])
    aligns = ["right" if c.endswith(":") and not c.startswith(":") else
              "center" if c.startswith(":") and c.endswith(":") else "left" for c in rule]
    rows = [[inline(cell, base) for cell in _cells(line)] for line in [lines[0], *lines[2:]]]
    count = max(len(r) for r in rows)
    for r in rows:
        r.extend([] for _ in range(count - len(r)))
    aligns.extend("left" for _ in range(count - len(aligns)))
    widths = [max(1, *(_width(r[i]) for r in rows)) for i in range(count)]
    if width is not None:
        widths = _fit_columns(widths, width - 3 * count - 1)  # "│ " before each cell, " │" after
    line_style = f"{base} class:md.table"

    def rule_row(left: str, mid: str, right: str) -> Fragments:
        return [(line_style, left + mid.join("─" * (w + 2) for w in widths) + right)]

    out: list[Fragments] = [rule_row("┌", "┬", "┐")]
    for number, cells in enumerate(rows):
        if number == 0:
            cells = [[(f"{style} class:md.bold", text) for style, text in cell] for cell in cells]
        pieces = [wrap(cell, w) if _width(cell) > w else [cell] for cell, w in zip(cells, widths, strict=True)]
        for k in range(max(len(p) for p in pieces)):
            row: Fragments = [(line_style, "│")]
            for piece, w, align in zip(pieces, widths, aligns, strict=True):
                cell = piece[k] if k < len(piece) else []
                pad = max(0, w - _width(cell))
                left = pad // 2 if align == "center" else pad if align == "right" else 0
                row += [(base, " " * (left + 1)), *cell, (base, " " * (pad - left + 1)), (line_style, "│")]
            out.append(row)
        if number == 0:
            out.append(rule_row("├", "┼", "┤"))
    out.append(rule_row("└", "┴", "┘"))
    return out


_NARROWEST_COLUMN = 4  # narrower than this a cell is more border than text: the table is left as is


def _fit_columns(widths: list[int], room: int) -> list[int]:
    """Column widths summing to at most `room`: the widest narrowed to one cap (the largest that
    fits), the cells left over handed back one each; `widths` as they are if they fit, or if
    the cap would be under `_NARROWEST_COLUMN`."""
    if sum(widths) <= room:
        return widths
    low, high = 0, max(widths)
    while low < high:  # the largest cap whose columns fit
        cap = (low + high + 1) // 2
        if sum(min(w, cap) for w in widths) <= room:
            low = cap
        else:
            high = cap - 1
    if low < _NARROWEST_COLUMN:
        return widths
    fitted = [min(w, low) for w in widths]
    spare = room - sum(fitted)
    for i, w in enumerate(widths):
        if spare and w > fitted[i]:
            fitted[i] += 1
            spare -= 1
    return fitted


# -- wrapping -----------------------------------------------------------------------------------


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


def _ascii_spans(text: str, width: int) -> list[tuple[int, int]]:
    """Where each row of `text` starts and ends: at the last space that fits, else (a word
    longer than a row) at the width. The spaces a row breaks at are not shown."""
    spans = []
    pos, end = 0, len(text)
    while end - pos > width:
        limit = pos + width
        brk = text.rfind(" ", pos + 1, limit + 1)  # a space right after a full row breaks it too
        if brk > pos and not text[pos:brk].isspace():
            stop = brk
            while text[stop - 1] == " ":
                stop -= 1
            spans.append((pos, stop))
            pos = brk
            while pos < end and text[pos] == " ":
                pos += 1
        else:
            spans.append((pos, limit))
            pos = limit
    spans.append((pos, end))
    return spans


def _cell_spans(text: str, width: int) -> list[tuple[int, int]]:
    """As `_ascii_spans`, counting terminal cells (wide characters take two, combining marks none)."""
    spans = []
    start, used = 0, 0
    brk = -1  # the last space in the row so far
    i, end = 0, len(text)
    while i < end:
        w = get_cwidth(text[i])
        if used + w > width and i > start:
            if text[i] == " ":
                spans.append((start, i))
                while i < end and text[i] == " ":
                    i += 1
            elif brk > start and not text[start:brk].isspace():
                spans.append((start, brk))
                i = brk
                while i < end and text[i] == " ":
                    i += 1
            else:
                spans.append((start, i))
            start, used, brk = i, 0, -1
            continue
        if text[i] == " ":
            brk = i
        used += w
        i += 1
    spans.append((start, end))
    return spans


def _slice(fragments: Fragments, start: int, end: int) -> Fragments:
    out: Fragments = []
    pos = 0
    for style, text in fragments:
        nxt = pos + len(text)
        if nxt > start and pos < end:
            out.append((style, text[max(0, start - pos):end - pos]))
        if nxt >= end:
            break
        pos = nxt
    return out


def wrap(fragments: Fragments, width: int) -> list[Fragments]:
    """Rows of at most `width` terminal cells, broken at word boundaries (an empty line is one
    empty row)."""
    width = max(1, width)
    text = "".join([t for _, t in fragments])
    if text.isascii():
        if len(text) <= width:
            return [[f for f in fragments if f[1]]]
        spans = _ascii_spans(text, width)
    else:
        spans = _cell_spans(text, width)
    return [_slice(fragments, start, end) for start, end in spans]


def wrap_indented(fragments: Fragments, width: int) -> list[Fragments]:
    """`wrap`, with the rows a long indented line breaks into all under its first: a tool's
    output (indented by two under its title) stays apart from the title when the screen breaks
    it. An indent of half the width or more is wrapped as it is."""
    rows = wrap(fragments, width)
    text = "".join([t for _, t in fragments])
    indent = len(text) - len(text.lstrip(" "))
    if len(rows) == 1 or indent == 0 or indent * 2 >= width or text.strip(" ") == "":
        return rows
    rows = wrap(_slice(fragments, indent, len(text)), width - indent)
    pad = (fragments[0][0], " " * indent)
    return [[pad, *row] for row in rows]
