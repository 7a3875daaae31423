"""The lexical index: Okapi BM25 over whole notes, read from the files themselves.

It needs no embedding and no vector store, so it is ready seconds after a process starts,
even on a kiln that was never indexed: searches answer from it at once while the vectors are
built in the background. Each note is one document made of weighted fields (BM25F in its
simplest form, a field's words counted `weight` times):

- the title (frontmatter `title`, else the first H1, else the file name) x TITLE_WEIGHT,
- the headings x HEADING_WEIGHT,
- the path (folder names, and the file name when it is not the title) x PATH_WEIGHT,
- what the frontmatter says the note is about (`description` or `summary`, `aliases`)
  x ABOUT_WEIGHT, like a heading (the rest of the frontmatter is left to property_search),
- the body x 1,
- what other notes say of it: the words around the wikilinks to it (up to ANCHOR_WORDS on
  each side, and the link's shown text) x 1, as web search counts anchor text (`anchors`).

The weights were chosen before looking at any query set: a title or a heading names what a
whole note or section is about, so one of its words says more than one word of prose.

A word is a run of letters and digits, stemmed (English snowball), stop words dropped; words
joined by "-", "_" or "." ("cap-add", "session_id", "config.toml") are also one term run together
("capadd"), as a developer remembers an identifier whole (`_TOKEN`); a camelCase or PascalCase
name ("sessionId", "HTTPServer") has the terms of the same name written with "_" (`_fold`), and
is one word of its note's length; typed whole in a query, it is its whole term alone when a
note holds it (`LexicalIndex.query_terms`), and typed as its words apart ("session config rpc"),
their term run together joins the query beside them (`joined_terms`).

Each section of a note (the text under one heading) is also a document of its own, carrying
the note's title, its heading path and the note's description, as it is embedded: a note
ranks by its best section too (`LexicalIndex.search` averages both rankings), so the words of a
query found together in one section count for more than the same words spread over a note.

Saved as term counts under .crucible/ (never code: a kiln is not trusted input), stamped with
each file's (mtime, size), so a new process re-reads only the notes that changed.
"""

from __future__ import annotations

import heapq
import json
import logging
import marshal
import math
import os
import posixpath
import re
import subprocess
import sys
import tempfile
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import snowballstemmer

from crucible.bounded_load import load_json
from crucible.errors import CrucibleError
from crucible.kiln.anchors import LinkGraph, LinkTerms, link_key
from crucible.kiln.chunking import CONTEXT_CHARS, MAX_CHUNKS
from crucible.kiln.notes import (
    MAX_NOTE_BYTES,
    NoteReadError,
    clip_title,
    decode_note_bytes,
    link_scan,
    split_frontmatter,
    wikilinks,
)
from crucible.kiln.paths import RESERVED_DIR, iter_markdown, open_to_read, resolve_in_kiln

if TYPE_CHECKING:
    import numpy as np

TITLE_WEIGHT = 3
HEADING_WEIGHT = 2
PATH_WEIGHT = 2
ABOUT_WEIGHT = 2
# Words on each side of a link that describe its target: about a clause, the usual anchor
# window (chosen before measuring; 5, 10, 20 and the whole line measured alike, bench/search.py).
ANCHOR_WORDS = 10
# Links of one note whose words count: past that a note is a list of links (an index), not
# descriptions, and a hostile note of a million links must not cost a million entries.
MAX_LINKS = 1000
# Distinct terms kept of one note, its most frequent: a book has some 20,000 distinct words,
# and a hostile 10 MB note of a million distinct ones cost 830 MB in `cru kiln index`.
MAX_NOTE_TERMS = 50_000
# The sections of one note that are documents of their own (`section_counts`): as many as the
# chunks embedded of it, and at most MAX_SECTION_TERMS distinct terms over them all (each
# section's counted apart: a hostile note of a thousand sections of distinct words must not
# cost millions of entries); the rest of such a note is found by the note's words.
MAX_SECTIONS = MAX_CHUNKS
MAX_SECTION_TERMS = 2 * MAX_NOTE_TERMS
# The saved index read at most: ~2.4 MB per 1,000 notes, so some 100,000 notes. A larger file
# (a vast kiln, or one that came with the kiln) is not read, which would take several times its
# size in memory: the index is read from the notes again, as on a first start.
MAX_SAVED_BYTES = 256 * 1024 * 1024

_WORD = re.compile(r"[^\W_]+")
# What the text is cut into: words, and words joined by "-", "_" or "." with no space between
# ("cap-add", "semantic_search", "config.toml", "gpt-4o"), each joined run as one token
# (possessive: linear in the text). A person who remembers such a compound types it whole, and
# its parts alone are common words ("cap", "add") that rank every note holding them as high; so
# a compound is a term of its own besides its parts: its words run together and stemmed, as the
# same word written solid ("re-indexed" and "reindexed" are both "reindex").
_TOKEN = re.compile(r"[^\W_]++(?:[-_.][^\W_]++)*")
_JOINED = re.compile(r"(?<=[^\W_])[-_.](?=[^\W_])")
JOINED_MAX_WORDS = 4  # the most words of a query `LexicalIndex.joined_terms` runs together
# ... among its first JOINED_QUERY_WORDS (a name is typed in a short query; a hostile megabyte
# of words would take seconds of stemming runs that are no name)
JOINED_QUERY_WORDS = 64
MAX_COMPOUND_CHARS = 64  # longer runs (a hash, a path, a hostile line) are their parts alone
# Where a camelCase or PascalCase name changes words: after a lower-case letter before a capital
# ("session|Id"), and after an acronym before a word ("HTTP|Server"); never one letter off
# ("iOS", "eBay", "IPv4", "OAuth" stay whole).
_CAMEL = re.compile(r"(?<=[A-Za-z])[a-z](?=[A-Z])|(?<=[A-Z])[A-Z](?=[A-Z][a-z])")
_CAMEL_MARK = "\x1f"  # where `_fold` cut a camelCase word (no token holds it: not a word character)
_JOINER = re.compile(r"[-_.]")
_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t don doesn isn""".split()
)
log = logging.getLogger(__name__)

_stemmer = snowballstemmer.stemmer("english")
_stem_lock = threading.Lock()  # the snowball stemmer object is not thread-safe


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    if not word.isalpha():  # numbers, ids, dates: nothing to stem (and many distinct ones)
        return word
    with _stem_lock:
        return str(_stemmer.stemWord(word))


def _fold(token: str) -> str:
    """A `_TOKEN` token lower-cased, the words of a camelCase or PascalCase name cut apart
    ("sessionId" has the terms of "session_id", "HTTPServer" those of "http_server"): a developer
    who writes `mcpServers` in one note and "mcp servers" or `mcp_servers` in another means one
    thing, and one searching for either should find both. A run past MAX_COMPOUND_CHARS is
    lower-cased alone (a hash, a hostile line: nothing a person types)."""
    lowered = token.lower()
    if lowered == token or token[1:].islower() or token.isupper() or len(token) > MAX_COMPOUND_CHARS:
        return lowered  # most: "word", "Word", "API"
    return _fold_camel(token)


@lru_cache(maxsize=200_000)
def _fold_camel(token: str) -> str:
    return _CAMEL.sub("\\g<0>" + _CAMEL_MARK, token).lower()


@lru_cache(maxsize=200_000)
def _compound_terms(token: str) -> tuple[str, ...]:
    """The terms of a `_fold`ed compound token: its words', then, when it joins camelCase words
    by "-", "_" or "." (`statusBar.activeSessionId`), each such word's own, then its own."""
    words = _WORD.findall(token)
    terms = [_stem(w) for w in words if w not in _STOPWORDS]
    if _CAMEL_MARK in token and _JOINER.search(token):
        terms += [_stem(part.replace(_CAMEL_MARK, "")) for part in _JOINER.split(token) if _CAMEL_MARK in part]
    terms.append(_stem("".join(words)))
    return tuple(terms)


@lru_cache(maxsize=200_000)
def _word_terms(token: str) -> tuple[str, ...]:
    """The terms of a `_fold`ed token that are its words as written, which a text's length
    counts (BM25 weighs by it): not a compound's own term, nor a camelCase name's parts (the
    name is one word): "OpenRouter" written thirteen times must not make its note longer."""
    if token.isalnum() or len(token) > MAX_COMPOUND_CHARS:
        return terms_of(token)
    return tuple(_stem(w) for w in _WORD.findall(token.replace(_CAMEL_MARK, "")) if w not in _STOPWORDS)


def _own_terms(token: str) -> int:
    """How many of `terms_of(token)`'s terms are not its words as written (`_word_terms`)."""
    return len(terms_of(token)) - len(_word_terms(token))


def terms_of(token: str) -> tuple[str, ...]:
    """The terms of one `_fold`ed `_TOKEN` token: none for a stop word."""
    if token.isalnum():  # a word
        return () if token in _STOPWORDS else (_stem(token),)
    if len(token) > MAX_COMPOUND_CHARS:
        return tuple(_stem(w) for w in _WORD.findall(token) if w not in _STOPWORDS)
    return _compound_terms(token)


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words dropped, English-stemmed words, and the compounds of words joined
    by "-", "_" or "." or written in camelCase: the lexical index's terms."""
    return [term for token in _TOKEN.findall(text) for term in terms_of(_fold(token))]


# Stems that do not begin with the word's letters but their last (snowball's exceptional forms
# "dying", "lying", "tying"); every other stem does (checked on 112,000 words: the test).
_IRREGULAR_STEMS = frozenset({"die", "lie", "tie"})


def counts_of(terms: Iterable[str], text: str) -> dict[str, int]:
    """How often each of `terms` is among `tokenize(text)`'s (those it holds): the same counts,
    stemming only the words that can stem to one of them. A snowball stem is the start of its
    word but for its last letter ("possibl" of "possibility", "happi" of "happy"; but for
    `_IRREGULAR_STEMS`), so a text holding no such start has none of the terms, and a word
    shorter than a term, or of another first letter, is not one. A search's snippets count the
    query's words in up to ~50 notes' chunks (a note of 256 sections: 26 ms profiled), and stemming
    all their words the first time each is seen was up to half of a first search."""
    wanted = {t for t in terms if t}
    lowered = text.lower()
    # (a letter lower-cased to two, "İ" to "i̇", can join a token's words into a term: no shortcut)
    if len(lowered) == len(text) and not any(t in _IRREGULAR_STEMS or t[:-1] in lowered for t in wanted):
        # (a compound's term is its words run together: "to-do" holds "todo")
        solid = _JOINED.sub("", lowered)
        if solid == lowered or not any(t[:-1] in solid for t in wanted):
            return {}
    shortest: dict[str, int] = {}
    for t in wanted:
        shortest[t[0]] = min(len(t), shortest.get(t[0], len(t)))
    counts: dict[str, int] = {}
    counted: Counter[str] = Counter()
    for token, n in Counter(_TOKEN.findall(text)).items():
        counted[_fold(token)] += n
    for token, n in counted.items():
        if token.isalnum() and len(token) < shortest.get(token[0], 1 << 30):
            continue
        for term in terms_of(token):
            if term in wanted:
                counts[term] = counts.get(term, 0) + n
    return counts


def term_counts(texts: Iterable[str]) -> tuple[dict[str, int], int]:
    """The terms `tokenize` gives for `texts`, with their counts, and how many there are in all:
    the words are counted first, so each distinct word is stemmed once (long texts repeat
    their words: several times faster than counting `tokenize`'s list)."""
    # Split at white space first (C speed), then find the words of each distinct piece: the
    # same words as `_WORD.findall` over the whole text, since white space is never in a word.
    pieces: Counter[str] = Counter()
    for text in texts:
        pieces.update(text.split())
    counts: dict[str, int] = {}
    total = 0
    for piece, n in pieces.items():
        for token in map(_fold, _TOKEN.findall(piece)):
            terms = terms_of(token)
            for term in terms:
                counts[term] = counts.get(term, 0) + n
            total += n * (len(terms) - _own_terms(token))
    return counts, total


# ---------------------------------------------------------------------------------------------
# A note's fields, without the full parse


_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_MARKUP_START = frozenset(" #`~")  # how a heading or a fence line can start
_FM_ABOUT = re.compile(
    r"""^(?:description|summary):[ \t]*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([^#\n]*?))[ \t]*(?:#.*)?$""",
    re.MULTILINE)
# `description: >` (or |, >-, |2 ...): the text is the indented lines below it
_FM_BLOCK = re.compile(r"[|>][-+0-9]*")
_FM_INDENTED = re.compile(r"(?:\n(?:[ \t]+.*)?)*")
_FM_ALIASES = re.compile(r"^alias(?:es)?:[ \t]*(.*)$((?:\n[ \t]*-[ \t].*)*)", re.MULTILINE)
_FM_TITLE = re.compile(r"""^title:[ \t]*(?:"([^"]*)"|'([^']*)'|([^#\n]*?))[ \t]*(?:#.*)?$""", re.MULTILINE)


@dataclass
class NoteFields:
    title: str
    headings: list[str]
    folders: list[str]
    stem: str
    about: str  # description or summary, and aliases
    body: str  # the body without its heading lines
    link_lines: list[str] = field(default_factory=list)  # the prose lines with a wikilink
    # The body cut at its headings: each section's heading path (H1 > H2 ...) and its lines
    sections: list[tuple[tuple[str, ...], list[str]]] = field(default_factory=list)


def link_terms(lines: Iterable[str]) -> LinkTerms:
    """The wikilinks of these prose lines (the first MAX_LINKS), by target, each with the terms
    written around it."""
    links: LinkTerms = {}
    budget = MAX_LINKS
    for line in lines:
        budget -= _link_terms(line, links, budget)
        if budget <= 0:
            break
    return links


def _link_terms(line: str, links: LinkTerms, budget: int) -> int:
    """Add the wikilinks of a line to `links` (at most `budget`; returns how many): for each
    (embeds aside), the words of the line around it (other links read as their shown text) and
    its own shown text. Linear in the line, however many links it holds."""
    scan = link_scan(line)
    words: list[str] = []  # the line's words, each link's shown text in its place
    spans: list[tuple[str, int, int]] = []  # each link's key, and where its shown text is in words
    pos = 0
    for m, link in wikilinks(scan):
        if len(spans) == budget:
            break
        words += map(_fold, _TOKEN.findall(scan[pos:m.start()]))
        start = len(words)
        words += map(_fold, _TOKEN.findall(link.alias or ""))
        pos = m.end()
        if not link.embed and (key := link_key(link.target)):
            spans.append((key, start, len(words)))
    after = scan.find("[[", pos)  # the words after the last link counted, up to the next one
    words += map(_fold, _TOKEN.findall(scan[pos:after if after >= 0 else len(scan)]))
    for key, start, end in spans:
        terms = links.setdefault(key, {})
        for word in words[max(0, start - ANCHOR_WORDS):end + ANCHOR_WORDS]:
            for term in terms_of(word):
                terms[term] = terms.get(term, 0) + 1
    return len(spans)


def note_fields(text: str, rel: str) -> NoteFields:
    """The fields of a note, read with a few regular expressions instead of the YAML parser
    (~20x faster, which is what lets a 10,000-note kiln be searchable within seconds). The title
    follows `notes.parse_note`: frontmatter `title`, else the first H1, else the file name."""
    yaml_text, body, _ = split_frontmatter(text)
    title = ""
    about: list[str] = []
    if yaml_text is not None:
        m = _FM_TITLE.search(yaml_text)
        if m:
            title = next((g for g in m.groups() if g is not None), "").strip()
        m = _FM_ABOUT.search(yaml_text)
        if m:
            value = next((g for g in m.groups() if g is not None), "")
            if _FM_BLOCK.fullmatch(value):
                block = _FM_INDENTED.match(yaml_text, m.end())  # matches, maybe empty
                value = block.group(0) if block else ""
            about.append(value)
        m = _FM_ALIASES.search(yaml_text)
        if m:
            about.append(m.group(1) + " " + m.group(2))
    headings: list[str] = []
    prose: list[str] = []
    link_lines: list[str] = []
    # Where each section starts in `prose`, with its heading path (the stack of open headings)
    starts: list[tuple[int, tuple[str, ...]]] = [(0, ())]
    stack: list[tuple[int, str]] = []
    fence: str | None = None
    for line in body.split("\n"):
        if line[:1] not in _MARKUP_START:  # most lines: neither a fence nor a heading
            prose.append(line)
            if fence is None and "[[" in line:
                link_lines.append(line)
            continue
        f = _FENCE.match(line)
        if f:
            marker = f.group(1)
            if fence is None:
                fence = marker[0] * len(marker)
            elif marker.startswith(fence):
                fence = None
            prose.append(line)
            continue
        h = _HEADING.match(line) if fence is None and line.lstrip(" ").startswith("#") else None
        if h:
            headings.append(h.group(2))
            if not title and len(h.group(1)) == 1:
                title = h.group(2).strip()
            level = len(h.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, h.group(2).strip()))
            starts.append((len(prose), tuple(t for _, t in stack)))
            continue
        prose.append(line)
        if fence is None and "[[" in line:
            link_lines.append(line)
    *folders, name = rel.split("/")  # a listing's kiln-relative path (PurePosixPath: 10x slower)
    stem = posixpath.splitext(name)[0]
    ends = [start for start, _ in starts[1:]] + [len(prose)]
    sections = [(path, prose[start:end]) for (start, path), end in zip(starts, ends, strict=True)]
    return NoteFields(
        title=title or stem, headings=headings, folders=folders, stem=stem,
        about=" ".join(about), body="\n".join(prose), link_lines=link_lines, sections=sections,
    )


def _add_terms(counts: dict[str, int], tokens: dict[str, int]) -> int:
    """Add counted `_TOKEN` tokens, as written, to `counts` as `tokenize`'s terms (each stemmed
    once); returns how many of them were compounds' own terms (not in the text's length)."""
    compounds = 0
    for written, n in tokens.items():
        token = written if written.islower() else _fold(written)  # (most tokens: no capital)
        if token.isalnum():  # a word (most tokens: `terms_of` inlined, the first build is mostly this)
            if token not in _STOPWORDS:
                term = _stem(token)
                counts[term] = counts.get(term, 0) + n
            continue
        for term in terms_of(token):
            counts[term] = counts.get(term, 0) + n
        compounds += n * _own_terms(token)
    return compounds


def field_counts(fields: NoteFields) -> tuple[dict[str, int], int]:
    """The note's terms (`tokenize`'s) with their counts, each field's counted by its weight,
    and their total. Words are counted before they are stemmed, so each distinct word of the
    note is stemmed once (the first build of a large kiln is mostly this)."""
    words: Counter[str] = Counter(_TOKEN.findall(fields.body))
    weighted = [(fields.title, TITLE_WEIGHT), (fields.about, ABOUT_WEIGHT)]
    weighted += [(h, HEADING_WEIGHT) for h in fields.headings if h.strip() != fields.title]
    weighted += [(f, PATH_WEIGHT) for f in fields.folders]
    for text, weight in weighted:
        for word in _TOKEN.findall(text):
            words[word] += weight
    in_title = set(tokenize(fields.title))
    counts: dict[str, int] = {}
    compounds = 0
    for token in map(_fold, _TOKEN.findall(fields.stem)):  # the file name, unless it is the title
        kept = [term for term in terms_of(token) if term not in in_title]
        for term in kept:
            counts[term] = counts.get(term, 0) + PATH_WEIGHT
        compounds += PATH_WEIGHT * (len(kept) - sum(1 for term in _word_terms(token) if term not in in_title))
    compounds += _add_terms(counts, words)
    # the note's length stays what it is (BM25 weighs by it): a compound adds no words
    length = sum(counts.values()) - compounds
    if len(counts) > MAX_NOTE_TERMS:
        counts = dict(heapq.nlargest(MAX_NOTE_TERMS, counts.items(), key=lambda item: item[1]))
    return counts, length


def section_counts(fields: NoteFields) -> list[tuple[dict[str, int], int]]:
    """Each section of the note with text as a document of its own for `LexicalIndex.sections`:
    the note's title, the section's heading path and what the note is about (its first
    CONTEXT_CHARS), then the section's words, each counted once: the section as it is embedded
    (chunking). Words of a query that sit together in one section score higher there than the
    same words spread over a note. At most MAX_SECTIONS sections and MAX_SECTION_TERMS terms."""
    title = fields.title
    prefix, prefix_length = term_counts([title, fields.about[:CONTEXT_CHARS]])
    prefix_compounds = sum(prefix.values()) - prefix_length
    out: list[tuple[dict[str, int], int]] = []
    budget = MAX_SECTION_TERMS
    for path, lines in fields.sections:
        if not any(line.strip() for line in lines):
            continue
        if path and path[0].casefold() == title.casefold():
            path = path[1:]  # the H1 that gave the note its title: said once
        # one pass of the regex over the whole section (sections are short: faster than
        # term_counts' split into pieces)
        counts = dict(prefix)
        compounds = prefix_compounds + _add_terms(counts, Counter(_TOKEN.findall("\n".join((*path, *lines)))))
        budget -= len(counts)
        if budget < 0 or len(out) == MAX_SECTIONS:
            break
        out.append((counts, sum(counts.values()) - compounds))
    return out


# A note as the lexical index keeps it: its title, its terms' counts and length (`field_counts`),
# its sections' (`section_counts`) and its prose lines with a wikilink (`link_terms` reads them).
NoteCounts = tuple[str, dict[str, int], int, list[tuple[dict[str, int], int]], list[str]]


def _stamp(st: os.stat_result) -> Stamp:
    return st.st_mtime_ns, st.st_size


def note_counts(text: str, rel: str, *, words: bool = True) -> NoteCounts:
    """What the lexical index keeps of a note (`words=False`: its title alone)."""
    fields = note_fields(text, rel)
    if not words:
        return fields.title, {}, 0, [], []
    counts, length = field_counts(fields)
    return fields.title, counts, length, section_counts(fields), fields.link_lines


def _read_counted(path: str, rel: str, words: bool) -> tuple[Stamp, NoteCounts] | None:
    """The file's stamp and `note_counts`; None if it cannot be read as a note (any more)."""
    try:
        with os.fdopen(open_to_read(path, rel), "rb") as f:  # a regular file: a named pipe is not read
            st = os.fstat(f.fileno())
            if st.st_size > MAX_NOTE_BYTES:
                raise NoteReadError(f"{rel}: not a readable note")
            data = f.read(MAX_NOTE_BYTES + 1)
        if len(data) > MAX_NOTE_BYTES:
            raise NoteReadError(f"{rel}: not a readable note")
        return _stamp(st), note_counts(decode_note_bytes(data, rel), rel, words=words)
    except (OSError, CrucibleError):
        return None


# A first reading of this many notes or more shares them with a second process (a 10,000-note
# kiln: ~5 s of a first search's wait on a 2-core machine, all of it counting words, which one
# process does on one core). Fewer are read here: a worker costs ~0.15-0.3 s to start.
SHARED_READ_MIN = 1000
# The worker's command: this interpreter, this code (tests replace it).
READ_WORKER = [sys.executable, "-c", "from crucible.kiln.lexical import _read_worker; _read_worker()"]


def _spare_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) - 1
    except AttributeError:  # not on Linux
        return (os.cpu_count() or 1) - 1


def count_files(files: Sequence[tuple[str, str]], *, words: bool = True) -> list[tuple[Stamp, NoteCounts] | None]:
    """`_read_counted` of each (rel, path), in order (None: unreadable). Many notes' words:
    a worker process on another core counts from the first note on while this one counts from
    the last back, until they meet (however busy this process is meanwhile: `cru mcp` imports
    the MCP SDK); a worker that fails leaves the rest to this one (slower, nothing lost)."""
    worker = _take_early(files)
    if worker is None and words and len(files) >= SHARED_READ_MIN and _spare_cpus() > 0:
        worker = _Reader.start(list(files))
    if worker is None:
        return [_read_counted(path, rel, words) for rel, path in files]
    own: list[tuple[Stamp, NoteCounts] | None] = []
    at = len(files)
    while at > worker.covered:
        at -= 1
        rel, path = files[at]
        own.append(_read_counted(path, rel, words))
    theirs = worker.stop()
    own.reverse()
    return theirs[:at] + own


class _Reader:
    """A worker process counting notes in order (`_read_worker`), and the thread that takes its
    batches: `covered` notes counted so far. Its output is marshal (only the str, int, dict,
    list and tuple a count is made of, from this code in a child of this process)."""

    BATCH_BYTES_MAX = 1 << 28  # a batch of READ_BATCH notes of at most MAX_NOTE_BYTES: far less

    def __init__(self, proc: subprocess.Popen[bytes], errors: IO[bytes]) -> None:
        self.proc = proc
        self.errors = errors  # its stderr: a file, so that no amount written there can stall it
        self.results: list[tuple[Stamp, NoteCounts] | None] = []
        self.covered = 0
        self.thread = threading.Thread(target=self._collect, name="kiln-words-reader", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, files: list[tuple[str, str]]) -> _Reader | None:
        try:
            errors = tempfile.TemporaryFile()
        except OSError as exc:
            log.warning("counting the notes' words in one process: no worker (%s)", exc)
            return None
        try:
            proc = subprocess.Popen(READ_WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=errors, start_new_session=True)
        except OSError as exc:
            errors.close()
            log.warning("counting the notes' words in one process: no worker (%s)", exc)
            return None
        assert proc.stdin is not None
        try:
            # The paths on stdin, then it stays open: the worker stops when it closes (this
            # process done with it, or gone).
            proc.stdin.write(json.dumps(files).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass  # gone already: `stop` says why
        return cls(proc, errors)

    def _collect(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        while len(head := stream.read(4)) == 4:
            size = int.from_bytes(head, "big")
            if size > self.BATCH_BYTES_MAX or len(body := stream.read(size)) < size:
                break
            try:
                batch = marshal.loads(body)
            except (EOFError, ValueError, TypeError):
                break
            if not isinstance(batch, list):
                break
            self.results += batch
            self.covered = len(self.results)

    def stop(self) -> list[tuple[Stamp, NoteCounts] | None]:
        """Stop the worker; the notes it counted, from the first."""
        proc = self.proc
        assert proc.stdin is not None
        done = self.covered
        try:
            proc.stdin.close()
        except OSError:
            pass
        self.thread.join(5)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with self.errors:
            self.errors.seek(max(0, self.errors.seek(0, os.SEEK_END) - 4096))  # its last lines
            err = self.errors.read().decode(errors="replace").strip()
        if proc.returncode not in (0, None) and err:
            # (stopped before the end by this process: exit 0; failed on its own: its error)
            log.warning("the notes' words worker failed after %d notes (%s): counted here",
                        done, err.splitlines()[-1][:200])
        return self.results


# A worker started by `read_early`, with the notes it was given, for `count_files` to take.
_early: tuple[list[tuple[str, str]], _Reader] | None = None
_early_lock = threading.Lock()


def read_early(root: Path, collection: str) -> None:
    """A kiln never indexed: start counting its notes' words in a worker now, for the first
    reading (`count_files`) to take. `cru mcp` calls it before it imports the MCP SDK (~1.3 s of
    a 10,000-note kiln's first search, which waits for the words). Only the listing is done
    here: counting in this process too would take the GIL from those imports. A kiln with a
    saved lexical index reads it in ~0.5 s of this process's own work: nothing to start."""
    global _early
    if lexical_file(root, collection).exists():
        return
    try:
        files = [(rel, f"{root}/{rel}") for rel in iter_markdown(root)]
    except (OSError, CrucibleError):
        return  # the reading proper says why
    if len(files) < SHARED_READ_MIN or _spare_cpus() < 1:
        return
    worker = _Reader.start(files)
    if worker is not None:
        with _early_lock:
            _early = (files, worker)


def _take_early(files: Sequence[tuple[str, str]]) -> _Reader | None:
    """The worker `read_early` started, if it was given exactly these notes (else it is stopped:
    the kiln changed meanwhile, or another was asked for)."""
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is None:
        return None
    given, worker = early
    if given == list(files):
        return worker
    worker.stop()
    return None


READ_BATCH = 200  # notes a worker sends at a time (~0.1 s of counting)


def _read_worker() -> None:
    """`python -c ...` (READ_WORKER): counts the notes named on stdin, in order, and writes them
    to stdout in batches (a 4-byte length, then marshal), until done or stdin closes."""
    try:
        os.nice(10)  # behind the agent and the person's other programs, as the index worker
    except OSError:
        pass
    files = json.loads(sys.stdin.readline())

    def parent_watch() -> None:  # stdin closes when the parent is done with us, or gone
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=parent_watch, daemon=True).start()
    out = sys.stdout.buffer
    for at in range(0, len(files), READ_BATCH):
        batch = marshal.dumps([_read_counted(path, rel, True) for rel, path in files[at:at + READ_BATCH]])
        out.write(len(batch).to_bytes(4, "big") + batch)
        out.flush()


def words_problem(text: str) -> str | None:
    """What a note's problems say when it holds more distinct terms than the lexical index keeps
    of it (MAX_NOTE_TERMS: the rest are not found by its words); None for any real note. Cheap:
    only past MAX_NOTE_TERMS distinct words are they stemmed to count, and only until past it."""
    if len(text) < 2 * MAX_NOTE_TERMS:  # each distinct word takes a character and a separator
        return None
    words = set(_WORD.findall(text.lower())) - _STOPWORDS
    if len(words) <= MAX_NOTE_TERMS:
        return None
    terms: set[str] = set()
    for word in words:  # until past the cap: a million distinct words are not all stemmed again
        terms.add(_stem(word))
        if len(terms) > MAX_NOTE_TERMS:
            return f"only its {MAX_NOTE_TERMS:,} most frequent distinct words are found by its words"
    return None


# ---------------------------------------------------------------------------------------------
# BM25


class Bm25:
    """Okapi BM25 over an inverted index that can add and drop single documents.

    Ours rather than rank-bm25/bm25s: those build a static corpus and must redo the whole of
    it when one note changes, while the watcher updates notes one at a time.

    Arrays rather than dicts, for vaults of 10,000+ notes (each section of a note is a document
    too): documents and terms are numbered, each term's postings are two int arrays (document
    numbers and counts) scored with numpy, and each document keeps its terms and
    counts the same way. At 10,000 generated notes a search takes ~30 % less time and the index
    ~12 % less memory than with a dict per term. A removed document leaves its postings (and its
    number) in place, scoring 0 (its length is infinite), until they outnumber the live ones and
    `_compact` rewrites the arrays.

    A document added `deferred` is kept as its term counts, out of the inverted index, until
    `post()`: searches scan those (a few milliseconds for 10,000 notes), so a first build can
    answer its first search before it spends the ~0.7 s per 10,000 notes that posting takes.
    """

    COMPACT_MIN = 1 << 16  # stale postings always allowed: a rewrite costs about as much as posting

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._number: dict[str, int] = {}  # each document's number
        self._ids: list[str | None] = []  # each number's document (None: removed)
        self._lengths = array("d")  # each number's length (inf once removed: it then scores 0)
        self._total_len = 0
        self._term: dict[str, int] = {}  # each term's number
        self._terms: list[str] = []  # each number's term
        self._docs: list[array[int]] = []  # each term's postings: document numbers
        self._tfs: list[array[int]] = []  # ... and the counts, in the same order
        self._dead: dict[int, int] = {}  # each term's postings of removed documents (until `_compact`)
        self._doc_terms: dict[int, tuple[array[int], array[int]]] = {}  # a posted document's terms and counts
        self._unposted: dict[int, dict[str, int]] = {}  # added deferred, not in the postings yet
        self._stale = 0  # postings of removed documents
        self._live = 0  # postings of posted documents
        self._norms: np.ndarray | None = None  # each document's length norm, until a length changes

    def __len__(self) -> int:
        return len(self._number)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._number

    def add(self, doc_id: str, tokens: Sequence[str]) -> None:
        self.add_counts(doc_id, Counter(tokens), len(tokens))

    def add_counts(self, doc_id: str, counts: dict[str, int], length: int, *, deferred: bool = False) -> None:
        """Add a document by its term counts (as saved by `counts`)."""
        self.remove(doc_id)
        number = len(self._ids)  # never reused (until `_compact`): a term holds a number once
        self._number[doc_id] = number
        self._ids.append(doc_id)
        self._lengths.append(length)
        self._total_len += length
        self._norms = None
        if deferred:
            self._unposted[number] = counts
        else:
            self._post_one(number, counts)

    def _post_one(self, number: int, counts: dict[str, int]) -> None:
        term_of = self._term
        if new := [t for t in counts if t not in term_of]:
            term_of.update(zip(new, range(len(self._terms), len(self._terms) + len(new)), strict=True))
            self._terms += new
            self._docs += [array("i") for _ in new]
            self._tfs += [array("i") for _ in new]
        terms, tfs = array("i", map(term_of.__getitem__, counts)), array("i", counts.values())
        docs, term_tfs = self._docs, self._tfs  # locals: the hot loop of a build
        for t, n in zip(terms, tfs, strict=True):
            docs[t].append(number)
            term_tfs[t].append(n)
        self._doc_terms[number] = (terms, tfs)
        self._live += len(terms)

    def post(self) -> None:
        """Put the documents added deferred into the inverted index."""
        unposted, self._unposted = self._unposted, {}
        while unposted:  # each count dict freed as it is posted: not both in memory at the peak
            self._post_one(*unposted.popitem())

    @property
    def postings(self) -> int:
        """How many postings the arrays hold (those of removed documents until `_compact`)."""
        return self._live + self._stale

    @property
    def unposted(self) -> int:
        """How many documents wait for `post()` (each search scans them: slow past thousands)."""
        return len(self._unposted)

    def counts(self, doc_id: str) -> dict[str, int]:
        number = self._number.get(doc_id)
        if number is None:
            return {}
        unposted = self._unposted.get(number)
        if unposted is not None:
            return dict(unposted)
        terms, tfs = self._doc_terms[number]
        return {self._terms[t]: n for t, n in zip(terms, tfs, strict=True)}

    def length(self, doc_id: str) -> int:
        number = self._number.get(doc_id)
        return 0 if number is None else int(self._lengths[number])

    def vocabulary(self) -> Iterable[str]:
        """Every term of the documents."""
        self.post()
        return [term for t, term in enumerate(self._terms) if self._df(t)]

    def remove(self, doc_id: str) -> None:
        number = self._number.pop(doc_id, None)
        if number is None:
            return
        self._ids[number] = None
        self._total_len -= int(self._lengths[number])
        self._lengths[number] = math.inf
        self._norms = None
        if self._unposted.pop(number, None) is not None:
            return
        terms, _ = self._doc_terms.pop(number)
        for t in terms:
            self._dead[t] = self._dead.get(t, 0) + 1
        self._live -= len(terms)
        self._stale += len(terms)
        if self._stale > max(self.COMPACT_MIN, self._live) or len(self._ids) > 2 * len(self._number) + self.COMPACT_MIN:
            self._compact()

    def _compact(self) -> None:
        """Drop the postings of removed documents and the terms no document holds, numbering
        the documents and terms left from 0 again."""
        import numpy as np  # not at the top: `cru mcp`'s note tools import this module, numpy waits for a search
        alive = np.array([i is not None for i in self._ids], dtype=bool)
        renumber = (np.cumsum(alive) - 1).astype(np.intc)
        kept_terms = [t for t in range(len(self._terms)) if self._df(t)]
        term_renumber = np.full(len(self._terms), -1, dtype=np.intc)
        term_renumber[kept_terms] = np.arange(len(kept_terms))
        docs, tfs = [], []
        for t in kept_terms:
            d = np.frombuffer(self._docs[t], dtype=np.intc)
            keep = alive[d]
            docs.append(array("i", renumber[d[keep]].tobytes()))
            tfs.append(array("i", np.frombuffer(self._tfs[t], dtype=np.intc)[keep].tobytes()))
        self._docs, self._tfs = docs, tfs
        self._terms = [self._terms[t] for t in kept_terms]
        self._term = {term: t for t, term in enumerate(self._terms)}
        self._doc_terms = {
            int(renumber[n]): (array("i", term_renumber[np.frombuffer(terms, dtype=np.intc)].tobytes()), counts)
            for n, (terms, counts) in self._doc_terms.items()
        }
        self._unposted = {int(renumber[n]): c for n, c in self._unposted.items()}
        live = [i for i in self._ids if i is not None]
        self._number = {doc_id: n for n, doc_id in enumerate(live)}
        self._ids = list(live)
        self._lengths = array("d", np.frombuffer(self._lengths, dtype=np.float64)[alive].tobytes())
        self._stale = 0
        self._dead = {}
        self._norms = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The index as flat arrays, to save: the documents' ids (`_strings`) and lengths, the
        terms, and each term's postings one after another (`offsets` into `docs` and `tfs`).
        Posts what waits and drops removed documents first (`_compact`)."""
        import numpy as np  # not at the top: see `_compact`

        self.post()
        if self._stale or len(self._ids) != len(self._number):
            self._compact()
        sizes = np.fromiter(map(len, self._docs), dtype=np.int64, count=len(self._docs))
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = [i for i in self._ids if i is not None]
        return {**_strings("ids", ids), **_strings("terms", self._terms),
                "lengths": np.frombuffer(self._lengths, dtype=np.float64).astype("<i8"),
                "offsets": offsets.astype("<i8"),
                "docs": np.frombuffer(b"".join(self._docs), dtype=np.intc).astype("<i4"),
                "tfs": np.frombuffer(b"".join(self._tfs), dtype=np.intc).astype("<i4")}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Bm25:
        """The index `to_arrays` saved, every document posted (nothing left for a search to scan
        or for `post()` to do). Raises ValueError if the arrays are not as `to_arrays` writes
        them: a saved file is read as hostile (a kiln may come with its `.crucible`)."""
        import numpy as np  # not at the top: see `_compact`

        ids, terms = _unstrings(arrays, "ids"), _unstrings(arrays, "terms")
        lengths, docs, tfs = (arrays[k] for k in ("lengths", "docs", "tfs"))
        offsets = arrays["offsets"].astype(np.int64)  # (a file's bytes would wrap when scaled)
        n, t = len(ids), len(terms)
        if len(lengths) != n or len(offsets) != t + 1 or len(docs) != len(tfs) or offsets[0] != 0 \
                or offsets[-1] != len(docs) or (t and np.diff(offsets).min() <= 0):
            raise ValueError("the postings do not add up")
        if n and not (0 <= lengths.min() and lengths.max() < MAX_COUNT * 4):
            raise ValueError("a length out of range")
        if len(docs) and not (0 <= docs.min() and docs.max() < n and 0 < tfs.min() and tfs.max() < MAX_COUNT):
            raise ValueError("a posting out of range")
        bm25 = cls()
        bm25._number = dict(zip(ids, range(n), strict=True))
        bm25._term = dict(zip(terms, range(t), strict=True))
        if len(bm25._number) != n or len(bm25._term) != t:
            raise ValueError("a document or a term twice")
        bm25._ids, bm25._terms = list(ids), terms
        bm25._lengths = array("d", lengths.astype(np.float64).tobytes())
        bm25._total_len = int(lengths.sum())
        docs, tfs = docs.astype(np.intc), tfs.astype(np.intc)
        bm25._docs, bm25._tfs = _slices(docs, offsets), _slices(tfs, offsets)
        # Each document's terms and counts (for `counts` and `remove`): the postings by document.
        by_doc = np.argsort(docs, kind="stable")
        term_of = np.repeat(np.arange(t, dtype=np.intc), np.diff(offsets))[by_doc]
        doc_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(docs, minlength=n), out=doc_offsets[1:])
        # The postings are by term and the sort stable: a document's terms come in rising order,
        # and one posted twice for a term (a count, a `remove`, going wrong) shows as a repeat.
        repeats = term_of[1:] <= term_of[:-1]
        starts = doc_offsets[1:-1]
        repeats[starts[(starts > 0) & (starts < len(docs))] - 1] = False  # each document's first
        if repeats.any():
            raise ValueError("a document posted twice for a term")
        bm25._doc_terms = dict(enumerate(zip(_slices(term_of, doc_offsets), _slices(tfs[by_doc], doc_offsets),
                                             strict=True)))
        bm25._live = len(docs)
        return bm25

    def _df(self, t: int) -> int:
        """How many posted documents hold term number `t`."""
        return len(self._docs[t]) - self._dead.get(t, 0)

    def _idf(self, df: int) -> float:
        n = len(self._number)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def holds(self, term: str) -> bool:
        """Whether a document holds `term`."""
        t = self._term.get(term)
        return (t is not None and self._df(t) > 0) or any(term in c for c in self._unposted.values())

    def idf(self, term: str) -> float:
        t = self._term.get(term)
        posted = 0 if t is None else self._df(t)
        return self._idf(posted + sum(1 for c in self._unposted.values() if term in c))

    def search(self, query_tokens: Sequence[str], limit: int) -> list[tuple[str, float]]:
        best = heapq.nsmallest(limit, ((-v, d) for d, v in self.scores(query_tokens).items()))
        return [(d, -v) for v, d in best]

    def scores(self, query_tokens: Sequence[str]) -> dict[str, float]:
        """The BM25 score of every document holding a query term (unordered)."""
        import numpy as np  # not at the top: `cru mcp`'s note tools import this module, numpy waits for a search

        if not self._number:
            return {}
        avg = self._total_len / len(self._number) or 1.0
        if (norms := self._norms) is None:
            lengths = np.frombuffer(self._lengths, dtype=np.float64)
            norms = self._norms = self.k1 * (1.0 - self.b + self.b * lengths / avg)
        total = np.zeros(len(self._ids))
        for term in set(query_tokens):
            t = self._term.get(term)
            posted = 0 if t is None else self._df(t)
            unposted = [(number, counts[term]) for number, counts in self._unposted.items() if term in counts]
            if not posted and not unposted:
                continue
            weight = self._idf(posted + len(unposted)) * (self.k1 + 1.0)
            if t is not None and posted:
                docs = np.frombuffer(self._docs[t], dtype=np.intc)
                tf = np.frombuffer(self._tfs[t], dtype=np.intc).astype(np.float64)
                total[docs] += weight * tf / (tf + norms[docs])  # a document once per term
            if unposted:
                numbers, counts = zip(*unposted, strict=True)
                docs, tf = np.array(numbers, dtype=np.intp), np.array(counts, dtype=np.float64)
                total[docs] += weight * tf / (tf + norms[docs])
        ids = self._ids
        # A removed document scores 0 (its norm is infinite): the others holding a term score > 0.
        return {d: float(total[n]) for n in np.flatnonzero(total).tolist() if (d := ids[n]) is not None}


# ---------------------------------------------------------------------------------------------
# The kiln's lexical index


Stamp = tuple[int, int]  # a file's (mtime_ns, size)
MAX_COUNT = 2**31  # a term's count in a document (a note is at most MAX_NOTE_BYTES)


# The saved index: a small JSON header naming flat arrays of integers, then the arrays' bytes
# (`_pack`). A second start reads it in ~0.5 s with numpy into an index ready to search; the JSON of
# term counts it replaced took ~3.5 s at 10,000 notes (parsing 1.3 s, the counts 0.5 s, posting them
# 1.7 s), which a second start's first answer waited for. Integers only (no pickle, no floats):
# every value is checked against what the index can hold before it is used.
_MAGIC = b"crucible lexical index\n"
_DTYPES = frozenset({"<i8", "<i4", "|u1"})
MAX_HEADER_BYTES = 1 << 16


def _strings(name: str, values: Sequence[str]) -> dict[str, np.ndarray]:
    """Strings as two arrays: their UTF-8 bytes one after another, and where each ends."""
    import numpy as np  # not at the top: see `Bm25._compact`

    encoded = [v.encode("utf-8", "surrogatepass") for v in values]  # a file name need not be UTF-8
    ends = np.fromiter(map(len, encoded), dtype="<i8", count=len(encoded)).cumsum()
    return {name: np.frombuffer(b"".join(encoded), dtype="|u1"), f"{name}.ends": ends.astype("<i8")}


def _unstrings(arrays: dict[str, np.ndarray], name: str) -> list[str]:
    import numpy as np  # not at the top: see `Bm25._compact`

    raw, ends = arrays[name].tobytes(), arrays[f"{name}.ends"]
    if len(ends) and (ends[-1] != len(raw) or ends[0] < 0 or np.diff(ends).min(initial=0) < 0):
        raise ValueError(f"the {name} do not add up")
    at = ends.tolist()
    return [raw[a:b].decode("utf-8", "surrogatepass") for a, b in zip([0, *at], at, strict=False)]


def _slices(values: np.ndarray, offsets: np.ndarray) -> list[array[int]]:
    """`values` (C ints) cut at `offsets`, each slice an array (as `Bm25` keeps its postings)."""
    raw, at = values.tobytes(), (offsets * values.itemsize).tolist()
    return [array("i", raw[a:b]) for a, b in zip(at, at[1:], strict=False)]


def _pack(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    spec, parts, at = {}, [], 0
    for name, values in arrays.items():
        data = values.tobytes()
        spec[name] = [values.dtype.str, at, len(data)]
        parts.append(data)
        at += len(data)
    head = json.dumps({**header, "arrays": spec}).encode()
    return _MAGIC + len(head).to_bytes(4, "little") + head + b"".join(parts)


def _unpack(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What `_pack` wrote; ValueError if it is not that (the arrays' values are checked by their
    readers). The arrays are views of `data`."""
    import numpy as np  # not at the top: see `Bm25._compact`

    if not data.startswith(_MAGIC):
        raise ValueError("not a saved lexical index")
    at = len(_MAGIC) + 4
    size = int.from_bytes(data[at - 4:at], "little")
    if size > MAX_HEADER_BYTES:
        raise ValueError("a header too large")
    header = load_json(data[at:at + size])
    body = memoryview(data)[at + size:]
    if not isinstance(header, dict) or not isinstance(spec := header.get("arrays"), dict):
        raise ValueError("no arrays")
    arrays = {}
    for name, (dtype, start, length) in spec.items():
        if dtype not in _DTYPES or type(start) is not int or type(length) is not int \
                or not 0 <= start <= start + length <= len(body):
            raise ValueError(f"the array {name} is out of the file")
        arrays[name] = np.frombuffer(body[start:start + length], dtype=dtype)
    return header, arrays


class LexicalIndex:
    """BM25 over every readable note of a kiln, kept current by `refresh` (not thread-safe:
    the owner holds a lock). Two rankings, of whole notes (`bm25`, its fields weighted, with
    the words of the links to it) and of their sections (`sections`, a note scoring as its best
    section), averaged by `search`."""

    # 5: the words around the links to a note count as its own; 6: sections; 7: compounds;
    # 8: camelCase names; 9: saved as arrays (`to_bytes`), no longer as JSON
    FORMAT = 9

    def __init__(self, *, words: bool = True) -> None:
        # False: the notes' titles and stamps alone, for a process that never searches them
        # (the index worker, which embeds what changed): never saved, so never over the words.
        self.words = words
        self.bm25 = Bm25()
        self.sections = Bm25()  # documents "path#n", n counting the note's sections from 0
        self._section_count: dict[str, int] = {}
        self._section_note: dict[str, str] = {}  # each section's note
        self.titles: dict[str, str] = {}
        self.stamps: dict[str, Stamp] = {}
        self.graph = LinkGraph()
        # The link terms in each note's BM25 counts (not saved: a load works them out from the
        # saved links when it first needs them; {} for a note read since, whose counts are its own)
        self._incoming: dict[str, dict[str, int]] = {}
        # Notes read (their link lines, or the terms `read_links` took from them) or dropped
        # (None) since `resolve_links`: a first build answers its first searches before it
        # spends the time on their links.
        self._unlinked: dict[str, list[str] | LinkTerms | None] = {}
        # The notes as a load read them, with their links: put in the graph only when a note
        # changes (a search needs no graph: the counts hold the terms of the links); until then
        # as saved, JSON not parsed yet (~0.1 s at 10,000 notes).
        self._saved_links: dict[str, Any] = {}
        self._saved_links_json: bytes | None = None

    def __len__(self) -> int:
        return len(self.titles)

    def set_note(self, path: str, text: str, stamp: Stamp = (0, 0), *, deferred: bool = False) -> None:
        """Read a note into the index; `resolve_links` then brings the terms of links up to date."""
        self._set_counted(path, stamp, note_counts(text, path, words=self.words), deferred=deferred)

    def _set_counted(self, path: str, stamp: Stamp, counted: NoteCounts, *, deferred: bool = False) -> None:
        title, counts, length, sections, link_lines = counted
        self.titles[path] = clip_title(title)
        self.stamps[path] = stamp
        if not self.words:
            return
        self.bm25.add_counts(path, counts, length, deferred=deferred)
        self._set_sections(path, sections, deferred=deferred)
        self._incoming[path] = {}  # its counts are its own words now
        self._unlinked[path] = link_lines

    def _set_sections(self, path: str, sections: Sequence[tuple[dict[str, int], int]], *,
                      deferred: bool = False) -> None:
        for n in range(len(sections), self._section_count.pop(path, 0)):
            self.sections.remove(f"{path}#{n}")
            del self._section_note[f"{path}#{n}"]
        for n, (counts, length) in enumerate(sections):
            self.sections.add_counts(f"{path}#{n}", counts, length, deferred=deferred)
            self._section_note[f"{path}#{n}"] = path
        if sections:
            self._section_count[path] = len(sections)

    def section_documents(self, path: str) -> list[tuple[dict[str, int], int]]:
        """The note's sections as `sections` holds them: (term counts, length) each."""
        ids = [f"{path}#{n}" for n in range(self._section_count.get(path, 0))]
        return [(self.sections.counts(i), self.sections.length(i)) for i in ids]

    def drop_note(self, path: str) -> None:
        self.titles.pop(path, None)
        self.stamps.pop(path, None)
        if not self.words:
            return
        self._incoming.pop(path, None)
        self.bm25.remove(path)
        self._set_sections(path, [])
        self._unlinked[path] = None

    def resolve_links(self, *, deferred: bool = False) -> None:
        """Bring the link graph up to date with the notes read and dropped since the last call,
        and give each note whose links in changed the terms of its links (see `anchors`)."""
        if not self._unlinked:
            return
        graph = self.graph
        if self._saved_links_json is not None:
            raw, self._saved_links_json = self._saved_links_json, None
            try:
                saved = load_json(raw)
            except ValueError:
                saved = None
            # Not as this code saves them: every note without links (their terms leave the
            # counts as the notes that hold the links change).
            self._saved_links = saved if isinstance(saved, dict) else dict.fromkeys(self.titles, {})
        if self._saved_links:
            for path in self._saved_links:
                graph.add_note(path)
            for path, links in self._saved_links.items():
                try:
                    graph.set_links(path, {str(k): {str(t): int(n) for t, n in v.items()} for k, v in links.items()})
                except (AttributeError, TypeError, ValueError):  # not as this code saves them
                    graph.set_links(path, {})
            graph.take_dirty()  # saved resolved, with the counts: only the changes below count
            for path in self._saved_links:  # what the counts of the notes not read since hold
                if path in self.titles and path not in self._incoming and (incoming := graph.incoming(path)):
                    self._incoming[path] = incoming
            self._saved_links = {}
        # The notes first, then their links: each link is bound once, to a note of the final set
        # (a first build would otherwise bind most links twice).
        for path, lines in self._unlinked.items():
            if lines is None:
                if graph.has(path):
                    graph.remove_note(path)
            elif not graph.has(path):
                graph.add_note(path)
        graph.rebind()
        for path, lines in self._unlinked.items():
            if lines is not None:
                graph.dirty.add(path)  # its counts lost the terms of the links to it
                graph.set_links(path, lines if isinstance(lines, dict) else link_terms(lines))
        self._unlinked = {}
        for path in graph.take_dirty():
            if path not in self.titles:
                continue
            new = graph.incoming(path)
            old = self._incoming.get(path, {})
            if new == old:
                continue
            counts = self.bm25.counts(path)
            for term, n in old.items():
                if (left := counts.get(term, 0) - n) > 0:
                    counts[term] = left
                else:
                    counts.pop(term, None)
            for term, n in new.items():
                counts[term] = counts.get(term, 0) + n
            # (never below 0: a saved index damaged where lengths are kept can load with lengths
            # that do not hold the link terms taken off; saved negative, it would be refused)
            length = max(0, self.bm25.length(path) + sum(new.values()) - sum(old.values()))
            self.bm25.add_counts(path, counts, length, deferred=deferred)
            if new:
                self._incoming[path] = new
            else:
                self._incoming.pop(path, None)

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """The notes by their words, best first: the mean of the note's score among whole notes
        and its best section's score among sections, each scaled to [0, 1] over its top `limit`
        (`min_max`, as `search.fuse` fuses; the neutral weights, chosen before measuring). Whole
        notes count the words of titles, headings, paths and links; sections reward a query's
        words found together (bench/search.py: recall@5 / MRR@10 on the hard set, notes alone
        0.88 / 0.68, this 0.94 / 0.81)."""
        terms = self.query_terms(query)
        notes = min_max(self.bm25.search(terms, limit))
        sections = min_max(self.section_ranking(terms, limit))
        mean = {p: (notes.get(p, 0.0) + sections.get(p, 0.0)) / 2 for p in notes.keys() | sections.keys()}
        return sorted(mean.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]

    def section_ranking(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """Notes by their best section's BM25 score (among all sections), best first."""
        best: dict[str, float] = {}
        note_of = self._section_note
        for doc_id, score in self.sections.scores(terms).items():
            path = note_of[doc_id]
            if score > best.get(path, 0.0):
                best[path] = score
        return [(p, -v) for v, p in heapq.nsmallest(limit, ((-v, p) for p, v in best.items()))]

    def query_idf(self, query: str) -> dict[str, float]:
        """The inverse document frequency of each of the query's terms (`query_terms`)."""
        return {t: self.bm25.idf(t) for t in self.query_terms(query)}

    def query_terms(self, query: str) -> list[str]:
        """`tokenize(query)`, but a camelCase name typed whole that some note holds whole
        (`GraduationState`) is that term alone: the person remembers the exact name, and its
        parts ("state") match every note about them, ranking a long note that holds the name once
        below them all. A name no note holds is its words, to find what holds them. (Words joined
        by "-" keep their parts: "one-off", "built-in" are prose whose words help.) A name typed
        as its words apart adds its term (`joined_terms`) beside them, as a compound's own term
        is beside its words: one term more, not more weight (counted as the words it joins, it
        ranked prose queries worse by words alone: bench/search.py)."""
        terms: list[str] = []
        for token in map(_fold, _TOKEN.findall(query)):
            parts = terms_of(token)
            name = _CAMEL_MARK in token and not _JOINER.search(token)  # (`_fold` marks short names only)
            terms += parts[-1:] if name and self.bm25.holds(parts[-1]) else parts
        return terms + [term for term in self.joined_terms(query) if term not in terms]

    def joined_terms(self, query: str) -> list[str]:
        """The terms of a query's neighbouring words run together that some note holds as one
        name ("session config rpc" of `SessionConfigRpc`, "open router" of "OpenRouter", "work
        tree" of "worktree"): a person who remembers a name's words types them apart. Longest
        runs first, no word in two; a run spans two tokens or more (a token's own words are its
        compound term already); among the query's first JOINED_QUERY_WORDS words."""
        words: list[tuple[str, int]] = []
        for n, token in enumerate(_TOKEN.finditer(query)):
            words += [(w, n) for w in _WORD.findall(_fold(token.group()))]
            if len(words) >= JOINED_QUERY_WORDS:
                del words[JOINED_QUERY_WORDS:]
                break
        taken: set[int] = set()
        found: list[str] = []
        for size in range(min(JOINED_MAX_WORDS, len(words)), 1, -1):
            for start in range(len(words) - size + 1):
                run = [w for w, _ in words[start:start + size]]
                joined = "".join(run)
                # Not "a head", "system's", "in to": no letter alone, a word that means something.
                # ("set up", "built in", "log in" join: "setup", "built-in", "login" are theirs.)
                if (words[start][1] == words[start + size - 1][1] or taken.intersection(range(start, start + size))
                        or len(joined) > MAX_COMPOUND_CHARS or all(w in _STOPWORDS for w in run)
                        or any(len(w) == 1 for w in run)):
                    continue
                term = _stem(joined)
                if self.bm25.holds(term):
                    taken.update(range(start, start + size))
                    if term not in found:
                        found.append(term)
        return found

    def literal_share(self, query: str) -> float:
        """The share of the query's words that sit in a compound some note holds whole
        ("cap-add" of "cap-add empty": 2 of 3): what an embedder cannot read (it splits an
        identifier into its common words, and "cap-add" means hats to it), for `search` to
        leave to the words."""
        tokens = [_fold(token) for token in _TOKEN.findall(query)]
        words = {token: sum(1 for w in _WORD.findall(token) if w not in _STOPWORDS) for token in tokens}
        total = sum(words.values())
        held = sum(n for token, n in words.items()
                   if _own_terms(token) and self.bm25.holds(terms_of(token)[-1]))
        return held / total if total else 0.0

    def refresh(self, root: Path, paths: Iterable[str] | None = None, *, deferred: bool = False) -> list[str]:
        """Re-read the notes whose file changed since they were read (all of the kiln's, or
        just `paths`), add new ones, drop those gone or unreadable. Returns the paths changed.
        `deferred`: the notes read are searchable at once; their links and postings wait for `post()`."""
        changed: list[str] = []
        base = str(root)
        listing = list(iter_markdown(root)) if paths is None else list(paths)
        present: set[str] = set()
        unread: list[tuple[str, str]] = []
        for rel in listing:
            try:
                # Paths from a listing are safe; others (a watcher's) are checked like any tool's.
                # Strings, not Paths, for the listing's: pathlib was a fifth of a first build.
                path = f"{base}/{rel}" if paths is None else str(resolve_in_kiln(root, rel, must_exist=True))
                # A note never read is stat'ed by whoever reads it (on a first build, a worker).
                if rel in self.stamps and self.stamps[rel] == _stamp(os.stat(path)):
                    present.add(rel)
                    continue
            except (OSError, CrucibleError):
                if rel in self.titles:
                    self.drop_note(rel)
                    changed.append(rel)
                continue
            unread.append((rel, path))
        for (rel, _), read in zip(unread, count_files(unread, words=self.words), strict=True):
            if read is None:  # not a readable note
                if rel in self.titles:
                    self.drop_note(rel)
                    changed.append(rel)
                continue
            present.add(rel)
            self._set_counted(rel, read[0], read[1], deferred=deferred)
            changed.append(rel)
        if paths is None:
            for gone in set(self.titles) - present:
                self.drop_note(gone)
                changed.append(gone)
        if not deferred:  # else at post()
            self.resolve_links()
        return changed

    def read_links(self) -> None:
        """Take the terms around the links of the notes read since `resolve_links` (most of
        its time on a first build). It changes nothing a search reads, so the owner of a
        deferred build can run it without the searches' lock."""
        for path, lines in self._unlinked.items():
            if isinstance(lines, list):
                self._unlinked[path] = link_terms(lines)

    def post(self) -> None:
        """Finish a deferred refresh: resolve the links and post the counts (see Bm25)."""
        self.resolve_links(deferred=True)
        self.bm25.post()
        self.sections.post()

    def to_bytes(self) -> bytes:
        """The index to save (`_pack`): each note's path, title and stamp, its links (so that a
        load needs no link resolved until a note changes), and both rankings' postings as
        `Bm25.to_arrays` gives them (the terms of the links to a note in its counts)."""
        import numpy as np  # not at the top: see `Bm25._compact`

        if not self.words:
            raise ValueError("an index of the notes' stamps alone is not saved: it has no words")
        self.resolve_links()  # what was read deferred and not posted yet
        paths = list(self.titles)
        if self._saved_links_json is not None:  # nothing changed since the load: as it was read
            links = self._saved_links_json
        else:
            resolved = self._saved_links or self.graph.links
            links = json.dumps({p: resolved.get(p, {}) for p in paths}).encode()
        arrays = {**_strings("paths", paths), **_strings("titles", [self.titles[p] for p in paths]),
                  "stamps": np.array([self.stamps.get(p, (0, 0)) for p in paths], dtype="<i8").reshape(-1),
                  "links": np.frombuffer(links, dtype="|u1")}
        for name, bm25 in (("notes", self.bm25), ("sections", self.sections)):
            arrays.update({f"{name}.{k}": v for k, v in bm25.to_arrays().items()})
        return _pack({"format": self.FORMAT, "notes": len(paths)}, arrays)

    @classmethod
    def from_bytes(cls, data: bytes, *, words: bool = True) -> LexicalIndex | None:
        """The saved index if it is well-formed and of this format, else None: ready to search,
        every document posted. `words=False`: the titles and stamps alone (see `words`)."""
        try:
            header, arrays = _unpack(data)
            if header.get("format") != cls.FORMAT:
                return None
            paths, titles = _unstrings(arrays, "paths"), _unstrings(arrays, "titles")
            stamps = arrays["stamps"].tolist()
            lex = cls(words=words)
            lex.titles = dict(zip(paths, titles, strict=True))
            lex.stamps = dict(zip(paths, zip(stamps[0::2], stamps[1::2], strict=True), strict=True))
            if not len(lex.titles) == len(paths) == len(stamps) // 2:
                raise ValueError("a note twice")
            if not words:
                return lex
            lex.bm25 = Bm25.from_arrays({k.removeprefix("notes."): v for k, v in arrays.items()
                                         if k.startswith("notes.")})
            lex.sections = Bm25.from_arrays({k.removeprefix("sections."): v for k, v in arrays.items()
                                             if k.startswith("sections.")})
            if lex.bm25._number.keys() != lex.titles.keys():
                raise ValueError("the notes ranked are not the notes")
            for section in lex.sections._number:
                path = lex._section_note[section] = section.rpartition("#")[0]
                lex._section_count[path] = lex._section_count.get(path, 0) + 1
            numbered = {f"{p}#{k}" for p, n in lex._section_count.items() for k in range(min(n, MAX_SECTIONS))}
            if not lex._section_count.keys() <= lex.titles.keys() or numbered != lex._section_note.keys():
                raise ValueError("the sections are not the notes'")  # each note's numbered from 0
            lex._saved_links_json = arrays["links"].tobytes()
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return lex


def min_max(ranking: list[tuple[str, float]]) -> dict[str, float]:
    """A ranking's scores min-max scaled to [0, 1] (all 1.0 when they are equal): how both
    lexical rankings are averaged here and words and meaning fused in `search.fuse`."""
    if not ranking:
        return {}
    values = [v for _, v in ranking]
    lo, hi = min(values), max(values)
    return {p: (v - lo) / (hi - lo) if hi > lo else 1.0 for p, v in ranking}


def lexical_file(root: Path, collection: str) -> Path:
    """Where a kiln's lexical index is saved (one per index collection, like the vectors)."""
    return root / RESERVED_DIR / f"lexical-{collection}.idx"


def load_lexical(root: Path, collection: str, *, deferred: bool = False,
                 words: bool = True) -> tuple[LexicalIndex, bool]:
    """The kiln's lexical index: the saved one brought up to date with the files, else built
    from them; and whether it differs from what is saved. `deferred`: the notes read from the
    files are left for `LexicalIndex.post()`; `words=False`: their titles and stamps alone."""
    try:
        with lexical_file(root, collection).open("rb") as f:
            saved = f.read(MAX_SAVED_BYTES + 1)
    except OSError:
        saved = b""
    loaded = LexicalIndex.from_bytes(saved, words=words) if len(saved) <= MAX_SAVED_BYTES else None
    lex = loaded or LexicalIndex(words=words)
    changed = bool(lex.refresh(root, deferred=deferred))
    if not deferred:
        lex.bm25.post()  # what the load left unposted
        lex.sections.post()
    return lex, changed


class LexicalView:
    """Search by words alone, before the index (and its vector store) is open: the methods of
    `index.KilnIndex` that search needs without vectors, over a lexical index that its owner
    changes only under `lock`."""

    def __init__(self, root: Path, lexical: LexicalIndex, lock: threading.RLock) -> None:
        self.root = root
        self._lexical = lexical
        self._lock = lock

    def __len__(self) -> int:
        with self._lock:
            return len(self._lexical)

    def lexical_search(self, query: str, limit: int) -> list[tuple[str, float]]:
        with self._lock:
            return self._lexical.search(query, limit)

    def query_idf(self, query: str) -> dict[str, float]:
        with self._lock:
            return self._lexical.query_idf(query)

    def note_title(self, path: str) -> str | None:
        with self._lock:
            return self._lexical.titles.get(path)
