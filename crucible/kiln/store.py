"""The kiln's vector store: two Chroma collections, one code path whether the store is an
embedded `PersistentClient` under `KILN/.crucible/chroma` (default) or a Chroma server
(`[index] url`).

- collection `<name>`: one row per chunk (heading section) — vector, text, path, heading, line;
- collection `<name>-notes`: one row per note — a note-level vector (mean of its chunks) and
  the hash of the file, which is the manifest that makes indexing incremental. Its metadata
  holds how the index was built (embedder, format, kiln name) and a generation token that
  every update changes.

Only kiln-relative paths are stored. Whatever Chroma raises is turned into an
`IndexUnusableError` (a message with the fix) here, in `store_errors`, and nowhere else.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import chromadb
import numpy as np
from chromadb.api.shared_system_client import SharedSystemClient
from chromadb.config import Settings

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln.chunking import StoredChunk
from crucible.kiln.embedder import CrucibleEmbeddingFunction, Embedder
from crucible.kiln.paths import STORE_DIR, KilnPathError, reserved_dir
from crucible.private_files import private_dir, private_tree

# Bump when what is stored per row changes: an index of another format is rebuilt.
INDEX_FORMAT = 5  # 2: an 'about' chunk per note (chunking.note_about); 3: each chunk carries the note's
# description; 4: or its lead sentence (chunking._lead); 5: with the built-in model, each chunk's
# word-piece bits beside the store (late_interaction)
REBUILD = "cru kiln index --rebuild"
# Rows per Chroma read/write call (well under any server's max batch size).
PAGE = 2000
# The metadata key that holds a chunk's text. Not the row's document: Chroma indexes documents
# for full-text search, which Crucible never asks it for (BM25 is its own), and an embedded
# Chroma's write holds the GIL throughout; documents made 7,000 chunks' writes take 5.9 s
# instead of 3.4 s, while the build's embedding waited for the GIL (measured, chromadb 1.5).
TEXT_KEY = "text"


# ---------------------------------------------------------------------------------------------
# Errors


class IndexUnusableError(CrucibleError):
    """The index cannot be used as it is (locked, damaged, or built differently)."""


class StaleViewError(IndexUnusableError):
    """A read that Chroma failed as an embedded store does when another process changed it
    since this one opened it: Chroma 1.5 says "Error executing plan: … Error creating hnsw
    segment reader: Nothing found on disk" or "… Error finding id" until it is opened again
    (seen while the index worker writes a kiln's first vectors), "Collection … does not exist"
    or "Error getting collection: Missing field: [Missing metadata segment]" while another
    process rebuilds it (its collections dropped and made again), and "disk I/O error" when its
    files were replaced.
    Opening it again is the cure (`KilnIndex.reading`); a store that still fails then is damaged."""


# How Chroma's messages say so (see StaleViewError), in lower case.
_STALE_VIEW_SIGNS = ("error executing plan", "disk i/o error", "does not exist", "missing metadata segment")


def _clean(message: str, root: Path) -> str:
    """An exception text fit to show: the kiln's absolute path removed, one short line."""
    for prefix in {str(root.resolve()), str(root)}:
        message = message.replace(prefix + os.sep, "").replace(prefix, "<kiln>")
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line[:300]


# Free bytes under which a failed write is put down to a full disk: Chroma's own message for one
# says nothing of space ("Error in compaction: Failed to apply logs to the metadata segment").
LOW_SPACE = 64 * 1024 * 1024
_FULL_SIGNS = ("no space left", "disk is full", "database or disk is full", "quota exceeded")


def disk_full(exc: BaseException, root: Path) -> bool:
    if any(sign in str(exc).lower() for sign in _FULL_SIGNS):
        return True
    where = root / STORE_DIR  # an embedded store's (a server's disk is not this machine's)
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "locked" in text and "sqlite" in text


@contextmanager
def store_errors(root: Path, store: str, doing: str) -> Iterator[None]:
    """Translate whatever Chroma raises into a message with the fix; one place for all calls."""
    try:
        yield
    except CrucibleError:
        raise
    except Exception as exc:  # noqa: BLE001 - chromadb raises many unrelated types
        reason = _clean(f"{type(exc).__name__}: {exc}", root)
        # A lock says so in its message; a full disk may not (see LOW_SPACE): after the lock.
        if _is_lock_error(exc):
            raise IndexUnusableError(
                f"the index in {store} is locked by another process while {doing} ({reason})",
                f"close the other `cru` using this kiln and retry; if none is running: {REBUILD}",
            ) from exc
        if doing not in ("reading it", "searching it") and disk_full(exc, root):
            raise IndexUnusableError(
                f"the disk holding the index in {store} is full while {doing} ({reason})",
                "free some space on that disk, then run `cru kiln index` (what was embedded is kept)",
            ) from exc
        if any(sign in reason.lower() for sign in _STALE_VIEW_SIGNS):
            raise StaleViewError(
                f"the index in {store} is damaged or unreadable while {doing} ({reason})", REBUILD
            ) from exc
        raise IndexUnusableError(
            f"the index in {store} is damaged or unreadable while {doing} ({reason})", REBUILD
        ) from exc


# ---------------------------------------------------------------------------------------------
# Rows


@dataclass
class NoteEntry:
    """A note as the index knows it (one row of the notes collection)."""

    path: str
    file_hash: str
    title: str
    chunks: int
    problems: str
    stamp: str = ""  # "mtime_ns:size" of the file when it was indexed ("" in older rows)


@dataclass
class ChunkRow:
    """A chunk to write: its id ("path#ordinal"), vector, text and metadata."""

    id: str
    vector: np.ndarray
    text: str
    meta: dict[str, Any]


@dataclass
class NoteRow:
    """A note to write: its path, note vector and metadata (hash, title, chunks, problems)."""

    path: str
    vector: np.ndarray
    meta: dict[str, Any]


def chunk_path(chunk_id: str) -> str:
    """The note path of a chunk id ("path#ordinal", see chunking.Chunk.id)."""
    return chunk_id.rpartition("#")[0]


def _text(meta: Any, doc: Any) -> str:
    """A chunk's text: in its metadata (TEXT_KEY), or in the row's document where an index
    written before that keeps it."""
    return str(meta.get(TEXT_KEY) or doc or "")


def _stored(meta: Any, doc: Any) -> StoredChunk:
    return StoredChunk(
        path=str(meta["path"]), ordinal=int(meta.get("ordinal", 0)),
        heading=str(meta.get("heading") or "") or None, line=int(meta.get("line", 1)),
        title=str(meta.get("title", "")), text=_text(meta, doc),
    )


def pages(collection: Any, include: list[str]) -> Iterator[tuple[list[str], list[Any], list[Any]]]:
    """Every row of a collection, PAGE at a time: (ids, metadatas, documents)."""
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


# ---------------------------------------------------------------------------------------------
# The store


class ChromaStore:
    """The two collections of one kiln's index. Every method blocks."""

    def __init__(self, root: Path, name: str, client: Any, embedder: Embedder, label: str,
                 local: Path | None, *, replacing: bool = False) -> None:
        self.root = root
        self.name = name
        self.client = client
        self.embedder = embedder
        self.label = label  # for messages: kiln-relative dir or the server URL
        self.local = local
        self.chunks: Any = None  # the Chroma collection of chunk rows
        self.notes: Any = None  # the Chroma collection of note rows
        self.needs_rebuild: str | None = None
        self._replacing = replacing  # a server's collections to drop at the update (--rebuild)
        self._attach()

    @classmethod
    def open(cls, root: Path, config: Config, embedder: Embedder, *, rebuild: bool = False) -> ChromaStore:
        """Open (or create) the store. `rebuild=True` (`cru kiln index --rebuild`): a local
        store damaged so that it cannot even be opened is thrown away first (a healthy one is
        emptied by the update, under the writer lock: a session searching it meanwhile sees its
        collections go and come back, never its files pulled away); a server's collections
        are dropped by the update too (`replacing`: what they hold, even another kiln's index,
        is not checked)."""
        name = config.index.collection
        if not _COLLECTION_NAME.fullmatch(name):
            raise CrucibleError(
                f"[index] collection {name!r} is not a usable Chroma collection name",
                f'use 3 to 60 letters, digits, ".", "_" or "-", starting and ending with a letter '
                f'or digit, e.g. collection = "{suggest_collection(name)}"',
            )
        url = config.index.url
        if url:
            return cls(root, name, _http_client(url), embedder, url, None, replacing=rebuild)
        local = _local_store(root)
        try:
            return cls(root, name, _persistent_client(local, root), embedder, STORE_DIR, local)
        except CrucibleError as exc:
            if not rebuild or exc.fix != REBUILD:  # locked by another process: never wiped
                raise
        _wipe_local(local)
        return cls(root, name, _persistent_client(_local_store(root), root), embedder, STORE_DIR, local)

    def errors(self, doing: str) -> Any:
        return store_errors(self.root, self.label, doing)

    def _attach(self) -> None:
        """Get the two collections, creating them if needed, and check how they were built."""
        with self.errors("opening it"):
            self.chunks = self._collection(self.name)
            self.notes = self._collection(f"{self.name}-notes")
            meta = self.notes.metadata or {}
            built_with = meta.get("embedder")
            if built_with is None:
                self.notes.modify(metadata=self.identity())
                return
        if self._replacing:
            # Dropped by the update, under the kiln's writer lock: not here, where another cru
            # may be writing them (its writes would fail on collections gone).
            self.needs_rebuild = "asked for (--rebuild)"
            return
        other = meta.get("kiln")
        if self.local is None and other not in (None, self.root.name):
            # A server is shared: never let this kiln's update wipe another kiln's index.
            raise IndexUnusableError(
                f"the collection {self.name!r} on {self.label} holds the index of another kiln "
                f"({other!r})",
                f'give this kiln its own collection: [index] collection = '
                f'"{suggest_collection(self.root.name)}" in the config (or replace that index: {REBUILD})',
            )
        if built_with != self.embedder.name:
            self.needs_rebuild = f"the index was built with {built_with}, the config asks for {self.embedder.name}"
        elif meta.get("format") != INDEX_FORMAT:
            self.needs_rebuild = f"the index has format {meta.get('format')}, this version writes {INDEX_FORMAT}"

    def identity(self) -> dict[str, Any]:
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

    def reset(self) -> None:
        """Drop both collections and start empty."""
        with self.errors("rebuilding it"):
            _drop_collections(self.client, self.name, self.root, self.label)
            self.needs_rebuild = None
            self._replacing = False
            self._attach()

    def close(self) -> None:
        closer = getattr(self.client, "close", None)
        if closer is not None:
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        if self.local is not None:
            private_tree(self.local)

    # -- reading -------------------------------------------------------------------------------

    def built_with(self) -> str | None:
        return (self.notes.metadata or {}).get("embedder")

    def generation(self) -> str:
        """The token every update changes (read fresh: another process may have written)."""
        with self.errors("reading it"):
            meta = self.client.get_collection(f"{self.name}-notes", embedding_function=None).metadata
        return str((meta or {}).get("generation", ""))

    def new_generation(self) -> str:
        generation = uuid.uuid4().hex
        with self.errors("updating it"):
            self.notes.modify(metadata={**self.identity(), "generation": generation})
        if self.local is not None:  # after each update's writes: the files Chroma made since
            private_tree(self.local)
        return generation

    def manifest(self) -> dict[str, NoteEntry]:
        """Every indexed note: path -> what the index knows of it."""
        out: dict[str, NoteEntry] = {}
        with self.errors("reading it"):
            for ids, metas, _ in pages(self.notes, include=["metadatas"]):
                for id_, m in zip(ids, metas, strict=True):
                    out[id_] = NoteEntry(
                        id_, str(m.get("hash", "")), str(m.get("title", "")),
                        int(m.get("chunks", 0)), str(m.get("problems", "")), str(m.get("stamp", "")),
                    )
        return out

    def count_notes(self) -> int:
        with self.errors("reading it"):
            return int(self.notes.count())

    def count_chunks(self) -> int:
        with self.errors("reading it"):
            return int(self.chunks.count())

    def chunk_texts(self) -> dict[str, list[tuple[int, str]]]:
        """Every stored chunk's text by note path: (ordinal, text), unordered."""
        texts: dict[str, list[tuple[int, str]]] = {}
        with self.errors("reading it"):
            for _, metas, docs in pages(self.chunks, include=["metadatas", "documents"]):
                for m, d in zip(metas, docs, strict=True):
                    texts.setdefault(str(m["path"]), []).append((int(m.get("ordinal", 0)), _text(m, d)))
        return texts

    def stored_vectors(self, paths: Sequence[str]) -> dict[str, tuple[set[str], dict[str, np.ndarray]]]:
        """For each note: the ids of its stored chunk rows and their vectors by chunk hash."""
        out: dict[str, tuple[set[str], dict[str, np.ndarray]]] = {p: (set(), {}) for p in paths}
        with self.errors("reading it"):
            for start in range(0, len(paths), 50):
                group = list(paths[start:start + 50])
                got = self.chunks.get(where={"path": {"$in": group}}, include=["metadatas", "embeddings"])
                for id_, meta, emb in zip(got["ids"], got["metadatas"], got["embeddings"], strict=True):
                    ids, vectors = out.setdefault(str(meta["path"]), (set(), {}))
                    ids.add(id_)
                    vectors[str(meta.get("hash"))] = np.asarray(emb, dtype=np.float32)
        return out

    # Queries ask Chroma for ids and distances only: fetching metadata costs ~0.1 ms a row,
    # so rows are read just for the few results shown (chunks_by_id).

    def _check_usable(self) -> None:
        if self.needs_rebuild:
            raise IndexUnusableError(f"the index cannot be searched: {self.needs_rebuild}", "cru kiln index")

    def query_chunks(self, vector: np.ndarray, k: int) -> list[tuple[str, str, float]]:
        """The k chunks nearest to `vector`, best first: (chunk id, note path, cosine similarity)."""
        return [(i, chunk_path(i), s) for i, s in self._query(self.chunks, vector, k)]

    def query_notes(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k notes whose note vector is nearest: (path, cosine similarity), best first."""
        return self._query(self.notes, vector, k)

    def _query(self, collection: Any, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        self._check_usable()
        with self.errors("searching it"):
            res = collection.query(query_embeddings=[vector], n_results=k, include=["distances"])
        return [(i, 1.0 - float(d)) for i, d in zip(res["ids"][0], res["distances"][0], strict=True)]

    def chunks_by_id(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        if not ids:
            return {}
        with self.errors("reading it"):
            got = self.chunks.get(ids=list(ids), include=["metadatas", "documents"])
        return {i: _stored(m, d) for i, m, d in zip(got["ids"], got["metadatas"], got["documents"], strict=True)}

    def note_vectors(self, paths: Sequence[str]) -> dict[str, np.ndarray]:
        if not paths:
            return {}
        with self.errors("reading it"):
            got = self.notes.get(ids=list(paths), include=["embeddings"])
        return {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"], strict=True)}

    def note_stamps(self, paths: Sequence[str]) -> dict[str, str]:
        """The file stamp each of these notes had when it was indexed (those in the index)."""
        if not paths:
            return {}
        with self.errors("reading it"):
            got = self.notes.get(ids=list(paths), include=["metadatas"])
        return {i: str((m or {}).get("stamp", "")) for i, m in zip(got["ids"], got["metadatas"], strict=True)}

    def note_chunks(self, paths: Sequence[str], *, embeddings: bool = False) -> dict[str, list[StoredChunk]]:
        """The stored chunks of these notes, in order."""
        out: dict[str, list[StoredChunk]] = {p: [] for p in paths}
        if not paths:
            return out
        include = ["metadatas", "documents"] + (["embeddings"] if embeddings else [])
        with self.errors("reading it"):
            got = self.chunks.get(where={"path": {"$in": list(paths)}}, include=include)
        embs = got["embeddings"] if embeddings else [None] * len(got["ids"])
        for m, d, e in zip(got["metadatas"], got["documents"], embs, strict=True):
            c = _stored(m, d)
            if e is not None:
                c.embedding = np.asarray(e, dtype=np.float32)
            out[c.path].append(c)
        for chunks in out.values():
            chunks.sort(key=lambda c: c.ordinal)
        return out

    # -- writing -------------------------------------------------------------------------------

    def write(self, chunks: list[ChunkRow], stale: list[str], notes: list[NoteRow]) -> None:
        """Chunk rows first, then the stale chunk ids dropped, the note rows last: an interrupted
        write leaves a note either fully updated or still marked stale in the manifest."""
        with self.errors("updating it"):
            for s in range(0, len(chunks), PAGE):
                page = chunks[s:s + PAGE]
                self.chunks.upsert(
                    ids=[c.id for c in page], embeddings=[c.vector for c in page],
                    metadatas=[{**c.meta, TEXT_KEY: c.text} for c in page],
                )
            if stale:
                self.chunks.delete(ids=stale)
            if notes:
                self.notes.upsert(
                    ids=[n.path for n in notes], embeddings=[n.vector for n in notes],
                    metadatas=[n.meta for n in notes],
                )

    def set_stamps(self, entries: list[tuple[NoteEntry, str]]) -> None:
        """Record new file stamps for notes whose content did not change (a touched file)."""
        with self.errors("updating it"):
            for s in range(0, len(entries), PAGE):
                page = entries[s:s + PAGE]
                self.notes.update(
                    ids=[e.path for e, _ in page],
                    metadatas=[{"path": e.path, "hash": e.file_hash, "title": e.title, "chunks": e.chunks,
                                "problems": e.problems, "stamp": stamp} for e, stamp in page],
                )

    def reopen(self) -> None:
        """See what another process wrote: an embedded Chroma keeps its vector index in memory
        and does not see another process's writes until it is opened again (measured with
        chromadb 1.5: counts follow, queries do not). A server needs nothing."""
        if self.local is None:
            return
        # Drop the process's cached system for this path (without stopping it: a search in
        # another thread may still be using it; it goes when the last reference does).
        SharedSystemClient._identifier_to_system.pop(str(self.local), None)
        SharedSystemClient._identifier_to_refcount.pop(str(self.local), None)
        self.client = _persistent_client(self.local, self.root)
        self._attach()

    def remove(self, paths: list[str]) -> None:
        """Drop these notes' rows, chunks and note row."""
        with self.errors("updating it"):
            for s in range(0, len(paths), 100):
                group = paths[s:s + 100]
                self.chunks.delete(where={"path": {"$in": group}})
                self.notes.delete(ids=group)


# ---------------------------------------------------------------------------------------------
# Helpers


_COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,58}[A-Za-z0-9]")


def suggest_collection(name: str) -> str:
    """A valid collection name made from `name` (a kiln folder name, say)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:50]
    return f"kiln-{clean}" if clean else "kiln-notes"


def _http_client(url: str) -> Any:
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


def _local_store(root: Path) -> Path:
    """The embedded store's folder, made 0700 in the kiln's `.crucible` (neither may be a link:
    Chroma would write, and `--rebuild` delete, wherever it leads)."""
    local = reserved_dir(root) / STORE_DIR.rpartition("/")[2]
    if local.is_symlink():
        raise KilnPathError(
            f"the kiln's {STORE_DIR} folder is a symbolic link: Crucible does not write its index "
            "through a link (it may lead out of the kiln)",
            f"remove the link (`rm {STORE_DIR}` in the kiln's folder); `cru kiln index` builds the index again",
        )
    return private_dir(local)


# More entries than any store Chroma makes holds (a handful of segment folders of ~5 files):
# past it the folder is not walked further, and is not taken for an index.
MAX_STORE_ENTRIES = 10_000


def _refuse_links(path: Path) -> None:
    """A symbolic link among the store's files (its database, that database's journals, a
    segment's folder or files) is refused: SQLite follows one, so a vault from elsewhere holding
    `chroma/chroma.sqlite3` linked to another database of the person's would have Chroma's
    tables and the notes' text written into that file. `--rebuild` removes the links (not what
    they lead to) with the rest of the store. Two levels: the layout Chroma makes."""

    def refused(what: str) -> IndexUnusableError:
        return IndexUnusableError(f"the index in {STORE_DIR} {what}", REBUILD)

    def linked(name: str) -> IndexUnusableError:
        return refused(f"holds a symbolic link ({name}): Crucible does not open its index through a "
                       "link (it may lead out of the kiln, and the index would be written where it leads)")

    seen = 0
    folders = [path]
    try:
        for folder in folders:  # the store, then the folders found in it (its segments')
            with os.scandir(folder) as listing:
                for entry in listing:
                    seen += 1
                    if entry.is_symlink():
                        raise linked(Path(entry.path).relative_to(path).as_posix())
                    if seen > MAX_STORE_ENTRIES:
                        raise refused(f"holds more than {MAX_STORE_ENTRIES:,} files: not a store Crucible made")
                    if folder == path and entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
    except OSError:
        return  # not there yet (Chroma makes it), or unreadable: Chroma's own error says so


def _persistent_client(path: Path, root: Path) -> Any:
    _refuse_links(path)
    with store_errors(root, STORE_DIR, "opening it"):
        reserved_dir(root)
        try:
            client = chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))
        except Exception:
            # Chroma keeps the system it failed to start for this path, half made: the next
            # opening in this process (once the store is mended) would get it, and fail again.
            _drop_system(path)
            raise
    private_tree(path)  # its database, made just now (or by an older version) with the umask
    return client


def _drop_system(path: Path) -> None:
    """Stop and forget the system Chroma caches for this store path in the process."""
    system = SharedSystemClient._identifier_to_system.pop(str(path), None)
    SharedSystemClient._identifier_to_refcount.pop(str(path), None)
    if system is not None:
        try:
            system.stop()
        except Exception:  # noqa: BLE001 - a damaged store may not even stop cleanly
            pass


def _wipe_local(path: Path) -> None:
    _drop_system(path)  # before deleting its files
    if path.exists():
        shutil.rmtree(path)


def _drop_collections(client: Any, name: str, root: Path, store: str) -> None:
    with store_errors(root, store, "rebuilding it"):
        existing = {getattr(c, "name", c) for c in client.list_collections()}
        for n in (name, f"{name}-notes"):
            if n in existing:
                client.delete_collection(n)
