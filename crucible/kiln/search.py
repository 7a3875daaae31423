"""Note-level search over a kiln: semantic, hybrid (semantic + BM25), text and property.

Every function blocks and returns one result per note, best first, with the note's best
chunk as the snippet and that chunk's heading. Paths are kiln-relative.

How notes are ranked by meaning (measured in bench/search.py on the sample kiln):
a note's score blends its best chunk's cosine similarity with that of its note vector (the
mean of its chunk vectors), because "best chunk" alone lets huge notes win by sheer number of
chunks, and the note vector alone misses a note whose one section answers the query.
The hybrid fuses that ranking with BM25 by reciprocal rank. On the sample kiln's 50
paraphrased queries, recall@5 / MRR@10 were: BM25 0.94 / 0.86, best chunk alone 0.90 / 0.77,
the blend 0.96 / 0.83, hybrid 1.00 / 0.92 — so hybrid is the default everywhere.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text
from crucible.kiln.index import KilnIndex, StoredChunk, tokenize
from crucible.kiln.notes import (
    MAX_NOTE_BYTES,
    Note,
    NoteReadError,
    decode_note_bytes,
    parse_note,
    split_frontmatter,
)
from crucible.kiln.paths import RESERVED_DIR, iter_markdown

SearchMode = Literal["hybrid", "semantic", "text", "property"]
# The default for `cru kiln search` and the agents' `semantic_search` tool: see bench/search.py.
DEFAULT_MODE: SearchMode = "hybrid"

# Weight of the best chunk against the note vector in the semantic score (bench/search.py).
CHUNK_WEIGHT = 0.3
# Reciprocal-rank fusion constant (the usual 60) and how deep each ranking goes into the fusion.
RRF_K = 60
FUSION_DEPTH = 50
SNIPPET_CHARS = 300
MAX_LIMIT = 100


class LineMatch(BaseModel):
    line: int  # 1-based
    text: str


class SearchResult(BaseModel):
    path: str
    title: str
    score: float
    heading: str | None
    snippet: str
    line: int | None = None  # 1-based line where the snippet starts, when known
    matches: list[LineMatch] | None = None  # text search: the matching lines

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def _check(query: str, limit: int) -> None:
    if not query.strip():
        raise CrucibleError("the search query is empty", "give some words to search for")
    if limit < 1 or limit > MAX_LIMIT:
        raise CrucibleError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")


# ---------------------------------------------------------------------------------------------
# Snippets


def _body(chunk_text: str) -> str:
    """A stored chunk's content without its "Title > Heading" first line."""
    head, sep, rest = chunk_text.partition("\n\n")
    return rest if sep else head


def snippet(text: str, query: str = "", chars: int = SNIPPET_CHARS) -> str:
    """About `chars` of `text` on one line, starting near the first query word it contains."""
    flat = " ".join(text.split())
    if len(flat) <= chars:
        return flat
    start = 0
    words = [w for w in re.findall(r"[^\W_]{3,}", query.lower())]
    lower = flat.lower()
    hits = [i for i in (lower.find(w) for w in words) if i >= 0]
    if hits:
        start = max(0, min(hits) - chars // 4)
        space = flat.rfind(" ", 0, start)
        start = space + 1 if start and space >= 0 else start
    cut = flat[start:start + chars]
    if start + chars < len(flat):
        cut = cut[: cut.rfind(" ")] if " " in cut else cut
        cut += " …"
    return ("… " if start else "") + cut


def _from_chunk(chunk: StoredChunk, score: float, query: str) -> SearchResult:
    return SearchResult(
        path=chunk.path, title=chunk.title or _stem(chunk.path), score=round(score, 4),
        heading=chunk.heading, snippet=snippet(_body(chunk.text), query), line=chunk.line,
    )


def _stem(path: str) -> str:
    return Path(path).stem


# ---------------------------------------------------------------------------------------------
# Semantic


@dataclass
class Dense:
    """A note found by meaning."""

    path: str
    chunk_sim: float | None  # its best chunk's similarity, if one of its chunks was retrieved
    chunk_id: str | None
    note_sim: float | None  # its note vector's similarity


def dense_ranking(
    index: KilnIndex, vector: np.ndarray, depth: int, chunk_weight: float = CHUNK_WEIGHT
) -> list[tuple[Dense, float]]:
    """Notes ranked by meaning: chunk_weight * best chunk + (1 - chunk_weight) * note vector.

    Chunks and note vectors are each retrieved from Chroma; a note found one way gets its other
    similarity exactly (its note vector is fetched) or bounded (a note none of whose chunks
    made the list scores at most the last chunk retrieved)."""
    chunks = index.query_chunks(vector, max(60, 3 * depth))
    notes = index.query_notes(vector, max(30, 2 * depth))
    found: dict[str, Dense] = {}
    for chunk_id, path, sim in chunks:  # best first: a note's first chunk is its best
        if path not in found:
            found[path] = Dense(path, sim, chunk_id, None)
    for path, sim in notes:
        found.setdefault(path, Dense(path, None, None, None)).note_sim = sim
    missing = [p for p, d in found.items() if d.note_sim is None]
    for path, vec in index.note_vectors(missing).items():
        found[path].note_sim = float(np.dot(vec, vector))
    floor = chunks[-1][2] if chunks else 0.0
    ranked = []
    for d in found.values():
        chunk_sim = d.chunk_sim if d.chunk_sim is not None else floor
        ranked.append((d, chunk_weight * chunk_sim + (1.0 - chunk_weight) * (d.note_sim or 0.0)))
    ranked.sort(key=lambda r: (-r[1], r[0].path))
    return ranked[:depth]


def _best_chunks(
    index: KilnIndex, paths: list[str], dense: dict[str, Dense], vector: np.ndarray, query: str
) -> dict[str, StoredChunk]:
    """The snippet chunk of each result: its best retrieved chunk; else, for a note found by its
    note vector, its chunk nearest the query; else (found by words only) its best BM25 chunk."""
    by_id = {d.chunk_id: d.path for p in paths if (d := dense.get(p)) and d.chunk_id}
    out = {by_id[i]: c for i, c in index.chunks_by_id(list(by_id)).items()}
    by_vector = [p for p in paths if p not in out and p in dense]
    for path, chunks in index.note_chunks(by_vector, embeddings=True).items():
        scored = [(float(np.dot(c.embedding, vector)), c) for c in chunks if c.embedding is not None]
        if scored:
            out[path] = max(scored, key=lambda s: s[0])[1]
    for path in paths:
        if path not in out:
            best = index.lexical_best_chunk(path, query)
            if best is not None:
                out[path] = best
    return out


def _results(
    index: KilnIndex, ranked: list[tuple[str, float]], dense: dict[str, Dense], vector: np.ndarray,
    query: str,
) -> list[SearchResult]:
    best = _best_chunks(index, [p for p, _ in ranked], dense, vector, query)
    results = []
    for path, score in ranked:
        chunk = best.get(path)
        if chunk is None:  # a note with no stored chunk (not in a complete index)
            results.append(SearchResult(path=path, title=_stem(path), score=round(score, 4),
                                        heading=None, snippet=""))
        else:
            results.append(_from_chunk(chunk, score, query))
    return results


def semantic_search(index: KilnIndex, query: str, limit: int = 10) -> list[SearchResult]:
    """Notes by meaning (Chroma vectors only)."""
    _check(query, limit)
    vector = index.embed_query(query)
    ranked = dense_ranking(index, vector, limit)
    dense = {d.path: d for d, _ in ranked}
    return _results(index, [(d.path, score) for d, score in ranked], dense, vector, query)


# ---------------------------------------------------------------------------------------------
# Hybrid


def lexical_ranking(index: KilnIndex, query: str, depth: int) -> list[tuple[str, float]]:
    """Notes by BM25 over their words (plain lexical baseline)."""
    return index.lexical_search(query, depth)


def rrf(rankings: list[list[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion: each ranking adds 1 / (k + rank) to the notes it lists."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, path in enumerate(ranking):
            fused[path] = fused.get(path, 0.0) + 1.0 / (k + rank + 1)
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))


def hybrid_search(index: KilnIndex, query: str, limit: int = 10) -> list[SearchResult]:
    """Notes by meaning and by words: the dense and BM25 rankings fused by reciprocal rank.

    The score is the fused score scaled so that 1.0 means first in both rankings."""
    _check(query, limit)
    vector = index.embed_query(query)
    depth = max(FUSION_DEPTH, limit)
    ranked = dense_ranking(index, vector, depth)
    lexical = lexical_ranking(index, query, depth)
    top = rrf([[d.path for d, _ in ranked], [p for p, _ in lexical]])[:limit]
    scale = 2.0 / (RRF_K + 1)
    dense = {d.path: d for d, _ in ranked}
    return _results(index, [(p, score / scale) for p, score in top], dense, vector, query)


# ---------------------------------------------------------------------------------------------
# Text and property search read the files themselves (no index needed); parsed notes are
# cached by (mtime, size) so repeated calls cost a stat per note.


@dataclass
class _Cached:
    stamp: tuple[int, int]
    text: str | None  # None: not a readable text note
    note: Note | None = None


class _NoteCache:
    def __init__(self) -> None:
        self._entries: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def get(self, root: Path, rel: str) -> _Cached:
        path = root / rel
        key = str(path)
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            return _Cached((0, 0), None)
        with self._lock:
            cached = self._entries.get(key)
        if cached is not None and cached.stamp == stamp:
            return cached
        text: str | None = None
        if st.st_size <= MAX_NOTE_BYTES:
            try:
                text = decode_note_bytes(path.read_bytes(), rel)
            except (OSError, NoteReadError):
                text = None
        cached = _Cached(stamp, text)
        with self._lock:
            self._entries[key] = cached
        return cached

    def note(self, root: Path, rel: str) -> Note | None:
        cached = self.get(root, rel)
        if cached.text is None:
            return None
        if cached.note is None:
            cached.note = parse_note(cached.text, rel)
        return cached.note


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
            data = json.loads((root / PROPERTIES_FILE).read_text(encoding="utf-8"))
            if data.get("format") == 1:
                for rel, (mtime, size, title, fm, tags) in data["notes"].items():
                    self.entries[str(rel)] = _Props((int(mtime), int(size)), str(title), dict(fm),
                                                    [str(t) for t in tags])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            self.entries = {}  # none yet, or damaged: parsed again

    def get(self, rel: str) -> _Props | None:
        try:
            st = (self.root / rel).stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        props = self.entries.get(rel)
        if props is not None and props.stamp == stamp:
            return props
        note = _cache.note(self.root, rel)
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
            (self.root / RESERVED_DIR).mkdir(exist_ok=True)
            atomic_write_text(self.root / PROPERTIES_FILE, json.dumps(data, ensure_ascii=False))
            self.dirty = False
        except OSError:
            pass  # a read-only kiln: parsed again next time


_stores: dict[Path, _PropertyStore] = {}
_stores_lock = threading.Lock()


def _property_store(root: Path) -> _PropertyStore:
    with _stores_lock:
        store = _stores.get(root)
        if store is None:
            store = _stores[root] = _PropertyStore(root)
        return store


def _notes_text(root: Path) -> Iterator[tuple[str, str]]:
    root = Path(root).resolve()
    for rel in iter_markdown(root):
        text = _cache.get(root, rel).text
        if text is not None:
            yield rel, text


def text_search(
    root: Path, query: str, limit: int = 10, regex: bool = False, case_sensitive: bool = False
) -> list[SearchResult]:
    """Notes whose text contains `query` (literal, or a Python regular expression with
    `regex=True`), most matching lines first; each with its matching lines and numbers."""
    _check(query, limit)
    flags = re.MULTILINE | (0 if case_sensitive else re.IGNORECASE)
    try:
        pattern = re.compile(query if regex else re.escape(query), flags)
    except re.error as exc:
        raise CrucibleError(
            f"invalid regular expression {query!r}: {exc}",
            "fix the pattern, or search for the literal text without regex",
        ) from None
    root = Path(root).resolve()
    hits: list[tuple[str, list[LineMatch]]] = []
    for rel, text in _notes_text(root):
        if not pattern.search(text):
            continue
        lines = [
            LineMatch(line=i + 1, text=line.strip()[:SNIPPET_CHARS])
            for i, line in enumerate(text.splitlines())
            if pattern.search(line)
        ]
        if not lines:  # a match across lines (regex with \n): report where it starts
            m = pattern.search(text)
            assert m is not None
            n = text.count("\n", 0, m.start())
            lines = [LineMatch(line=n + 1, text=text.splitlines()[n].strip()[:SNIPPET_CHARS])]
        hits.append((rel, lines))
    hits.sort(key=lambda h: (-len(h[1]), h[0]))
    results = []
    for rel, lines in hits[:limit]:
        note = _cache.note(root, rel)
        first = lines[0]
        results.append(SearchResult(
            path=rel, title=note.title if note else _stem(rel), score=float(len(lines)),
            heading=_heading_at(note, first.line) if note else None, snippet=first.text,
            line=first.line, matches=lines[:20],
        ))
    return results


def _heading_at(note: Note, line: int) -> str | None:
    """The heading path ("H1 > H2") of the section holding 1-based `line`."""
    stack: list[tuple[int, str]] = []
    for h in note.headings:
        if h.line + 1 > line:
            break
        while stack and stack[-1][0] >= h.level:
            stack.pop()
        stack.append((h.level, h.text))
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
) -> list[SearchResult]:
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
    if limit < 1 or limit > MAX_LIMIT:
        raise CrucibleError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    root = Path(root).resolve()
    store = _property_store(root)
    with store.lock:
        return _property_matches(root, store, key, value, tag, word, limit)


def _property_matches(
    root: Path, store: _PropertyStore, key: str | None, value: str | None, tag: str | None,
    word: str | None, limit: int,
) -> list[SearchResult]:
    results: list[SearchResult] = []
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
        results.append(SearchResult(
            path=rel, title=note.title, score=1.0, heading=None, snippet=text[:SNIPPET_CHARS],
            line=line,
        ))
    if complete:
        store.save(listed)  # forgets deleted notes too
    elif store.dirty:
        store.save(set(store.entries))
    return results


def run_search(
    mode: SearchMode, root: Path, index: KilnIndex | None, query: str, limit: int = 10, *,
    regex: bool = False, case_sensitive: bool = False,
) -> list[SearchResult]:
    """One entry point for callers that take a mode (the CLI); text/property need no index."""
    if mode == "text":
        return text_search(root, query, limit, regex=regex, case_sensitive=case_sensitive)
    if mode == "property":
        return property_search(root, query, limit=limit)
    if index is None:
        raise CrucibleError(f"{mode} search needs the index", "cru kiln index")
    if mode == "semantic":
        return semantic_search(index, query, limit)
    return hybrid_search(index, query, limit)


__all__ = [
    "DEFAULT_MODE", "LineMatch", "SearchMode", "SearchResult", "hybrid_search", "property_search",
    "run_search", "semantic_search", "snippet", "text_search", "tokenize",
]
