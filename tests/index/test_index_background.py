"""Issue 15: search from the first second. A partial index answers by words with the embedded
share; an update stopped (or killed -9) midway resumes without re-embedding what was written;
a session's background build and `cru kiln index` share one kiln (one writer, no lock errors)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from index_helpers import stored_chunk_hashes, write_notes
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

import crucible.kiln.index as index_module
from crucible.config import Config, EmbedderConfig
from crucible.errors import CrucibleError
from crucible.kiln import filesearch
from crucible.kiln.builder import FOLLOW_EVERY, BackgroundIndex
from crucible.kiln.index import STATUS_FILE, IndexProgress, KilnIndex, build_status
from crucible.kiln.lexical import LexicalIndex, lexical_file, load_lexical
from crucible.kiln.paths import STORE_DIR
from crucible.kiln.search import hybrid_search
from crucible.kiln.store import StaleViewError
from crucible.kiln_mcp import CrucibleKilnBackend, _message
from mcp_bridge.kiln_api import IndexShare

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from gated_embedder import GatedEmbedder  # noqa: E402

TOPICS = ["harbour", "glacier", "violin", "compiler", "orchard", "falcon", "lantern", "quarry"]


def many_notes(n: int) -> dict[str, str]:
    """`n` short notes (one chunk each), each with a word of its own."""
    return {
        f"batch-{i // 50:02d}/note-{i:04d}.md":
            f"# Note {i}\n\nAbout the {TOPICS[i % len(TOPICS)]} and the word uniqueword{i}.\n"
        for i in range(n)
    }


class CountingEmbedder:
    """The real built-in embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.inner.embed(texts)


def counting(index: KilnIndex) -> CountingEmbedder:
    embedder = CountingEmbedder(index.embedder)
    index.embedder = embedder  # type: ignore[assignment]
    return embedder


def test_a_kiln_never_indexed_answers_by_words_before_its_vector_store_opens(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first search on a kiln with no vectors does not wait for the vector store and the
    embedder to load (a second or more, on top of reading the notes): it answers by words from
    the lexical index alone, exactly as the open index would."""
    gate = threading.Event()
    real_open = KilnIndex.open

    def held_open(*args: Any, **kwargs: Any) -> KilnIndex:
        assert gate.wait(60)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(KilnIndex, "open", held_open)
    monkeypatch.setenv("CRUCIBLE_INDEX_MODE", "thread")
    backend = CrucibleKilnBackend(tiny_kiln, Config())
    try:
        backend.start_indexing()
        assert backend.index_ready()  # the first search need not wait for the store
        early = backend.semantic_search("chili flakes", 3)
        assert not (tiny_kiln / STORE_DIR).exists()  # answered while the store was held closed
        assert early.index == IndexShare(embedded=0.0, notes=3)
        hit = early.results[0]
        assert (hit.path, hit.heading, hit.line) == ("Cooking/Pasta.md", "Pasta night > Sauce", 11)
        gate.set()
        backend.open_index(lambda *_: None)
        assert backend._index is not None and (tiny_kiln / STORE_DIR).is_dir()
        later = hybrid_search(backend._index, "chili flakes", 3, by_meaning=False)
        assert [h.model_dump() for h in early.results] == [h.model_dump() for h in later]
    finally:
        gate.set()
        backend.close()


def test_a_search_reads_the_stores_generation_once_and_reports_the_share_as_of_it(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """semantic_search on the bridge caught up with other processes' writes twice, once for the
    share it reports and once inside the search: each a read of the store's generation, ~0.5 ms
    of a ~8 ms search. Once now, and the share it reports is as of that read: a note another
    process embedded meanwhile is found and counted."""
    monkeypatch.setenv("CRUCIBLE_INDEX_MODE", "thread")
    backend = CrucibleKilnBackend(tiny_kiln, Config())
    here = threading.get_ident()
    reads: list[int] = []
    real_generation = index_module.ChromaStore.generation

    def counted(store: Any) -> str:
        if threading.get_ident() == here:  # not the background index's own follower
            reads.append(1)
        return real_generation(store)

    try:
        backend.start_indexing()
        backend.open_index(lambda *_: None)
        deadline = time.monotonic() + 120
        while backend.index_state().phase != "ready":
            assert time.monotonic() < deadline, backend.index_state()
            time.sleep(0.05)
        backend.semantic_search("chili flakes", 3)  # loads the query model
        monkeypatch.setattr(index_module.ChromaStore, "generation", counted)
        found = backend.semantic_search("chili flakes", 3)
        assert len(reads) == 1
        assert found.index == IndexShare(embedded=1.0, notes=3)
        (tiny_kiln / "Quokka.md").write_text("# Quokka\n\nThe quokka census happens on Tuesdays.\n")
        other = KilnIndex.open(tiny_kiln, Config())  # `cru kiln index` in another terminal
        try:
            other.update()
        finally:
            other.close()
        reads.clear()
        found = backend.semantic_search("quokka census", 3)
        assert len(reads) == 1
        assert found.results[0].path == "Quokka.md"
        assert found.index == IndexShare(embedded=1.0, notes=4)
    finally:
        backend.close()


def test_the_vector_store_loads_after_the_searches_by_words_that_waited_for_it(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing and opening the vector store holds the GIL for a second or more: the searches
    by words that were waiting for the notes to be read answer first."""
    opened_at: list[float] = []
    real_open = KilnIndex.open

    def recording_open(*args: Any, **kwargs: Any) -> KilnIndex:
        opened_at.append(time.monotonic())
        return real_open(*args, **kwargs)

    monkeypatch.setattr(KilnIndex, "open", recording_open)
    background = BackgroundIndex(tiny_kiln, Config(), mode="thread")
    try:
        with background.words_only() as words:
            assert words is not None and len(words) == 3
            time.sleep(0.5)  # a long search: the opening waits for it
            assert not opened_at
            answered = time.monotonic()
        background.open_index()
        assert opened_at and opened_at[0] >= answered
        with background.words_only() as words:  # open now: search the index itself
            assert words is None
    finally:
        background.close()


def test_a_partial_index_answers_by_words_and_says_how_far_it_is(tiny_kiln: Path) -> None:
    ix = KilnIndex.open(tiny_kiln, Config())
    try:
        assert ix.embedded_share() == (0, 3)
        # Nothing embedded yet: the words alone answer, with the section and line from the file.
        hit = hybrid_search(ix, "chili flakes", 3)[0]
        assert (hit.path, hit.heading, hit.line) == ("Cooking/Pasta.md", "Pasta night > Sauce", 11)
        assert hit.snippet.startswith("Garlic, olive oil") and hit.title == "Pasta night"
        # One note embedded: found by meaning, the others still by their words.
        ix.update_paths(["Garden/Compost.md"])
        assert ix.embedded_share() == (1, 3)
        assert hybrid_search(ix, "rotting vegetable waste into soil", 1)[0].path == "Garden/Compost.md"
        assert hybrid_search(ix, "wikilinks", 1)[0].path == "Links.md"
        ix.update()
        assert ix.embedded_share() == (3, 3)
        (tiny_kiln / "Links.md").write_text("# Linking notes\n\nNew words: zeppelin.\n")
        ix.update_paths(["Links.md"])
        assert ix.embedded_share() == (3, 3)
    finally:
        ix.close()


def test_a_build_that_fails_after_its_last_write_is_ready_not_stopped(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that fails once every note is written (the worker killed as it exits, a last
    save failing) missed nothing: the session is ready, the agent's search says nothing of a
    stop, and no try is due (none was, before: a pointless retry was set, and the next real stop
    waited twice as long)."""
    real_update = KilnIndex.update

    def fails_after_writing(index: KilnIndex, *args: Any, **kwargs: Any) -> Any:
        real_update(index, *args, **kwargs)
        raise CrucibleError("the indexing worker was killed by SIGKILL")

    monkeypatch.setattr(KilnIndex, "update", fails_after_writing)
    monkeypatch.setenv("CRUCIBLE_INDEX_MODE", "thread")
    backend = CrucibleKilnBackend(tiny_kiln, Config())
    try:
        backend.start_indexing()
        backend.open_index(lambda *_: None)
        deadline = time.monotonic() + 120
        while (state := backend.index_state()).phase != "ready":
            assert time.monotonic() < deadline and state.phase != "failed", state
            time.sleep(0.05)
        assert state.embedded == 1.0 and state.problem is None, state
        found = backend.semantic_search("chili flakes", 3)
        assert found.index == IndexShare(embedded=1.0, notes=3) and found.summary_line() is None
        assert found.results[0].path == "Cooking/Pasta.md"
        assert backend._indexer().retry_due_in() is None
    finally:
        backend.close()


def test_a_stopped_update_resumes_without_reembedding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "GROUP_NOTES", 32)  # a small kiln in several groups
    root = tmp_path / "kiln"
    write_notes(root, many_notes(100))  # 4 groups of notes
    ix = KilnIndex.open(root, Config())
    embedder = counting(ix)
    stop = threading.Event()

    def progress(p: IndexProgress) -> None:
        if p.phase == "embed" and p.notes_done >= 32:  # the first group is embedded
            stop.set()

    report = ix.update(progress=progress, stop=stop)
    assert report.stopped and 0 < report.notes_indexed < 100
    embedded_first = embedder.texts
    assert ix.embedded_share() == (report.notes_indexed, 100)
    ix.close()

    again = KilnIndex.open(root, Config())
    embedder = counting(again)
    try:
        report = again.update()
        assert not report.stopped and report.notes_unchanged == 100 - report.notes_indexed
        assert embedder.texts == report.chunks_embedded == 100 - embedded_first  # nothing twice
        assert again.count_chunks() == again.count_notes() == 100
        assert again.embedded_share() == (100, 100)
    finally:
        again.close()


def test_kill_9_midway_then_a_restart_embeds_only_what_was_missing(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "kiln"
    notes = 8 * index_module.GROUP_NOTES + 16  # eight groups and a short one
    write_notes(root, many_notes(notes))
    proc = subprocess.Popen([cru_bin, "kiln", "index", "--kiln", str(root)], env=clean_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = root / STATUS_FILE
    try:
        # The writer's status file says how many notes are embedded; two groups embedded means
        # the first is written (the pipeline writes a group while it embeds the next).
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                done = json.loads(status.read_text()).get("notes_done", 0)
            except (OSError, ValueError):
                done = 0
            if done >= 2 * index_module.GROUP_NOTES:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the update ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    # The lock died with its holder; its status file did not, and is not the next holder's.
    assert status.exists() and build_status(root) is None
    lock = index_module.WriterLock(root)
    lock.acquire()
    try:
        assert build_status(root) == {}
    finally:
        lock.release()

    ix = KilnIndex.open(root, Config())
    stored = ix.count_chunks()
    ix.close()
    assert 0 < stored < notes

    done = subprocess.run([cru_bin, "kiln", "index", "--kiln", str(root), "--json"], env=clean_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # Every chunk written before the kill is kept: only the others are embedded now.
    assert report["chunks_embedded"] == notes - stored
    ix = KilnIndex.open(root, Config())
    try:
        assert ix.count_chunks() == ix.count_notes() == notes and ix.status().stale == 0
        # and every chunk has its word pieces, those written before the kill too
        assert ix.tokens is not None
        hashes = stored_chunk_hashes(ix, list(ix.manifest()))
        assert len(hashes) == notes and ix.tokens.missing(h for hs in hashes.values() for h in hs) == set()
    finally:
        ix.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_background_index_in_a_thread_and_in_a_worker(tiny_kiln: Path, mode: Any) -> None:
    states: list[str] = []
    ready = threading.Event()

    def heard(state: Any) -> None:
        states.append(state.phase)
        if state.phase in ("ready", "failed"):
            ready.set()

    background = BackgroundIndex(tiny_kiln, Config(), mode=mode)
    background.subscribe(heard)
    background.start()
    try:
        index = background.open_index()  # open (searchable by words) before it is embedded
        assert hybrid_search(index, "compost heap", 1)[0].path == "Garden/Compost.md"
        assert ready.wait(300), states
        state = background.state()
        assert (state.phase, state.embedded, state.notes) == ("ready", 1.0, 3), state
        assert states[0] == "opening" and "embedding" in states
        assert index.embedded_share() == (3, 3)
        assert hybrid_search(index, "rotting kitchen scraps", 1)[0].path == "Garden/Compost.md"
    finally:
        background.close()


def test_a_changed_note_left_while_a_search_held_the_lock_is_embedded_without_another_change(
        tiny_kiln: Path) -> None:
    """The watcher's `update_paths` leaves a changed note to whoever holds the index's lock in
    this process. A search opening the store again (as another process's writes ended) holds it
    too, and embeds nothing: the note stayed unembedded, "embedded so far", until the next change.
    The session's index embeds it by itself."""
    background = BackgroundIndex(tiny_kiln, Config(), mode="thread")
    background.start()
    try:
        index = background.open_index()
        deadline = time.monotonic() + 300
        while background.state().phase != "ready" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert background.state().phase == "ready", background.state()
        (tiny_kiln / "Harbor rota.md").write_text("# Harbor rota\n\nThe quayside lamplighter rota for winter.\n")
        held, release = threading.Event(), threading.Event()

        def reopening() -> None:  # as `KilnIndex._reopen` holds it, for as long as the test says
            with index._lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=reopening)
        holder.start()
        try:
            assert held.wait(10)
            index.update_paths(["Harbor rota.md"])  # the watcher's call: the words have it at once
            assert hybrid_search(index, "quayside lamplighter", 1)[0].path == "Harbor rota.md"
            assert index.embedded_share() == (3, 4)
        finally:
            release.set()
            holder.join(10)
        deadline = time.monotonic() + 10 * FOLLOW_EVERY
        while index.embedded_share() != (4, 4) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index.embedded_share() == (4, 4)
    finally:
        background.close()


def test_a_worker_gone_before_it_read_its_config_is_said_by_its_exit_not_a_traceback(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker may be gone before its config reaches it (a SIGTERM of `cru mcp` as it starts
    stops it first): that is its exit status, said as such, not a broken pipe's traceback."""
    real_popen = subprocess.Popen

    def gone_worker(argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        proc = real_popen([sys.executable, "-c", "import sys; sys.exit(3)"], **kwargs)
        proc.wait()  # gone: writing its config meets a closed pipe
        return proc

    background = BackgroundIndex(tiny_kiln, Config(), mode="process")
    failed = threading.Event()
    background.subscribe(lambda state: failed.set() if state.phase == "failed" else None)
    monkeypatch.setattr(subprocess, "Popen", gone_worker)
    background.start()
    try:
        assert failed.wait(120), background.state()
        assert background.state().problem == "the indexing worker stopped (exit status 3)"
        assert "Traceback" not in caplog.text and "BrokenPipeError" not in caplog.text
    finally:
        background.close()


def test_the_index_worker_reads_the_notes_stamps_alone_and_leaves_the_saved_words(tiny_kiln: Path) -> None:
    """The index worker embeds what changed and never searches: it reads the notes' titles and
    stamps, not their words (~35 MiB of its peak at 10,000 notes), and never writes the saved
    words (an index without them would replace them). A note changed since the save is
    embedded, and the words the session reads next are what reading the notes gives, with
    the words of the changed note's new link counted for the note it links to."""
    saved_before = LexicalIndex()
    saved_before.refresh(tiny_kiln)
    (tiny_kiln / ".crucible").mkdir(exist_ok=True)
    lexical_file(tiny_kiln, "kiln").write_bytes(saved_before.to_bytes())
    saved_bytes = lexical_file(tiny_kiln, "kiln").read_bytes()
    with (tiny_kiln / "Links.md").open("a") as f:
        f.write("\nA xylophone recipe for [[Garden/Compost|the quokka heap]].\n")
    worker = subprocess.Popen([sys.executable, "-m", "crucible.kiln.builder", "--kiln", str(tiny_kiln)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write(Config().model_dump_json() + "\n")
        worker.stdin.flush()
        said = [json.loads(line) for line in worker.stdout]  # until it is done and exits
    finally:
        worker.stdin.close()
        worker.wait(60)
    assert worker.returncode == 0 and "done" in said[-1], said[-3:]
    assert said[-1]["embedded"] == 1.0 and said[-1]["notes"] == len(saved_before.titles)
    assert lexical_file(tiny_kiln, "kiln").read_bytes() == saved_bytes  # the words left as saved
    index = KilnIndex.open(tiny_kiln, Config())
    try:
        assert "Links.md" in {h.path for h in hybrid_search(index, "xylophone recipe", 3)}
        assert index.embedded_share() == (len(saved_before.titles),) * 2
    finally:
        index.close()
    session_reads, _ = load_lexical(tiny_kiln, "kiln")  # a session's next start
    fresh = LexicalIndex()
    fresh.refresh(tiny_kiln)
    for path in fresh.titles:
        assert session_reads.bm25.counts(path) == fresh.bm25.counts(path), path
        assert session_reads.section_documents(path) == fresh.section_documents(path), path
    assert "quokka" in session_reads.bm25.counts("Garden/Compost.md")  # the link's words, for its target
    assert session_reads.search("xylophone", 3)[0][0] == "Links.md"


def test_once_ready_the_notes_properties_are_read_so_a_first_property_search_parses_nothing(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first property_search of a 10,000-note kiln parsed every note's YAML (~8 s): once the
    index is ready, the session reads them in the background and saves them."""
    (tiny_kiln / "Garden" / "Beds.md").write_text("---\nstatus: sprouting\ntags: [soil]\n---\n# Beds\n\nRaised beds.\n")
    background = BackgroundIndex(tiny_kiln, Config(), mode="thread")
    background.start()
    saved = tiny_kiln / filesearch.PROPERTIES_FILE
    try:
        deadline = time.monotonic() + 120
        while not (saved.exists() and len(json.loads(saved.read_text())["notes"]) == 4):
            assert time.monotonic() < deadline, background.state()
            time.sleep(0.1)
        assert background.state().phase == "ready"

        def no_parsing(*_: Any) -> None:
            raise AssertionError("a note was parsed again")

        monkeypatch.setattr(filesearch, "parse_note", no_parsing)
        hits = filesearch.property_search(tiny_kiln, "status:sprouting")
        assert [(h.path, h.snippet) for h in hits] == [("Garden/Beds.md", "status: sprouting")]
        assert [h.path for h in filesearch.property_search(tiny_kiln, "#soil")] == ["Garden/Beds.md"]
    finally:
        background.close()


def test_a_progress_change_held_back_by_the_throttle_is_sent_late_not_dropped(tiny_kiln: Path) -> None:
    """Progress is sent at most every NOTIFY_EVERY; a change inside that interval reaches the
    status bar when it is over (before: it was dropped, and the bar showed the older share until
    the next group of notes was done, which can take long)."""
    from crucible.kiln import builder

    heard: list[tuple[str, float]] = []
    got_last = threading.Event()

    def listener(state: Any) -> None:
        heard.append((state.phase, state.embedded))
        if state.embedded == 0.5:
            got_last.set()

    background = BackgroundIndex(tiny_kiln, Config())  # never started: its progress driven here
    background.subscribe(listener)
    background._set(phase="embedding", embedded=0.1, notes=3)
    background._set(embedded=0.3)  # within the interval: held back ...
    background._set(embedded=0.5)  # ... and replaced by the newer share
    assert heard == [("embedding", 0.1)]
    assert got_last.wait(builder.NOTIFY_EVERY * 4), heard
    assert heard == [("embedding", 0.1), ("embedding", 0.5)]  # the newest, once, in order
    background.close()


# --- through `cru mcp` -----------------------------------------------------------------------


@pytest.fixture
def stalled_embedder() -> Iterator[str]:
    """An OpenAI-style embedding server on 127.0.0.1 that accepts and never answers: a build
    that cannot progress, so the index stays at 0% for as long as the test looks."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def _config(env: dict[str, str], text: str) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _texts(result: Any) -> list[str]:
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


async def test_cru_mcp_answers_at_once_from_words_with_the_embedded_share(
    cru_bin: str, clean_env: dict[str, str], tmp_kiln: Path, stalled_embedder: str
) -> None:
    _config(clean_env, f'[embedder]\nprovider = "openai"\nmodel = "m"\nurl = "{stalled_embedder}"\n')
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(tmp_kiln)], env=clean_env)
    async with Client(params, mode="legacy") as c:
        with trio.fail_after(60):  # nothing is ever embedded: the answer cannot wait for it
            r = await c.call_tool("semantic_search", {"query": "sourdough starter", "limit": 3})
        assert not r.is_error, _texts(r)
        sc = r.structured_content
        assert sc is not None and sc["index"] == {"embedded": 0.0, "notes": 33}
        assert sc["results"][0]["path"] == "Cooking/Sourdough starter.md"
        as_json, line = _texts(r)
        assert json.loads(as_json) == sc
        assert line.startswith("Index: 0% of the kiln's 33 notes are embedded so far")
        assert sc["notice"] == line  # in the structured result too: all Claude Code's model reads
        # The answer came from the words while the vector store opened: then the build runs
        # (nothing is ever embedded here, so it stays at "embedding").
        with trio.fail_after(60):
            while True:
                r = await c.call_tool("get_kiln_stats", {})
                assert r.structured_content is not None
                index = r.structured_content["index"]
                if index["opened"] and index["phase"] != "opening":  # opened, then its build starts
                    break
                await trio.sleep(0.1)
        assert index["phase"] == "embedding" and index["embedded"] == 0.0


async def test_a_session_and_cru_kiln_index_share_the_kiln(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A session's build and `cru kiln index` on one kiln. The embedder is a real HTTP server
    that the test lets answer (fixtures/gated_embedder.py), so the session's build is still
    running when the other cru starts, however fast this machine embeds."""
    root = tmp_path / "kiln"
    notes = 300
    write_notes(root, many_notes(notes))
    with GatedEmbedder() as embedder:
        _config(clean_env, embedder.config_toml())
        params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(root)], env=clean_env)
        async with Client(params, mode="legacy") as c:
            await _share_the_kiln(c, embedder, cru_bin, clean_env, root, notes)
    assert not [p for p in os.listdir(root / ".crucible") if p.endswith(".json") and "build" in p]


async def _share_the_kiln(c: Client, embedder: GatedEmbedder, cru_bin: str, clean_env: dict[str, str],
                          root: Path, notes: int) -> None:
    async def phase() -> dict[str, Any]:
        r = await c.call_tool("get_kiln_stats", {})
        assert r.structured_content is not None
        return dict(r.structured_content["index"])

    with trio.fail_after(120):  # the session's background build holds the writer lock
        while not (build_status(root) or {}).get("notes_total") or not embedder.requested.is_set():  # noqa: ASYNC110
            await trio.sleep(0.1)
    assert (await phase())["phase"] == "embedding"
    # `cru kiln info` shows the state: the share embedded so far and who is building
    info = await trio.run_process([cru_bin, "kiln", "info", "--kiln", str(root), "--json"], env=clean_env,
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert info.returncode == 0, info.stderr.decode()
    index = json.loads(info.stdout)["index"]
    assert index["building"]["pid"] != os.getpid() and index["building"]["notes_total"] == notes
    assert 0.0 <= index["embedded"] < 1.0
    # the pid shown is the session's cru (the writer is its index worker, a child)
    session = index["building"]["cru"]
    assert session != index["building"]["pid"]
    assert b"mcp" in (await trio.Path(f"/proc/{session}/cmdline").read_bytes()).split(b"\0")
    text = await trio.run_process([cru_bin, "kiln", "info", "--kiln", str(root)], env=clean_env,
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert f"being updated now by another cru (pid {session})" in text.stdout.decode()
    assert "\nindex: being updated: " in text.stdout.decode()  # not "stale", while it is built
    # `cru kiln index` beside it: waits for the session's build (showing it), then runs.
    other = await trio.lowlevel.open_process(
        [cru_bin, "kiln", "index", "--kiln", str(root), "--json"], env=clean_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert other.stdout is not None and other.stderr is not None
    err = out = b""

    async def drain_err() -> None:
        nonlocal err
        while chunk := await other.stderr.receive_some():  # type: ignore[union-attr]
            err += chunk

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_err)
            while f"waiting for another cru (pid {session})".encode() not in err:  # noqa: ASYNC110
                assert other.returncode is None, err.decode()
                await trio.sleep(0.05)
            embedder.open()  # the session's build goes on, then the other runs
            while chunk := await other.stdout.receive_some():
                out += chunk
        await other.wait()
    assert other.returncode == 0, err.decode()
    assert "locked" not in err.decode()
    assert json.loads(out)["notes_seen"] == notes
    # the session searched throughout and ends with the whole kiln embedded
    with trio.fail_after(120):
        while (state := await phase()).get("phase") != "ready":  # noqa: ASYNC110 - seen by asking
            await trio.sleep(0.1)
    assert state["embedded"] == 1.0 and state["notes"] == notes
    r = await c.call_tool("semantic_search", {"query": "uniqueword123", "limit": 2})
    assert r.structured_content is not None
    # The gated embedder's vectors mean nothing (a hash of the text): the only note with the word
    # scores at least as high as the nearest vector's note, so it is one of the first two.
    assert "batch-02/note-0123.md" in [hit["path"] for hit in r.structured_content["results"]]
    assert r.structured_content["index"] == {"embedded": 1.0, "notes": notes}
    assert "notice" not in r.structured_content and len(r.content) == 1  # complete: nothing to say


async def test_searches_while_the_worker_writes_the_first_vectors_all_answer(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`cru mcp` on a kiln never indexed, searched over and over while its index worker writes
    the first vectors: Chroma in cru mcp cannot read another process's first writes until it
    opens the store again (it failed every search with "Nothing found on disk" until the
    worker's next generation, or for good). Every search answers, by meaning as it comes."""
    root = tmp_path / "kiln"
    notes = 400
    write_notes(root, many_notes(notes))
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(root)], env=clean_env)
    failed: list[str] = []
    shares: list[float] = []
    async with Client(params, mode="legacy") as c:
        with trio.fail_after(240):
            while len([s for s in shares if s > 0]) < 30 and (not shares or shares[-1] < 1.0):
                r = await c.call_tool("semantic_search", {"query": "uniqueword123", "limit": 1})
                if r.is_error:
                    failed.append(" ".join(_texts(r)))
                else:
                    assert r.structured_content is not None
                    shares.append(r.structured_content["index"]["embedded"])
                await trio.sleep(0.2)
    assert not failed, failed[:3]
    assert 0.0 < max(shares)  # the worker wrote while the searches ran


@asynccontextmanager
async def _indexed_behind_a_gate(
    cru_bin: str, clean_env: dict[str, str], root: Path, query: str
) -> AsyncIterator[GatedEmbedder]:
    """300 notes in `root`, indexed by `cru kiln index` through a gated embedder (open) that the
    cru processes of the test use too; `query` (the searches') is always answered at once."""
    write_notes(root, many_notes(300))
    with GatedEmbedder(answer_at_once=lambda texts: texts == [query]) as embedder:
        embedder.open()
        _config(clean_env, embedder.config_toml())
        built = await trio.run_process([cru_bin, "kiln", "index", "--kiln", str(root)], env=clean_env,
                                       capture_stdout=True, capture_stderr=True, check=False)
        assert built.returncode == 0, built.stderr.decode()
        yield embedder


async def test_searches_while_another_cru_rebuilds_the_index_all_answer(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`cru mcp` serving an embedded kiln while `cru kiln index --rebuild` in another process
    throws the store away and builds it again: the first search after the store's files were
    replaced failed with "disk I/O error" and the advice to run the rebuild that was running.
    The embedder is a real HTTP server that holds the rebuild's batches until the test lets
    them go (the search's own query is answered at once), so the searches run while the new
    store is empty, however fast this machine builds. Every search answers, by words while
    the new store lacks this note, and from the whole index when the rebuild is done."""
    root = tmp_path / "kiln"
    query = "uniqueword123"
    async with _indexed_behind_a_gate(cru_bin, clean_env, root, query) as embedder:
        params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(root)], env=clean_env)
        failed: list[str] = []
        found: list[str] = []
        shares: list[float] = []
        async with Client(params, mode="legacy") as c:

            async def search() -> None:
                r = await c.call_tool("semantic_search", {"query": query, "limit": 1})
                if r.is_error:
                    failed.append(" ".join(_texts(r)))
                else:
                    assert r.structured_content is not None
                    found.append(r.structured_content["results"][0]["path"])
                    shares.append(r.structured_content["index"]["embedded"])

            await search()
            assert not failed and found == ["batch-02/note-0123.md"] and shares == [1.0]
            embedder.shut()
            built_requests = embedder.requests
            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    done = trio.Event()

                    async def rebuild() -> None:
                        other = await trio.run_process(
                            [cru_bin, "kiln", "index", "--rebuild", "--kiln", str(root)], env=clean_env,
                            capture_stdout=True, capture_stderr=True, check=False)
                        assert other.returncode == 0, other.stderr.decode()
                        done.set()

                    nursery.start_soon(rebuild)
                    while embedder.requests == built_requests:  # the store is thrown away before the first batch
                        await search()
                        await trio.sleep(0.05)
                    held = len(found)
                    for _ in range(10):  # the rebuild waits at its first batch: the new store is empty
                        await search()
                        await trio.sleep(0.05)
                    assert not failed, failed[:3]
                    assert found[held:] == ["batch-02/note-0123.md"] * 10  # found by its word
                    assert shares[-1] == 0.0  # and the answer says nothing is embedded yet
                    embedder.open()
                    while not done.is_set():
                        await search()
                        await trio.sleep(0.05)
            for _ in range(3):
                await search()
    assert not failed, failed[:3]
    assert found[-3:] == ["batch-02/note-0123.md"] * 3
    assert shares[-1] == 1.0


async def test_a_writer_stopped_midway_is_named_and_the_others_do_not_freeze(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`cru kiln index --rebuild` stopped by Ctrl-Z (SIGSTOP) in the middle of its update:
    opening the store while it is stopped inside a write waits until it goes on, in silence and
    holding the GIL, so a `cru mcp` started then froze whole (found by hand, ~1 stop in 8).
    `cru kiln info` says whom it waits for and how to let it go on; `cru mcp` answers by words
    at once; once the writer goes on, both finish, and the search is by meaning again. (The
    writer is stopped here while the gated embedder holds it, not inside a write: the test
    checks what the others do about a stopped writer, which is what they can see.)"""
    root = tmp_path / "kiln"
    query = "uniqueword123"
    async with _indexed_behind_a_gate(cru_bin, clean_env, root, query) as embedder:
        embedder.shut()
        before = embedder.requests
        writer = await trio.lowlevel.open_process(
            [cru_bin, "kiln", "index", "--rebuild", "--kiln", str(root)], env=clean_env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        info: trio.Process | None = None
        try:
            with trio.fail_after(60):
                while embedder.requests == before:  # noqa: ASYNC110 - the embedder is a thread
                    await trio.sleep(0.05)
            os.kill(writer.pid, signal.SIGSTOP)
            info = await trio.lowlevel.open_process([cru_bin, "kiln", "info", "--kiln", str(root)], env=clean_env,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert info.stdout is not None and info.stderr is not None
            said = b""
            with trio.fail_after(30):
                while b"\n" not in said:
                    chunk = await info.stderr.receive_some()
                    assert chunk, said
                    said += chunk
            assert said.decode().strip() == (
                f"index: waiting for another cru (pid {writer.pid}) that is writing this kiln's index; it "
                f"is stopped (Ctrl-Z?): `fg` it in its terminal, or `kill -CONT {writer.pid}`")
            params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(root)], env=clean_env)
            async with Client(params, mode="legacy") as c:
                with trio.fail_after(30):
                    r = await c.call_tool("semantic_search", {"query": query, "limit": 1})
                assert not r.is_error and r.structured_content is not None, _texts(r)
                assert r.structured_content["results"][0]["path"] == "batch-02/note-0123.md"
                assert r.structured_content["index"]["embedded"] == 0.0  # by words: the store is not open
                with trio.fail_after(30):  # and the agent can see why
                    while True:
                        stats = (await c.call_tool("get_kiln_stats", {})).structured_content
                        assert stats is not None
                        if stats["index"].get("phase") == "waiting":
                            break
                        await trio.sleep(0.2)
                assert stats["index"]["opened"] is False
                assert stats["index"]["problem"] == (
                    f"another cru (pid {writer.pid}) is updating the index; it is stopped (Ctrl-Z?): "
                    f"`fg` it in its terminal, or `kill -CONT {writer.pid}`")
                assert info.poll() is None  # still waiting for the writer
                os.kill(writer.pid, signal.SIGCONT)
                embedder.open()
                with trio.fail_after(120):
                    assert await writer.wait() == 0
                    out = b""
                    while chunk := await info.stdout.receive_some():
                        out += chunk
                    assert await info.wait() == 0
                assert "index: " in out.decode(), out
                with trio.fail_after(60):
                    while True:
                        r = await c.call_tool("semantic_search", {"query": query, "limit": 1})
                        assert r.structured_content is not None, _texts(r)
                        if r.structured_content["index"]["embedded"] == 1.0:
                            break
                        await trio.sleep(0.2)
                assert r.structured_content["results"][0]["path"] == "batch-02/note-0123.md"
        finally:
            for proc in (writer, info):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    await proc.wait()


@contextmanager
def _ready_session(root: Path, clean_env: dict[str, str]) -> Iterator[tuple[GatedEmbedder, BackgroundIndex]]:
    """A session's index (in this process) on `root`, built through a gated embedder that the
    `cru` processes of the test use too; yielded once the kiln is embedded, closed after."""
    with GatedEmbedder() as embedder:
        embedder.open()
        _config(clean_env, embedder.config_toml())
        config = Config(embedder=EmbedderConfig(provider="openai", model="gated", url=embedder.url,
                                                batch_size=32))
        background = BackgroundIndex(root, config, mode="thread")
        background.start()
        try:
            deadline = time.monotonic() + 60
            while background.state().phase != "ready":
                assert time.monotonic() < deadline and background.state().phase != "failed", background.state()
                time.sleep(0.05)
            yield embedder, background
        finally:
            background.close()


def test_another_processs_small_update_is_not_shown_and_the_notes_changed_meanwhile_follow(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Two sessions on a kiln: a note saved re-indexes in one (here `cru kiln index`), and the
    other's status bar must not flash `indexing 99% (another cru)` for it. A note this session
    changed meanwhile waited for the other's lock: it is embedded when the other is done."""
    root = tmp_path / "kiln"
    notes = many_notes(60)
    write_notes(root, notes)
    with _ready_session(root, clean_env) as (embedder, background):
        phases: list[str] = []
        background.subscribe(lambda state: phases.append(state.phase))
        other: subprocess.Popen[str] | None = None
        deadline = time.monotonic() + 60
        try:
            index = background.open_index()
            assert index.embedded_share() == (60, 60)
            embedder.shut()  # the other's embedding waits at the gate while this one looks
            changed = sorted(notes)[:3]
            for rel in changed:
                (root / rel).write_text(notes[rel] + "\nEdited elsewhere.\n")
            other = subprocess.Popen([cru_bin, "kiln", "index", "--kiln", str(root)], env=clean_env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            while not (build_status(root) or {}).get("notes_total"):
                assert other.poll() is None and time.monotonic() < deadline + 60, other.stderr
                time.sleep(0.05)
            assert build_status(root)["notes_total"] == 3  # type: ignore[index]
            mine = sorted(notes)[10]
            (root / mine).write_text(notes[mine] + "\nEdited here.\n")
            assert index.update_paths([mine]).notes_indexed == 0  # the other holds the lock
            time.sleep(3 * FOLLOW_EVERY)  # the session looked at least twice meanwhile
            embedder.open()
            _, err = other.communicate(timeout=60)
            assert other.returncode == 0, err
            deadline = time.monotonic() + 30
            while index.embedded_share() != (60, 60):
                assert time.monotonic() < deadline, index.embedded_share()
                time.sleep(0.1)
            assert "waiting" not in phases and background.state().phase == "ready", phases
        finally:
            if other is not None and other.poll() is None:
                other.kill()
                other.wait()


def test_a_small_kilns_rebuild_killed_midway_in_another_process_is_finished_by_the_session(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`cru kiln index --rebuild` on a kiln too small to show in the session's bar, killed with
    kill -9 after it emptied the store: the session, which had the whole kiln embedded, builds
    it again rather than searching a near-empty index until its next start."""
    root = tmp_path / "kiln"
    write_notes(root, many_notes(20))
    with _ready_session(root, clean_env) as (embedder, background):
        other: subprocess.Popen[str] | None = None
        deadline = time.monotonic() + 60
        try:
            index = background.open_index()
            assert index.embedded_share() == (20, 20)
            embedder.shut()  # the rebuild empties the store, then waits at the gate
            asked = embedder.requests
            other = subprocess.Popen([cru_bin, "kiln", "index", "--rebuild", "--kiln", str(root)],
                                     env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
            while embedder.requests == asked:
                assert other.poll() is None and time.monotonic() < deadline + 60, other.stderr
                time.sleep(0.05)
            time.sleep(2 * FOLLOW_EVERY)  # the session saw it (too small to show)
            other.kill()
            other.wait()
            assert index.reading(index.count_notes) == 0  # what the rebuild left: nothing
            embedder.open()
            deadline = time.monotonic() + 30
            while index.reading(index.count_notes) != 20 or background.state().phase != "ready":
                assert time.monotonic() < deadline, (index.embedded_share(), background.state())
                time.sleep(0.1)
            assert index.embedded_share() == (20, 20) and background.state().embedded == 1.0
        finally:
            if other is not None and other.poll() is None:
                other.kill()
                other.wait()


def test_a_tool_errors_fix_is_a_sentence_and_a_command_in_it_stays_a_command() -> None:
    assert _message(CrucibleError("the index is damaged", "cru kiln index --rebuild")) == (
        "the index is damaged. Run `cru kiln index --rebuild`.")
    assert _message(CrucibleError("it changed", "read the note again")) == "it changed. Read the note again."
    assert _message(CrucibleError("no fix here")) == "no fix here"


def test_a_read_that_fails_again_after_reopening_answers_by_words_only_while_another_process_writes(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unit test of `KilnIndex.reading` (the store's failure is a stand-in here; the real one
    is driven through cru mcp above): a read is retried after the store is opened again;
    failing still it is an error, unless another process holds the writer lock (a build)."""
    index = KilnIndex.open(tiny_kiln, Config())
    attempts: list[int] = []

    def read() -> str:
        attempts.append(1)
        raise StaleViewError("the index in .crucible/chroma is damaged or unreadable", "cru kiln index --rebuild")

    try:
        with pytest.raises(StaleViewError):
            index.reading(read, fallback=lambda: "by words")
        # opened again before the second, a pause before the third; no process writing: once more
        assert len(attempts) == 4
        attempts.clear()
        with pytest.raises(StaleViewError):  # a reading inside a reading: the outer one's tries
            index.reading(lambda: index.reading(read))
        assert len(attempts) == 4  # not 4 x 4
        attempts.clear()
        monkeypatch.setattr(index_module, "build_status", lambda root: {"pid": 12345})
        assert index.reading(read, fallback=lambda: "by words") == "by words"
        assert len(attempts) == 3  # still being written: no last try
        with pytest.raises(StaleViewError):  # no fallback: the error
            index.reading(read)
    finally:
        index.close()


def test_a_writer_that_ends_during_the_tries_is_not_taken_for_a_damaged_store(tiny_kiln: Path) -> None:
    """The race CI met in `cru mcp` at the end of a first build: the index worker wrote its last
    generation and let go of the lock while a search's tries failed (the store's failure is a
    stand-in here). No process writes by the end of the tries, but one did during them: the
    search answers by words, not "damaged, run the rebuild"; and the next read goes through."""
    index = KilnIndex.open(tiny_kiln, Config())
    other = KilnIndex.open(tiny_kiln, Config())  # the worker: another client of the same store
    attempts: list[int] = []

    def read() -> str:
        attempts.append(1)
        if len(attempts) == 3:
            other.update()  # the worker's writes and last generation, then its lock is free
        raise StaleViewError("the index in .crucible/chroma is damaged or unreadable while reading it "
                             "(InternalError: Error executing plan: Internal error: Error finding id)",
                             "cru kiln index --rebuild")

    try:
        assert index.reading(read, fallback=lambda: "by words") == "by words"
        assert len(attempts) == 4  # the last try saw the new generation through a view opened anew
        assert index.reading(lambda: index.count_notes()) == 3
    finally:
        other.close()
        index.close()


def test_a_store_unreadable_after_another_process_wrote_fails_no_search_and_no_build(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of the vector store failing as Chroma fails beside another process's fresh
    writes (the failure is injected here; the real one is driven through cru mcp above): once
    another process has written, a search answers by words with the share known last, and the
    build's state is not "failed" for it. Each read path of a search is covered at once."""
    monkeypatch.setenv("CRUCIBLE_INDEX_MODE", "thread")
    backend = CrucibleKilnBackend(tiny_kiln, Config())
    other = None
    try:
        backend.start_indexing()
        backend.open_index(lambda *_: None)
        deadline = time.monotonic() + 300
        while backend.index_state().phase != "ready":
            assert time.monotonic() < deadline and backend.index_state().phase != "failed"
            time.sleep(0.1)
        before = backend.semantic_search("chili flakes", 3)
        other = KilnIndex.open(tiny_kiln, Config())  # another writer (its own client)
        (tiny_kiln / "Links.md").write_text("# Linking notes\n\nNew words: zeppelin.\n")
        other.update_paths(["Links.md"])

        def unreadable(*_: Any, **__: Any) -> Any:
            raise StaleViewError("the index in .crucible/chroma is damaged or unreadable while reading it "
                                 "(InternalError: Error executing plan: Internal error: Error finding id)",
                                 "cru kiln index --rebuild")

        for name in ("manifest", "count_notes", "chunks_by_id", "note_vectors", "note_chunks", "_query"):
            monkeypatch.setattr(index_module.ChromaStore, name, unreadable)
        after = backend.semantic_search("chili flakes", 3)
        assert after.results[0].path == before.results[0].path == "Cooking/Pasta.md"
        assert after.results[0].heading == "Pasta night > Sauce"
        assert after.index == IndexShare(embedded=1.0, notes=3)
        assert backend.semantic_search("zeppelin", 1).results[0].path == "Links.md"  # the other's write
        assert backend._indexer().share() == (1.0, 3)  # the build's state keeps what it knew
        monkeypatch.setattr(index_module.ChromaStore, "generation", unreadable)  # read before each try
        assert backend.semantic_search("chili flakes", 3).results[0].path == "Cooking/Pasta.md"
    finally:
        if other is not None:
            other.close()
        backend.close()
