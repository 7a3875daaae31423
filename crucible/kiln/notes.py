"""Parse a note: YAML frontmatter (ruamel.yaml round-trip), title, tags, wikilinks, headings.

Parsing never raises on content: a broken note is still a note, with its problems listed.
"""

from __future__ import annotations

import datetime as _dt
import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.util import load_yaml_guess_indent

from crucible.bounded_load import BoundedLoadError, bounded_yaml, load_yaml
from crucible.errors import CrucibleError
from crucible.kiln.atomic import content_hash as _hash
from crucible.kiln.paths import open_folder, open_in_folder, resolve_in_kiln

MAX_NOTE_BYTES = 10 * 1024 * 1024

# A title or heading as shown and as it prefixes every chunk of its note: a note's own first
# line may be a megabyte long (a 10 MB note of long headings made 900 MB of chunk text).
MAX_TITLE_CHARS = 200


def clip_title(text: str) -> str:
    """A title or heading on one line, at most MAX_TITLE_CHARS (cut with "…")."""
    line = " ".join(text[: MAX_TITLE_CHARS * 4].split())
    return line if len(line) <= MAX_TITLE_CHARS else line[: MAX_TITLE_CHARS - 1].rstrip() + "…"


class NoteReadError(CrucibleError):
    """A note that cannot be read as text; `reason` is short ("binary file", "not UTF-8 text")."""

    def __init__(self, message: str, fix: str | None = None, reason: str = "") -> None:
        super().__init__(message, fix)
        self.reason = reason


class FrontmatterError(CrucibleError):
    """Frontmatter that is not a YAML mapping (only raised where it cannot be worked around)."""


@dataclass(frozen=True)
class WikiLink:
    target: str
    alias: str | None
    heading: str | None
    embed: bool


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    line: int  # 0-based, in the full note text


@dataclass
class Note:
    path: str
    text: str
    frontmatter: dict[str, Any]
    body: str
    body_start_line: int
    title: str
    tags: list[str]
    links: list[WikiLink]
    headings: list[Heading]
    content_hash: str
    problems: list[str] = field(default_factory=list)

    @property
    def aliases(self) -> list[str]:
        """Frontmatter `aliases` (or `alias`) as a list of strings."""
        raw = self.frontmatter.get("aliases", self.frontmatter.get("alias"))
        if isinstance(raw, str):
            return [a.strip() for a in raw.split(",") if a.strip()]
        if isinstance(raw, list):
            return [str(a).strip() for a in raw if a is not None and str(a).strip()]
        return []


# ---------------------------------------------------------------------------------------------
# Frontmatter

_FM_OPEN = re.compile(r"^\ufeff?---[ \t]*\r?$")
_FM_CLOSE = re.compile(r"^(?:---|\.\.\.)[ \t]*\r?$")


def _lines_keepends(text: str) -> list[str]:
    # Only \n ends a line here (\r\n keeps its \r); str.splitlines would also split on \x0c etc.
    return text.split("\n")


def _fm_span(text: str) -> tuple[int, int] | None:
    """(index of the closing delimiter line, number of lines before the body) or None."""
    lines = _lines_keepends(text)
    if not lines or not _FM_OPEN.match(lines[0]):
        return None
    for i in range(1, len(lines)):
        if _FM_CLOSE.match(lines[i]):
            return i, i + 1
    return None


def split_frontmatter(text: str) -> tuple[str | None, str, int]:
    """(the YAML text or None, the body, the 0-based line where the body starts)."""
    span = _fm_span(text)
    if span is None:
        return None, text, 0
    close, body_line = span
    lines = _lines_keepends(text)
    yaml_text = "\n".join(line.rstrip("\r") for line in lines[1:close])
    if close > 1:
        yaml_text += "\n"
    body = "\n".join(lines[body_line:])
    return yaml_text, body, body_line


def _yaml(indent_from: str | None = None) -> Any:
    y = bounded_yaml("rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long value
    mapping, sequence, offset = 2, 4, 2  # Obsidian's style: "tags:\n  - a"
    if indent_from:
        try:
            _, ind, bsi = load_yaml_guess_indent(indent_from)
        except Exception:  # guessing is a nicety; the real load reports errors
            ind, bsi = None, None
        if bsi is not None and ind:
            sequence, offset = ind, bsi
        elif ind:
            mapping = ind
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    return y


def _yaml_reason(exc: Exception, line_offset: int = 1) -> str:
    if isinstance(exc, BoundedLoadError):
        return exc.reason + (f" (line {exc.line + line_offset})" if exc.line is not None else "")
    if isinstance(exc, MarkedYAMLError):
        problem = exc.problem or exc.context or "syntax error"
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1 + line_offset})" if mark is not None else ""
        return f"{problem}{where}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def load_frontmatter(yaml_text: str) -> CommentedMap:
    """The frontmatter as a round-trip map (comments, order, quotes kept). Raises FrontmatterError.
    Bounded (crucible.bounded_load): alias bombs and deep nesting are refused, not expanded."""
    try:
        data = load_yaml(yaml_text, _yaml())
    except BoundedLoadError as e:
        # One prefix for every frontmatter that cannot be used: callers and tools match it.
        raise FrontmatterError(f"frontmatter is not valid YAML: {_yaml_reason(e)}",
                               fix="remove the aliases (*name) or the nesting from the YAML between "
                                   "the '---' lines") from e
    except (YAMLError, ValueError, TypeError) as e:
        raise FrontmatterError(f"frontmatter is not valid YAML: {_yaml_reason(e)}",
                               fix="fix the YAML between the '---' lines") from e
    if data is None:
        return CommentedMap()
    if not isinstance(data, CommentedMap):
        raise FrontmatterError(
            f"frontmatter is not a mapping of keys to values (it is a {type(data).__name__})",
            fix="write the frontmatter as 'key: value' lines",
        )
    return data


def dump_frontmatter(data: Mapping[str, Any], *, style_from: str | None = None) -> str:
    """YAML text for `data` (a CommentedMap keeps its comments), ending with a newline."""
    if not data:
        return ""
    out = io.StringIO()
    _yaml(style_from).dump(data, out)
    return out.getvalue()


def _plain(value: Any) -> Any:
    """ruamel values -> plain JSON-safe python (dates as ISO strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (_dt.date, _dt.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def merge_frontmatter(text: str, updates: Mapping[str, Any], remove: Sequence[str] = ()) -> str:
    """The note text with its frontmatter updated in place: comments, key order and the body
    are kept; new keys go at the end. Raises FrontmatterError if the existing YAML is broken."""
    yaml_text, body, _ = split_frontmatter(text)
    newline = "\r\n" if text.split("\n", 1)[0].endswith("\r") else "\n"
    data = load_frontmatter(yaml_text) if yaml_text is not None else CommentedMap()
    for key, value in updates.items():
        data[key] = value
    for key in remove:
        if key in data:
            del data[key]
    dumped = dump_frontmatter(data, style_from=yaml_text)
    if newline != "\n":
        dumped = dumped.replace("\n", newline)
    if yaml_text is None:
        if not dumped:
            return text
        bom = "\ufeff" if text.startswith("\ufeff") else ""
        rest = text[len(bom):]
        return f"{bom}---{newline}{dumped}---{newline}{rest}"
    span = _fm_span(text)
    assert span is not None
    lines = _lines_keepends(text)
    opening, closing = lines[0], lines[span[0]]
    if not data:
        return body  # nothing left: drop the empty block
    return opening + "\n" + dumped + closing + "\n" + body


def replace_body(text: str, body: str) -> str:
    """The note with its body replaced and its frontmatter block untouched."""
    span = _fm_span(text)
    if span is None:
        return body
    lines = _lines_keepends(text)
    return "\n".join(lines[: span[1]]) + "\n" + body


# ---------------------------------------------------------------------------------------------
# Body scanning

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_BACKTICKS = re.compile(r"`+")
# Bounded repetitions keep every pattern linear on a huge single-line note.
_URL = re.compile(r"(?:\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://|\bwww\.)[^\s<>()\[\]]*|<[^>\s]{1,2048}>")
_WIKILINK = re.compile(r"(!?)\[\[([^\[\]\n]{1,1000}?)\]\]")
# A tag starts after whitespace or at line start; Obsidian requires one non-digit character.
_TAG = re.compile(r"(?:(?<=\s)|^)#([\w/-]+)")
_HTML_COMMENT = re.compile(r"<!--.*?-->")


def _blank_code(line: str) -> str:
    """Blank out inline code spans: a run of n backticks up to the next run of exactly n."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(line)]
    if len(runs) < 2:
        return line
    # next_same[i]: index of the next run with the same length as run i (linear, not a regex scan)
    next_same: list[int | None] = [None] * len(runs)
    last_of_len: dict[int, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        n = runs[i][1] - runs[i][0]
        next_same[i] = last_of_len.get(n)
        last_of_len[n] = i
    out = []
    pos = i = 0
    while i < len(runs):
        j = next_same[i]
        if j is None:
            i += 1
            continue
        start, end = runs[i][0], runs[j][1]
        out.append(line[pos:start])
        out.append(" " * (end - start))
        pos = end
        i = j + 1
    out.append(line[pos:])
    return "".join(out)


def code_block_lines(lines: Sequence[str]) -> list[bool]:
    """For each line, whether it is inside a fenced code block (fence lines included)."""
    out: list[bool] = []
    fence: str | None = None
    for line in lines:
        m = _FENCE.match(line.rstrip("\r"))
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence = m.group(1)
                out.append(True)
                continue
            out.append(False)
        else:
            out.append(True)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                fence = None
    return out


def parse_heading(line: str) -> tuple[int, str] | None:
    """(level, text) of an ATX heading line, or None."""
    m = _ATX.match(line.rstrip("\r"))
    if not m:
        return None
    text = (m.group(2) or "").strip()
    if not text:
        return None
    return len(m.group(1)), text


def _tags_in(text: str) -> Iterable[str]:
    for m in _TAG.finditer(text):
        tag = m.group(1).rstrip("/")
        if tag and not tag.replace("/", "").isdigit() and any(not c.isdigit() for c in tag):
            yield tag


def _parse_link(embed: str, inner: str) -> WikiLink:
    inner = inner.replace("\\|", "|")  # a link inside a table escapes its pipe
    target, sep, alias = inner.partition("|")
    target, hsep, heading = target.partition("#")
    return WikiLink(
        target=target.strip(),
        alias=alias.strip() or None if sep else None,
        heading=heading.strip() or None if hsep else None,
        embed=bool(embed),
    )


def link_scan(line: str) -> str:
    """A line as links and tags are read from it: inline code, URLs and HTML comments blanked."""
    return _URL.sub(" ", _HTML_COMMENT.sub(" ", _blank_code(line)))


def wikilinks(scan: str) -> Iterable[tuple[re.Match[str], WikiLink]]:
    """The wikilinks of a `link_scan`ned line, with where each stands in it."""
    for m in _WIKILINK.finditer(scan):
        yield m, _parse_link(m.group(1), m.group(2))


def frontmatter_tags(frontmatter: Mapping[str, Any]) -> list[str]:
    raw = frontmatter.get("tags", frontmatter.get("tag"))
    items: list[Any]
    if raw is None:
        items = []
    elif isinstance(raw, str):
        items = re.split(r"[,\s]+", raw)
    elif isinstance(raw, list):
        items = []
        for item in raw:
            items.extend(re.split(r"[,\s]+", item) if isinstance(item, str) else [item])
    else:
        items = [raw]
    out = []
    for item in items:
        if item is None:
            continue
        tag = str(item).strip().lstrip("#").strip()
        if tag:
            out.append(tag)
    return out


def _dedupe(tags: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for t in tags:
        key = t.casefold()  # tags are case-insensitive, as in Obsidian; the first spelling wins
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def parse_note(text: str, path: str) -> Note:
    """Parse note text; never raises on content (problems are listed in `Note.problems`)."""
    problems: list[str] = []
    yaml_text, body, body_start = split_frontmatter(text)
    frontmatter: dict[str, Any] = {}
    if yaml_text is not None:
        try:
            frontmatter = _plain(load_frontmatter(yaml_text))
        except FrontmatterError as e:
            problems.append(e.message)

    lines = body.split("\n")
    in_code = code_block_lines(lines)
    headings: list[Heading] = []
    links: list[WikiLink] = []
    inline_tags: list[str] = []
    for i, (line, code) in enumerate(zip(lines, in_code, strict=True)):
        if code:
            continue
        h = parse_heading(line)
        if h is not None:
            headings.append(Heading(level=h[0], text=h[1], line=body_start + i))
            scan = h[1]
        else:
            scan = line
        scan = link_scan(scan)
        links.extend(link for _, link in wikilinks(scan))
        inline_tags.extend(_tags_in(_WIKILINK.sub(" ", scan)))

    title = ""
    fm_title = frontmatter.get("title")
    if isinstance(fm_title, (str, int, float)) and not isinstance(fm_title, bool) and str(fm_title).strip():
        title = str(fm_title).strip()
    if not title:
        title = next((h.text for h in headings if h.level == 1), "")
    if not title:
        title = PurePosixPath(path).stem
    title = clip_title(title)

    return Note(
        path=path,
        text=text,
        frontmatter=frontmatter,
        body=body,
        body_start_line=body_start,
        title=title,
        tags=_dedupe([*frontmatter_tags(frontmatter), *inline_tags]),
        links=links,
        headings=headings,
        content_hash=_hash(text),
        problems=problems,
    )


# ---------------------------------------------------------------------------------------------
# Reading from disk


def check_note_text(text: str, rel: str) -> None:
    """A note about to be written must read back as one (`decode_note_bytes`): no NUL (read as
    a binary file) and not over MAX_NOTE_BYTES; else NoteReadError, and nothing is written."""
    if "\x00" in text:
        raise NoteReadError(f"{rel}: the text holds a NUL character (\\x00), which would make the note "
                            "read as a binary file; nothing was written",
                            fix="remove the NUL characters from the text", reason="binary file")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_NOTE_BYTES:
        raise NoteReadError(
            f"{rel}: the note would be {size / (1024 * 1024):.1f} MiB; notes up to "
            f"{MAX_NOTE_BYTES // (1024 * 1024)} MiB are read, so nothing was written",
            fix="split it into smaller notes", reason="too large")


def decode_note_bytes(data: bytes, rel: str) -> str:
    """Note bytes -> text, or NoteReadError with a short reason."""
    if len(data) > MAX_NOTE_BYTES:
        raise NoteReadError(
            f"{rel}: too large ({len(data) // (1024 * 1024)} MiB; notes up to "
            f"{MAX_NOTE_BYTES // (1024 * 1024)} MiB are read)",
            fix="split the note into smaller notes", reason="too large",
        )
    if b"\x00" in data[:8192]:
        raise NoteReadError(f"{rel}: binary file, not a text note",
                            fix="keep binary files out of .md names", reason="binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NoteReadError(f"{rel}: not UTF-8 text (bad byte at offset {e.start})",
                            fix="save the note as UTF-8", reason="not UTF-8 text") from e


def read_note(root: Path, rel: str) -> Note:
    """Read and parse the note at kiln-relative `rel` (KilnPathError / NoteReadError)."""
    path = resolve_in_kiln(root, rel, must_exist=True)
    clean = PurePosixPath(rel.strip().replace("\\", "/")).as_posix()
    if path.is_dir():
        if clean == ".":
            raise NoteReadError("no note named: the path is empty", reason="folder",
                                fix="give a note's path, e.g. 'folder/note.md' (list_notes shows them)")
        raise NoteReadError(f"{clean}: is a folder, not a note", reason="folder",
                            fix="give a note's path in it (list_notes with this folder shows them)")
    try:
        # Opened relative to the kiln's folders, never through a symlink: a folder swapped
        # for a link to elsewhere after the check above is refused, not read.
        parts = path.relative_to(root.resolve()).parts
        folder = open_folder(root, parts[:-1])
        try:
            fd = open_in_folder(folder, parts[-1], os.O_RDONLY, rel=clean)  # a regular file only
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_NOTE_BYTES:
                raise NoteReadError(
                    f"{clean}: too large ({size // (1024 * 1024)} MiB; notes up to "
                    f"{MAX_NOTE_BYTES // (1024 * 1024)} MiB are read)",
                    fix="split the note into smaller notes", reason="too large",
                )
            data = f.read(MAX_NOTE_BYTES + 1)
    except PermissionError as e:
        raise NoteReadError(f"{clean}: cannot be read (permission denied)",
                            fix="check the file's permissions", reason="permission denied") from e
    except OSError as e:
        raise NoteReadError(f"{clean}: cannot be read ({e.strerror or type(e).__name__})",
                            reason="cannot be read") from e
    return parse_note(decode_note_bytes(data, clean), clean)
