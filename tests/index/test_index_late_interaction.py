"""Late interaction (crucible/kiln/late_interaction.py): each chunk's word pieces, kept as bits
beside the index by the real built-in model, compared with a query's; and what the search does
with them when some are missing."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from index_helpers import stored_chunk_hashes, write_notes

from crucible.config import Config, IndexConfig
from crucible.kiln.index import KilnIndex
from crucible.kiln.late_interaction import (
    MAX_PIECES_PER_CHUNK,
    PLANE_BITS,
    PLANES_ID,
    TokenStore,
    maxsim_notes,
    rerank,
    tokens_file,
)
from crucible.kiln.search import hybrid_search

NOTES = {
    "Kitchen/Bread.md": "# Bread\n\nKnead the dough, let it rise overnight, then bake the loaf at 230 C.\n",
    "Kitchen/Soup.md": "# Soup\n\nSimmer onions and carrots in stock; blend until smooth.\n",
    "Code/Compiler.md": "# Compiler\n\nThe optimiser inlines small functions and removes dead branches.\n",
    "Code/Parser.md": "# Parser\n\nA recursive descent parser reads tokens into a syntax tree.\n",
}


@pytest.fixture
def indexed(tmp_path: Path) -> Iterator[KilnIndex]:
    write_notes(tmp_path / "kiln", NOTES)
    ix = KilnIndex.open(tmp_path / "kiln", Config())
    try:
        ix.update()
        yield ix
    finally:
        ix.close()


def test_every_chunk_keeps_its_word_pieces_privately_and_they_match_by_meaning(indexed: KilnIndex) -> None:
    ix = indexed
    store = ix.tokens
    assert store is not None  # the built-in model gives word pieces
    hashes = stored_chunk_hashes(ix, list(NOTES))
    assert sorted(hashes) == sorted(NOTES) and store.missing(h for hs in hashes.values() for h in hs) == set()
    path = tokens_file(ix.root, ix.name)
    for f in (path, path.with_name(path.name + "-wal")):  # the notes' pieces: the person's only
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # A question in other words than its note's is closest to it piece by piece.
    question = "how long should my loaf prove before it goes in the oven"
    _, query = ix.embed_query_pieces(question)
    assert query is not None
    scores = ix.piece_scores(query, list(NOTES))
    assert set(scores) == set(NOTES)
    assert max(scores, key=lambda p: scores[p]) == "Kitchen/Bread.md"
    assert hybrid_search(ix, question, 4)[0].path == "Kitchen/Bread.md"
    (ix.root / "Kitchen" / "Soup.md").unlink()
    ix.update()
    assert set(ix.piece_scores(query, list(NOTES))) == set(NOTES) - {"Kitchen/Soup.md"}


def test_a_lost_or_damaged_store_leaves_the_search_as_it_was_and_the_next_update_fills_it(
    indexed: KilnIndex,
) -> None:
    """Pieces damaged, or lost (the store emptied): the notes without them keep their fused
    place, and nothing fails; the next full update embeds what is missing, and only that."""
    ix = indexed
    store = ix.tokens
    assert store is not None
    query = "recursive descent parsing into a tree"
    assert hybrid_search(ix, query, 4)[0].path == "Code/Parser.md"
    db = sqlite3.connect(tokens_file(ix.root, ix.name))
    parser = stored_chunk_hashes(ix, ["Code/Parser.md"])["Code/Parser.md"]
    db.executemany("UPDATE bits SET bits = x'00ff' WHERE hash = ?", [(h,) for h in parser])  # not whole rows
    db.commit()
    db.close()
    _, pieces = ix.embed_query_pieces(query)
    assert pieces is not None and "Code/Parser.md" not in ix.piece_scores(pieces, list(NOTES))
    assert hybrid_search(ix, query, 4)[0].path == "Code/Parser.md"
    store.clear()
    assert ix.piece_scores(pieces, list(NOTES)) == {}
    assert [r.path for r in hybrid_search(ix, query, 4)] == [r.path for r in _without_pieces(ix, query)]
    report = ix.update()
    assert report.notes_unchanged == 0 and report.chunks_embedded == ix.count_chunks()
    assert set(ix.piece_scores(pieces, list(NOTES))) == set(NOTES)
    assert ix.update().chunks_embedded == 0  # known now: nothing embedded again


def _without_pieces(ix: KilnIndex, query: str) -> list:  # type: ignore[type-arg]
    """The search as `[index] word_pieces = false` makes it: as before late interaction."""
    real = ix.config
    ix.config = real.model_copy(update={"index": real.index.model_copy(update={"word_pieces": False})})
    try:
        return hybrid_search(ix, query, 4)
    finally:
        ix.config = real


def test_word_pieces_turned_off_are_neither_kept_nor_used(tmp_path: Path) -> None:
    root = tmp_path / "kiln"
    write_notes(root, NOTES)
    ix = KilnIndex.open(root, Config(index=IndexConfig(word_pieces=False)))
    try:
        ix.update()
        assert ix.tokens is None and ix.embed_query_pieces("bread")[1] is None
        assert not tokens_file(ix.root, ix.name).exists()
        query = "how long should my loaf prove before it goes in the oven"
        assert [r.path for r in hybrid_search(ix, query, 4)] == [r.path for r in _without_pieces(ix, query)]
    finally:
        ix.close()


def test_bits_compare_as_the_vectors_do(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / ".crucible" / "tokens-x.sqlite")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 384)).astype(np.float32)
    near = a + 0.1 * rng.standard_normal((5, 384)).astype(np.float32)
    far = rng.standard_normal((7, 384)).astype(np.float32)
    store.put([("near", near), ("far", far)])
    store.set_chunks({"Near.md": ["near"], "Far.md": ["far"], "Both.md": ["far", "near"], "None.md": ["none"]})
    got = store.note_pieces(["Near.md", "Far.md", "Both.md", "None.md"], 8)
    assert set(got) == {"Near.md", "Far.md", "Both.md"} and store.missing(["near", "none"]) == {"none"}
    q = store.bits(a)
    near_score, far_score, both_score = maxsim_notes(q, [got["Near.md"], got["Far.md"], got["Both.md"]])
    assert near_score is not None and far_score is not None and near_score > 0.9 > 0.3 > far_score
    assert both_score == near_score  # a note's best chunk
    assert maxsim_notes(q[:0], [got["Near.md"]]) == [None] and maxsim_notes(q, [[]]) == [None]
    store.close()


def test_a_store_from_elsewhere_is_read_within_bounds(tmp_path: Path) -> None:
    """A vault may bring its own `.crucible/tokens-*.sqlite`, made by anything: tables without
    their keys, a row of a gigabyte, a note of a million chunks. A row longer than any chunk's is
    not read (its chunk counts as without pieces, and is embedded again); no more than `most`
    rows a note are read."""
    path = tmp_path / ".crucible" / "tokens-x.sqlite"
    path.parent.mkdir()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT, value BLOB)")
    db.execute("INSERT INTO meta VALUES ('planes', ?)", (PLANES_ID,))
    db.execute("CREATE TABLE bits (hash TEXT, bits BLOB)")  # no keys: duplicates can be there
    db.execute("CREATE TABLE chunks (path TEXT, ordinal INTEGER, hash TEXT)")
    row = bytes(PLANE_BITS // 8)
    db.execute("INSERT INTO bits VALUES ('huge', ?)", (row * (MAX_PIECES_PER_CHUNK + 1),))
    db.execute("INSERT INTO bits VALUES ('small', ?)", (row * 3,))
    db.execute("INSERT INTO chunks VALUES ('Huge.md', 0, 'huge')")
    db.executemany("INSERT INTO chunks VALUES ('Many.md', 0, 'small')", [()] * 5000)
    db.commit()
    db.close()
    store = TokenStore(path)
    assert store.missing(["huge", "small"]) == {"huge"}
    got = store.note_pieces(["Huge.md", "Many.md"], 8)
    assert list(got) == ["Many.md"] and len(got["Many.md"]) == 8  # not 5,000 chunks read
    store.close()


def test_a_note_without_pieces_keeps_its_fused_score() -> None:
    fused = [("a", 1.0), ("b", 0.8), ("c", 0.2)]
    # scaled: fused a 1, b 0.75, c 0; pieces a 0, c 1; b has none and keeps 0.75 as its own
    assert [p for p, _ in rerank(fused, {"a": 0.1, "c": 0.9})] == ["b", "a", "c"]
    assert rerank(fused, {"a": 0.5}) == fused  # one note compared: nothing to weigh it against
    assert rerank(fused, {"a": 0.5, "c": 0.5}) == fused  # pieces that tell no note from another
