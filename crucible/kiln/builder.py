"""The kiln's index, kept up to date in the background while a session serves.

`BackgroundIndex.start()` returns at once. Its thread opens the index (the vector store and
the lexical index, which is read from the files in seconds), then embeds whatever is missing:
in that thread (`mode="thread"`), or in a worker process at low CPU priority
(`mode="process"`, `python -m crucible.kiln.builder`) whose writes this process follows.
Searches use the index as soon as it is open: words first, vectors as they come. The query
embedder (the built-in model) takes seconds to load, holding the GIL for much of it: it is
loaded when a search first needs it, or in the background after a search that did without it
(`query_embedder_ready`, `load_query_embedder`).

Resumable: the update writes a group of notes at a time and the next one re-embeds only
what was not written (see `index.KilnIndex.update`), so a kill -9 or a restart loses at most
one group. One writer per kiln: another process's update is waited for (and read around);
once this one is built, another's (`cru kiln index --rebuild` in another terminal) is shown as
it runs, and finished here if it stopped midway.

The state (`state()`, and `subscribe(fn)` to hear of each change, called from the indexing
thread) is what a status bar or a notice shows: phase, the embedded share, the note count.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Literal

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln.filesearch import warm_properties
from crucible.kiln.lexical import LexicalIndex, LexicalView, load_lexical
from crucible.kiln.paths import STORE_DIR
from crucible.kiln.writer_status import (
    build_status,
    other_cru,
    stopped,
    stopped_hint,
    wait_while_stopped,
)
from mcp_bridge.kiln_api import shown_duration, shown_percent

log = logging.getLogger(__name__)

BuildMode = Literal["thread", "process"]
# Measured in bench/index.py (--modes): see the note there and the README.
DEFAULT_MODE: BuildMode = "process"
MODE_ENV = "CRUCIBLE_INDEX_MODE"
# The worker's CPU priority: the agent and the session's own calls come first.
WORKER_NICE = 10
# How long the opening waits, once the lexical index is read, for the searches that wait for it
# to answer before it imports the vector store (they take milliseconds).
WORDS_FIRST = 2.0
# State changes heard at most this often while embedding (the first and last always).
NOTIFY_EVERY = 0.5
# Once built, how often the index looks whether another process (`cru kiln index` in another
# terminal) is updating it: one open and flock of the lock file.
FOLLOW_EVERY = 1.0
# Another process's update of fewer notes than this (a note saved while two sessions serve the
# kiln) takes a second or so: it is not shown, nor finished here if it stops.
FOLLOW_MIN_NOTES = 50
# An index on a server that could not be opened is tried again this often (an embedded store is
# tried again when its files change).
RETRY_SERVER = 30.0
# A build that stopped midway is tried again after `[index] retry_secs`, doubled after each
# that stops again up to this: an embedder back up, or a worker the OOM killer took (each try
# embeds more: what was written stays), goes on without the person.
RETRY_BUILD_MAX = 1800.0

Phase = Literal["starting", "opening", "waiting", "embedding", "ready", "failed", "stopped"]


@dataclass(frozen=True)
class IndexState:
    """Where the kiln's index is. `embedded`: the share of notes whose vectors are stored and
    current (0..1); `notes`: readable notes in the kiln (0 until the index is open)."""

    phase: Phase
    embedded: float = 0.0
    notes: int = 0
    problem: str | None = None  # why it failed, or whom it waits for
    stopped_writer: int | None = None  # waiting: the pid of the writer, when it is stopped (Ctrl-Z)
    retry_in: float | None = None  # a build that failed: the seconds until this session tries again

    @property
    def searchable(self) -> bool:
        return self.phase in ("waiting", "embedding", "ready", "stopped")

    @property
    def stopped_midway(self) -> bool:
        """A build that failed after embedding some notes: those are searched by meaning (a
        store that cannot be opened fails with 0, see `BackgroundIndex._fail`)."""
        return self.phase == "failed" and 0 < self.embedded < 1

    @property
    def percent(self) -> int:
        """The share embedded as every place shows it, `semantic_search`'s line too."""
        return shown_percent(self.embedded)

    def failure_text(self, problem: str) -> str:
        """A failed build said once to the person (`cru acp`'s notice, `cru chat`'s transcript):
        why, and what it means for searching; `problem`: the reason, redacted for showing."""
        again = f"It is tried again in {shown_duration(self.retry_in)}" if self.retry_in else ""
        if self.stopped_midway:
            return (f"indexing the kiln stopped at {self.percent}% ({problem}); searching the "
                    "kiln matches the notes embedded so far by meaning too, the others by words only. "
                    f"{again + ', or ' if again else ''}`cru kiln index` embeds the rest")
        return (f"the kiln's index cannot be used ({problem}); searching the kiln matches words only. "
                f"{again + '; ' if again else ''}`cru kiln index` says how to mend it, and this session "
                "takes the mended index")


StateFn = Callable[[IndexState], None]


def _worker_end(code: int) -> str:
    """Why the indexing worker stopped, as the person reads it: a signal by its name (the
    kernel's OOM killer sends SIGKILL, the likeliest at 10,000 notes on a small machine)."""
    if code >= 0:
        return f"the indexing worker stopped (exit status {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"the indexing worker was killed by {name}" + (
        ", as when memory runs out" if -code == signal.SIGKILL else "")


def _mode(mode: BuildMode | None) -> BuildMode:
    wanted = mode or os.environ.get(MODE_ENV) or DEFAULT_MODE
    return "thread" if wanted == "thread" else "process"


class BackgroundIndex:
    """One kiln's index for a process: opened and brought up to date in the background."""

    def __init__(self, root: Path, config: Config, *, mode: BuildMode | None = None) -> None:
        self.root = root
        self.config = config
        self.mode = _mode(mode)
        self._index: Any = None  # KilnIndex once open (imported in the thread: Chroma is heavy)
        self._error: CrucibleError | None = None
        self._opened = threading.Event()
        self._model_loader: threading.Thread | None = None
        self._model_tried = threading.Event()  # the loader ended (loaded, or failed: the search says why)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: subprocess.Popen[str] | None = None
        self._state = IndexState("starting")
        self._state_lock = threading.Lock()
        self._listeners: list[StateFn] = []
        self._notified = 0.0
        self._late: threading.Timer | None = None  # sends a change the throttle held back
        self._send_lock = threading.Lock()
        # The lexical index, read before the vector store opens (chromadb and the embedder take
        # a second or more to import): a kiln with no vectors yet is searched by words at once.
        self._lexical: LexicalIndex | None = None
        self._lex_lock = threading.RLock()  # shared with the KilnIndex once open
        self._lexical_read = threading.Event()  # read, or the opening failed first
        self._words_searching = 0  # searches answering by words before the index opens
        self._words_done = threading.Condition()
        self._search_broke = False  # the failure shown is a search's (search_failed)
        self._retry_wait = config.index.retry_secs  # before the next try of a build stopped midway
        self._retry_at: float | None = None  # when that try is due (monotonic)

    # -- for the owner -----------------------------------------------------------------------

    def start(self) -> None:
        """Start opening and building (once; later calls do nothing)."""
        with self._state_lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="kiln-index", daemon=True)
        self._thread.start()

    def open_index(self) -> Any:
        """The open KilnIndex (starting if needed, waiting while it opens); its CrucibleError
        if it cannot be opened."""
        self.start()
        self._opened.wait()
        if self._error is not None:
            raise self._error
        return self._index

    def answers_by_words(self) -> bool:
        """Whether a search now answers by words alone without waiting for the index to open:
        it is still opening (or not started), on a kiln with no vectors yet, or while another
        process writes the store (opening it waits on that process's write; the opening waits
        for it to go on when it is stopped, see `_run`). Never waits."""
        if self._opened.is_set():
            return False
        if not (self.config.index.url or (self.root / STORE_DIR).is_dir()):
            return True
        return build_status(self.root) is not None

    @contextmanager
    def words_only(self) -> Iterator[LexicalView | None]:
        """While the index opens on a kiln that has no vectors yet (never indexed with the
        built-in store): its lexical index, to answer by words without waiting for the vector
        store (waits for the lexical index itself: seconds on 10,000 notes). None otherwise:
        search the open index (`open_index`). The opening goes on to import the vector store
        only when the searches inside this block are done (or after WORDS_FIRST seconds): that
        import would take half of the GIL from them."""
        if not self.answers_by_words():
            yield None
            return
        with self._words_done:
            self._words_searching += 1
        try:
            self.start()
            self._lexical_read.wait()
            yield None if self._opened.is_set() else self.words()
        finally:
            with self._words_done:
                self._words_searching -= 1
                self._words_done.notify_all()

    def words(self) -> LexicalView | None:
        """The kiln's lexical index once read (None before, or when reading it failed): what a
        search answers with when the vector store cannot be opened (`open_index`'s error)."""
        lexical = self._lexical
        return LexicalView(self.root, lexical, self._lex_lock) if lexical is not None else None

    def search_failed(self, exc: CrucibleError) -> None:
        """A search found the open store failing (damaged since it opened): the index shows that
        problem (the status bar, `cru acp`'s notice) until a search reads the store again."""
        if self._index is not None and self.state().phase == "ready":
            self._set(phase="failed", problem=exc.message, force=True)
            self._search_broke = True

    def search_read(self) -> None:
        """A search read the open store: a failure `search_failed` showed is over (not another:
        a build that failed stays failed)."""
        if self._search_broke and self.state().phase == "failed":
            self._search_broke = False
            share, notes = self.share()
            self._set(phase="ready", embedded=share, notes=notes, problem=None, force=True)

    def query_embedder_ready(self) -> bool:
        """Whether a query is embedded now, without loading a model first. Never waits."""
        index = self.index
        if index is None:
            return False
        embedder = index.embedder
        return not hasattr(embedder, "load") or getattr(embedder, "loaded", True) or self._model_tried.is_set()

    def load_query_embedder(self, after: float = 0.0) -> None:
        """Load the query model in the background `after` seconds from now (once): after the
        answer that did without it is sent, since the load holds the GIL for long stretches."""
        index = self.index
        with self._state_lock:
            if index is None or self._model_loader is not None or self.query_embedder_ready():
                return
            self._model_loader = threading.Timer(after, self._load_query_embedder, args=(index.embedder,))
            self._model_loader.name = "kiln-query-model"
            self._model_loader.daemon = True
            self._model_loader.start()

    @property
    def index(self) -> Any:
        """The KilnIndex if it is open, else None (never waits)."""
        return self._index if self._opened.is_set() else None

    def state(self) -> IndexState:
        with self._state_lock:
            return self._state

    def retry_due_in(self) -> float | None:
        """Seconds until this session tries a build that stopped midway again; None when it
        will not (none stopped, or `[index] retry_secs = 0`)."""
        at = self._retry_at
        return None if at is None else max(0.0, at - time.monotonic())

    def subscribe(self, fn: StateFn) -> Callable[[], None]:
        """Call `fn(state)` on each change (from the indexing thread: make it thread-safe).
        Returns the function that unsubscribes."""
        with self._state_lock:
            self._listeners.append(fn)

        def unsubscribe() -> None:
            with self._state_lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)

        return unsubscribe

    def close(self, timeout: float = 2.0) -> None:
        """Stop building (what was written stays) and close the index, within `timeout`."""
        self._stop.set()
        with self._words_done:  # the opening may be waiting for searches by words: go on
            self._words_done.notify_all()
        worker = self._worker
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._index is not None and (self._thread is None or not self._thread.is_alive()):
            self._index.close()

    # -- the indexing thread ---------------------------------------------------------------------

    def _set(self, force: bool = False, **changes: Any) -> None:
        if changes.get("phase", "failed") != "failed":
            self._search_broke = False  # over: a later failure is not a search's
        with self._state_lock:
            if changes.get("phase", self._state.phase) != "waiting":
                changes.setdefault("stopped_writer", None)
            if changes.get("phase", self._state.phase) != "failed":
                changes.setdefault("retry_in", None)
            state = replace(self._state, **changes)
            if state == self._state:
                return  # nothing new to tell (a wait or a follow looks again and again)
            self._state = state
            now = time.monotonic()
            if not force and state.phase == "embedding" and now - self._notified < NOTIFY_EVERY:
                # Held back, not dropped: sent when the interval is over unless a newer one
                # goes first (a long group after it would leave the bar behind meanwhile).
                if self._late is None and not self._stop.is_set():
                    self._late = threading.Timer(self._notified + NOTIFY_EVERY - now, self._send_late)
                    self._late.name, self._late.daemon = "kiln-index-progress", True
                    self._late.start()
                return
            self._notified = now
        self._send()

    def _send_late(self) -> None:
        with self._state_lock:
            self._late = None
            if self._stop.is_set() or time.monotonic() - self._notified < NOTIFY_EVERY * 0.9:
                return  # a newer change was sent meanwhile
            self._notified = time.monotonic()
        self._send()

    def _send(self) -> None:
        # One sender at a time, each with the newest state: a listener never sees an older
        # state after a newer one (the late sender is another thread).
        with self._send_lock:
            with self._state_lock:
                state, listeners = self._state, list(self._listeners)
            for fn in listeners:
                try:
                    fn(state)
                except Exception:  # a listener's bug must not stop the index
                    log.exception("index state listener failed")

    def current_share(self, *, follow: bool = True) -> tuple[float, int]:
        """The share a search reports: the progress of the update running (this process's, or
        another's it follows), else read from the open index, caught up with the other
        processes' writes first. Read also when another's update has just ended and the
        follower has not looked yet (once a second): it said 0.0 after a `--rebuild` that had
        made the whole index again. `follow=False`: the caller has just caught up (a search
        does), and reading the store's generation again would cost as much as the read."""
        from crucible.kiln.store import StaleViewError  # chromadb: loaded with the open index

        state = self.state()
        if state.notes and (state.phase == "embedding"
                            or (state.phase == "waiting" and build_status(self.root) is not None)):
            return state.embedded, state.notes
        try:
            if follow:
                self._index.follow_store()  # one read when no other process wrote
        except StaleViewError:
            pass  # `share` says the share known last
        return self.share()

    def share(self) -> tuple[float, int]:
        """(the share of notes embedded, readable notes) read from the open index."""
        from crucible.kiln.store import StaleViewError  # chromadb: loaded with the open index

        try:
            embedded, total = self._index.embedded_share()
        except StaleViewError as exc:
            # Another process's last writes cannot be read yet: the share known last stands
            # (the index is not failed for it; the next search reads them).
            log.info("the embedded share could not be read (%s)", exc.message)
            state = self.state()
            return state.embedded, state.notes or len(self._index.lexical())
        return (round(embedded / total, 4) if total else 1.0), total

    def _run(self) -> None:
        try:
            self._set(phase="opening", force=True)
            # Words first: a kiln never indexed is searchable from here on (see words_only)
            lexical, changed = load_lexical(self.root, self.config.index.collection, deferred=True)
            self._lexical = lexical
            self._lexical_read.set()
            with self._words_done:  # the searches that waited for the words go first
                self._words_done.wait_for(lambda: self._words_searching == 0 or self._stop.is_set(),
                                          timeout=WORDS_FIRST)
            lexical.read_links()  # changes nothing the searches read: no lock
            with self._lex_lock:  # then the links and the inverted index, so later searches need not scan
                lexical.post()
            if self._stop.is_set():  # closed before the store was opened: nothing to stop
                self._set(phase="stopped", force=True)
                return
            # A writer stopped mid-write would hold the opening (and the GIL): wait for it here,
            # shown as waiting; searches answer by words meanwhile (answers_by_words).
            if not self.config.index.url and not wait_while_stopped(
                    self.root, lambda status: self._waiting(status) and not self._stop.wait(FOLLOW_EVERY)):
                self._set(phase="stopped", force=True)
                return
            index = self._open(lexical, changed)
            if index is None:  # closed while the store could not be opened
                self._set(phase="stopped", force=True)
                return
            self._index = index  # before the error goes: open_index reads the error, then this
            self._error = None
            self._opened.set()
            index.save_lexical()  # after: the first search need not wait for it
            if self._build_or_stop():
                self._warm_properties()
            # Until closed: others' updates shown as they run; one that stopped before its end
            # (or this one's, stopped midway) is finished here.
            while self._follow_others():
                self._build_or_stop()
            if self._stop.is_set():
                self._set(phase="stopped", force=True)
        except CrucibleError as exc:
            self._fail(exc)
        except Exception as exc:  # the thread's boundary: say it, never kill the session
            log.exception("the kiln's index failed")
            self._fail(CrucibleError(f"the kiln's index failed ({type(exc).__name__}: {exc})",
                                     "cru kiln index"))
        finally:
            self._lexical_read.set()
            self._opened.set()

    def _open(self, lexical: LexicalIndex, changed: bool) -> Any:
        """The opened KilnIndex; None if closed first. A store that cannot be opened (damaged, a
        link inside it, its server down) fails the index, and searches answer by words with the
        problem (`words`), until the store changes (`cru kiln index --rebuild` in another
        terminal) or, for a server, RETRY_SERVER seconds pass: then it is opened again, so the
        session takes the fix without a restart."""
        # chromadb (~1 s): in this thread, not at start
        from crucible.kiln.index import KilnIndex

        while True:
            stamp = self._store_stamp()
            try:
                return KilnIndex.open(self.root, self.config, lexical=(lexical, changed, self._lex_lock))
            except CrucibleError as exc:
                failure = exc
                self._fail(failure)
                self._opened.set()  # searches now answer by words, with this problem
            retry_at = time.monotonic() + RETRY_SERVER
            shown_waiting = False
            while not self._stop.wait(FOLLOW_EVERY):
                if self.config.index.url:
                    if time.monotonic() >= retry_at:
                        break  # quietly: the state changes only if the outcome does
                    continue
                status = build_status(self.root)
                if status is not None:  # being written (the fix running): its progress, then open it
                    shown_waiting = self._waiting(status)
                elif self._store_stamp() != stamp:
                    log.info("the kiln's index changed since it could not be opened: opening it again")
                    self._set(phase="opening", problem=None, force=True)
                    break
                elif shown_waiting:  # a writer came and went, and left the store as it was
                    shown_waiting = False
                    self._fail(failure)
            else:
                return None

    def _store_stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What changes when the vector store is written or replaced (its folder's entries and
        its database file)."""
        out = []
        for path in (self.root / STORE_DIR, self.root / STORE_DIR / "chroma.sqlite3"):
            try:
                st = path.lstat()
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def _warm_properties(self) -> None:
        """Once the index is ready (the CPU is free then): every note's properties, so that a
        first `property_search` of a large kiln need not parse every note's YAML."""
        try:
            warm_properties(self.root, self._stop.is_set)
        except Exception:  # the search reads them itself, as without this
            log.debug("reading the notes' properties failed", exc_info=True)

    def _load_query_embedder(self, embedder: Any) -> None:
        try:
            if not self._stop.is_set():
                embedder.load()
        except Exception:  # the next search embeds its query itself, and says why it cannot
            log.debug("loading the query embedder failed", exc_info=True)
        finally:
            self._model_tried.set()

    def _fail(self, exc: CrucibleError, retry_in: float | None = None) -> None:
        if self._index is None:  # no store open: nothing is searched by meaning
            self._error = exc
            self._set(phase="failed", problem=exc.message, embedded=0.0, force=True)
        else:  # a build that stopped midway: what it wrote is searched, `embedded` says how much
            try:
                # All the worker wrote (killed, it said nothing of its last writes), as searches see it
                self._index.follow_store(writer_killed=self.mode == "process")
                embedded, notes = self.share()
            except Exception:  # (what broke the build may break this read too: the progress's share)
                state = self.state()
                embedded, notes = state.embedded, state.notes
            if embedded >= 1.0:  # it stopped after its last write: nothing is missing
                log.info("the index's build stopped (%s) with every note embedded", exc.message)
                self._retry_from_start()  # no try due, and the next stop waits the least
                self._set(phase="ready", embedded=embedded, notes=notes, problem=None, force=True)
                return
            self._set(phase="failed", problem=exc.message, embedded=embedded, retry_in=retry_in, force=True)

    def _waiting(self, status: dict[str, Any] | None) -> bool:
        pid = (status or {}).get("pid")
        self._set(phase="waiting", problem=f"{other_cru(status)} is updating the index{stopped_hint(status)}",
                  stopped_writer=pid if isinstance(pid, int) and stopped(status) else None,
                  embedded=_status_share(status, self._state.embedded))
        return not self._stop.is_set()

    def _build_or_stop(self) -> bool:
        """`_build`; one that stops midway (its worker killed, the embedder failing) is shown
        (`_fail`: what it embedded is searched) and tried again after `_retry_wait`, unless `cru
        kiln index` in another terminal, or the next update another process leaves incomplete,
        takes it on first (`_follow_others`)."""
        try:
            built = self._build()
        except CrucibleError as exc:
            wait = self._retry_wait
            if wait > 0:  # tried again by `_follow_others`
                self._retry_at = time.monotonic() + wait
                self._retry_wait = min(wait * 2, max(wait, RETRY_BUILD_MAX))
            self._fail(exc, retry_in=wait or None)
            return False
        self._retry_from_start()
        return built

    def _as_of_now(self, share: float, notes: int) -> tuple[float, int]:
        """The worker's progress over the notes it set out with, as a share of the kiln's notes
        now: a note written since is searched by its words already (a result may list it), so
        it counts, as not embedded yet ("0% of the kiln's 122 notes" listed the 123rd)."""
        lexical = self._lexical
        now = len(lexical) if lexical is not None else 0
        if not now or now == notes:
            return share, notes
        return round(min(1.0, share * notes / now), 4), now

    def _retry_from_start(self) -> None:
        """A build ended (here or in another process): the next one that stops waits the least."""
        self._retry_wait, self._retry_at = self.config.index.retry_secs, None

    def _build(self) -> bool:
        """Embed what is missing; then `ready`, unless closed meanwhile (False)."""
        share, notes = self.share()
        self._set(phase="embedding", embedded=share, notes=notes, problem=None, force=True)
        if self.mode == "thread":
            self._build_here()
        else:
            self._build_in_worker()
        if self._stop.is_set():
            return False
        share, notes = self.share()
        self._set(phase="ready", embedded=share, notes=notes, problem=None, force=True)
        return True

    def _follow_others(self) -> bool:
        """Until closed (False): another process's update of this kiln (`cru kiln index
        --rebuild` in another terminal) shows as `waiting` with its progress, as when it held
        the lock at start, and the share it left when it is done. True when it left the index
        incomplete (stopped by Ctrl-C or a kill -9): this session builds the rest. An update
        too small to show is finished too when it left less embedded than before it (a
        `--rebuild` of a small kiln stopped midway). This session's build stopped midway
        (`_build_or_stop`) is ready once another process embedded the rest."""
        busy = shown = False
        before = 1.0  # the share embedded when the other's update began
        while not self._stop.wait(FOLLOW_EVERY):
            try:
                status = build_status(self.root)
                if status is not None and (os.getpid() in (status.get("pid"), status.get("cru"))
                                           or self._index.writing_here()):
                    status = None  # this process's own update (the watcher's changed notes)
                if status is not None:
                    if not busy:
                        busy, before = True, self._state.embedded
                    total = status.get("notes_total")
                    shown = shown or (isinstance(total, int) and total >= FOLLOW_MIN_NOTES)
                    if shown:
                        self._waiting(status)
                elif busy:
                    busy = False
                    self._index.reading(lambda: None)  # open the store again: it was rewritten
                    self._index.update_paths([])  # the notes changed here meanwhile (they waited)
                    share, notes = self.share()
                    if share < 1.0 and (shown or share < before):
                        return True
                    if shown or self._state.phase != "ready":
                        self._set(phase="ready", embedded=share, notes=notes, problem=None, force=True)
                    shown = False
                elif self._index.has_queued() and not self._index.writing_here():
                    # Changed notes the watcher left to the lock's holder when that was no
                    # update (a search opening the store again as the worker ended): embedded
                    # here, not at the next change ("embedded so far" stayed below 100%).
                    self._index.update_paths([])
                elif self._state.phase == "failed" and not self._search_broke:
                    # Stopped midway: finished since by an update too quick to be seen running
                    self._index.follow_store()
                    share, notes = self.share()
                    if share >= 1.0:
                        self._retry_from_start()
                        self._set(phase="ready", embedded=share, notes=notes, problem=None, force=True)
                    elif self._retry_at is not None and time.monotonic() >= self._retry_at:
                        log.info("the index's build stopped midway: trying it again")
                        self._retry_at = None
                        return True
            except Exception as exc:  # a look that failed says nothing of the index: look again
                log.debug("following other processes' updates failed: %s", exc)
        return False

    def _build_here(self) -> None:
        def progress(_: Any) -> None:
            share, notes = self.share()
            self._set(phase="embedding", embedded=share, notes=notes, problem=None)

        try:
            self._index.update(progress=progress, wait=self._waiting, stop=self._stop)
        except CrucibleError:
            if not self._stop.is_set():
                raise

    def _build_in_worker(self) -> None:
        """Run the update in `python -m crucible.kiln.builder` and follow its progress lines;
        then bring this process's view of the store up to date and take the notes changed
        meanwhile (the watcher queued them)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "crucible.kiln.builder", "--kiln", str(self.root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self._worker = proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        errors: list[str] = []
        drain = threading.Thread(target=_collect, args=(proc.stderr, errors), daemon=True)
        drain.start()
        try:
            # The config on stdin (it may hold an embedder's key: never in argv), then the pipe
            # stays open: the worker stops when it closes (this process gone).
            try:
                proc.stdin.write(self.config.model_dump_json() + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # the worker is gone already (stopped with this process): its exit says why
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "waiting" in msg:
                    self._waiting(msg["waiting"])
                elif "embedded" in msg:
                    share, notes = self._as_of_now(float(msg["embedded"]), int(msg.get("notes", self._state.notes)))
                    self._set(phase="embedding", embedded=share, notes=notes, problem=None)
                elif "error" in msg:
                    errors.append(str(msg["error"]))
        finally:
            code = proc.wait()
            drain.join(2)
            self._worker = None
        if code != 0 and not self._stop.is_set():
            raise CrucibleError(
                errors[-1] if errors else _worker_end(code),
                "cru kiln index",
            )
        if not self._stop.is_set():
            self._index.follow_store()
            self._index.update_paths([])  # the notes changed while the worker ran


def _status_share(status: dict[str, Any] | None, known: float) -> float:
    """The embedded share another process's status file says (a number in 0..1), else `known`."""
    value = (status or {}).get("embedded")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    return known


def _collect(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip())
        del into[:-20]


# ---------------------------------------------------------------------------------------------
# The worker process


def _worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m crucible.kiln.builder")
    ap.add_argument("--kiln", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass
    config = Config.model_validate_json(sys.stdin.readline())
    stop = threading.Event()

    def parent_watch() -> None:  # stdin closes when the parent goes, however it goes
        sys.stdin.read()
        stop.set()
        time.sleep(2)  # a group being written gets this long to finish
        os._exit(0)

    threading.Thread(target=parent_watch, daemon=True).start()

    def say(msg: dict[str, Any]) -> None:
        print(json.dumps(msg), flush=True)

    from crucible.kiln.index import KilnIndex  # chromadb (~1 s): after the parent heard we started

    try:
        # The notes' stamps alone, not their words: this process never searches them (it embeds
        # what changed; the session, which searches, saves the words). 10,000 notes: ~35 MiB
        # less of its peak (~700 MiB a minute into a first build).
        root = args.kiln.resolve()
        lexical, changed = load_lexical(root, config.index.collection, deferred=True, words=False)
        index = KilnIndex.open(root, config, lexical=(lexical, changed, threading.RLock()))
        index.working_for(os.getppid())
        last = 0.0

        def progress(_: Any) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= NOTIFY_EVERY:
                last = now
                embedded, total = index.embedded_share()
                say({"embedded": round(embedded / total, 4) if total else 1.0, "notes": total})

        def waiting(status: dict[str, Any] | None) -> bool:
            say({"waiting": status or {}})
            return not stop.is_set()

        try:
            report = index.update(progress=progress, wait=waiting, stop=stop)
            embedded, total = index.embedded_share()
            say({"embedded": round(embedded / total, 4) if total else 1.0, "notes": total,
                 "done": report.to_json()})
        finally:
            index.close()
    except CrucibleError as exc:
        say({"error": exc.message})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
