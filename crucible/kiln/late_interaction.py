"""Late interaction: a query compared with a chunk word piece by word piece (ColBERT's MaxSim:
each query piece's best match in the chunk, averaged), over the built-in model's token vectors.

A note's one vector blurs what its words say in context; MaxSim keeps them apart, and finds the
note for a question that shares its meaning but few of its words (issue 15's hard set: recall@5
0.941 -> 0.965, MRR@10 0.842 -> 0.898 as a third voice after the fusion, bench/search.py; no
other set lower by more than 0.001). The vectors are not stored (384 floats a word piece: ten times the chunk vectors);
each piece keeps the signs of its projections on PLANE_BITS random directions (SimHash: two
vectors' angle is about the share of signs they differ in), 96 bytes, compared by counting
differing bits. Measured on the sample kiln against the float vectors: 768 bits rank as they
do; 384 lost a few known-item queries.

The bits live in `.crucible/tokens-<collection>.sqlite`, keyed by the chunk text's hash: a chunk
re-embedded for any reason writes the same row, so nothing needs removing for correctness when a
note changes or goes (rows no chunk has are dropped when the index is reset). They are written
before the chunk's row in Chroma, so a chunk found there has its bits (a kill between the two
leaves bits no chunk has yet). A note the store does not know (the store removed, of other
planes, or a write that failed) is gone through again by the next full update, which embeds, in
the background, its chunks without bits; meanwhile it keeps its place in the fused ranking.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from crucible.kiln.lexical import min_max
from crucible.kiln.paths import RESERVED_DIR, KilnPathError, reserved_dir
from crucible.private_files import FILE_MODE

log = logging.getLogger(__name__)
# What a store that cannot be read or written raises: searches then go on without it.
STORE_ERRORS = (sqlite3.Error, OSError, KilnPathError)

PLANE_BITS = 768
# Which planes the stored bits were made with (kept in the store: other planes, bits dropped).
PLANES_ID = f"sha256-signs-{PLANE_BITS}"
# The most chunks of one note compared with the query (its first ones): a note of thousands of
# sections costs no more than this.
MAX_CHUNKS_SCORED = 64
# The most word pieces one chunk's row may hold (the model reads 256 tokens of a chunk; a
# store from elsewhere may hold anything): a longer row is not read, and its chunk embedded again.
MAX_PIECES_PER_CHUNK = 512
# How many of the fused ranking's first notes are compared by their word pieces.
RERANK_DEPTH = 20
# MaxSim's say against the fused score: equal, fixed a priori (as the fusion's); less for a query
# naming an identifier the kiln holds (search._hybrid), which word pieces read as common words.
PIECES_WEIGHT = 0.5


@functools.cache
def planes() -> np.ndarray:
    """The random directions, (384, PLANE_BITS) of +1 / -1 (Achlioptas' projections: as good as
    Gaussian ones for SimHash), drawn from SHA-256 in counter mode: the same in every version of
    every library, so bits written by one are read by another."""
    need = 384 * PLANE_BITS // 8
    stream = b"".join(hashlib.sha256(b"crucible-planes-%d" % i).digest() for i in range(-(-need // 32)))
    signs = np.unpackbits(np.frombuffer(stream[:need], dtype=np.uint8)).astype(np.float32) * 2 - 1
    return signs.reshape(384, PLANE_BITS)


def tokens_file(root: Path, collection: str) -> Path:
    return root / RESERVED_DIR / f"tokens-{collection}.sqlite"


class TokenStore:
    """The chunks' word-piece bits, by chunk hash. Thread-safe; several processes may read while
    one writes (SQLite's WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._planes_checked = False
        self._said: set[str] = set()

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            reserved_dir(self.path.parent.parent)
            if (linked := self.linked()) is not None:
                raise linked
            # Made 0600 before SQLite opens it: its -wal and -shm files take the same mode.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE))
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB)")
            db.execute("CREATE TABLE IF NOT EXISTS bits (hash TEXT PRIMARY KEY, bits BLOB NOT NULL)")
            # Which chunks each note has (as in the vector store), read with their bits in one query.
            db.execute("CREATE TABLE IF NOT EXISTS chunks (path TEXT, ordinal INTEGER, hash TEXT, "
                       "PRIMARY KEY (path, ordinal))")
            self._db = db
        return self._db

    def linked(self) -> KilnPathError | None:
        """The store's file or one of its journals as a link, which it refuses: SQLite writes
        through a link, and a vault from elsewhere could aim one at another of the person's files
        (and O_NOFOLLOW's error would name the file by its absolute path)."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            file = self.path.with_name(self.path.name + suffix)
            if file.is_symlink():
                return KilnPathError(
                    f"{RESERVED_DIR}/{file.name} is a symbolic link: Crucible does not write its "
                    "word-piece store through a link",
                    f"remove the link (`rm {RESERVED_DIR}/{file.name}` in the kiln's folder)",
                )
        return None

    def _warn(self, what: str, exc: Exception) -> None:
        """Said once a process for each failure (a build meets the same one at every step);
        searches go on without the pieces."""
        if isinstance(exc, KilnPathError):
            said = exc.message
        else:  # an OSError's text would name the file by its absolute path
            said = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        fix = f"; fix: {exc.fix}" if isinstance(exc, KilnPathError) and exc.fix else ""
        line = f"the word-piece store {self.path.name} {what} ({said}{fix}): searches go on without it"
        if line not in self._said:
            self._said.add(line)
            log.warning("%s", line)

    def _check_planes(self) -> None:
        """Bits written with other planes (another version's) mean nothing here: dropped, once."""
        if self._planes_checked:
            return
        with self._lock:
            db = self._open()
            row = db.execute("SELECT value FROM meta WHERE key = 'planes'").fetchone()
            if row is None or row[0] != PLANES_ID:
                db.execute("BEGIN IMMEDIATE")
                try:
                    row = db.execute("SELECT value FROM meta WHERE key = 'planes'").fetchone()
                    if row is None or row[0] != PLANES_ID:
                        db.execute("DELETE FROM bits")
                        db.execute("DELETE FROM chunks")
                        db.execute("INSERT OR REPLACE INTO meta VALUES ('planes', ?)", (PLANES_ID,))
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:  # left open, every later write would fail
                        db.execute("ROLLBACK")
                    raise
            self._planes_checked = True

    def bits(self, vectors: np.ndarray) -> np.ndarray:
        """Word-piece vectors (n, 384) -> their signs on the planes, packed: uint64 (n, PLANE_BITS/64)."""
        packed = np.packbits(vectors @ planes() > 0, axis=1)
        return np.ascontiguousarray(packed).view(np.uint64)

    def missing(self, hashes: Iterable[str]) -> set[str]:
        """The hashes without bits; none when the store cannot be read (else they would be
        embedded again on every update)."""
        wanted = list(dict.fromkeys(hashes))
        try:
            found = set(self._get(wanted))
        except STORE_ERRORS as exc:
            self._warn("cannot be read", exc)
            return set()
        return {h for h in wanted if h not in found}

    def put(self, rows: Sequence[tuple[str, np.ndarray]]) -> None:
        """(chunk hash, word-piece vectors) rows."""
        if rows:
            self._write([("INSERT OR REPLACE INTO bits VALUES (?, ?)",
                          [(h, self.bits(v).tobytes()) for h, v in rows])])

    def set_chunks(self, notes: Mapping[str, Sequence[str]]) -> None:
        """The chunk hashes of these notes, in order, replacing what was said of them."""
        self._write([("DELETE FROM chunks WHERE path = ?", [(p,) for p in notes]),
                     ("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?)",
                      [(path, i, h) for path, hashes in notes.items() for i, h in enumerate(hashes)])])

    def forget(self, paths: Sequence[str]) -> None:
        """Notes gone from the index (their bits stay: another chunk may share a text)."""
        self._write([("DELETE FROM chunks WHERE path = ?", [(p,) for p in paths])])

    def _write(self, steps: Sequence[tuple[str, Sequence[tuple[object, ...]]]]) -> None:
        """The statements in one transaction. A full disk stops the build as the vector store's
        would; another failure (a read-only kiln) is said in the log, and the notes are searched
        without their pieces."""
        try:
            self._check_planes()
            with self._lock:
                db = self._open()
                db.execute("BEGIN")
                try:
                    for sql, args in steps:
                        db.executemany(sql, args)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:  # (SQLite ends it itself on a full disk)
                        db.execute("ROLLBACK")
                    raise
        except STORE_ERRORS as exc:
            # Not at the top: search imports this module, and a search by words must not load
            # chromadb (the index thread imports it meanwhile; two threads importing it at once
            # deadlock on its circular imports). A write comes with the open index, chromadb loaded.
            from crucible.kiln.store import IndexUnusableError, disk_full

            if disk_full(exc, self.path.parent.parent):
                raise IndexUnusableError(
                    # strerror: an OSError's text would name the file by its absolute path
                    f"the disk holding the index in {RESERVED_DIR} is full while updating it "
                    f"({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc})",
                    "free some space on that disk, then run `cru kiln index` (what was embedded is kept)",
                ) from exc
            self._warn("could not be updated", exc)

    def known_notes(self) -> set[str] | None:
        """The notes whose chunks are known here; None if the store cannot be read."""
        try:
            self._check_planes()  # the pieces of other planes are dropped first
            with self._lock:
                return {p for (p,) in self._open().execute("SELECT DISTINCT path FROM chunks")}
        except STORE_ERRORS as exc:
            self._warn("cannot be read", exc)
            return None

    def note_pieces(self, paths: Sequence[str], most: int) -> dict[str, list[np.ndarray]]:
        """The bits of each note's first `most` chunks, in order, for the notes whose chunks all
        have them; {} if the store cannot be read (said in the log)."""
        words = PLANE_BITS // 64
        rows: dict[str, list[tuple[int, bytes | None]]] = {}
        try:
            self._check_planes()
            with self._lock:
                db = self._open()
                for s in range(0, len(paths), 500):
                    part = list(paths[s:s + 500])
                    marks = ",".join("?" * len(part))
                    # Bounded as a store from elsewhere may not be (rows past a note's `most`,
                    # rows too long): neither is read.
                    for path, ordinal, bits in db.execute(
                        "SELECT c.path, c.ordinal, CASE WHEN length(b.bits) <= ? THEN b.bits END "
                        "FROM chunks c LEFT JOIN bits b ON b.hash = c.hash "
                        f"WHERE c.path IN ({marks}) AND c.ordinal >= 0 AND c.ordinal < ? LIMIT ?",
                        [MAX_PIECES_PER_CHUNK * PLANE_BITS // 8, *part, most, most * len(part)],
                    ):
                        rows.setdefault(path, []).append((ordinal, bits))
        except STORE_ERRORS as exc:
            self._warn("cannot be read", exc)
            return {}
        out: dict[str, list[np.ndarray]] = {}
        for path, found in rows.items():
            # A chunk without bits, or bits of another length (a damaged row): the note is left
            # out rather than misread.
            if all(isinstance(b, bytes) and len(b) % (words * 8) == 0 for _, b in found):
                out[path] = [np.frombuffer(b, dtype=np.uint64).reshape(-1, words)  # type: ignore[arg-type]
                             for _, b in sorted(found, key=lambda r: r[0])[:most]]
        return out

    def _get(self, hashes: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        with self._lock:
            db = self._open()
            for s in range(0, len(hashes), 500):
                part = hashes[s:s + 500]
                marks = ",".join("?" * len(part))
                out.update(db.execute(
                    f"SELECT hash, bits FROM bits WHERE hash IN ({marks}) AND length(bits) <= ?",
                    [*part, MAX_PIECES_PER_CHUNK * PLANE_BITS // 8]).fetchall())
        return out

    def clear(self) -> None:
        try:
            with self._lock:
                db = self._open()
                db.execute("DELETE FROM bits")
                db.execute("DELETE FROM chunks")
        except STORE_ERRORS as exc:
            self._warn("could not be emptied", exc)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def maxsim_notes(query: np.ndarray, notes: Sequence[Sequence[np.ndarray]]) -> list[float | None]:
    """Each note's MaxSim with the query (bit rows of each, `TokenStore.bits`): for each query
    piece its most alike piece of a chunk, as 1 - 2 * (share of differing signs), the mean over
    the query's pieces, and the note's best chunk; None for a note with nothing to compare."""
    kept = [[c for c in chunks if len(c)] for chunks in notes]
    sizes = [len(c) for chunks in kept for c in chunks]
    if len(query) == 0 or not sizes:
        return [None] * len(notes)
    # Word by word (64 bits each), into buffers made once: the counts stay a (query pieces,
    # pieces) array, not a third dimension of words, which measured twice as slow; each word's
    # column contiguous, and no array made per word, measured 1.5x faster again.
    words = np.ascontiguousarray(np.concatenate([c for chunks in kept for c in chunks]).T)
    shape = (len(query), words.shape[1])
    differ = np.zeros(shape, dtype=np.uint16)
    xor, count = np.empty(shape, dtype=np.uint64), np.empty(shape, dtype=np.uint8)
    for w in range(len(words)):
        np.bitwise_xor(query[:, w, None], words[None, w], out=xor)
        np.bitwise_count(xor, out=count)
        differ += count
    starts = np.cumsum([0, *sizes[:-1]])
    per_chunk = (1.0 - 2.0 * np.minimum.reduceat(differ, starts, axis=1) / PLANE_BITS).mean(axis=0)
    out: list[float | None] = []
    at = 0
    for chunks in kept:
        out.append(float(per_chunk[at:at + len(chunks)].max()) if chunks else None)
        at += len(chunks)
    return out


def rerank(fused: Sequence[tuple[str, float]], scores: Mapping[str, float],
           weight: float = PIECES_WEIGHT) -> list[tuple[str, float]]:
    """The fused ranking's notes with MaxSim as a third voice: `weight` of it, the rest the fused
    score, each min-max scaled over the notes compared. A note without bits (not embedded with
    them yet) keeps its fused score as its MaxSim, so it is neither lifted nor pushed down for it."""
    if not fused or len(set(scores.values())) < 2:  # MaxSim that tells no note from another
        return list(fused)
    fused_scaled = min_max(list(fused))
    pieces_scaled = min_max(list(scores.items()))
    out = []
    for path, _ in fused:
        f = fused_scaled[path]
        out.append((path, (1.0 - weight) * f + weight * pieces_scaled.get(path, f)))
    out.sort(key=lambda kv: -kv[1])
    return out
