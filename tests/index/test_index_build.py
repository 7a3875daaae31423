"""KilnIndex against a real Chroma: full and incremental updates, bad input, locked and
damaged stores, an embedder switch, and a real `chroma run` server."""

from __future__ import annotations

import fcntl
import os
import pathlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from index_helpers import write_notes

from crucible.config import Config, EmbedderConfig, IndexConfig
from crucible.errors import CrucibleError
from crucible.kiln import index as index_mod
from crucible.kiln import lexical as lexical_mod
from crucible.kiln import store as store_mod
from crucible.kiln.embedder import MiniLMEmbedder
from crucible.kiln.index import LOCK_FILE, REBUILD, STORE_DIR, IndexProgress, KilnIndex
from crucible.kiln.search import hybrid_search, semantic_search


@pytest.fixture
def opened() -> Iterator[list[KilnIndex]]:
    """Indexes opened by a test, closed after it."""
    handles: list[KilnIndex] = []
    yield handles
    for h in handles:
        h.close()


def open_index(root: Path, opened: list[KilnIndex], config: Config | None = None, **kw: Any) -> KilnIndex:
    ix = KilnIndex.open(root, config or Config(), **kw)
    opened.append(ix)
    return ix


def paths(results: list[Any]) -> list[str]:
    return [r.path for r in results]


def test_full_then_nothing_to_do(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    seen: list[IndexProgress] = []
    report = ix.update(progress=seen.append)
    assert (report.notes_seen, report.notes_indexed, report.notes_unchanged) == (3, 3, 0)
    assert report.chunks_embedded == ix.count_chunks() == 5  # pasta: intro + 2 sections
    assert report.skipped == [] and report.degraded == []
    assert {p.phase for p in seen} == {"scan", "embed"}
    assert seen[-1].chunks_done == seen[-1].chunks_total == 5
    again = ix.update()
    assert (again.notes_indexed, again.notes_unchanged, again.chunks_embedded) == (0, 3, 0)
    assert ix.status().stale == 0
    assert paths(semantic_search(ix, "cooking noodles in boiling water", 3))[0] == "Cooking/Pasta.md"


def test_a_first_build_looks_up_no_stored_vectors_and_a_later_one_does(
    tiny_kiln: Path, opened: list[KilnIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing stored there is nothing to reuse: the first build does not ask Chroma for
    stored vectors (such a read, made while the build's first write created the vector
    segment, once failed in CI: "Nothing found on disk"); an update after it does, and reuses."""
    ix = open_index(tiny_kiln, opened)
    asked: list[list[str]] = []
    real = ix.chroma.stored_vectors
    monkeypatch.setattr(ix.chroma, "stored_vectors", lambda paths: asked.append(list(paths)) or real(paths))
    assert ix.update().chunks_embedded == 5 and asked == []
    note = tiny_kiln / "Cooking/Pasta.md"
    note.write_text(note.read_text().replace("parsley", "basil leaves"))
    report = ix.update()
    assert asked == [["Cooking/Pasta.md"]] and (report.chunks_embedded, report.chunks_reused) == (1, 2)


def test_change_one_section_reembeds_only_that_chunk(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    note = tiny_kiln / "Cooking/Pasta.md"
    note.write_text(note.read_text().replace("parsley", "basil leaves"))
    assert ix.status().stale == 1
    report = ix.update()
    assert (report.notes_indexed, report.notes_unchanged) == (1, 2)
    assert (report.chunks_embedded, report.chunks_reused) == (1, 2)
    assert ix.count_chunks() == 5
    hits = semantic_search(ix, "basil leaves", 1)
    assert hits[0].path == "Cooking/Pasta.md" and "basil" in hits[0].snippet


def test_removing_a_section_drops_its_chunk(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    note = tiny_kiln / "Cooking/Pasta.md"
    note.write_text(note.read_text().split("## Serving")[0])
    report = ix.update()
    assert (report.chunks_embedded, report.chunks_reused) == (0, 2)
    assert ix.count_chunks() == 4


def test_deleted_note_leaves_index_and_results(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    assert "Garden/Compost.md" in paths(hybrid_search(ix, "compost heap leaves", 3))
    (tiny_kiln / "Garden/Compost.md").unlink()
    report = ix.update()
    assert report.notes_removed == 1 and report.chunks_embedded == 0
    assert "Garden/Compost.md" not in ix.manifest()
    assert "Garden/Compost.md" not in paths(hybrid_search(ix, "compost heap leaves", 3))
    assert "Garden/Compost.md" not in paths(semantic_search(ix, "compost heap leaves", 3))


def test_update_paths_touches_only_the_named_notes(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    write_notes(tiny_kiln, {"New.md": "# Bicycles\n\nOil the chain and check tyre pressure.\n"})
    (tiny_kiln / "Links.md").unlink()
    report = ix.update_paths(["New.md", "Links.md", ".crucible/x.md", "notes.txt"])
    assert (report.notes_indexed, report.notes_removed, report.chunks_embedded) == (1, 1, 1)
    assert sorted(ix.manifest()) == ["Cooking/Pasta.md", "Garden/Compost.md", "New.md"]
    assert paths(hybrid_search(ix, "bike chain maintenance", 1)) == ["New.md"]


def test_bad_input_is_reported_and_indexing_goes_on(
    tiny_kiln: Path, opened: list[KilnIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tiny_kiln / "binary.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (tiny_kiln / "latin1.md").write_bytes("# Café\n\nCrème brûlée\n".encode("latin-1"))
    with open(tiny_kiln / "huge.md", "wb") as f:  # 50 MB (sparse: fast to make)
        f.truncate(50 * 1024 * 1024)
    (tiny_kiln / "broken.md").write_text(
        "---\ntitle: [unclosed\n---\n# Broken yaml\n\nThe frontmatter here is not valid.\n"
    )
    (tiny_kiln / "locked.md").write_text("# Locked\n\nSecret words.\n")
    # Tests run as root, for whom chmod 000 changes nothing: refuse this one file's open()
    # the way the OS would for another user.
    real_open = pathlib.Path.open

    def guarded_open(self: pathlib.Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "locked.md":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", guarded_open)
    real_os_open = os.open  # notes are read through an opened folder (O_NOFOLLOW): refuse there too

    def guarded_os_open(name: Any, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(os.fsdecode(name)) == "locked.md":
            raise PermissionError(13, "Permission denied", os.fsdecode(name))
        return real_os_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded_os_open)
    ix = open_index(tiny_kiln, opened)
    report = ix.update()
    skipped = dict(report.skipped)
    assert set(skipped) == {"binary.md", "latin1.md", "huge.md", "locked.md"}
    assert "binary" in skipped["binary.md"]
    assert "UTF-8" in skipped["latin1.md"]
    assert "too large" in skipped["huge.md"] and "50 MiB" in skipped["huge.md"]
    assert "permission denied" in skipped["locked.md"]
    assert [p for p, _ in report.degraded] == ["broken.md"]
    assert "YAML" in report.degraded[0][1]
    assert report.notes_indexed == 4  # the three good notes and the degraded one
    assert paths(hybrid_search(ix, "frontmatter is not valid", 1)) == ["broken.md"]
    for _, reason in report.skipped + report.degraded:
        assert str(tiny_kiln) not in reason
    # Unchanged on the next run: still reported, nothing re-embedded; and not counted as stale.
    again = ix.update()
    assert again.chunks_embedded == 0
    assert set(dict(again.skipped)) == set(skipped) and [p for p, _ in again.degraded] == ["broken.md"]
    assert ix.status().stale == 0


def test_note_that_turns_binary_leaves_the_index(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    (tiny_kiln / "Links.md").write_bytes(b"\x00\x01\x02binary now")
    report = ix.update()
    assert [p for p, _ in report.skipped] == ["Links.md"] and report.notes_removed == 1
    assert "Links.md" not in ix.manifest()


def test_a_named_pipe_is_never_read_by_the_index(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    """A FIFO called x.md blocked its reader in open() for good: a full update lists past it,
    and one named to update_paths (what the file watcher does when it appears) is skipped with
    why, not opened to read."""
    (tiny_kiln / "W").mkdir()
    os.mkfifo(tiny_kiln / "W" / "fifo2.md")
    ix = open_index(tiny_kiln, opened)
    report = ix.update()
    assert report.notes_seen == len(list(tiny_kiln.rglob("*.md"))) - 1 and "W/fifo2.md" not in ix.manifest()
    report = ix.update_paths(["W/fifo2.md"])
    assert "not a regular file (a named pipe); notes are regular files" in dict(report.skipped)["W/fifo2.md"]
    assert "W/fifo2.md" not in ix.manifest() and ix.status().stale == 0


def test_only_relative_paths_are_stored(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    got = ix.chunk_collection.get(include=["metadatas", "documents"])
    for meta in got["metadatas"]:
        assert not str(meta["path"]).startswith("/")
        assert all(str(tiny_kiln) not in str(v) for v in meta.values())
    ix.close()
    opened.remove(ix)
    for f in (tiny_kiln / STORE_DIR).rglob("*"):
        if f.is_file():
            assert str(tiny_kiln).encode() not in f.read_bytes(), f.name


class Renamed:
    """The built-in model under another name: an index built with it is 'another embedder'."""

    name = "test:renamed-minilm"
    dim = 384
    config = EmbedderConfig(provider="openai", model="renamed-minilm", url="http://127.0.0.1:9")

    def embed(self, texts: list[str]) -> np.ndarray:
        return MiniLMEmbedder().embed(texts)


def test_switching_embedder_rebuilds(
    tiny_kiln: Path, opened: list[KilnIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    open_index(tiny_kiln, opened).update()
    opened.pop().close()
    monkeypatch.setattr(index_mod, "make_embedder", lambda cfg: Renamed())
    ix = open_index(tiny_kiln, opened)
    assert ix.needs_rebuild and "builtin:all-MiniLM-L6-v2" in ix.needs_rebuild
    with pytest.raises(CrucibleError) as err:
        semantic_search(ix, "pasta", 3)
    assert err.value.fix == "cru kiln index"
    report = ix.update()
    assert report.rebuilt and report.chunks_embedded == 5 and report.notes_unchanged == 0
    assert ix.status().embedder == "test:renamed-minilm"
    assert paths(semantic_search(ix, "cooking noodles", 1)) == ["Cooking/Pasta.md"]
    # and a watcher-style partial update on a stale index rebuilds it the same way
    monkeypatch.undo()
    ix2 = open_index(tiny_kiln, opened)
    assert ix2.needs_rebuild
    assert ix2.update_paths(["Links.md"]).rebuilt


def test_index_locked_by_another_process(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    with open(tiny_kiln / LOCK_FILE, "a") as other:  # another updater holds the writer lock
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(CrucibleError) as err:
            ix.update()
    assert "another process" in err.value.message and REBUILD in (err.value.fix or "")
    assert ix.update().notes_unchanged == 3  # lock released: works again


def test_store_errors_become_messages_with_the_fix(tiny_kiln: Path) -> None:
    """Unit: what Chroma raises (its SQLite busy error, anything else) becomes a CrucibleError
    without the kiln's absolute path. (Chroma's own store did not surface a lock held by an
    outside SQLite connection in practice, hence the raised error here.)"""
    with pytest.raises(CrucibleError) as err:
        with store_mod.store_errors(tiny_kiln, STORE_DIR, "updating it"):
            raise sqlite3.OperationalError("database is locked")
    assert "locked by another process" in err.value.message and REBUILD in (err.value.fix or "")
    with pytest.raises(CrucibleError) as err:
        with store_mod.store_errors(tiny_kiln, STORE_DIR, "reading it"):
            raise RuntimeError(f"no such table in {tiny_kiln}/.crucible/chroma/chroma.sqlite3")
    assert "damaged" in err.value.message and err.value.fix == REBUILD
    assert str(tiny_kiln) not in str(err.value)
    assert not isinstance(err.value, store_mod.StaleViewError)  # damaged: opening again will not help
    # What an embedded Chroma says while another process drops and makes its collections again
    # (seen in CI during `cru kiln index --rebuild`): a stale view, which the reader retries
    # after opening the store again, not a damaged store.
    with pytest.raises(store_mod.StaleViewError):
        with store_mod.store_errors(tiny_kiln, STORE_DIR, "searching it"):
            raise RuntimeError("Error getting collection: Missing field: [Missing metadata segment]")


def test_corrupt_store_says_rebuild_and_rebuild_fixes_it(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    store = tiny_kiln / STORE_DIR
    store.mkdir(parents=True)
    (store / "chroma.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CrucibleError) as err:
        open_index(tiny_kiln, opened)
    assert err.value.fix == REBUILD
    assert str(tiny_kiln) not in str(err.value)
    ix = open_index(tiny_kiln, opened, rebuild=True)
    report = ix.update(rebuild=True)
    assert report.notes_indexed == 3 and report.rebuilt


def test_chroma_server_same_code_path(tiny_kiln: Path, opened: list[KilnIndex], chroma_server: str) -> None:
    import chromadb

    config = Config(index=IndexConfig(url=chroma_server, collection="tiny-server"))
    ix = open_index(tiny_kiln, opened, config)
    assert ix.store == chroma_server
    report = ix.update()
    assert report.notes_indexed == 3 and report.chunks_embedded == 5
    assert not (tiny_kiln / STORE_DIR).exists()  # nothing stored in the kiln
    (tiny_kiln / "Garden/Compost.md").unlink()
    assert ix.update().notes_removed == 1
    assert paths(hybrid_search(ix, "spaghetti sauce", 1)) == ["Cooking/Pasta.md"]
    # the rows are on the server, as any Chroma client sees them
    host, port = chroma_server.rsplit(":", 1)
    other = chromadb.HttpClient(host=host.split("//")[1], port=int(port))
    assert other.get_collection("tiny-server", embedding_function=None).count() == 4
    assert other.get_collection("tiny-server-notes", embedding_function=None).count() == 2
    # a rebuild through the server drops and refills the collections, in the update (under the
    # kiln's writer lock), not when it opens them: another cru may be writing them then
    ix.close()
    opened.remove(ix)
    ix = open_index(tiny_kiln, opened, config, rebuild=True)
    assert ix.count_notes() == 2 and ix.needs_rebuild
    report = ix.update()
    assert report.notes_indexed == 2 and report.rebuilt and not ix.needs_rebuild
    assert other.get_collection("tiny-server", embedding_function=None).count() == 4


def test_unreachable_server_is_a_clear_error(tiny_kiln: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(index=IndexConfig(url=f"http://127.0.0.1:{port}"))
    with pytest.raises(CrucibleError) as err:
        KilnIndex.open(tiny_kiln, config)
    assert "cannot reach the Chroma server" in err.value.message
    assert "chroma run" in (err.value.fix or "")


def test_interrupted_update_resumes_without_reembedding(tiny_kiln: Path, opened: list[KilnIndex]) -> None:
    ix = open_index(tiny_kiln, opened)
    ix.update()
    # The state a kill leaves mid-update: chunk rows written, the notes' rows (the manifest) not.
    ix.chroma.notes.delete(ids=["Cooking/Pasta.md", "Links.md"])
    assert ix.status().stale == 2
    report = ix.update()
    assert (report.notes_indexed, report.chunks_embedded, report.chunks_reused) == (2, 0, 4)
    assert ix.count_chunks() == 5 and ix.status().stale == 0


def test_shared_server_collection_is_not_taken_over_silently(
    tmp_path: Path, opened: list[KilnIndex], chroma_server: str
) -> None:
    config = Config(index=IndexConfig(url=chroma_server, collection="shared-coll"))
    first = tmp_path / "work-notes"
    write_notes(first, {"A.md": "# A\n\nAlpha.\n"})
    open_index(first, opened, config).update()
    second = tmp_path / "home notes"
    write_notes(second, {"B.md": "# B\n\nBeta.\n"})
    with pytest.raises(CrucibleError) as err:
        open_index(second, opened, config)
    assert "'work-notes'" in err.value.message
    assert 'collection = "kiln-home-notes"' in (err.value.fix or "")
    # the first kiln's index is intact; a rebuild from the second one takes the collection over
    assert sorted(open_index(first, opened, config).manifest()) == ["A.md"]
    taken = open_index(second, opened, config, rebuild=True)
    assert sorted(open_index(first, opened, config).manifest()) == ["A.md"]  # until it updates
    assert taken.update().notes_indexed == 1 and sorted(taken.manifest()) == ["B.md"]


def test_bad_collection_name(tiny_kiln: Path) -> None:
    with pytest.raises(CrucibleError) as err:
        KilnIndex.open(tiny_kiln, Config(index=IndexConfig(collection="my notes!")))
    assert "not a usable Chroma collection name" in err.value.message
    assert 'collection = "kiln-my-notes"' in (err.value.fix or "")


def test_a_note_past_the_words_kept_says_so(
    tiny_kiln: Path, opened: list[KilnIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A note of more distinct words than the lexical index keeps of it is indexed, and its
    problems say that the rest of its words do not find it (the cap made small here)."""
    monkeypatch.setattr(lexical_mod, "MAX_NOTE_TERMS", 300)
    (tiny_kiln / "Glossary.md").write_text("# Glossary\n\n" + " ".join(f"term{i}" for i in range(400)) + "\n")
    (tiny_kiln / "Short.md").write_text("# Short\n\n" + " ".join(f"term{i}" for i in range(250)) + "\n")
    ix = open_index(tiny_kiln, opened)
    report = ix.update()
    assert report.degraded == [("Glossary.md", "only its 300 most frequent distinct words are found by its words")]
    assert report.notes_indexed == 5
    assert "Glossary.md" in paths(hybrid_search(ix, "term7", 5))
