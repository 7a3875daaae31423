"""One kiln's search index: keeps the vector store (`store.ChromaStore`) and the lexical index
(`lexical.LexicalIndex`) in step with the notes on disk.

An update reads and chunks the notes that changed, embeds only the chunks whose text is new
(the vectors of unchanged chunks are kept), writes them to the store note by note, and patches
the lexical index along. The lexical index is rebuilt from the store's chunk rows when it is
missing and then kept current by every update, so it can never disagree with the store.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text, content_hash
from crucible.kiln.chunking import Chunk, chunk_note
from crucible.kiln.embedder import Embedder, make_embedder
from crucible.kiln.lexical import LexicalIndex, tokenize
from crucible.kiln.notes import MAX_NOTE_BYTES, Note, NoteReadError, decode_note_bytes, read_note
from crucible.kiln.paths import RESERVED_DIR, SKIP_DIRS, iter_markdown
from crucible.kiln.store import (
    REBUILD,
    STORE_DIR,
    ChromaStore,
    ChunkRow,
    IndexUnusableError,
    NoteEntry,
    NoteRow,
    StoredChunk,
)

log = logging.getLogger(__name__)

LOCK_FILE = f"{RESERVED_DIR}/index.lock"
# Texts per embedder call: small enough for a lively progress bar, big enough to batch well.
EMBED_STEP = 32

__all__ = ["LOCK_FILE", "REBUILD", "STORE_DIR", "IndexProgress", "IndexReport", "IndexStatus", "KilnIndex"]


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

    def __init__(self, root: Path, config: Config, chroma: ChromaStore) -> None:
        self.root = root
        self.config = config
        self.chroma = chroma
        self.embedder: Embedder = chroma.embedder
        self.store = chroma.label  # for messages: kiln-relative dir or the server URL
        self.name = chroma.name
        self._lock = threading.RLock()  # one writer at a time (see _writing)
        self._lexical: LexicalIndex | None = None
        # Guards the in-memory BM25 index alone, so searches never wait for a long update.
        self._lex_lock = threading.RLock()
        self._lex_generation: str | None = None  # the store generation _lexical matches
        self._lex_dirty = False  # changed since saved

    @classmethod
    def open(cls, root: Path, config: Config, *, rebuild: bool = False) -> KilnIndex:
        """Open (or create) the kiln's index. `rebuild=True` first throws the stored index
        away — the way out of a damaged local store, which cannot even be opened."""
        root = Path(root).resolve()
        embedder = make_embedder(config.embedder)
        return cls(root, config, ChromaStore.open(root, config, embedder, rebuild=rebuild))

    @property
    def needs_rebuild(self) -> str | None:
        return self.chroma.needs_rebuild

    def close(self) -> None:
        with self._lex_lock:
            if self._lex_dirty and self._lexical is not None and self._lex_generation is not None:
                self._save_lexical(self._lexical, self._lex_generation)
        self.chroma.close()

    def __enter__(self) -> KilnIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what is stored ----------------------------------------------------------------------

    def manifest(self) -> dict[str, NoteEntry]:
        """Every indexed note: path -> what the index knows of it."""
        return self.chroma.manifest()

    @property
    def chunk_collection(self) -> Any:
        """The Chroma collection of chunk rows (for benchmarks comparing against raw queries)."""
        return self.chroma.chunks

    def count_notes(self) -> int:
        return self.chroma.count_notes()

    def count_chunks(self) -> int:
        return self.chroma.count_chunks()

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
        return IndexStatus(
            store=self.store, collection=self.name, embedder=self.chroma.built_with(),
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
        self.chroma.reset()
        with self._lex_lock:
            self._lexical = None
            self._lex_generation = None
            self._lex_dirty = False

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
        # Also for notes not in the manifest: an update interrupted before it wrote their
        # note rows left chunk rows whose vectors are still good.
        self._reuse_vectors(pending)
        self._write(pending, report, progress, len(paths))
        self._remove(gone)
        generation = self.chroma.new_generation()
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
            generation = self.chroma.generation()
            if self._lexical is not None and self._lex_generation != generation:
                self._lexical = None  # another process changed the index: rebuilt when needed
            elif self._lexical is None and full:
                loaded = self._load_lexical(generation)
                if loaded is not None:
                    self._lexical, self._lex_generation = loaded, generation

    def _reuse_vectors(self, pending: list[_Pending]) -> None:
        """Keep the stored vectors of chunks whose text did not change; note the old chunk ids."""
        stored = self.chroma.stored_vectors([p.note.path for p in pending])
        for p in pending:
            ids, vectors = stored.get(p.note.path, (set(), {}))
            p.old_ids = set(ids)
            p.vectors = [vectors.get(h) for h in p.hashes]

    def _write(
        self, pending: list[_Pending], report: IndexReport, progress: ProgressFn | None,
        notes_total: int,
    ) -> None:
        """Embed what is new, then write a group of notes at a time (see ChromaStore.write)."""
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
        chunk_rows: list[ChunkRow] = []
        stale: list[str] = []
        note_rows: list[NoteRow] = []
        for p in group:
            path = p.note.path
            new_ids = []
            for c, h, v in zip(p.chunks, p.hashes, p.vectors, strict=True):
                assert v is not None
                new_ids.append(c.id)
                chunk_rows.append(ChunkRow(c.id, v, c.text, {
                    "path": path, "ordinal": c.ordinal, "heading": _heading(c), "line": c.start_line + 1,
                    "hash": h, "title": p.note.title,
                }))
            stale.extend(p.old_ids - set(new_ids))
            # chunk_note gives every note at least one chunk (its title when the body is empty)
            vec = _unit(np.mean(np.stack([v for v in p.vectors if v is not None]), axis=0))
            note_rows.append(NoteRow(path, vec, {
                "path": path, "hash": p.file_hash, "title": p.note.title, "chunks": len(p.chunks),
                "problems": p.problems,
            }))
        self.chroma.write(chunk_rows, stale, note_rows)
        with self._lex_lock:
            if self._lexical is not None:
                for p in group:
                    self._lexical.set_note(p.note.path, p.note.title, p.texts)

    def _remove(self, paths: list[str]) -> None:
        self.chroma.remove(paths)
        with self._lex_lock:
            if self._lexical is not None:
                for p in paths:
                    self._lexical.drop_note(p)

    # -- reading -----------------------------------------------------------------------------

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self.embedder.embed([text])[0], dtype=np.float32)

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
        chunks = self.chroma.note_chunks([path])[path]
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
        return f"{self.chroma.notes.id}:{generation}"

    def _lex_file(self) -> Path:
        return self.root / RESERVED_DIR / f"lexical-{self.name}.json"

    def _lexical_index(self) -> LexicalIndex:
        with self._lex_lock:
            generation = self.chroma.generation()
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
        texts = self.chroma.chunk_texts()
        lex = LexicalIndex()
        for path, entry in self.chroma.manifest().items():
            lex.set_note(path, entry.title, [t for _, t in sorted(texts.get(path, []))])
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
