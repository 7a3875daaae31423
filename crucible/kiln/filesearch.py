"""Text and property search: they read the notes themselves, no index needed.

Every function blocks and returns one `SearchHit` per note, best first. Paths are kiln-relative.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crucible.bounded_load import MAX_DEPTH, load_json
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text
from crucible.kiln.notes import (
    MAX_NOTE_BYTES,
    Note,
    clip_title,
    decode_note_bytes,
    parse_note,
    split_frontmatter,
)
from crucible.kiln.paths import (
    RESERVED_DIR,
    KilnPathError,
    iter_markdown,
    open_to_read,
    reserved_dir,
)
from crucible.private_files import FILE_MODE
from mcp_bridge.kiln_api import LineMatch, SearchHit

SNIPPET_CHARS = 300
MAX_LIMIT = 100
# A page of text. Past it a query is no search (the embedder reads its first ~250 words anyway),
# and a hostile megabyte of one took seconds of stemming and snippet scanning.
MAX_QUERY_CHARS = 16_384
# How long one text search may spend matching a regular expression (the tool timeout is 30 s).
REGEX_BUDGET = 10.0
# The regex module compiles a counted repeat by writing its item out that many times: x{99999999}
# took 15 GB to compile, before any deadline applies. So a pattern is measured before it is
# compiled: a count (the m and n of {m,n}) above MAX_REPEAT, or a pattern whose counted repeats
# multiply out (nested counts multiply: (a{100}){100} is 10,000) to more than MAX_PATTERN_ITEMS
# items, is refused. 100,000 items compile in ~0.1 s and ~30 MB.
MAX_REPEAT = 1000
MAX_PATTERN_ITEMS = 100_000
# The first share of processor time one search call may take; doubled for the next call each time
# a call needs more (see text_search).
FIRST_SLICE = 0.1
# What str.splitlines ends a line at: a literal query holding none of them cannot span lines.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def check_query(query: str, limit: int) -> None:
    if not query.strip():
        raise CrucibleError("the search query is empty", "give some words to search for")
    if len(query) > MAX_QUERY_CHARS:
        raise CrucibleError(f"the search query is {len(query):,} characters long; a search takes at most "
                            f"{MAX_QUERY_CHARS:,}", "search for a few words or sentences: the key phrases of a "
                            "passage, not the passage")
    check_limit(limit)


def check_limit(limit: int) -> None:
    if limit < 1 or limit > MAX_LIMIT:
        raise CrucibleError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")


def _stem(path: str) -> str:
    return Path(path).stem


# Parsed notes are cached by (mtime, size) so repeated calls cost a stat per note. The cache
# holds at most CACHE_CHARS of note text, the least recently read notes dropped first: a text
# search reads every note, and a kiln of large notes would otherwise stay whole in memory.
CACHE_CHARS = 64 << 20


@dataclass
class _Cached:
    stamp: tuple[int, int]
    text: str | None  # None: not a readable text note
    note: Note | None = None


class _NoteCache:
    def __init__(self, max_chars: int = CACHE_CHARS) -> None:
        self._entries: OrderedDict[str, _Cached] = OrderedDict()  # least recently read first
        self._chars = 0
        self.max_chars = max_chars
        self._lock = threading.Lock()

    def get(self, root: Path, rel: str) -> _Cached:
        key = f"{root}/{rel}"  # strings, not Paths: a text search stats every note of the kiln
        try:
            st = os.stat(key)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            return _Cached((0, 0), None)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and cached.stamp == stamp:
                self._entries.move_to_end(key)
                return cached
        cached = _Cached(stamp, _read_text(key, st.st_size, rel))
        with self._lock:
            self._drop(key)
            self._entries[key] = cached
            self._chars += len(cached.text or "")
            while self._chars > self.max_chars and len(self._entries) > 1:
                self._drop(next(iter(self._entries)))
        return cached

    def _drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._chars -= len(old.text or "")

    def note(self, root: Path, rel: str) -> Note | None:
        cached = self.get(root, rel)
        if cached.text is None:
            return None
        if cached.note is None:
            cached.note = parse_note(cached.text, rel)
        return cached.note


def _read_text(path: str, size: int, rel: str) -> str | None:
    """The note's text, or None if it is not a readable text note of a size we read."""
    if size > MAX_NOTE_BYTES:
        return None
    try:
        with os.fdopen(open_to_read(path, rel), "rb") as f:  # a named pipe is not read
            return decode_note_bytes(f.read(MAX_NOTE_BYTES + 1), rel)
    except (OSError, CrucibleError):  # NoteReadError, NotRegularFileError
        return None


_cache = _NoteCache()


# Property search needs every note's frontmatter and tags; parsing YAML is ~1 ms a note, so
# what it found is also saved per kiln in .crucible/properties.json (by mtime and size) and a
# new process re-parses only the notes that changed.

PROPERTIES_FILE = f"{RESERVED_DIR}/properties.json"


@dataclass
class _Props:
    stamp: tuple[int, int]
    title: str
    frontmatter: dict[str, Any]
    tags: list[str]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


class _PropertyStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.entries: dict[str, _Props] = {}
        self.dirty = False
        try:
            # a note's frontmatter was bounded at MAX_DEPTH when parsed; the cache adds 4 levels
            data = load_json((root / PROPERTIES_FILE).read_text(encoding="utf-8"), MAX_DEPTH + 4)
            if data.get("format") == 1:
                for rel, (mtime, size, title, fm, tags) in data["notes"].items():
                    self.entries[str(rel)] = _Props((int(mtime), int(size)), str(title), dict(fm),
                                                    [str(t) for t in tags])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.entries = {}  # none yet, or damaged: parsed again

    def get(self, rel: str, *, keep_text: bool = True) -> _Props | None:
        """The note's properties, parsed again if it changed. `keep_text=False`: without keeping
        its text in the note cache (a warm-up of the whole kiln would hold all of it)."""
        try:
            st = (self.root / rel).stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        props = self.entries.get(rel)
        if props is not None and props.stamp == stamp:
            return props
        if keep_text:
            note = _cache.note(self.root, rel)
        else:
            text = _read_text(f"{self.root}/{rel}", st.st_size, rel)
            note = parse_note(text, rel) if text is not None else None
        if note is None:
            return None
        props = _Props(stamp, note.title, _jsonable(note.frontmatter), list(note.tags))
        self.entries[rel] = props
        self.dirty = True
        return props

    def save(self, present: set[str]) -> None:
        for gone in set(self.entries) - present:
            del self.entries[gone]
            self.dirty = True
        if not self.dirty:
            return
        data = {"format": 1, "notes": {
            rel: [p.stamp[0], p.stamp[1], p.title, p.frontmatter, p.tags] for rel, p in self.entries.items()
        }}
        try:
            reserved_dir(self.root)
            atomic_write_text(self.root / PROPERTIES_FILE, json.dumps(data, ensure_ascii=False),
                              new_file_mode=FILE_MODE)
            self.dirty = False
        except (OSError, KilnPathError):
            pass  # a read-only kiln, or a linked .crucible (reserved_dir): parsed again next time


_stores: dict[Path, _PropertyStore] = {}
_stores_lock = threading.Lock()


def _property_store(root: Path) -> _PropertyStore:
    with _stores_lock:
        store = _stores.get(root)
        if store is None:
            store = _stores[root] = _PropertyStore(root)
        return store


def warm_properties(root: Path, stopped: Callable[[], bool] = lambda: False, batch: int = 100) -> bool:
    """Read every note's properties into the cache and save it, so that a first
    `property_search` of a large kiln does not parse every note's YAML (~8 s for 10,000 notes).
    A batch at a time under the store's lock: a search meanwhile waits one batch. False if
    `stopped()` said so first."""
    root = Path(root).resolve()
    store = _property_store(root)
    present: set[str] = set()
    todo: list[str] = []

    def read(rels: list[str]) -> None:
        with store.lock:
            for rel in rels:
                store.get(rel, keep_text=False)

    for rel in iter_markdown(root):
        present.add(rel)
        todo.append(rel)
        if len(todo) >= batch:
            if stopped():
                return False
            read(todo)
            todo = []
    read(todo)
    with store.lock:
        store.save(present)
    return True


def _notes_text(root: Path) -> Iterator[tuple[str, str]]:
    root = Path(root).resolve()
    for rel in iter_markdown(root):
        text = _cache.get(root, rel).text
        if text is not None:
            yield rel, text


def _compile(query: str, regex: bool, case_sensitive: bool) -> Any:
    import regex as rx  # ~30 ms: only a regex query pays for it

    flags = rx.MULTILINE | rx.VERSION0 | (0 if case_sensitive else rx.IGNORECASE)
    pattern = query if regex else rx.escape(query)
    try:
        if regex:
            _check_size(query, _pattern_items(rx, pattern, flags))
        return rx.compile(pattern, flags)
    except (rx.error, ValueError) as exc:  # ValueError: conflicting inline flags, e.g. (?V1)
        raise CrucibleError(
            f"invalid regular expression {query!r}: {exc}",
            "fix the pattern, or search for the literal text without regex",
        ) from None
    except RecursionError:
        raise CrucibleError(f"the regular expression {query[:100]!r} nests its groups too deeply",
                            "use fewer nested parentheses") from None


def _check_size(query: str, items: tuple[int, int]) -> None:
    """Refuse a pattern whose compiled form would be huge (see MAX_REPEAT)."""
    largest, total = items
    shown = repr(query if len(query) <= 100 else query[:100] + "…")
    fix = ("repeat fewer times: use + or * for 'any number', or {0,1000} at most; nested counts "
           "multiply, so (a{100}){100} is 10,000; or search for the literal text without regex")
    if largest > MAX_REPEAT:
        raise CrucibleError(f"the regular expression {shown} repeats something {largest:,} times; "
                            f"a search allows at most {MAX_REPEAT:,} (a larger count can take "
                            "gigabytes to compile)", fix)
    if total > MAX_PATTERN_ITEMS:
        raise CrucibleError(f"the regular expression {shown} is too large once its repeats are "
                            f"multiplied out ({total:,} items; a search allows at most "
                            f"{MAX_PATTERN_ITEMS:,}, as compiling it takes too much memory)", fix)


def _pattern_items(rx: Any, pattern: str, flags: int) -> tuple[int, int]:
    """(the largest repeat count, the number of items once every counted repeat is written
    out) of `pattern`, parsed by the regex module's own parser (which `rx.compile` runs first,
    then writes the repeats out): every syntax it knows (verbose mode, comments, fuzzy
    matching, POSIX classes, inline flags) is read as it reads it. rx.error if it is invalid."""
    core = rx._regex_core
    global_flags = flags
    while True:  # as regex._main._compile: an inline global flag ((?x)) parses the pattern again
        source = core.Source(pattern)
        info = core.Info(global_flags, source.char_type, {})
        source.ignore_space = bool(info.flags & rx.VERBOSE)
        source.use_unicode_space(bool(info.flags & rx.VERSION1))
        try:
            parsed = core._parse_pattern(source, info)
            break
        except core._UnscopedFlagSet:
            global_flags = info.global_flags
    largest = 0

    def items(node: Any) -> int:
        nonlocal largest
        inner = 0
        for value in vars(node).values():
            for child in value if isinstance(value, list | tuple) else (value,):
                if isinstance(child, core.RegexBase):
                    inner += items(child)
        if isinstance(node, core.GreedyRepeat):  # lazy and possessive repeats too (subclasses)
            count = max(node.min_count, node.max_count or 0)
            largest = max(largest, count)
            return max(1, inner) * max(1, count)
        return 1 + inner

    total = items(parsed)
    return largest, total


def text_search(
    root: Path, query: str, limit: int = 10, regex: bool = False, case_sensitive: bool = False,
    *, time_budget: float = REGEX_BUDGET,
) -> list[SearchHit]:
    """Notes whose text contains `query` (literal, or a Python regular expression with
    `regex=True`): those whose file name matches it too first (text_search "Idea" puts
    Inbox/Idea.md before notes that say "idea" more often; a folder's name does not count),
    then most matching lines first; each with its matching lines and numbers.

    Patterns run on the `regex` module, not `re`: it gives up at a deadline (a pattern like
    `(a|aa)+$` backtracks for ages on a long run of `a`s) and releases the GIL while it
    matches, so the server's other calls go on meanwhile. Same syntax as `re`; a pattern that
    would compile to something huge (`x{99999999}`) is refused first (`_check_size`)."""
    check_query(query, limit)
    pattern = _compile(query, regex, case_sensitive)
    literal = not regex and LINE_BREAKS.isdisjoint(query)  # then no pattern that can backtrack
    search = pattern.search if literal else _deadline_search(pattern, query, time_budget)
    root = Path(root).resolve()
    hits: list[tuple[bool, str, list[LineMatch]]] = []
    for rel, text in _notes_text(root):
        if literal:
            if not (lines := _lines_holding(pattern, text)):
                continue
        elif not search(text):
            continue
        else:
            lines = [
                LineMatch(line=i + 1, text=line.strip()[:SNIPPET_CHARS])
                for i, line in enumerate(text.splitlines())
                if search(line)
            ]
        if not lines:  # a match across lines (regex with \n): report where it starts
            m = search(text)
            assert m is not None
            n = text.count("\n", 0, m.start())
            lines = [LineMatch(line=n + 1, text=text.splitlines()[n].strip()[:SNIPPET_CHARS])]
        hits.append((bool(search(rel.rpartition("/")[2])), rel, lines))
    hits.sort(key=lambda h: (not h[0], -len(h[2]), h[1]))
    results = []
    for _, rel, lines in hits[:limit]:
        note = _cache.note(root, rel)
        first = lines[0]
        results.append(SearchHit(
            path=rel, title=note.title if note else _stem(rel), score=float(len(lines)),
            heading=_heading_at(note, first.line) if note else None, snippet=first.text,
            line=first.line, matches=lines[:20],
        ))
    return results


def _deadline_search(pattern: Any, query: str, budget: float) -> Callable[..., Any]:
    """`pattern.search`, every call of it together stopped `budget` seconds (of the clock on
    the wall) from now, with CrucibleError.

    The regex module's `timeout=` counts the process's processor time (C's clock()), not the
    wall's: a search given the 10 s left took 18 s on a busy machine (the process got half a
    processor), and other threads' work counts too. So each call gets a share of processor time
    that is small at first and doubles each time a call needs more (the call is made again,
    from the start), at most the time left converted at the rate the process has been getting
    processor time meanwhile; and the deadline is checked before every call (a pattern that
    times out only on a note's whole text made one fast call per line after it)."""
    deadline = time.monotonic() + budget
    share = FIRST_SLICE
    spent = [0.0, 0.0]  # wall and processor seconds inside pattern.search so far

    def too_slow() -> CrucibleError:
        return CrucibleError(
            f"the regular expression {query[:100]!r} took more than {budget:g} s to match "
            "the notes, so the search was stopped",
            "simplify it: nested repetition such as (a+)+ or (a|aa)+ can take forever to "
            "fail; or search for the literal text without regex",
        )

    def search(text: str) -> Any:
        nonlocal share
        while True:
            now, cpu = time.monotonic(), time.process_time()
            if now >= deadline:
                raise too_slow()
            # processor seconds per wall second while matching (above 1 with other busy threads)
            rate = spent[1] / spent[0] if spent[0] > 0.05 else 1.0
            allowed = (deadline - now) * max(rate, 0.05)
            try:
                return pattern.search(text, timeout=max(0.001, min(share, allowed)))
            except TimeoutError:
                if share >= allowed:
                    raise too_slow() from None
                share *= 2
            finally:
                spent[0] += time.monotonic() - now
                spent[1] += time.process_time() - cpu

    return search


def _lines_holding(pattern: Any, text: str) -> list[LineMatch]:
    """The lines of `text` (as str.splitlines cuts them) holding a match of `pattern`, a literal
    that cannot span lines: one search per matching line, from the start of the next, rather
    than one per line (a common word in 10,000 notes: 130,000 calls, most of a search)."""
    found: list[LineMatch] = []
    if (m := pattern.search(text)) is None:  # most notes: not cut into lines at all
        return found
    lines = text.splitlines(keepends=True)
    starts = list(itertools.accumulate(map(len, lines), initial=0))
    while m is not None:
        i = bisect.bisect_right(starts, m.start()) - 1
        found.append(LineMatch(line=i + 1, text=lines[i].strip()[:SNIPPET_CHARS]))
        m = pattern.search(text, starts[i + 1]) if starts[i + 1] < len(text) else None
    return found


def _heading_at(note: Note, line: int) -> str | None:
    """The heading path ("H1 > H2") of the section holding 1-based `line`."""
    stack: list[tuple[int, str]] = []
    for h in note.headings:
        if h.line + 1 > line:
            break
        while stack and stack[-1][0] >= h.level:
            stack.pop()
        stack.append((h.level, clip_title(h.text)))
    return " > ".join(t for _, t in stack) or None


# -- property search ---------------------------------------------------------------------------


def _parse_property_query(query: str) -> tuple[str | None, str | None, str | None]:
    """"#tag" / "tag:x" -> tag; "key:value" or "key=value" -> key and value; else a word that
    may be a key, a value or a tag."""
    q = query.strip()
    if q.startswith("#"):
        return None, None, q[1:]
    m = re.match(r"^([^:=\s]+)\s*[:=]\s*(.*)$", q)
    if m:
        key, value = m.group(1), m.group(2).strip()
        if key.lower() in ("tag", "tags"):
            return None, None, value.lstrip("#")
        return key, value or None, None
    return None, None, None


def _scalars(value: Any) -> list[str]:
    if isinstance(value, list | tuple | set):
        return [s for v in value for s in _scalars(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if value is None:
        return []
    if isinstance(value, bool):
        return ["true" if value else "false"]
    return [str(value)]


def _tag_match(want: str, tags: list[str]) -> list[str]:
    w = want.lower().lstrip("#")
    return [t for t in tags if t.lower() == w or t.lower().startswith(w + "/")]


def _fm_lines(text: str, keys: set[str]) -> tuple[str, int | None]:
    """The frontmatter lines of `keys` (for the snippet) and the first one's 1-based number."""
    yaml_text, _, _ = split_frontmatter(text)
    if yaml_text is None:
        return "", None
    out: list[str] = []
    first: int | None = None
    lines = yaml_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([^\s:#][^:]*):", line)
        if m and m.group(1).strip().lower() in keys:
            if first is None:
                first = i + 2  # the frontmatter starts after the opening "---" line
            out.append(line.strip())
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t", "-"))):
                out.append(lines[j].strip())
                j += 1
    return " ".join(out), first


def property_search(
    root: Path, query: str | None = None, *, key: str | None = None, value: str | None = None,
    tag: str | None = None, limit: int = 10,
) -> list[SearchHit]:
    """Notes by frontmatter and tags. `key` alone: notes that have the key; with `value`: whose
    value (or one of whose list items) equals it, case-insensitively; `tag`: notes with the tag
    or a nested one (`project` finds `project/crucible`), frontmatter or inline. `query` is a
    shorthand: "#tag", "tag:x", "key:value", "key=value", or a bare word matched against keys,
    values and tags. Given together, all conditions must hold."""
    q_key, q_value, q_tag = _parse_property_query(query) if query else (None, None, None)
    word = query.strip() if query and not (q_key or q_tag) else None
    key, value, tag = key or q_key, value or q_value, tag or q_tag
    if not (key or value or tag or word):
        raise CrucibleError(
            "property search needs a key, a value, a tag or a query",
            'e.g. query "status:draft", "#project", or key="status" value="draft"',
        )
    check_limit(limit)
    root = Path(root).resolve()
    store = _property_store(root)
    with store.lock:
        return _property_matches(root, store, key, value, tag, word, limit)


def _property_matches(
    root: Path, store: _PropertyStore, key: str | None, value: str | None, tag: str | None,
    word: str | None, limit: int,
) -> list[SearchHit]:
    results: list[SearchHit] = []
    listed: set[str] = set()
    complete = True
    for rel in iter_markdown(root):
        if len(results) >= limit:
            complete = False
            break
        listed.add(rel)
        note = store.get(rel)
        if note is None:
            continue
        fm = {str(k): v for k, v in note.frontmatter.items()}
        fm_lower = {k.lower(): v for k, v in fm.items()}
        keys: set[str] = set()
        tags_hit: list[str] = []
        if key is not None:
            if key.lower() not in fm_lower:
                continue
            if value is not None and value.lower() not in [
                s.lower() for s in _scalars(fm_lower[key.lower()])
            ]:
                continue
            keys.add(key.lower())
        elif value is not None:
            keys |= {k for k, v in fm_lower.items() if value.lower() in [s.lower() for s in _scalars(v)]}
            if not keys:
                continue
        if tag is not None:
            tags_hit = _tag_match(tag, note.tags)
            if not tags_hit:
                continue
        if word is not None:
            w = word.lower()
            keys |= {k for k, v in fm_lower.items() if k == w or w in [s.lower() for s in _scalars(v)]}
            tags_hit = _tag_match(w, note.tags)
            if not keys and not tags_hit:
                continue
        text, line = _fm_lines(_cache.get(root, rel).text or "", keys)
        if tags_hit:
            text = (text + " " if text else "") + "tags: " + ", ".join(f"#{t}" for t in tags_hit)
        results.append(SearchHit(
            path=rel, title=note.title, score=1.0, heading=None, snippet=text[:SNIPPET_CHARS],
            line=line,
        ))
    if complete:
        store.save(listed)  # forgets deleted notes too
    elif store.dirty:
        store.save(set(store.entries))
    return results
