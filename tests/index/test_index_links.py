"""The words around a wikilink count for the note it points to (crucible/kiln/anchors.py): a
note is found by what other notes say of it, kept right as notes change, are added, removed or
renamed, and through a save and a load."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.kiln.anchors import LinkGraph
from crucible.kiln.lexical import (
    ANCHOR_WORDS,
    MAX_LINKS,
    MAX_NOTE_TERMS,
    LexicalIndex,
    link_terms,
    note_fields,
    tokenize,
    words_problem,
)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _found(lex: LexicalIndex, query: str) -> list[str]:
    return [p for p, _ in lex.search(query, 10)]


def test_a_note_is_found_by_the_words_of_the_links_to_it(tmp_path: Path) -> None:
    _write(tmp_path, "Guides/Basic Commands.md", "# Basic Commands\n\n`cru chat`, `cru kiln index`.\n")
    _write(tmp_path, "Home.md", "# Home\n\n- [[Basic Commands]] - the handful of instructions typed daily\n")
    _write(tmp_path, "Other.md", "# Other\n\nNothing about it here.\n")
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    assert set(_found(lex, "instructions typed daily")) == {"Guides/Basic Commands.md", "Home.md"}

    # the link goes: so do its words from the target
    _write(tmp_path, "Home.md", "# Home\n\nthe handful of instructions typed daily\n")
    lex.refresh(tmp_path)
    assert _found(lex, "instructions typed daily") == ["Home.md"]

    # a link to a note that does not exist yet names it once it is created, and its shown text counts
    _write(tmp_path, "Other.md", "# Other\n\nSee [[Later|the garden planner]] for sowing dates.\n")
    lex.refresh(tmp_path)
    assert _found(lex, "garden planner") == ["Other.md"]
    _write(tmp_path, "Plans/Later.md", "# Later\n\nRows and dates.\n")
    lex.refresh(tmp_path)
    assert set(_found(lex, "garden planner")) == {"Other.md", "Plans/Later.md"}
    # ... and no longer once it is gone
    (tmp_path / "Plans/Later.md").unlink()
    lex.refresh(tmp_path)
    assert _found(lex, "garden planner") == ["Other.md"]


def test_links_resolve_as_obsidian_resolves_them(tmp_path: Path) -> None:
    notes = {
        "A/Index.md": "# A index\n",
        "B/Index.md": "# B index\n",
        "Deep/Er/Index.md": "# Deep index\n",
        "B/Note.md": "[[Index]] sibling words\n\n[[/Deep/Er/Index.md]] whole path words\n",
        "C/Note.md": "[[Index]] elsewhere words\n\n[[er/index]] partial path words\n\n![[Index]] embedded words\n",
        "Self.md": "[[Self]] mirror words\n\n```\n[[Index]] fenced words\n```\n\n`[[Index]]` inline code words\n",
    }
    for rel, text in notes.items():
        _write(tmp_path, rel, text)
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    assert set(_found(lex, "sibling")) == {"B/Index.md", "B/Note.md"}  # the one in the linking note's folder
    assert set(_found(lex, "elsewhere")) == {"A/Index.md", "C/Note.md"}  # else the shortest path
    assert set(_found(lex, "whole")) == {"Deep/Er/Index.md", "B/Note.md"}  # a path from the root
    assert set(_found(lex, "partial")) == {"Deep/Er/Index.md", "C/Note.md"}  # its end, any case
    for word in ("embedded", "mirror", "fenced", "inline"):  # embeds, self-links, code: no link
        assert len(_found(lex, word)) == 1, word
    # an exact path wins over the folder and the length: a note at the root named like them
    _write(tmp_path, "Index.md", "# Root index\n")
    lex.refresh(tmp_path)
    assert set(_found(lex, "sibling")) == {"Index.md", "B/Note.md"}
    assert set(_found(lex, "elsewhere")) == {"Index.md", "C/Note.md"}


def test_a_note_of_many_links_counts_the_first_ones_read_in_one_pass() -> None:
    """A hostile note: 50,000 links on one line. The first MAX_LINKS count, each target with the
    words beside its own link (ANCHOR_WORDS on each side), not the whole line; the rest do not."""
    line = " ".join(f"w{i} [[t{i}]]" for i in range(50_000))
    links = link_terms(note_fields(line + "\n\n[[later]] words", "n.md").link_lines)
    assert len(links) == MAX_LINKS and "later" not in links
    assert links["t500"] == {f"w{i}": 1 for i in range(501 - ANCHOR_WORDS, 501 + ANCHOR_WORDS)}
    last = MAX_LINKS - 1  # the words after the last one counted: up to the next link
    assert links[f"t{last}"] == {f"w{i}": 1 for i in range(last + 1 - ANCHOR_WORDS, last + 2)}


def test_a_note_of_more_distinct_words_than_a_book_keeps_its_most_frequent(tmp_path: Path) -> None:
    """A hostile note of a million distinct words cost 830 MB in `cru kiln index` (each word a
    posting). The lexical index keeps the note's MAX_NOTE_TERMS most frequent terms, the title's
    among them, and its length as it is; the words of other notes are found as before."""
    words = " ".join(f"zq{i}x" for i in range(MAX_NOTE_TERMS + 20_000))
    _write(tmp_path, "Big.md", f"# Pelican migration\n\n{words}\n\nPelicans fly south. Pelicans rest.\n")
    _write(tmp_path, "Small.md", "# Small\n\nA heron and a pelican.\n")
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    counts = lex.bm25.counts("Big.md")
    assert len(counts) == MAX_NOTE_TERMS
    assert counts["pelican"] >= 3 and "migrat" in counts  # the title's words and the repeated one
    assert lex.bm25.length("Big.md") > MAX_NOTE_TERMS + 20_000  # as long as it is
    assert _found(lex, "pelican migration")[0] == "Big.md"
    assert _found(lex, "heron") == ["Small.md"]


def test_a_note_past_the_kept_words_is_told_and_no_other_is() -> None:
    """The words past MAX_NOTE_TERMS are not found by words: the note's problems say so. Counted
    as the index counts them (stemmed: two forms of a word are one term), and a large note of
    few distinct words is not stemmed at all to find it out."""
    def word(i: int) -> str:  # a distinct English-looking word: "ba", consonants, "t"
        letters = ""
        while True:
            i, r = divmod(i, 20)
            letters += "bcdfghjklmnpqrstvwxz"[r]
            if not i:
                return f"ba{letters}t"

    many = " ".join(word(i) for i in range(MAX_NOTE_TERMS + 1))
    assert words_problem(many) == "only its 50,000 most frequent distinct words are found by its words"
    assert words_problem(many + " " + many) is not None
    assert len(set(tokenize(f"{word(7)} {word(7)}s"))) == 1
    plurals = " ".join(f"{word(i)} {word(i)}s" for i in range(MAX_NOTE_TERMS // 2 + 1))  # one term each
    assert words_problem(plurals) is None
    assert words_problem(" ".join(word(i) for i in range(MAX_NOTE_TERMS))) is None
    assert words_problem("the same few words " * 100_000) is None


def test_many_notes_of_one_name_cost_links_resolved_in_proportion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folder notes: 2,000 `index.md`, each linking `[[index]]` (its own) and the next folder's.
    Resolving them costs a few lookups a link, not one per link and note of that name (4
    million here, 24 s on 3,000 such notes before)."""
    for i in range(2000):
        _write(tmp_path, f"f{i:04d}/index.md", f"# Folder {i}\n\n[[index]] word{i}, [[f{(i + 1) % 2000:04d}/index]]\n")
    calls = 0
    resolve = LinkGraph.resolve

    def counted(self: LinkGraph, key: str, source: str) -> str | None:
        nonlocal calls
        calls += 1
        return resolve(self, key, source)

    monkeypatch.setattr(LinkGraph, "resolve", counted)
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    assert calls < 10 * 4000, calls
    assert set(_found(lex, "word7")) == {"f0007/index.md", "f0008/index.md"}  # its own link says nothing new


_NAMES = st.sampled_from(["a/x.md", "b/x.md", "x.md", "a/y.md", "b/c/y.md", "q/r/s/y.md", "z.md"])
_LINKS = st.lists(st.tuples(st.sampled_from(["x", "y", "a/x", "c/y", "z", "b/c/y", "nowhere"]),
                            st.sampled_from(["apple", "pear", "plum", "fig"])), max_size=4)
_OPS = st.lists(st.tuples(st.booleans(), _NAMES, _LINKS), min_size=1, max_size=12)


def _text(links: list[tuple[str, str]]) -> str:
    return "# note\n\n" + "\n".join(f"- [[{target}]] {word}" for target, word in links) + "\n"


@given(batches=st.lists(_OPS, min_size=1, max_size=4), after_load=_OPS, read_first=st.booleans())
@settings(max_examples=200, deadline=None)
def test_changing_notes_one_at_a_time_gives_the_index_built_at_once(
    batches: list[list[tuple[bool, str, list[tuple[str, str]]]]],
    after_load: list[tuple[bool, str, list[tuple[str, str]]]], read_first: bool,
) -> None:
    """Whatever notes are written and removed, and in which order, the counts of every note are
    those of an index read from the final notes at once; and so after a save, a load and more
    changes. (`read_first`: the terms of links read before they are resolved, as a first build
    does outside the searches' lock.)"""
    final: dict[str, str] = {}

    def apply(lexes: list[LexicalIndex], ops: list[tuple[bool, str, list[tuple[str, str]]]]) -> None:
        for write, rel, links in ops:
            if write:
                final[rel] = _text(links)
            else:
                final.pop(rel, None)
            for lex in lexes:
                if write:
                    lex.set_note(rel, final[rel])
                else:
                    lex.drop_note(rel)
        for lex in lexes:
            if read_first:
                lex.read_links()
            lex.resolve_links()

    def at_once() -> dict[str, tuple[int, dict[str, int]]]:
        lex = LexicalIndex()
        for rel, text in final.items():
            lex.set_note(rel, text)
        lex.resolve_links()
        return state(lex)

    def state(lex: LexicalIndex) -> dict[str, tuple[int, dict[str, int]]]:
        return {p: (lex.bm25.length(p), lex.bm25.counts(p)) for p in lex.titles}

    live = LexicalIndex()
    for ops in batches:
        apply([live], ops)
    assert state(live) == at_once()
    loaded = LexicalIndex.from_bytes(live.to_bytes())
    assert loaded is not None and state(loaded) == state(live)
    apply([live, loaded], after_load)  # a load goes on from there as the live index does
    assert state(live) == state(loaded) == at_once()
