"""One kiln's search index: the lexical index (`lexical.LexicalIndex`, read from the files, ready
in seconds) and the vector store (`store.ChromaStore`, filled by embedding, which takes minutes
on a large kiln), kept in step with the notes on disk.

An update compares each note's file with what the store holds (its stamp, then its hash),
then streams the changed notes through three stages — read and chunk, embed, write — a group
of notes at a time, so only the embedding is on the critical path and an update interrupted
anywhere (kill -9 included) keeps everything written so far: a note's row is written after its
chunks, and the next update re-embeds only chunks whose text is not stored yet.

One writer per kiln: `WriterLock`, a file lock that other processes wait on (or read around,
`writer_status`), with a status file telling them how far the writer is.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, Field

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_bytes, atomic_write_text, content_hash
from crucible.kiln.chunking import Chunk, chunk_note
from crucible.kiln.embedder import Embedder, make_embedder
from crucible.kiln.late_interaction import (
    MAX_CHUNKS_SCORED,
    TokenStore,
    maxsim_notes,
    tokens_file,
)
from crucible.kiln.lexical import LexicalIndex, lexical_file, load_lexical, words_problem
from crucible.kiln.notes import MAX_NOTE_BYTES, Note, NoteReadError, decode_note_bytes, read_note
from crucible.kiln.paths import (
    SKIP_DIRS,
    KilnPathError,
    NotRegularFileError,
    iter_markdown,
    open_to_read,
    reserved_dir,
)
from crucible.kiln.store import (
    REBUILD,
    STORE_DIR,
    ChromaStore,
    ChunkRow,
    IndexUnusableError,
    NoteEntry,
    NoteRow,
    StaleViewError,
)
from crucible.kiln.writer_status import (
    LOCK_FILE,
    STATUS_FILE,
    build_status,
    other_cru,
    read_status,
    stopped,
)
from crucible.private_files import FILE_MODE

log = logging.getLogger(__name__)

# Texts per embedder call: the embedder sorts them by length, so a wide window pads less
# (measured: 256-512 texts embed ~25% faster than 32); still a progress step every few seconds.
EMBED_STEP = 256
# Notes read, embedded and written together (the unit of the pipeline and of resumption). An
# embedded Chroma's write holds the GIL throughout and costs most per call, not per row: 128
# built 2,000 generated notes in 19.0 s against 21.4 s at 32 (`cru kiln index`), and a kill -9
# loses at most two groups' embeddings.
GROUP_NOTES = 128
# A small update still comes in steps: at least PROGRESS_STEPS groups (of MIN_GROUP_NOTES notes
# or more), so the share embedded that the status bar and the searches show goes up while it
# runs; the sample kiln's 122 notes were one group, shown at 0% until the end.
PROGRESS_STEPS = 8
MIN_GROUP_NOTES = 16
# During a long update, how often the store's generation changes (other processes follow it).
GENERATION_EVERY = 10.0
# How often the writer updates its status file.
STATUS_EVERY = 0.5
# Before the last try of a read that failed beside another process's writes (they land meanwhile).
STALE_RETRY_PAUSE = 0.2

__all__ = [
    "LOCK_FILE", "REBUILD", "STATUS_FILE", "STORE_DIR", "IndexProgress", "IndexReport",
    "IndexStatus", "KilnIndex", "WriterLock", "build_status", "other_cru",
]


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class IndexProgress:
    """Where an update is: `scan` compares the notes with the store, `embed` reads, embeds and
    writes the changed ones (`notes_*` count those; `chunks_total` grows as they are read)."""

    phase: Literal["scan", "embed"]
    notes_done: int
    notes_total: int
    chunks_done: int
    chunks_total: int
    path: str | None = None


ProgressFn = Callable[[IndexProgress], None]
# Called while another process holds the writer lock, with its status; False stops waiting.
WaitFn = Callable[[dict[str, Any] | None], bool]
T = TypeVar("T")


class IndexReport(BaseModel):
    notes_seen: int = 0
    notes_indexed: int = 0
    notes_unchanged: int = 0
    notes_removed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0  # unchanged chunks of a changed note: vector kept, not re-embedded
    elapsed: float = 0.0
    rebuilt: str | None = None  # why the whole index was rebuilt, when it was
    stopped: bool = False  # stopped before the end (asked to); what was written stays
    skipped: list[tuple[str, str]] = Field(default_factory=list)  # (path, reason): not indexed
    degraded: list[tuple[str, str]] = Field(default_factory=list)  # (path, reason): indexed anyway

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"skipped", "degraded", "stopped"})
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
    # Notes whose word pieces are kept (late_interaction) and the store's size; None: not kept.
    word_pieces: int | None = None
    word_pieces_bytes: int = 0
    # Why the word pieces cannot be kept or read (a link where their store is), with its fix.
    word_pieces_problem: str | None = None


# ---------------------------------------------------------------------------------------------
# One writer per kiln


class IndexBusyError(IndexUnusableError):
    """Another process holds the writer lock."""


class WriterLock:
    """The kiln's writer lock (flock on .crucible/index.lock), and the status file its holder
    keeps (.crucible/index-build.json: pid, the cru it works for, and progress) for the
    processes waiting on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._handle: IO[str] | None = None
        self._published = 0.0
        self.cru_pid = os.getpid()  # the index worker: its session's cru (see KilnIndex.working_for)

    def acquire(self, wait: WaitFn | None = None) -> None:
        """Take the lock. Held by another process: without `wait`, an IndexUnusableError;
        with it, poll every half second, calling `wait(status)`, until free or it says stop."""
        lock_path = self.root / LOCK_FILE
        reserved_dir(self.root)
        # the person's files are 0600 (the lock is empty, but a new file says nothing to others)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
        handle: IO[str] = os.fdopen(fd, "a+")  # held until release()
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise
            if wait is None or not wait(read_status(self.root)):
                handle.close()
                raise IndexBusyError(
                    "the index is being updated by another process",
                    f"wait for the other `cru` on this kiln to finish; if none is running: {REBUILD}",
                )
            time.sleep(0.5)
        self._handle = handle
        try:  # a holder killed before its release left its status: it is not this one's
            (self.root / STATUS_FILE).unlink(missing_ok=True)
        except OSError:
            pass

    def publish(self, status: dict[str, Any], *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._published < STATUS_EVERY:
            return
        self._published = now
        try:
            atomic_write_text(self.root / STATUS_FILE, json.dumps({"pid": os.getpid(), "cru": self.cru_pid, **status}),
                              new_file_mode=FILE_MODE)
        except OSError:
            pass  # a read-only .crucible: the others just see no progress

    @property
    def held(self) -> bool:
        """This process holds the lock (an update of its own is running)."""
        return self._handle is not None

    def release(self) -> None:
        if self._handle is None:
            return
        try:
            (self.root / STATUS_FILE).unlink(missing_ok=True)
        except OSError:
            pass
        self._handle.close()  # releases the lock
        self._handle = None


# ---------------------------------------------------------------------------------------------
# The index


def _heading(chunk: Chunk) -> str:
    return " > ".join(chunk.heading_path)


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}:{st.st_size}"


@dataclass
class _Todo:
    """A note to (re)index, as the scan found it."""

    path: str
    file_hash: str | None
    stamp: str
    entry: NoteEntry | None


@dataclass
class _Pending:
    """A changed note between reading and writing."""

    note: Note
    file_hash: str
    stamp: str
    problems: str
    chunks: list[Chunk]
    texts: list[str]  # what is embedded, one per chunk
    hashes: list[str]
    vectors: list[np.ndarray | None]  # reused vectors, None = to embed
    old_ids: set[str]


class KilnIndex:
    """One kiln's index. Every method blocks: call from trio via `trio.to_thread.run_sync`.
    Safe to share between threads (the watcher and a background update write while tools
    search)."""

    def __init__(self, root: Path, config: Config, chroma: ChromaStore) -> None:
        self.root = root
        self.config = config
        self.chroma = chroma
        self.embedder: Embedder = chroma.embedder
        self.store = chroma.label  # for messages: kiln-relative dir or the server URL
        self.name = chroma.name
        self._lock = threading.RLock()  # one writer in this process (see _writing)
        self._writer = WriterLock(root)
        # Guards the lexical index and what is known embedded, so searches never wait for
        # a long update.
        self._lex_lock = threading.RLock()
        self._lexical: LexicalIndex | None = None
        self._lex_dirty = False  # changed since saved
        self._embedded: set[str] | None = None  # notes whose stored row matches their file
        self._own_generations: set[str] = set()
        self._seen_generation: str | None = None
        self._others_wrote = False  # another process wrote to the store since this one opened it
        self._stale_view = False  # another process wrote since the store was opened last
        self._in_reading = threading.local()  # a read inside `reading` is retried by it, once
        self._queued: set[str] = set()  # changed while an update ran here: indexed after it
        self._pieces = TokenStore(tokens_file(root, self.name))

    @classmethod
    def open(
        cls, root: Path, config: Config, *, rebuild: bool = False,
        lexical: tuple[LexicalIndex, bool, threading.RLock] | None = None,
    ) -> KilnIndex:
        """Open (or create) the kiln's index. `rebuild=True` first throws the stored index
        away — the way out of a damaged local store, which cannot even be opened. `lexical`:
        the kiln's lexical index already loaded (`lexical.load_lexical`: the index, whether it
        differs from what is saved) and the lock its other readers take."""
        root = Path(root).resolve()
        embedder = make_embedder(config.embedder)
        index = cls(root, config, ChromaStore.open(root, config, embedder, rebuild=rebuild))
        index._seen_generation = index.chroma.generation()
        if lexical is not None:
            index._lexical, index._lex_dirty, index._lex_lock = lexical
        return index

    @property
    def tokens(self) -> TokenStore | None:
        """The chunks' word-piece bits (late_interaction), where the embedder gives word pieces
        (the built-in model; not a server's, nor a test's stand-in)."""
        if not self.config.index.word_pieces:
            return None
        return self._pieces if hasattr(self.embedder, "embed_with_tokens") else None

    @property
    def needs_rebuild(self) -> str | None:
        return self.chroma.needs_rebuild

    def close(self) -> None:
        self.save_lexical()
        self.chroma.close()
        self._pieces.close()

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
                if entry is not None and entry.file_hash == _file_hash(self.root / rel, rel):
                    continue
                if entry is None and not _readable_note(self.root / rel, rel):
                    continue  # skipped by every update: not waiting to be indexed
            except (OSError, NotRegularFileError):
                continue
            stale += 1
        stale += len(set(manifest) - seen)
        pieces, size, problem = None, 0, None
        if self.tokens is not None:
            path = self.tokens.path
            if (linked := self.tokens.linked()) is not None:
                pieces, problem = 0, f"{linked.message} (fix: {linked.fix})"
            else:
                # Not made here when absent (an index of an older version): that is 0 notes.
                pieces = len(self.tokens.known_notes() or ()) if path.exists() else 0
                size = sum(f.stat().st_size for f in (path, path.with_name(path.name + "-wal")) if f.exists())
        return IndexStatus(
            store=self.store, collection=self.name, embedder=self.chroma.built_with(),
            notes=len(manifest), chunks=self.count_chunks(), stale=stale,
            needs_rebuild=self.needs_rebuild, word_pieces=pieces, word_pieces_bytes=size,
            word_pieces_problem=problem,
        )

    def working_for(self, cru_pid: int) -> None:
        """This process updates the index for another `cru` (its index worker): the others
        are told that one's pid."""
        self._writer.cru_pid = cru_pid

    def has_queued(self) -> bool:
        """Changed notes wait for their vectors: `update_paths` found this process's lock taken
        (an update, or a search opening the store again) and left them to its holder."""
        return bool(self._queued)

    def writing_here(self) -> bool:
        """An update of this process holds the kiln's writer lock."""
        return self._writer.held

    def embedded_share(self) -> tuple[int, int]:
        """(notes whose vectors are stored and current, readable notes in the kiln)."""
        with self._lex_lock:
            lex = self.lexical()
            if self._embedded is None:
                self._embedded = self._current_in_store(lex)
            return len(self._embedded & lex.stamps.keys()), len(lex)

    def embedded_paths(self) -> frozenset[str]:
        """The notes whose vectors are stored and current."""
        with self._lex_lock:
            lex = self.lexical()
            if self._embedded is None:
                self._embedded = self._current_in_store(lex)
            return frozenset(self._embedded)

    def current_on_disk(self, paths: Sequence[str]) -> set[str]:
        """Those of `paths` whose stored rows are of the file as it is now (a stat each, and one
        read of their rows): their stored chunks can stand for the file."""
        stamps = self.chroma.note_stamps(paths)
        out = set()
        for path, stamp in stamps.items():
            try:
                if stamp and stamp == _stamp((self.root / path).stat()):
                    out.add(path)
            except OSError:
                pass
        return out

    def _current_in_store(self, lex: LexicalIndex) -> set[str]:
        stamps = {p: f"{m}:{s}" for p, (m, s) in lex.stamps.items()}
        manifest = self.reading(self.manifest)  # read beside the index worker's writes too
        return {p for p, e in manifest.items() if e.stamp and stamps.get(p) == e.stamp}

    # -- following other processes -------------------------------------------------------------

    def follow_store(self, *, writer_killed: bool = False) -> None:
        """Catch up with another process's update (`cru kiln index` beside a session): the
        store's generation says whether one happened. Cheap when none did (one read).
        `writer_killed`: the writer stopped without a last generation (the index worker killed
        midway): read the store again all the same, for what it wrote since its last one."""
        if writer_killed:
            self._seen_generation = None
        try:
            generation = self.chroma.generation()
        except StaleViewError:
            raise  # `reading` opens the store again and retries
        except IndexUnusableError:
            # This process's view failed (the store damaged, or its files replaced under it by
            # another cru's rebuild, the fix): open it again when no one writes it, and read
            # once more; still failing, it is damaged. Else a session kept its broken view.
            if self.chroma.local is None or build_status(self.root) is not None or not self._reopen(False):
                raise
            generation = self.chroma.generation()
        if generation != self._seen_generation:
            self._seen_generation = generation
            if generation not in self._own_generations:
                self._stale_view = self._others_wrote = True
                with self._lex_lock:
                    if self._lexical is not None and self._lexical.refresh(self.root):
                        self._lex_dirty = True
                    self._embedded = None  # recomputed from the store when asked
        # Not while this process writes through it (then no other process can have written),
        # nor while the process writing it is stopped: opening it waits for that one to go on,
        # holding the GIL (the view stays stale; `reading` answers by words meanwhile).
        if self._stale_view and not (self.chroma.local is not None and stopped(build_status(self.root))):
            self._reopen(True)

    def _reopen(self, if_stale: bool) -> bool:
        """Open the store again (a view another process's writes left behind, or that failed),
        unless this process is writing through it (its lock held); `if_stale`: only while the
        view is still stale (another thread may have opened it meanwhile). False if not tried."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._stale_view or not if_stale:
                self.chroma.reopen()
                self._stale_view = False
        finally:
            self._lock.release()
        return True

    def _reading_here(self) -> bool:
        """This thread runs inside `reading` (which followed the store first)."""
        return bool(getattr(self._in_reading, "active", False))

    def reading(self, read: Callable[[], T], fallback: Callable[[], T] | None = None) -> T:
        """Run a search through the store, caught up with other processes' writes first. When
        Chroma cannot read another process's writes yet (StaleViewError: the index worker wrote
        since its last generation), open the store again and run it once more, then once more
        after a pause; if it still fails while another process is writing or has written since
        this one opened the store, `fallback` answers (the words: a search must not fail
        because the index is being built). When no process writes any more, once more first:
        the writer may have ended during the tries (its last generation not seen yet), and a
        view opened after it reads all it wrote. A store that still fails so with no other
        writer is reported (damaged). A `reading` inside another (the embedded notes, read by
        a hybrid search) is left to the outer one's tries."""
        if self._reading_here():
            return read()
        self._in_reading.active = True
        try:
            for attempt, pause in enumerate((0.0, 0.0, STALE_RETRY_PAUSE, 0.0)):
                if attempt == 3 and build_status(self.root) is not None:
                    break  # still being written: the words answer
                if pause:
                    time.sleep(pause)
                try:
                    self.follow_store()  # reads the generation: fails like the read itself
                    return read()
                except StaleViewError as exc:
                    failure = exc
                    self._stale_view = True  # opened again by the next follow_store
        finally:
            self._in_reading.active = False
        if fallback is None or not (self._others_wrote or build_status(self.root) is not None):
            raise failure
        log.info("the vector store could not be read while another process writes it (%s): "
                 "answering by words", failure.message)
        return fallback()

    # -- updating ----------------------------------------------------------------------------

    def update(
        self, progress: ProgressFn | None = None, rebuild: bool = False, *,
        wait: WaitFn | None = None, stop: threading.Event | None = None,
    ) -> IndexReport:
        """Bring the index up to date with the whole kiln; only what changed is embedded.
        `wait`: how to wait for another process's update (default: refuse at once);
        `stop`: set to stop between groups of notes (what was written stays)."""
        with self._writing(wait):
            report = IndexReport()
            reason = "asked for (--rebuild)" if rebuild else self.needs_rebuild
            if reason:
                self._reset()
                report.rebuilt = reason
            unfollowed: list[tuple[str, str]] = []
            paths = list(iter_markdown(self.root, unfollowed=unfollowed))
            report.skipped.extend(unfollowed)
            self._refresh_lexical(None)
            self._update(paths, report, progress, full=True, stop=stop)
            self._drain_queue(report, stop)
            self.save_lexical()
            return report

    def update_paths(self, paths: Iterable[str], progress: ProgressFn | None = None) -> IndexReport:
        """Re-index just these kiln-relative paths (changed, new or deleted notes). The lexical
        index has them at once; while an update runs in this process, their vectors are left
        to it (it takes them when it is done) instead of waiting for it."""
        if self.needs_rebuild:
            return self.update(progress)
        expanded = self.expand_paths(paths)
        self._refresh_lexical(expanded)
        self._queued.update(expanded)
        if not self._lock.acquire(blocking=False):
            return IndexReport()
        try:
            with self._writing():
                report = IndexReport()
                self._drain_queue(report, None)
                return report
        except IndexBusyError:  # another process updates the index: these wait for the next call
            return IndexReport()
        finally:
            self._lock.release()

    def _drain_queue(self, report: IndexReport, stop: threading.Event | None) -> None:
        while self._queued and not (stop is not None and stop.is_set()):
            queued = sorted(self._queued)
            self._queued.clear()
            self._update(queued, report, None, full=False, stop=stop)

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
    def _writing(self, wait: WaitFn | None = None) -> Iterator[None]:
        """One writer at a time: a thread lock here, the file lock against other processes."""
        with self._lock:
            self._writer.acquire(wait)
            try:
                # Another process may have written since this one last looked: open the store
                # again before writing through a stale view of it.
                self.follow_store()
                yield
            finally:
                self._writer.release()

    def _reset(self) -> None:
        self.chroma.reset()
        if self.tokens is not None:
            self.tokens.clear()
        with self._lex_lock:
            self._embedded = set()

    def _update(
        self, paths: list[str], report: IndexReport, progress: ProgressFn | None, *, full: bool,
        stop: threading.Event | None = None,
    ) -> None:
        started = time.perf_counter()
        manifest = self.manifest()
        root = self.root
        todo: list[_Todo] = []
        touched: list[tuple[NoteEntry, str]] = []
        gone: list[str] = []
        listed: set[str] = set()
        # Notes stored without their word pieces' record (late_interaction: the store lost, or a
        # write that failed) are gone through again, their chunks without pieces embedded (_prepare).
        known = self.tokens.known_notes() if full and manifest and self.tokens is not None else None

        for i, rel in enumerate(paths):
            if progress is not None:
                progress(IndexProgress("scan", i, len(paths), 0, 0, rel))
            path = root / rel
            if not full and (not is_indexable(rel) or not (path.exists() or path.is_symlink())):
                if rel in manifest:
                    gone.append(rel)
                continue
            listed.add(rel)
            report.notes_seen += 1
            entry = manifest.get(rel)
            try:
                stamp = _stamp(path.stat())
                unchanged = entry is not None and entry.stamp == stamp
                fh: str | None = None if unchanged else _file_hash(path, rel)
            except (OSError, NotRegularFileError):
                stamp, unchanged, fh = "", False, None  # read_note below says why
            if entry is not None and not unchanged and fh == entry.file_hash:
                touched.append((entry, stamp))  # same content, new stamp
                unchanged = True
            if unchanged and (known is None or rel in known):
                assert entry is not None
                report.notes_unchanged += 1
                if entry.problems:
                    report.degraded.append((rel, entry.problems))
                continue
            todo.append(_Todo(rel, fh, stamp, entry))

        if full:
            gone.extend(p for p in manifest if p not in listed and p not in gone)
            current = listed - {t.path for t in todo}
            with self._lex_lock:
                self._embedded = current
        if touched:
            self.chroma.set_stamps(touched)
            self._mark_embedded([e.path for e, _ in touched])
        if gone:
            self._remove(gone)
        if todo:
            self._write(todo, report, progress, stop)
        if touched or gone or report.notes_indexed:
            self._new_generation()
        report.notes_removed += len(gone)
        report.elapsed += time.perf_counter() - started

    def _new_generation(self) -> None:
        generation = self.chroma.new_generation()
        self._own_generations.add(generation)
        self._seen_generation = generation

    # The pipeline: group k+1 is read and chunked, and group k-1 written, in helper threads
    # while group k is embedded here; onnxruntime and OpenVINO release the GIL while they compute.

    def _write(
        self, todo: list[_Todo], report: IndexReport, progress: ProgressFn | None,
        stop: threading.Event | None,
    ) -> None:
        size = group_notes(len(todo))
        groups = [todo[i:i + size] for i in range(0, len(todo), size)]
        notes_done = notes_known = chunks_done = chunks_known = 0
        last_generation = time.monotonic()

        def publish(force: bool = False) -> None:
            self._writer.publish({"notes_done": notes_done, "notes_total": len(todo),
                                  "chunks_done": chunks_done, "embedded": self._share_now()}, force=force)

        def show(path: str | None) -> None:
            estimate = chunks_known + round(chunks_known / max(1, notes_known) * (len(todo) - notes_known))
            p = IndexProgress("embed", notes_done, len(todo), chunks_done, max(estimate, chunks_done), path)
            publish()
            if progress is not None:
                progress(p)

        # Said before the first embedding, which can take long (a slow embedder, a rebuild's
        # first group): the others show how far this is from the start.
        publish(force=True)
        # Nothing stored yet (a first build, a rebuild): no vectors to look up for reuse. Chroma
        # also failed a read ("Error creating hnsw segment reader: Nothing found on disk") made
        # while this build's first write created the vector segment (seen once in CI).
        stored = self.count_chunks() > 0
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kiln-index") as pool:
            preparing: Future[list[_Pending]] = pool.submit(self._prepare, groups[0], report, stored)
            writing: Future[None] | None = None
            for k in range(len(groups)):
                pending = preparing.result()
                if k + 1 < len(groups):
                    preparing = pool.submit(self._prepare, groups[k + 1], report, stored)
                work = [(p, i) for p in pending for i, v in enumerate(p.vectors) if v is None]
                chunks_known += len(work)
                notes_known += len(groups[k])
                for s in range(0, len(work), EMBED_STEP):
                    step = work[s:s + EMBED_STEP]
                    texts = [p.texts[i] for p, i in step]
                    if self.tokens is not None:
                        # The bits before the chunk's row: a chunk stored has them.
                        vectors, words = self.embedder.embed_with_tokens(texts)  # type: ignore[attr-defined]
                        self.tokens.put([(p.hashes[i], w) for (p, i), w in zip(step, words, strict=True)])
                    else:
                        vectors = self.embedder.embed(texts)
                    for (p, i), v in zip(step, vectors, strict=True):
                        p.vectors[i] = v
                    chunks_done += len(step)
                    show(step[-1][0].note.path)
                report.chunks_embedded += len(work)
                report.chunks_reused += sum(len(p.chunks) for p in pending) - len(work)
                if writing is not None:
                    writing.result()
                writing = pool.submit(self._store_notes, pending)
                notes_done += len(groups[k])
                report.notes_indexed += len(pending)
                if time.monotonic() - last_generation > GENERATION_EVERY:
                    writing.result()
                    self._new_generation()
                    last_generation = time.monotonic()
                if stop is not None and stop.is_set() and k + 1 < len(groups):
                    report.stopped = True
                    preparing.cancel()
                    break
            if writing is not None:
                writing.result()
        if not report.stopped:
            chunks_known = chunks_done  # exact now: every group was read
            notes_known = len(todo)
        show(None)

    def _prepare(self, group: list[_Todo], report: IndexReport, stored: bool) -> list[_Pending]:
        """Read and chunk the group's notes, and find the vectors stored for unchanged chunks
        (also of notes not in the manifest: an interrupted update left their chunk rows), if
        anything is `stored`."""
        pending: list[_Pending] = []
        gone: list[str] = []
        for t in group:
            try:
                note = read_note(self.root, t.path)
            except CrucibleError as exc:  # NoteReadError, or a KilnPathError for a bad link
                report.skipped.append((t.path, _reason(exc, t.path)))
                if t.entry is not None:
                    gone.append(t.path)
                continue
            # A chunk's text starts with "Title > Heading": it is embedded as it is.
            chunks = chunk_note(note)  # may add a problem: the note has too many sections
            if (capped := words_problem(note.text)) is not None:
                note.problems.append(capped)
            problems = "; ".join(note.problems)
            if problems:
                report.degraded.append((t.path, problems))
            pending.append(_Pending(
                note, t.file_hash or note.content_hash, t.stamp, problems, chunks,
                [c.text for c in chunks], [c.content_hash for c in chunks], [None] * len(chunks), set(),
            ))
        if gone:
            self._remove(gone)
            report.notes_removed += len(gone)
        found = self.chroma.stored_vectors([p.note.path for p in pending]) if stored else {}
        # A chunk stored without its word pieces (an index of an older version) is embedded again.
        bare = self.tokens.missing(h for p in pending for h in p.hashes) if self.tokens and found else set()
        for p in pending:
            ids, vectors = found.get(p.note.path, (set(), {}))
            p.old_ids = set(ids)
            p.vectors = [None if h in bare else vectors.get(h) for h in p.hashes]
        return pending

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
                "problems": p.problems, "stamp": p.stamp,
            }))
        self.chroma.write(chunk_rows, stale, note_rows)
        if self.tokens is not None:
            self.tokens.set_chunks({p.note.path: p.hashes for p in group})
        self._mark_embedded([p.note.path for p in group])

    def _remove(self, paths: list[str]) -> None:
        self.chroma.remove(paths)
        if self.tokens is not None:
            self.tokens.forget(paths)
        with self._lex_lock:
            if self._embedded is not None:
                self._embedded.difference_update(paths)

    def _mark_embedded(self, paths: list[str]) -> None:
        with self._lex_lock:
            if self._embedded is not None:
                self._embedded.update(paths)

    def _share_now(self) -> float:
        embedded, total = self.embedded_share()
        return round(embedded / total, 4) if total else 1.0

    # -- the lexical index ---------------------------------------------------------------------

    def lexical(self) -> LexicalIndex:
        """The lexical index, loaded (or built from the files) on first use. Hold no lock for
        long with it: call under `_lex_lock` (the methods below do)."""
        with self._lex_lock:
            if self._lexical is None:
                # saved by warm_lexical, an update or close when it changed
                self._lexical, self._lex_dirty = load_lexical(self.root, self.name)
            return self._lexical

    def _refresh_lexical(self, paths: list[str] | None) -> None:
        with self._lex_lock:
            changed = self.lexical().refresh(self.root, paths)
            if changed:
                self._lex_dirty = True
                if self._embedded is not None:
                    self._embedded.difference_update(changed)

    def warm_lexical(self) -> None:
        """Load or build the lexical index now, and save it, so the first search is quick."""
        self.lexical()
        self.save_lexical()

    def lexical_search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """Notes by BM25: (path, score), best first."""
        if not self._reading_here():  # else a hybrid search's `reading` just did
            try:
                self.follow_store()
            except StaleViewError:  # the words answer whatever the vector store says (the fallback)
                self._stale_view = True
        with self._lex_lock:
            return self.lexical().search(query, limit)

    def query_idf(self, query: str) -> dict[str, float]:
        with self._lex_lock:
            return self.lexical().query_idf(query)

    def literal_share(self, query: str) -> float:
        with self._lex_lock:
            return self.lexical().literal_share(query)

    def note_title(self, path: str) -> str | None:
        with self._lex_lock:
            return self.lexical().titles.get(path)

    def save_lexical(self) -> None:
        with self._lex_lock:
            if not self._lex_dirty or self._lexical is None or not self._lexical.words:
                return  # (the index worker's stamps alone: the session saves the words)
            data = self._lexical.to_bytes()
            self._lex_dirty = False
        try:
            reserved_dir(self.root)
            saved = lexical_file(self.root, self.name)
            atomic_write_bytes(saved, data, new_file_mode=FILE_MODE)
            saved.with_suffix(".json").unlink(missing_ok=True)  # the JSON an earlier Crucible saved (format 8 and before)
        except OSError as exc:  # a read-only kiln still searches; it rebuilds next time
            log.warning("could not save the lexical index: %s", exc.strerror or exc)
        except KilnPathError as exc:  # a linked .crucible: nothing written through it
            log.warning("could not save the lexical index: %s", exc.message)

    # -- reading -----------------------------------------------------------------------------

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self.embedder.embed([text])[0], dtype=np.float32)

    def embed_query_pieces(self, text: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The query's vector, and its word pieces' bits (late_interaction) where the index keeps
        the chunks' (else None), from one run of the model."""
        if self.tokens is None:
            return self.embed_query(text), None
        vectors, words = self.embedder.embed_with_tokens([text])  # type: ignore[attr-defined]
        return np.asarray(vectors[0], dtype=np.float32), self.tokens.bits(words[0])

    def piece_scores(self, query: np.ndarray, paths: Sequence[str]) -> dict[str, float]:
        """MaxSim of the query's word-piece bits with each note's best chunk, for the notes whose
        stored chunks all have theirs (late_interaction)."""
        if self.tokens is None or len(query) == 0:
            return {}
        notes = self.tokens.note_pieces(paths, MAX_CHUNKS_SCORED)
        found = list(notes)
        scores = maxsim_notes(query, [notes[p] for p in found])
        return {p: s for p, s in zip(found, scores, strict=True) if s is not None}


# ---------------------------------------------------------------------------------------------
# Helpers


def group_notes(todo: int) -> int:
    """How many notes an update of `todo` notes reads, embeds and writes together."""
    return min(GROUP_NOTES, max(MIN_GROUP_NOTES, -(-todo // PROGRESS_STEPS)))


def _file_hash(path: Path, rel: str) -> str:
    """Hash of the file's bytes; a file over the note size cap is not read (read_note says why),
    nor one that is not a regular file (NotRegularFileError: a named pipe would never answer)."""
    with os.fdopen(open_to_read(path, rel), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_NOTE_BYTES:
            return f"size:{size}"
        return content_hash(f.read())


def _readable_note(path: Path, rel: str) -> bool:
    """Whether an update would index this file (a regular file, not too large, binary or undecodable)."""
    try:
        with os.fdopen(open_to_read(path, rel), "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_NOTE_BYTES:
                return False
            decode_note_bytes(f.read(), rel)
    except (NoteReadError, NotRegularFileError):
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
