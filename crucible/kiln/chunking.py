"""Split a note into chunks by heading sections, with a size cap, for embedding and search.

Each chunk's text starts with "Title > H1 > H2" so an embedding knows where the text sits,
and, on a second line, what the note is for: its description, else its lead sentence
(`_context_line`, `_lead`). A note whose frontmatter says what it is about (`description` or
`summary`, `aliases`) gets one more chunk holding just that: the note's own one-line answer to
"what is this for", which is how a person searches who does not remember the note's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crucible.kiln.atomic import content_hash
from crucible.kiln.notes import Note, clip_title, code_block_lines

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Chunk:
    note_path: str
    ordinal: int
    heading_path: tuple[str, ...]
    text: str
    start_line: int  # 0-based line in the full note text where the chunk's content starts
    content_hash: str

    @property
    def id(self) -> str:
        return f"{self.note_path}#{self.ordinal}"


@dataclass
class _Section:
    path: tuple[str, ...]
    lines: list[str]
    first_line: int  # full-text line of lines[0]


def _sections(note: Note) -> list[_Section]:
    lines = note.body.split("\n")
    base = note.body_start_line
    by_line = {h.line - base: h for h in note.headings}
    sections = [_Section((), [], base)]
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        h = by_line.get(i)
        if h is None:
            sections[-1].lines.append(line.rstrip("\r"))
            continue
        while stack and stack[-1][0] >= h.level:
            stack.pop()
        stack.append((h.level, clip_title(h.text)))
        # The heading line itself is not repeated in the content: it is in the chunk's prefix.
        sections.append(_Section(tuple(t for _, t in stack), [], base + i + 1))
    return sections


def _paragraphs(lines: list[str], first_line: int) -> list[tuple[int, list[str]]]:
    """Blocks separated by blank lines (a blank line inside a code fence does not split)."""
    in_code = code_block_lines(lines)
    out: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = first_line
    for i, (line, code) in enumerate(zip(lines, in_code, strict=True)):
        if not line.strip() and not code:
            if current:
                out.append((start, current))
                current = []
            continue
        if not current:
            start = first_line + i
        current.append(line)
    if current:
        out.append((start, current))
    return out


def _hard_split(start: int, lines: list[str], max_chars: int) -> list[tuple[int, str]]:
    """Split one oversized paragraph at line ends, and overlong lines at spaces (else anywhere)."""
    pieces: list[tuple[int, str]] = []
    buf: list[str] = []
    buf_start = start
    size = 0
    for offset, line in enumerate(lines):
        while len(line) > max_chars:
            if buf:
                pieces.append((buf_start, "\n".join(buf)))
                buf, size = [], 0
            cut = line.rfind(" ", 0, max_chars + 1)
            if cut <= 0:
                cut = max_chars
            pieces.append((start + offset, line[:cut].rstrip()))
            line = line[cut:].lstrip()
        if buf and size + 1 + len(line) > max_chars:
            pieces.append((buf_start, "\n".join(buf)))
            buf, size = [], 0
        if not buf:
            buf_start = start + offset
            size = len(line)
        else:
            size += 1 + len(line)
        buf.append(line)
    if buf:
        pieces.append((buf_start, "\n".join(buf)))
    return [p for p in pieces if p[1].strip()]


def _pack(section: _Section, max_chars: int) -> list[tuple[int, str]]:
    """The section's content in pieces of at most max_chars, cut at paragraph boundaries."""
    pieces: list[tuple[int, str]] = []
    buf: list[str] = []
    buf_start = section.first_line
    size = 0
    for start, para_lines in _paragraphs(section.lines, section.first_line):
        para = "\n".join(para_lines)
        if len(para) > max_chars:
            if buf:
                pieces.append((buf_start, "\n\n".join(buf)))
                buf, size = [], 0
            pieces.extend(_hard_split(start, para_lines, max_chars))
            continue
        if buf and size + 2 + len(para) > max_chars:
            pieces.append((buf_start, "\n\n".join(buf)))
            buf, size = [], 0
        if not buf:
            buf_start, size = start, len(para)
        else:
            size += 2 + len(para)
        buf.append(para)
    if buf:
        pieces.append((buf_start, "\n\n".join(buf)))
    return pieces


# The most chunks of one note's body that are embedded. A note's size is capped (notes.py), but
# not its headings: a 2 MB note of "# h1\nx\n" sections made 200,000 chunks, hours of embedding
# and GBs of vectors from one file. 1,000 chunks hold ~1.5 MB of prose; the rest of such a
# note is found by its words (the lexical index reads all of it).
MAX_CHUNKS = 1000


def chunk_note(note: Note, max_chars: int = 1500, max_chunks: int = MAX_CHUNKS) -> list[Chunk]:
    """Chunks of the note's body by heading section; a long section is cut at paragraphs.

    A note whose body has no text gets one chunk holding its title, so it can still be found.
    At most `max_chunks` of the body (then a problem says so in `note.problems`).
    """
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    chunks: list[Chunk] = []
    about = note_about(note)
    context = _context_line(about) or _lead(note)
    for section in _sections(note):
        path = section.path
        if path and path[0].casefold() == note.title.casefold():
            path = path[1:]  # the H1 that gave the note its title: don't say it twice
        prefix = " > ".join((note.title, *path)) + (f"\n{context}" if context else "") + "\n\n"
        for start, piece in _pack(section, max_chars):
            if len(chunks) == max_chunks:
                break
            text = prefix + piece
            chunks.append(Chunk(note.path, len(chunks), section.path, text, start, content_hash(text)))
        else:
            continue
        note.problems.append(f"only its first {max_chunks} chunks are searched by meaning (line "
                             f"{start + 1} on is found by its words)")
        break
    if not chunks:
        chunks.append(Chunk(note.path, 0, (), note.title, note.body_start_line, content_hash(note.title)))
    if about:
        text = f"{note.title}\n\n{about}"
        chunks.append(Chunk(note.path, len(chunks), (), text, _about_line(note), content_hash(text)))
    return chunks


ABOUT_KEYS = ("description", "summary")
# The most of a note's description every one of its chunks carries (about 40 tokens of the 256
# MiniLM reads), cut at a word.
CONTEXT_CHARS = 200


def _context_line(about: str) -> str:
    """What the note is about, as the second line of each chunk's prefix: a section embedded
    with its note's purpose is found by a question about that purpose ("contextual" chunk
    embeddings). The description's first line, else the aliases; "" when the note has neither
    (then its lead sentence, `_lead`)."""
    line = about.split("\n", 1)[0]
    if len(line) <= CONTEXT_CHARS:
        return line
    cut = line[:CONTEXT_CHARS]
    return (cut[: cut.rfind(" ")] if " " in cut else cut) + " …"


# Headings, quotes and callouts, embeds, tables, HTML, links, fences and rules; lists below.
_NOT_PROSE = tuple("#>!|<[`=~")
_LIST_ITEM = re.compile(r"(?:[-*+]|\d+[.)])\s")
_SENTENCE = re.compile(r"(.+?[.!?])(?:\s|$)")


def _lead(note: Note) -> str:
    """The first sentence of prose before the note's first subsection (its introduction, as an
    undescribed note says what it is for), or "". A line of prose has five words or more and is
    not in a code block, a list, a table or a quote (it may start in **bold**)."""
    lines = note.body.split("\n")
    base = note.body_start_line
    headings = {h.line - base: h for h in note.headings}
    for i, (line, code) in enumerate(zip(lines, code_block_lines(lines), strict=True)):
        if i in headings:
            h = headings[i]
            if h is note.headings[0] and h.level == 1 and clip_title(h.text).casefold() == note.title.casefold():
                continue  # the H1 that gave the note its title
            break  # the first section: what follows is not the note's introduction
        text = line.strip()[:1000]  # a sentence past that is cut at CONTEXT_CHARS anyway
        if code or not text or text.startswith(_NOT_PROSE) or _LIST_ITEM.match(text) or text.startswith("---"):
            continue
        if len(text.split()) >= 5:
            m = _SENTENCE.match(text)
            return _context_line(m.group(1) if m else text)
    return ""


def note_about(note: Note) -> str:
    """What the note's frontmatter says it is about: its description (or summary) and aliases."""
    parts = []
    for key in ABOUT_KEYS:
        value = note.frontmatter.get(key)
        if isinstance(value, str) and value.strip():
            parts.append(" ".join(value.split()))
            break
    if note.aliases:
        parts.append("Also called: " + ", ".join(note.aliases))
    return "\n".join(parts)


def _about_line(note: Note) -> int:
    """0-based line of the description (or aliases) in the note's text."""
    lines = note.text.split("\n")[: note.body_start_line]
    for key in (*ABOUT_KEYS, "aliases", "alias"):
        for i, line in enumerate(lines):
            if line.startswith(f"{key}:"):
                return i
    return 0


@dataclass
class StoredChunk:
    """A chunk as the vector store holds it (or as search rebuilds it from the note on disk)."""

    path: str
    ordinal: int
    heading: str | None
    line: int  # 1-based line of the note where the chunk's content starts
    title: str
    text: str  # as embedded: "Title > Heading" line, the description's line, blank line, content
    embedding: np.ndarray | None = None
