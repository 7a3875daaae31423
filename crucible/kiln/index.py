"""The kiln's search index: chunk and note vectors in Chroma, plus an in-memory BM25 index.

Chroma holds all that must persist, through one code path whether the store is an embedded
`PersistentClient` under `KILN/.crucible/chroma` (default) or a Chroma server (`[index] url`):
- collection `<name>`: one row per chunk (heading section) — vector, text, path, heading, line;
- collection `<name>-notes`: one row per note — a note-level vector (mean of its chunks) and
  the hash of the file, which is the manifest that makes indexing incremental.
Only kiln-relative paths are stored. The lexical (BM25) index is rebuilt from the chunk rows
on first use and then kept current by every update, so it can never disagree with Chroma.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import urlsplit

import numpy as np
import snowballstemmer
from pydantic import BaseModel, Field

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text, content_hash
from crucible.kiln.chunking import Chunk, chunk_note
from crucible.kiln.embedder import CrucibleEmbeddingFunction, Embedder, make_embedder
from crucible.kiln.notes import MAX_NOTE_BYTES, Note, NoteReadError, decode_note_bytes, read_note
from crucible.kiln.paths import RESERVED_DIR, SKIP_DIRS, iter_markdown

log = logging.getLogger(__name__)

# Bump when what is stored per row changes: an index of another format is rebuilt.
INDEX_FORMAT = 1
STORE_DIR = f"{RESERVED_DIR}/chroma"
LOCK_FILE = f"{RESERVED_DIR}/index.lock"
REBUILD = "cru kiln index --rebuild"
# Texts per embedder call: small enough for a lively progress bar, big enough to batch well.
EMBED_STEP = 32
# Rows per Chroma read/write call (well under any server's max batch size).
PAGE = 2000


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class IndexProgress:
    """Where an update is: `scan` reads and chunks changed notes, `embed` embeds their chunks."""

    phase: Literal["scan", "embed"]
    notes_done: int
    notes_total: int
    chunks_done: int
    chunks_total: int
    path: str | None = None


ProgressFn = Callable[[IndexProgress], None]


class IndexReport(BaseModel):
    notes_seen: int = 0
    notes_indexed: int = 0
    notes_unchanged: int = 0
    notes_removed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0  # unchanged chunks of a changed note: vector kept, not re-embedded
    elapsed: float = 0.0
    rebuilt: str | None = None  # why the whole index was rebuilt, when it was
    skipped: list[tuple[str, str]] = Field(default_factory=list)  # (path, reason): not indexed
    degraded: list[tuple[str, str]] = Field(default_factory=list)  # (path, reason): indexed anyway

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"skipped", "degraded"})
        data["elapsed"] = round(self.elapsed, 3)
        data["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        data["degraded"] = [{"path": p, "reason": r} for p, r in self.degraded]
        return data


class IndexStatus(BaseModel):
    store: str  # "KILN-relative dir" or the server URL
    collection: str
    embedder: str | None  # the embedder the index was built with
    notes: int
    chunks: int
    stale: int  # notes added, changed or deleted since the last update
    needs_rebuild: str | None = None


@dataclass
class NoteEntry:
    """A note as the index knows it (one row of the notes collection)."""

    path: str
    file_hash: str
    title: str
    chunks: int
    problems: str


@dataclass
class StoredChunk:
    path: str
    ordinal: int
    heading: str | None
    line: int  # 1-based line of the note where the chunk's content starts
    title: str
    text: str  # as embedded: "Title > Heading" line, blank line, content
    score: float = 0.0  # cosine similarity to the query, when it came from a query
    embedding: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------
# Lexical index (BM25)

_WORD = re.compile(r"[^\W_]+")
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
_stemmer = snowballstemmer.stemmer("english")
_stem_lock = threading.Lock()  # the snowball stemmer object is not thread-safe


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    with _stem_lock:
        return str(_stemmer.stemWord(word))


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words dropped, English-stemmed words: the lexical index's terms."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


class Bm25:
    """Okapi BM25 over an inverted index that can add and drop single documents.

    Ours rather than rank-bm25/bm25s: those build a static corpus and must redo the whole of
    it when one note changes, while the watcher updates notes one at a time.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[str, int]] = {}
        self._doc_terms: dict[str, tuple[str, ...]] = {}
        self._doc_len: dict[str, int] = {}
        self._total_len = 0

    def __len__(self) -> int:
        return len(self._doc_len)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._doc_len

    def add(self, doc_id: str, tokens: Sequence[str]) -> None:
        self.remove(doc_id)
        counts = Counter(tokens)
        for term, n in counts.items():
            self._postings.setdefault(term, {})[doc_id] = n
        self._doc_terms[doc_id] = tuple(counts)
        self._doc_len[doc_id] = len(tokens)
        self._total_len += len(tokens)

    def add_counts(self, doc_id: str, counts: dict[str, int], length: int) -> None:
        """Add a document by its term counts (as saved by `counts`)."""
        self.remove(doc_id)
        for term, n in counts.items():
            self._postings.setdefault(term, {})[doc_id] = n
        self._doc_terms[doc_id] = tuple(counts)
        self._doc_len[doc_id] = length
        self._total_len += length

    def counts(self, doc_id: str) -> dict[str, int]:
        return {t: self._postings[t][doc_id] for t in self._doc_terms.get(doc_id, ())}

    def length(self, doc_id: str) -> int:
        return self._doc_len.get(doc_id, 0)

    def remove(self, doc_id: str) -> None:
        terms = self._doc_terms.pop(doc_id, None)
        if terms is None:
            return
        for term in terms:
            posting = self._postings[term]
            del posting[doc_id]
            if not posting:
                del self._postings[term]
        self._total_len -= self._doc_len.pop(doc_id)

    def idf(self, term: str) -> float:
        n = len(self._doc_len)
        df = len(self._postings.get(term, ()))
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def search(self, query_tokens: Sequence[str], limit: int) -> list[tuple[str, float]]:
        if not self._doc_len:
            return []
        avg = self._total_len / len(self._doc_len) or 1.0
        k1, b = self.k1, self.b
        scores: dict[str, float] = {}
        for term in set(query_tokens):
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = self.idf(term)
            for doc_id, tf in posting.items():
                norm = k1 * (1.0 - b + b * self._doc_len[doc_id] / avg)
                scores[doc_id] = scores.get(doc_id, 0.0) + idf * tf * (k1 + 1.0) / (tf + norm)
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:limit]


class LexicalIndex:
    """BM25 over whole notes (title counted twice, then the text of every chunk).

    Saved as JSON under .crucible/ (term counts only, never code: a kiln is not trusted input)
    and tagged with the index generation it matches, so a new process loads it instead of
    re-reading every chunk from Chroma."""

    FORMAT = 1

    def __init__(self) -> None:
        self.bm25 = Bm25()
        self.titles: dict[str, str] = {}

    def set_note(self, path: str, title: str, texts: Iterable[str]) -> None:
        tokens = tokenize(title) * 2
        for text in texts:
            tokens.extend(tokenize(text))
        self.titles[path] = title
        self.bm25.add(path, tokens)

    def drop_note(self, path: str) -> None:
        self.titles.pop(path, None)
        self.bm25.remove(path)

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        return self.bm25.search(tokenize(query), limit)

    def to_json(self, tag: str) -> dict[str, Any]:
        return {
            "format": self.FORMAT, "tag": tag,
            "notes": {p: [t, self.bm25.length(p), self.bm25.counts(p)] for p, t in self.titles.items()},
        }

    @classmethod
    def from_json(cls, data: Any, tag: str) -> LexicalIndex | None:
        """The saved index if it is for `tag` and well-formed, else None."""
        if not isinstance(data, dict) or data.get("format") != cls.FORMAT or data.get("tag") != tag:
            return None
        lex = cls()
        try:
            for path, (title, length, counts) in data["notes"].items():
                lex.titles[str(path)] = str(title)
                lex.bm25.add_counts(str(path), {str(t): int(n) for t, n in counts.items()}, int(length))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return lex


# ---------------------------------------------------------------------------------------------
# Errors


def _clean(message: str, root: Path) -> str:
    """An exception text fit to show: the kiln's absolute path removed, one short line."""
    for prefix in {str(root.resolve()), str(root)}:
        message = message.replace(prefix + os.sep, "").replace(prefix, "<kiln>")
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line[:300]


class IndexUnusableError(CrucibleError):
    """The index cannot be used as it is (locked, damaged, or built differently)."""


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "locked" in text and "sqlite" in text


@contextmanager
def _store_errors(root: Path, store: str, doing: str) -> Iterator[None]:
    """Translate whatever Chroma raises into a message with the fix; one place for all calls."""
    try:
        yield
    except CrucibleError:
        raise
    except Exception as exc:  # noqa: BLE001 - chromadb raises many unrelated types
        reason = _clean(f"{type(exc).__name__}: {exc}", root)
        if _is_lock_error(exc):
            raise IndexUnusableError(
                f"the index in {store} is locked by another process while {doing} ({reason})",
                f"close the other `cru` using this kiln and retry; if none is running: {REBUILD}",
            ) from exc
        raise IndexUnusableError(
            f"the index in {store} is damaged or unreadable while {doing} ({reason})", REBUILD
        ) from exc


# ---------------------------------------------------------------------------------------------
# The index


def _heading(chunk: Chunk) -> str:
    return " > ".join(chunk.heading_path)


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


@dataclass
class _Pending:
    """A changed note between scanning and writing."""

    note: Note
    file_hash: str
    problems: str
    chunks: list[Chunk]
    texts: list[str]  # what is embedded, one per chunk
    hashes: list[str]
    vectors: list[np.ndarray | None]  # reused vectors, None = to embed
    old_ids: set[str]


class KilnIndex:
    """One kiln's index. Every method blocks: call from trio via `trio.to_thread.run_sync`.
    Safe to share between threads (the watcher updates while tools search)."""

    def __init__(
        self, root: Path, config: Config, client: Any, embedder: Embedder, store: str,
        local_store: Path | None,
    ) -> None:
        self.root = root
        self.config = config
        self.client = client
        self.embedder = embedder
        self.store = store  # for messages: kiln-relative dir or the server URL
        self.local_store = local_store
        self.name = config.index.collection
        self._lock = threading.RLock()  # one writer at a time (see _writing)
        self._lexical: LexicalIndex | None = None
        # Guards the in-memory BM25 index alone, so searches never wait for a long update.
        self._lex_lock = threading.RLock()
        self._lex_generation: str | None = None  # the store generation _lexical matches
        self._lex_dirty = False  # changed since saved
        self._chunks: Any = None
        self._notes: Any = None
        self.needs_rebuild: str | None = None
        self._attach()

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, config: Config, *, rebuild: bool = False) -> KilnIndex:
        """Open (or create) the kiln's index. `rebuild=True` first throws the stored index
        away — the way out of a damaged local store, which cannot even be opened."""
        root = Path(root).resolve()
        name = config.index.collection
        if not _COLLECTION_NAME.fullmatch(name):
            raise CrucibleError(
                f"[index] collection {name!r} is not a usable Chroma collection name",
                f'use 3 to 60 letters, digits, ".", "_" or "-", starting and ending with a letter '
                f'or digit, e.g. collection = "{_suggest(name)}"',
            )
        embedder = make_embedder(config.embedder)
        url = config.index.url
        if url:
            client, store, local = _http_client(url), url, None
            if rebuild:
                _drop_collections(client, config.index.collection, root, store)
        else:
            local = root / STORE_DIR
            store = STORE_DIR
            if rebuild:
                _wipe_local(local)
            local.mkdir(parents=True, exist_ok=True)
            client = _persistent_client(local, root)
        return cls(root, config, client, embedder, store, local)

    def _attach(self) -> None:
        """Get the two collections, creating them if needed, and check how they were built."""
        with _store_errors(self.root, self.store, "opening it"):
            self._chunks = self._collection(self.name)
            self._notes = self._collection(f"{self.name}-notes")
            meta = self._notes.metadata or {}
            built_with = meta.get("embedder")
            if built_with is None:
                self._notes.modify(metadata=self._identity())
                return
        other = meta.get("kiln")
        if self.local_store is None and other not in (None, self.root.name):
            # A server is shared: never let this kiln's update wipe another kiln's index.
            raise IndexUnusableError(
                f"the collection {self.name!r} on {self.store} holds the index of another kiln "
                f"({other!r})",
                f'give this kiln its own collection: [index] collection = "{_suggest(self.root.name)}" '
                f"in the config (or replace that index: {REBUILD})",
            )
        if built_with != self.embedder.name:
            self.needs_rebuild = f"the index was built with {built_with}, the config asks for {self.embedder.name}"
        elif meta.get("format") != INDEX_FORMAT:
            self.needs_rebuild = f"the index has format {meta.get('format')}, this version writes {INDEX_FORMAT}"

    def _identity(self) -> dict[str, Any]:
        # The kiln's folder name only (no path): tells kilns apart on a shared server.
        return {"embedder": self.embedder.name, "format": INDEX_FORMAT, "kiln": self.root.name}

    def _collection(self, name: str) -> Any:
        try:
            return self.client.get_or_create_collection(
                name,
                configuration={"hnsw": {"space": "cosine"}},
                embedding_function=CrucibleEmbeddingFunction(self.embedder),
            )
        except ValueError as exc:
            if "embedding function" not in str(exc).lower():
                raise
            # Stored with another embedder's config: open without one; _attach sees the mismatch.
            return self.client.get_collection(name, embedding_function=None)

    def close(self) -> None:
        with self._lex_lock:
            if self._lex_dirty and self._lexical is not None and self._lex_generation is not None:
                self._save_lexical(self._lexical, self._lex_generation)
        closer = getattr(self.client, "close", None)
        if closer is not None:
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def __enter__(self) -> KilnIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what is stored ----------------------------------------------------------------------

    def manifest(self) -> dict[str, NoteEntry]:
        """Every indexed note: path -> what the index knows of it."""
        out: dict[str, NoteEntry] = {}
        with _store_errors(self.root, self.store, "reading it"):
            for ids, metas, _ in _pages(self._notes, include=["metadatas"]):
                for id_, m in zip(ids, metas, strict=True):
                    out[id_] = NoteEntry(
                        id_, str(m.get("hash", "")), str(m.get("title", "")),
                        int(m.get("chunks", 0)), str(m.get("problems", "")),
                    )
        return out

    @property
    def chunk_collection(self) -> Any:
        """The Chroma collection of chunk rows (for benchmarks comparing against raw queries)."""
        return self._chunks

    def count_notes(self) -> int:
        with _store_errors(self.root, self.store, "reading it"):
            return int(self._notes.count())

    def count_chunks(self) -> int:
        with _store_errors(self.root, self.store, "reading it"):
            return int(self._chunks.count())

    def status(self) -> IndexStatus:
        manifest = self.manifest()
        stale = 0
        seen: set[str] = set()
        for rel in iter_markdown(self.root):
            seen.add(rel)
            entry = manifest.get(rel)
            try:
                if entry is not None and entry.file_hash == _file_hash(self.root / rel):
                    continue
                if entry is None and not _readable_note(self.root / rel, rel):
                    continue  # skipped by every update: not waiting to be indexed
            except OSError:
                continue
            stale += 1
        stale += len(set(manifest) - seen)
        meta = self._notes.metadata or {}
        return IndexStatus(
            store=self.store, collection=self.name, embedder=meta.get("embedder"),
            notes=len(manifest), chunks=self.count_chunks(), stale=stale,
            needs_rebuild=self.needs_rebuild,
        )

    # -- updating ----------------------------------------------------------------------------

    def update(self, progress: ProgressFn | None = None, rebuild: bool = False) -> IndexReport:
        """Bring the index up to date with the whole kiln; only what changed is embedded."""
        with self._writing():
            report = IndexReport()
            reason = "asked for (--rebuild)" if rebuild else self.needs_rebuild
            if reason:
                self._reset()
                report.rebuilt = reason
            paths = list(iter_markdown(self.root))
            self._update(paths, report, progress, full=True)
            with self._lex_lock:
                if self._lex_dirty and self._lexical is not None and self._lex_generation is not None:
                    self._save_lexical(self._lexical, self._lex_generation)
            return report

    def update_paths(self, paths: Iterable[str], progress: ProgressFn | None = None) -> IndexReport:
        """Re-index just these kiln-relative paths (changed, new or deleted notes)."""
        if self.needs_rebuild:
            return self.update(progress)
        with self._writing():
            report = IndexReport()
            self._update(self.expand_paths(paths), report, progress, full=False)
            return report

    def expand_paths(self, paths: Iterable[str]) -> list[str]:
        """Notes named, plus those under a named folder: a folder created or moved in (its
        files may predate the watch on it) or deleted (its notes leave the index)."""
        out: set[str] = set()
        manifest: dict[str, NoteEntry] | None = None
        for rel in paths:
            rel = rel.strip("/")
            if not rel:
                continue
            if is_indexable(rel):
                out.add(rel)
                continue
            if any(part.startswith(".") or part in SKIP_DIRS for part in rel.split("/")):
                continue
            folder = self.root / rel
            if folder.is_dir() and not folder.is_symlink():
                out.update(iter_markdown(self.root, rel))
            if manifest is None:
                manifest = self.manifest()
            out.update(p for p in manifest if p.startswith(rel + "/"))
        return sorted(out)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One writer at a time: a thread lock here, a file lock against other processes."""
        with self._lock:
            lock_path = self.root / LOCK_FILE
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle: IO[str] = open(lock_path, "a+")  # noqa: SIM115 - held for the block
            try:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    raise IndexUnusableError(
                        "the index is being updated by another process",
                        f"wait for the other `cru` on this kiln to finish; if none is running: {REBUILD}",
                    ) from None
                yield
            finally:
                handle.close()  # releases the lock

    def _reset(self) -> None:
        with _store_errors(self.root, self.store, "rebuilding it"):
            _drop_collections(self.client, self.name, self.root, self.store)
            with self._lex_lock:
                self._lexical = None
                self._lex_generation = None
                self._lex_dirty = False
            self.needs_rebuild = None
            self._attach()

    def _update(
        self, paths: list[str], report: IndexReport, progress: ProgressFn | None, *, full: bool
    ) -> None:
        started = time.perf_counter()
        manifest = self.manifest()
        root = self.root
        pending: list[_Pending] = []
        gone: list[str] = []
        present: set[str] = set()

        for i, rel in enumerate(paths):
            if progress is not None:
                progress(IndexProgress("scan", i, len(paths), 0, 0, rel))
            path = root / rel
            if not full and (not is_indexable(rel) or not (path.exists() or path.is_symlink())):
                if rel in manifest:
                    gone.append(rel)
                continue
            report.notes_seen += 1
            entry = manifest.get(rel)
            try:
                fh: str | None = _file_hash(path)
            except OSError:
                fh = None  # read_note below says why
            if fh is not None and entry is not None and entry.file_hash == fh:
                present.add(rel)
                report.notes_unchanged += 1
                if entry.problems:
                    report.degraded.append((rel, entry.problems))
                continue
            try:
                note = read_note(root, rel)
            except CrucibleError as exc:  # NoteReadError, or a KilnPathError for a bad link
                report.skipped.append((rel, _reason(exc, rel)))
                if entry is not None:
                    gone.append(rel)
                continue
            present.add(rel)
            problems = "; ".join(note.problems)
            if problems:
                report.degraded.append((rel, problems))
            # A chunk's text starts with "Title > Heading": it is embedded as it is.
            chunks = chunk_note(note)
            pending.append(
                _Pending(note, fh or note.content_hash, problems, chunks, [c.text for c in chunks],
                         [c.content_hash for c in chunks], [None] * len(chunks), set())
            )

        if full:
            gone.extend(p for p in manifest if p not in present and p not in gone)
        if not pending and not gone:
            report.elapsed = time.perf_counter() - started
            return

        self._prepare_lexical(full)
        with _store_errors(root, self.store, "updating it"):
            # Also for notes not in the manifest: an update interrupted before it wrote their
            # note rows left chunk rows whose vectors are still good.
            self._reuse_vectors(pending)
            self._write(pending, report, progress, len(paths))
            self._remove(gone)
            generation = uuid.uuid4().hex
            self._notes.modify(metadata={**self._identity(), "generation": generation})
        with self._lex_lock:
            if self._lexical is not None:
                self._lex_generation = generation
                self._lex_dirty = True
        report.notes_removed = len(gone)
        report.notes_indexed = len(pending)
        report.elapsed = time.perf_counter() - started

    def _prepare_lexical(self, full: bool) -> None:
        """Before writing: the in-memory BM25 index must match the store to be patched along;
        a full update also brings a saved one up to date (so `cru kiln index` keeps it fresh)."""
        with self._lex_lock:
            generation = self._remote_generation()
            if self._lexical is not None and self._lex_generation != generation:
                self._lexical = None  # another process changed the index: rebuilt when needed
            elif self._lexical is None and full:
                loaded = self._load_lexical(generation)
                if loaded is not None:
                    self._lexical, self._lex_generation = loaded, generation

    def _reuse_vectors(self, pending: list[_Pending]) -> None:
        """Keep the stored vectors of chunks whose text did not change; note the old chunk ids."""
        for start in range(0, len(pending), 50):
            group = pending[start:start + 50]
            by_path = {p.note.path: p for p in group}
            got = self._chunks.get(
                where={"path": {"$in": list(by_path)}}, include=["metadatas", "embeddings"]
            )
            old: dict[str, dict[str, np.ndarray]] = {}
            for id_, meta, emb in zip(got["ids"], got["metadatas"], got["embeddings"], strict=True):
                path = str(meta["path"])
                by_path[path].old_ids.add(id_)
                old.setdefault(path, {})[str(meta.get("hash"))] = np.asarray(emb, dtype=np.float32)
            for path, p in by_path.items():
                vectors = old.get(path, {})
                p.vectors = [vectors.get(h) for h in p.hashes]

    def _write(
        self, pending: list[_Pending], report: IndexReport, progress: ProgressFn | None,
        notes_total: int,
    ) -> None:
        """Embed what is new, then write note by note: chunk rows first, the note row last, so
        an interrupted update leaves a note either fully updated or still marked stale."""
        to_embed = sum(v is None for p in pending for v in p.vectors)
        done = 0
        queue: list[_Pending] = []
        queued = 0

        def flush() -> None:
            nonlocal done, queued
            work = [(p, i) for p in queue for i, v in enumerate(p.vectors) if v is None]
            for s in range(0, len(work), EMBED_STEP):
                step = work[s:s + EMBED_STEP]
                vectors = self.embedder.embed([p.texts[i] for p, i in step])
                for (p, i), v in zip(step, vectors, strict=True):
                    p.vectors[i] = v
                done += len(step)
                if progress is not None:
                    progress(IndexProgress("embed", notes_total, notes_total, done, to_embed,
                                           step[-1][0].note.path))
            report.chunks_embedded += len(work)
            report.chunks_reused += sum(len(p.chunks) for p in queue) - len(work)
            self._store_notes(queue)
            queue.clear()
            queued = 0

        for p in pending:
            queue.append(p)
            queued += sum(v is None for v in p.vectors)
            if queued >= 4 * EMBED_STEP:
                flush()
        if queue:
            flush()

    def _store_notes(self, group: list[_Pending]) -> None:
        ids: list[str] = []
        embeddings: list[np.ndarray] = []
        documents: list[str] = []
        metadatas: list[dict[str, Any]] = []
        stale: list[str] = []
        note_rows: list[tuple[str, np.ndarray, dict[str, Any]]] = []
        for p in group:
            path = p.note.path
            new_ids = []
            for c, h, v in zip(p.chunks, p.hashes, p.vectors, strict=True):
                assert v is not None
                new_ids.append(c.id)
                ids.append(c.id)
                embeddings.append(v)
                documents.append(c.text)
                metadatas.append({
                    "path": path, "ordinal": c.ordinal, "heading": _heading(c), "line": c.start_line + 1,
                    "hash": h, "title": p.note.title,
                })
            stale.extend(p.old_ids - set(new_ids))
            # chunk_note gives every note at least one chunk (its title when the body is empty)
            vec = _unit(np.mean(np.stack([v for v in p.vectors if v is not None]), axis=0))
            note_rows.append((path, vec, {
                "path": path, "hash": p.file_hash, "title": p.note.title, "chunks": len(p.chunks),
                "problems": p.problems,
            }))
        for s in range(0, len(ids), PAGE):
            self._chunks.upsert(
                ids=ids[s:s + PAGE], embeddings=embeddings[s:s + PAGE],
                documents=documents[s:s + PAGE], metadatas=metadatas[s:s + PAGE],
            )
        if stale:
            self._chunks.delete(ids=stale)
        self._notes.upsert(
            ids=[r[0] for r in note_rows], embeddings=[r[1] for r in note_rows],
            documents=[str(r[2]["title"]) for r in note_rows], metadatas=[r[2] for r in note_rows],
        )
        with self._lex_lock:
            if self._lexical is not None:
                for p in group:
                    self._lexical.set_note(p.note.path, p.note.title, p.texts)

    def _remove(self, paths: list[str]) -> None:
        for s in range(0, len(paths), 100):
            group = paths[s:s + 100]
            self._chunks.delete(where={"path": {"$in": group}})
            self._notes.delete(ids=group)
        with self._lex_lock:
            if self._lexical is not None:
                for p in paths:
                    self._lexical.drop_note(p)

    # -- reading -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.needs_rebuild:
            raise IndexUnusableError(f"the index cannot be searched: {self.needs_rebuild}", "cru kiln index")

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self.embedder.embed([text])[0], dtype=np.float32)

    # Queries ask Chroma for ids and distances only: fetching metadata costs ~0.1 ms a row,
    # so rows are read just for the few results shown (chunks_by_id).

    def query_chunks(self, vector: np.ndarray, k: int) -> list[tuple[str, str, float]]:
        """The k chunks nearest to `vector`, best first: (chunk id, note path, cosine similarity)."""
        res = self._query(self._chunks, vector, k)
        return [(i, chunk_path(i), s) for i, s in res]

    def query_notes(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k notes whose note vector is nearest: (path, cosine similarity), best first."""
        return self._query(self._notes, vector, k)

    def _query(self, collection: Any, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        self._check_usable()
        with _store_errors(self.root, self.store, "searching it"):
            res = collection.query(query_embeddings=[vector], n_results=k, include=["distances"])
        return [(i, 1.0 - float(d)) for i, d in zip(res["ids"][0], res["distances"][0], strict=True)]

    def chunks_by_id(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        if not ids:
            return {}
        with _store_errors(self.root, self.store, "reading it"):
            got = self._chunks.get(ids=list(ids), include=["metadatas", "documents"])
        return {
            i: _stored(m, d, 0.0)
            for i, m, d in zip(got["ids"], got["metadatas"], got["documents"], strict=True)
        }

    def note_vectors(self, paths: Sequence[str]) -> dict[str, np.ndarray]:
        if not paths:
            return {}
        with _store_errors(self.root, self.store, "reading it"):
            got = self._notes.get(ids=list(paths), include=["embeddings"])
        return {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"], strict=True)}

    def note_chunks(self, paths: Sequence[str], *, embeddings: bool = False) -> dict[str, list[StoredChunk]]:
        """The stored chunks of these notes, in order."""
        out: dict[str, list[StoredChunk]] = {p: [] for p in paths}
        if not paths:
            return out
        include = ["metadatas", "documents"] + (["embeddings"] if embeddings else [])
        with _store_errors(self.root, self.store, "reading it"):
            got = self._chunks.get(where={"path": {"$in": list(paths)}}, include=include)
        embs = got["embeddings"] if embeddings else [None] * len(got["ids"])
        for m, d, e in zip(got["metadatas"], got["documents"], embs, strict=True):
            c = _stored(m, d, 0.0)
            if e is not None:
                c.embedding = np.asarray(e, dtype=np.float32)
            out[c.path].append(c)
        for chunks in out.values():
            chunks.sort(key=lambda c: c.ordinal)
        return out

    def warm_lexical(self) -> None:
        """Load or build the BM25 index now, and save it, so the first search is quick."""
        with self._lex_lock:
            lex = self._lexical_index()
            if self._lex_dirty and self._lex_generation is not None:
                self._save_lexical(lex, self._lex_generation)

    def lexical_search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """Notes by BM25: (path, score), best first."""
        with self._lex_lock:
            return self._lexical_index().search(query, limit)

    def lexical_best_chunk(self, path: str, query: str) -> StoredChunk | None:
        """The note's chunk with the most weight of the query's words (its first if none)."""
        chunks = self.note_chunks([path])[path]
        if not chunks:
            return None
        terms = set(tokenize(query))
        with self._lex_lock:
            bm25 = self._lexical_index().bm25
            idf = {t: bm25.idf(t) for t in terms}
        best, best_score = chunks[0], 0.0
        for c in chunks:
            counts = Counter(tokenize(c.text))
            score = sum(idf[t] * counts[t] / (counts[t] + 1.2) for t in terms if t in counts)
            if score > best_score:
                best, best_score = c, score
        return best

    # The in-memory BM25 index follows the store's generation, a token that every update
    # changes: another process's update (`cru kiln index` beside a session) is seen at the
    # next search, and the index saved under .crucible/ is used only if it is of this state.

    def _lex_tag(self, generation: str) -> str:
        return f"{self._notes.id}:{generation}"

    def _lex_file(self) -> Path:
        return self.root / RESERVED_DIR / f"lexical-{self.name}.json"

    def _remote_generation(self) -> str:
        with _store_errors(self.root, self.store, "reading it"):
            meta = self.client.get_collection(f"{self.name}-notes", embedding_function=None).metadata
        return str((meta or {}).get("generation", ""))

    def _lexical_index(self) -> LexicalIndex:
        with self._lex_lock:
            generation = self._remote_generation()
            if self._lexical is None or self._lex_generation != generation:
                self._lexical = self._load_lexical(generation) or self._build_lexical(generation)
                self._lex_generation = generation
            return self._lexical

    def _load_lexical(self, generation: str) -> LexicalIndex | None:
        try:
            data = json.loads(self._lex_file().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return LexicalIndex.from_json(data, self._lex_tag(generation))

    def _build_lexical(self, generation: str) -> LexicalIndex:
        texts: dict[str, list[tuple[int, str]]] = {}
        titles: dict[str, str] = {}
        with _store_errors(self.root, self.store, "reading it"):
            for _, metas, docs in _pages(self._chunks, include=["metadatas", "documents"]):
                for m, d in zip(metas, docs, strict=True):
                    texts.setdefault(str(m["path"]), []).append((int(m.get("ordinal", 0)), str(d or "")))
            for ids, metas, _ in _pages(self._notes, include=["metadatas"]):
                for id_, m in zip(ids, metas, strict=True):
                    titles[id_] = str(m.get("title", ""))
        lex = LexicalIndex()
        for path, title in titles.items():
            lex.set_note(path, title, [t for _, t in sorted(texts.get(path, []))])
        self._save_lexical(lex, generation)
        return lex

    def _save_lexical(self, lex: LexicalIndex, generation: str) -> None:
        try:
            self._lex_file().parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self._lex_file(), json.dumps(lex.to_json(self._lex_tag(generation))))
            self._lex_dirty = False
        except OSError as exc:  # a read-only kiln still searches; it rebuilds next time
            log.warning("could not save the lexical index: %s", exc.strerror or exc)


# ---------------------------------------------------------------------------------------------
# Helpers


_COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,58}[A-Za-z0-9]")


def _suggest(name: str) -> str:
    """A valid collection name made from `name` (a kiln folder name, say)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:50]
    return f"kiln-{clean}" if clean else "kiln-notes"


def chunk_path(chunk_id: str) -> str:
    """The note path of a chunk id ("path#ordinal", see chunking.Chunk.id)."""
    return chunk_id.rpartition("#")[0]


def _stored(meta: Any, doc: Any, score: float) -> StoredChunk:
    return StoredChunk(
        path=str(meta["path"]), ordinal=int(meta.get("ordinal", 0)),
        heading=str(meta.get("heading") or "") or None, line=int(meta.get("line", 1)),
        title=str(meta.get("title", "")), text=str(doc or ""), score=score,
    )


def _pages(collection: Any, include: list[str]) -> Iterator[tuple[list[str], list[Any], list[Any]]]:
    offset = 0
    while True:
        got = collection.get(include=include, limit=PAGE, offset=offset)
        ids = got["ids"]
        if not ids:
            return
        metas = got.get("metadatas") or [None] * len(ids)
        docs = got.get("documents") or [None] * len(ids)
        yield ids, metas, docs
        if len(ids) < PAGE:
            return
        offset += len(ids)


def _file_hash(path: Path) -> str:
    """Hash of the file's bytes; a file over the note size cap is not read (read_note says why)."""
    size = path.stat().st_size
    if size > MAX_NOTE_BYTES:
        return f"size:{size}"
    return content_hash(path.read_bytes())


def _readable_note(path: Path, rel: str) -> bool:
    """Whether an update would index this file (not too large, binary or undecodable)."""
    if path.stat().st_size > MAX_NOTE_BYTES:
        return False
    try:
        decode_note_bytes(path.read_bytes(), rel)
    except NoteReadError:
        return False
    return True


def _reason(exc: CrucibleError, rel: str) -> str:
    """The error's message without its leading "path: " (the report shows the path)."""
    message = exc.message
    return message[len(rel) + 2:] if message.startswith(f"{rel}: ") else message


def is_indexable(rel: str) -> bool:
    """Whether the kiln listing would include this path (a .md note outside dot-folders)."""
    parts = rel.split("/")
    return rel.lower().endswith(".md") and not any(p.startswith(".") or p in SKIP_DIRS for p in parts)


def _http_client(url: str) -> Any:
    import chromadb
    from chromadb.config import Settings

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CrucibleError(
            f"[index] url {url!r} is not an http(s) URL",
            "set it like url = \"http://127.0.0.1:8000\", or remove it for the built-in store",
        )
    try:
        return chromadb.HttpClient(
            host=parts.hostname, port=parts.port or (443 if parts.scheme == "https" else 8000),
            ssl=parts.scheme == "https", settings=Settings(anonymized_telemetry=False),
        )
    except Exception as exc:  # noqa: BLE001 - connection errors come in several types
        raise CrucibleError(
            f"cannot reach the Chroma server at {url} ({type(exc).__name__})",
            "start it (`chroma run --host 127.0.0.1 --port N`) or remove `url` from [index] "
            "in the config to use the store inside the kiln",
        ) from exc


def _persistent_client(path: Path, root: Path) -> Any:
    import chromadb
    from chromadb.config import Settings

    with _store_errors(root, STORE_DIR, "opening it"):
        return chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))


def _wipe_local(path: Path) -> None:
    from chromadb.api.shared_system_client import SharedSystemClient

    # Chroma caches one system per store path in the process: drop ours before deleting it.
    system = SharedSystemClient._identifier_to_system.pop(str(path), None)
    SharedSystemClient._identifier_to_refcount.pop(str(path), None)
    if system is not None:
        try:
            system.stop()
        except Exception:  # noqa: BLE001 - a damaged store may not even stop cleanly
            pass
    if path.exists():
        shutil.rmtree(path)


def _drop_collections(client: Any, name: str, root: Path, store: str) -> None:
    with _store_errors(root, store, "rebuilding it"):
        existing = {getattr(c, "name", c) for c in client.list_collections()}
        for n in (name, f"{name}-notes"):
            if n in existing:
                client.delete_collection(n)
