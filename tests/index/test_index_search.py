"""Search over a real index of small kilns: note-level results, snippets with headings,
text search with line numbers, property search, and bad queries."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from crucible.config import Config
from crucible.errors import CrucibleError
from crucible.kiln import filesearch, lexical
from crucible.kiln import search as search_module
from crucible.kiln.index import KilnIndex
from crucible.kiln.lexical import (
    Bm25,
    LexicalIndex,
    LexicalView,
    NoteFields,
    field_counts,
    note_fields,
    tokenize,
)
from crucible.kiln.search import (
    hybrid_search,
    property_search,
    semantic_search,
    snippet,
    text_search,
)
from crucible.kiln.store import TEXT_KEY
from mcp_bridge.kiln_api import LineMatch


@pytest.fixture
def tiny_index(tiny_kiln: Path) -> Iterator[KilnIndex]:
    ix = KilnIndex.open(tiny_kiln, Config())
    ix.update()
    yield ix
    ix.close()


@pytest.fixture(scope="module")
def fixture_index(tmp_path_factory: pytest.TempPathFactory, fixture_kiln_src: Path) -> Iterator[KilnIndex]:
    """The project's fixture kiln, indexed once for the module (read-only use)."""
    import shutil

    root = tmp_path_factory.mktemp("fixture") / "kiln"
    shutil.copytree(fixture_kiln_src, root, ignore=shutil.ignore_patterns(".crucible"))
    ix = KilnIndex.open(root, Config())
    ix.update()
    yield ix
    ix.close()


QUERIES = json.loads((Path(__file__).parents[1] / "kiln_core" / "queries.json").read_text())


@pytest.mark.parametrize("pair", QUERIES, ids=[q["expected"] for q in QUERIES])
def test_hybrid_finds_the_note_for_a_paraphrase(fixture_index: KilnIndex, pair: dict[str, str]) -> None:
    results = hybrid_search(fixture_index, pair["query"], 5)
    assert pair["expected"] in [r.path for r in results]


def test_results_are_notes_with_their_best_section(tiny_index: KilnIndex) -> None:
    for search in (semantic_search, hybrid_search):
        results = search(tiny_index, "chili flakes and garlic warmed in oil", 10)
        assert len({r.path for r in results}) == len(results) == 3  # one result per note
        top = results[0]
        assert top.path == "Cooking/Pasta.md" and top.title == "Pasta night"
        assert top.heading == "Pasta night > Sauce"
        assert top.snippet.startswith("Garlic, olive oil") and "Pasta night >" not in top.snippet
        assert top.line == 11  # the section's first content line, 1-based
        assert (tiny_index.root / top.path).read_text().splitlines()[top.line - 1].startswith("Garlic")
        assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    assert hybrid_search(tiny_index, "chili flakes and garlic warmed in oil", 10)[0].score == 1.0


def test_an_index_that_keeps_chunk_text_as_documents_still_shows_snippets(tiny_index: KilnIndex) -> None:
    """Chunk text is kept in the rows' metadata (Chroma's document index was the costliest
    part of a write); an index written before keeps it as the rows' documents, and is read as
    it is, without a rebuild."""
    chunks = tiny_index.chroma.chunks
    got = chunks.get(include=["metadatas", "documents", "embeddings"])
    assert all(m[TEXT_KEY] for m in got["metadatas"]) and not any(got["documents"])
    texts_now = tiny_index.chroma.chunk_texts()
    old_metas = [{k: v for k, v in m.items() if k != TEXT_KEY} for m in got["metadatas"]]
    chunks.delete(ids=got["ids"])
    chunks.add(ids=got["ids"], embeddings=got["embeddings"], metadatas=old_metas,
               documents=[m[TEXT_KEY] for m in got["metadatas"]])
    assert tiny_index.chroma.chunk_texts() == texts_now
    for search in (semantic_search, hybrid_search):
        top = search(tiny_index, "chili flakes and garlic warmed in oil", 10)[0]
        assert (top.path, top.heading) == ("Cooking/Pasta.md", "Pasta night > Sauce")
        assert top.snippet.startswith("Garlic, olive oil")


def test_a_note_found_by_words_alone_takes_its_snippet_from_the_index_while_current(
    tiny_index: KilnIndex, tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result that the dense ranking did not bring (found by its words) shows its chunk with
    most of the query's words. Read from the chunks the index holds while they are the file's
    (reading and chunking a note of 256 sections again took 35 ms of a search); from the file
    once it changed since it was indexed."""
    vector = tiny_index.embed_query("parsley and grated cheese")
    real_read = search_module.read_note

    def no_read(*args: Any) -> Any:
        raise AssertionError("read the note's file for a snippet the index holds")

    monkeypatch.setattr(search_module, "read_note", no_read)
    best = search_module._best_chunks(tiny_index, ["Cooking/Pasta.md"], {}, vector, "parsley and grated cheese")
    chunk = best["Cooking/Pasta.md"]
    assert (chunk.heading, chunk.line) == ("Pasta night > Serving", 15)
    assert tiny_kiln.joinpath("Cooking/Pasta.md").read_text().splitlines()[chunk.line - 1].startswith("Finish")
    # changed on disk, not indexed again: the file says what the note holds now
    monkeypatch.setattr(search_module, "read_note", real_read)
    path = tiny_kiln / "Cooking/Pasta.md"
    path.write_text(path.read_text().replace("Finish with parsley", "Finish with basil"))
    best = search_module._best_chunks(tiny_index, ["Cooking/Pasta.md"], {}, vector, "basil")
    assert best["Cooking/Pasta.md"].text.endswith("Finish with basil and grated cheese.")


def test_search_after_edit_and_json_shape(tiny_index: KilnIndex, tiny_kiln: Path) -> None:
    (tiny_kiln / "Links.md").write_text("# Linking notes\n\nPhotosynthesis turns sunlight into sugar.\n")
    tiny_index.update()
    r = hybrid_search(tiny_index, "how plants make food from light", 1)[0]
    assert r.path == "Links.md"
    assert set(r.to_json()) == {"path", "title", "score", "heading", "snippet", "line"}


def test_empty_query_and_bad_limit(tiny_index: KilnIndex, tiny_kiln: Path) -> None:
    with pytest.raises(CrucibleError, match="empty"):
        hybrid_search(tiny_index, "  ", 5)
    with pytest.raises(CrucibleError, match="limit"):
        semantic_search(tiny_index, "pasta", 0)
    with pytest.raises(CrucibleError, match="empty"):
        text_search(tiny_kiln, "")
    # a page of text is a query; a megabyte is refused at once, saying what to search for instead
    assert hybrid_search(tiny_index, "pasta " * (filesearch.MAX_QUERY_CHARS // 6), 5)
    for search in (lambda q: hybrid_search(tiny_index, q, 5), lambda q: text_search(tiny_kiln, q)):
        with pytest.raises(CrucibleError, match="1,000,000 characters long; a search takes at most 16,384") as err:
            search("pasta" * 200_000)
        assert "key phrases" in (err.value.fix or "")


def test_text_search_literal_regex_case(tiny_kiln: Path) -> None:
    hits = text_search(tiny_kiln, "GARLIC")
    assert [h.path for h in hits] == ["Cooking/Pasta.md"]
    assert hits[0].line == 11 and hits[0].matches and hits[0].matches[0].text.startswith("Garlic")
    assert hits[0].heading == "Pasta night > Sauce"
    assert text_search(tiny_kiln, "GARLIC", case_sensitive=True) == []
    # literal: regex characters are just text
    assert text_search(tiny_kiln, "[[Cooking/Pasta|wikilinks]]")[0].path == "Links.md"
    assert text_search(tiny_kiln, "a.d") == []
    regex = text_search(tiny_kiln, r"^## \w+", regex=True)
    assert regex[0].path == "Cooking/Pasta.md" and regex[0].score == 2
    assert [m.line for m in regex[0].matches or []] == [9, 13]
    with pytest.raises(CrucibleError) as err:
        text_search(tiny_kiln, "(unclosed", regex=True)
    assert "invalid regular expression" in err.value.message


def test_text_search_gives_up_on_a_runaway_regex(tiny_kiln: Path) -> None:
    (tiny_kiln / "Trap.md").write_text("a" * 40 + "!\n")
    # exponential on Python's re; other notes have lines ending in "a"
    assert "Trap.md" not in [h.path for h in text_search(tiny_kiln, "(a+)+$", regex=True)]
    with pytest.raises(CrucibleError) as err:
        text_search(tiny_kiln, "(a|aa)+$", regex=True, time_budget=0.5)
    assert "took more than 0.5 s" in err.value.message and "simplify" in (err.value.fix or "")
    # matching that needs the whole note at once is stopped there too (it ran on, a call a line)
    (tiny_kiln / "Slow.md").write_text("x" + "a" * 400 + "\n")
    with pytest.raises(CrucibleError, match="took more than 0.5 s"):
        text_search(tiny_kiln, "(.*a){25}x", regex=True, time_budget=0.5)
    # the same syntax as Python's re, Unicode words included
    assert text_search(tiny_kiln, r"(?<=al )dente\b", regex=True)[0].path == "Cooking/Pasta.md"


@pytest.mark.parametrize(("pattern", "said"), [
    ("x{99999999}", "repeats something 99,999,999 times; a search allows at most 1,000"),
    ("x{1000000,}", "repeats something 1,000,000 times"),
    ("x{0,5000}", "repeats something 5,000 times"),
    ("(a{1000}){1000}", "(1,002,001 items; a search allows at most 100,000"),
    ("((a{100}){100}){100}", "(1,020,201 items;"),
    ("a{1000}" * 101, "items; a search allows at most 100,000"),  # one after another: they add up
    ("(?:" + "abcdefghij" * 20 + "){1000}", "items; a search allows at most 100,000"),  # a long item
    ("(?x)(?:a{1000}) # a comment\n {1000}", "(1,001,001 items;"),  # verbose: the count is the group's
    ("(?x)x{99 999}", "repeats something 99,999 times"),  # verbose: spaces in a count
    ("(?:(?:a{1000}){e<=1}){1000}", "(1,00"),  # fuzzy matching
    ("(?:a{1000}){1000}?", "(1,001,001 items;"),  # lazy
    ("(?:a{1000}){1000}+", "(1,001,001 items;"),  # possessive
])
def test_a_pattern_that_would_compile_to_something_huge_is_refused(tiny_kiln: Path, pattern: str, said: str) -> None:
    """The regex module writes a counted repeat out when it compiles it: x{99999999} took 15 GB
    (cru mcp was killed) before any time limit applied. Measured on its own parse, first."""
    with pytest.raises(CrucibleError) as err:
        text_search(tiny_kiln, pattern, regex=True)
    assert said in err.value.message, err.value.message
    assert "nested counts multiply" in (err.value.fix or "")


@pytest.mark.parametrize("pattern", [
    "(a{100}){100}", "x{1000}", "\\d{4}-\\d{2}-\\d{2}", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "(?#x{99999})garlic", "[x{99999}]", "(?x)garlic # x{99999}", "(?:garlic){e<=1}", "x{0,1000}",
])
def test_a_pattern_of_a_usual_size_is_searched(tiny_kiln: Path, pattern: str) -> None:
    text_search(tiny_kiln, pattern, regex=True)  # no error: comments, sets and literal braces are no counts


def test_a_pattern_nested_too_deeply_is_refused(tiny_kiln: Path) -> None:
    with pytest.raises(CrucibleError, match="nests its groups too deeply"):
        text_search(tiny_kiln, "(" * 3000 + ")" * 3000, regex=True)


def test_text_search_ranks_by_matching_lines_and_skips_bad_files(tiny_kiln: Path) -> None:
    (tiny_kiln / "bin.md").write_bytes(b"\x00\x01 leaves leaves")
    (tiny_kiln / "More.md").write_text("leaves\nleaves again\nno\n")
    (tiny_kiln / ".crucible").mkdir()
    (tiny_kiln / ".crucible" / "hidden.md").write_text("leaves")
    hits = text_search(tiny_kiln, "leaves")
    assert [h.path for h in hits] == ["More.md", "Garden/Compost.md"]
    assert [m.line for m in hits[0].matches or []] == [1, 2]
    # the cache sees edits
    (tiny_kiln / "More.md").write_text("nothing here\n")
    assert [h.path for h in text_search(tiny_kiln, "leaves")] == ["Garden/Compost.md"]
    # a note named as the query comes first, though others say it more often
    (tiny_kiln / "Inbox").mkdir()
    (tiny_kiln / "Inbox" / "Idea.md").write_text("# Idea\n\nA thought.\n")
    (tiny_kiln / "Ideas everywhere.txt.md").write_text("an idea\nanother idea\nidea three\n")
    (tiny_kiln / "Journal.md").write_text("idea one\nidea two\nidea three\nidea four\n")
    assert [h.path for h in text_search(tiny_kiln, "Idea")][:3] == ["Ideas everywhere.txt.md", "Inbox/Idea.md", "Journal.md"]
    assert [h.path for h in text_search(tiny_kiln, r"\bIdea\.md", regex=True)] == []  # the path alone is no hit
    (tiny_kiln / "Idea").mkdir()  # a folder's name is not the note's
    (tiny_kiln / "Idea" / "Misc.md").write_text("one idea\n")
    assert [h.path for h in text_search(tiny_kiln, "Idea")][:4] == [
        "Ideas everywhere.txt.md", "Inbox/Idea.md", "Journal.md", "Idea/Misc.md"]


_LINE_TEXT = st.lists(st.sampled_from([*"aAbB xß\u0130i\u0131K\u212a", "\n", "\r\n", "\r", "\u2028", "\x0c"]),
                      max_size=60).map("".join)


@given(text=_LINE_TEXT, query=st.text(st.sampled_from(list("aAbxßKk\u212a\u0130i ")), min_size=1, max_size=3),
       case_sensitive=st.booleans())
@settings(max_examples=400, deadline=None)
def test_a_literal_query_finds_the_lines_a_search_of_each_line_finds(
    text: str, query: str, case_sensitive: bool
) -> None:
    """text_search finds a literal query's lines with one search per matching line: the same
    lines, numbers and snippets as searching every line of `str.splitlines` (line breaks of
    every kind, case folding of ß, the Kelvin sign and dotted I included)."""
    assume(query.strip())
    pattern = filesearch._compile(query, False, case_sensitive)
    per_line = [LineMatch(line=i + 1, text=line.strip()[:filesearch.SNIPPET_CHARS])
                for i, line in enumerate(text.splitlines()) if pattern.search(line)]
    assert filesearch._lines_holding(pattern, text) == per_line


def test_text_search_keeps_at_most_its_budget_of_note_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crucible.kiln import filesearch as search_mod

    cache = search_mod._NoteCache(max_chars=50_000)
    monkeypatch.setattr(search_mod, "_cache", cache)
    for i in range(40):  # 40 notes of ~10,000 characters: 8 times the budget
        (tmp_path / f"n{i:02d}.md").write_text(f"# Note {i}\n" + ("filler words here " * 550) + f"\nmarker{i % 4}\n")
    for _ in range(2):  # a second pass reads again what was dropped, and finds the same
        hits = text_search(tmp_path, "marker3", limit=100)
        assert sorted(h.path for h in hits) == [f"n{i:02d}.md" for i in range(3, 40, 4)]
        assert hits[0].title.startswith("Note ")
        assert 0 < cache._chars <= 50_000
        assert cache._chars == sum(len(c.text or "") for c in cache._entries.values())
    # what was read last stays: the notes the results were titled from
    assert str(tmp_path / hits[-1].path) in cache._entries


def test_property_search(tiny_kiln: Path) -> None:
    def found(query: str | None = None, *, key: str | None = None, value: str | None = None,
              tag: str | None = None) -> list[str]:
        return [r.path for r in property_search(tiny_kiln, query, key=key, value=value, tag=tag)]

    assert found("status:draft") == ["Cooking/Pasta.md"]
    assert found(key="status", value="DONE") == ["Garden/Compost.md"]
    assert found(key="status") == ["Cooking/Pasta.md", "Garden/Compost.md"]
    assert found("#food") == ["Cooking/Pasta.md"]
    assert found(tag="meta") == ["Links.md"]  # an inline tag
    assert found("tag:quick") == ["Cooking/Pasta.md"]
    assert found("garden") == ["Garden/Compost.md"]  # a bare word: key, value or tag
    assert found("status:draft", tag="garden") == []
    r = property_search(tiny_kiln, "status:draft")[0]
    assert r.snippet == "status: draft" and r.line == 3 and r.title == "Pasta night"
    (tiny_kiln / "Nested.md").write_text("---\ntags: [food/baking]\n---\n# Bread\n")
    assert found("#food") == ["Cooking/Pasta.md", "Nested.md"]
    with pytest.raises(CrucibleError):
        property_search(tiny_kiln)


def test_bm25_add_remove_and_ranking() -> None:
    bm = Bm25()
    bm.add("a", tokenize("the cat sat on the mat"))
    bm.add("b", tokenize("dogs chase cats in the park"))
    bm.add("c", tokenize("stock markets fell sharply"))
    assert {d for d, _ in bm.search(tokenize("cats"), 5)} == {"a", "b"}  # cats ~ cat
    assert bm.search(tokenize("market"), 5)[0][0] == "c"  # stemmed: markets ~ market
    bm.add("c", tokenize("nothing about finance"))  # re-adding replaces
    assert bm.search(tokenize("market"), 5) == []
    bm.remove("a")
    bm.remove("a")
    assert len(bm) == 2 and [d for d, _ in bm.search(tokenize("cat"), 5)] == ["b"]
    assert tokenize("The Linking of Notes") == ["link", "note"]


def test_a_notes_terms_are_counted_by_field_weight() -> None:
    """What the lexical index holds for a note: each field's words (stemmed, stop words out)
    counted title x3, headings x2, path x2, description/aliases x2, body x1."""
    text = ("---\ndescription: Planting notes for spring\naliases: [veg plot]\n---\n"
            "# Garden Beds\n\nThe beds get compost.\n\n## Watering\n\nWater the beds at dawn; beds dry fast.\n")
    counts, total = field_counts(note_fields(text, "Home/Garden Beds.md"))
    assert total == sum(counts.values())
    assert counts["garden"] == 3 and counts["bed"] == 3 + 3  # title x3 + three in the body
    assert counts["water"] == 2 + 1  # the heading x2 + "Water" in the body
    assert counts["home"] == 2  # the folder; the file name is the title, not counted again
    assert counts["spring"] == 2 and counts["veg"] == 2 and counts["plot"] == 2
    assert counts["compost"] == 1 and "the" not in counts


def _garden(root: Path) -> None:
    (root / "Garden").mkdir(parents=True)
    (root / "Garden/Winter Beds.md").write_text(
        "# Winter beds\n\nWhat to do with the beds between November and March.\n\n"
        "## Mulch\n\nSpread leaf mould over bare soil.\n\n"
        "## Fleece\n\nCover seedlings with horticultural fleece the evening a frost is forecast.\n\n"
        "## Tools\n\nOil the spade and hang it up.\n")
    (root / "Garden/Journal.md").write_text(
        "# Garden journal\n\n"
        "## March\n\nThe seedlings came up in the greenhouse. Seedlings everywhere.\n\n"
        "## April\n\nA late frost again; frost on the lawn. Bought fleece for the fruit cage.\n\n"
        "## May\n\nEvening watering. Cover crops sown. The evening light was long.\n")
    (root / "Garden/Compost.md").write_text("# Compost\n\nTurn the heap. Worms and seedlings like it; cover it.\n")


def test_a_query_whose_words_sit_together_in_one_section_finds_that_note_first(tmp_path: Path) -> None:
    """The journal holds the query's words more often, spread over its months; the winter note
    holds them together, in one section. By whole notes the journal wins; the lexical index
    also ranks notes by their best section, and its search (the mean of both) and the search
    by words alone give the winter note first."""
    _garden(tmp_path)
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    query = "cover seedlings with fleece on an evening of frost"
    assert lex.bm25.search(tokenize(query), 3)[0][0] == "Garden/Journal.md"
    assert [p for p, _ in lex.section_ranking(tokenize(query), 3)][0] == "Garden/Winter Beds.md"
    assert [p for p, _ in lex.search(query, 3)] == ["Garden/Winter Beds.md", "Garden/Journal.md", "Garden/Compost.md"]
    assert lex.search(query, 3)[0][1] == pytest.approx(1.0, abs=0.05)
    assert search_module.words_search(LexicalView(tmp_path, lex, threading.RLock()), query, 3)[0].path == "Garden/Winter Beds.md"


def test_a_notes_sections_follow_its_edits_and_are_saved(tmp_path: Path) -> None:
    """Each section with text is a document: the title, its heading path and the description
    come with its words. An edit to fewer sections drops the rest; a deleted note leaves none;
    a saved index loads the same sections."""
    _garden(tmp_path)
    note = tmp_path / "Garden/Winter Beds.md"
    note.write_text("---\ndescription: Jobs for the cold months\n---\n" + note.read_text())
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    sections = lex.section_documents("Garden/Winter Beds.md")
    assert len(sections) == 4  # the introduction, Mulch, Fleece, Tools
    fleece, length = sections[2]
    expected = Counter(tokenize("Winter beds Fleece Jobs for the cold months "
                                "Cover seedlings with horticultural fleece the evening a frost is forecast."))
    assert fleece == dict(expected) and length == sum(expected.values())
    loaded = LexicalIndex.from_bytes(lex.to_bytes())
    assert loaded is not None and loaded.section_documents("Garden/Winter Beds.md") == sections
    before = len(lex.sections)
    note.write_text("# Winter beds\n\n## Fleece\n\nCover seedlings.\n")
    lex.refresh(tmp_path)
    assert len(lex.section_documents("Garden/Winter Beds.md")) == 1 and len(lex.sections) == before - 3
    note.unlink()
    lex.refresh(tmp_path)
    assert lex.section_documents("Garden/Winter Beds.md") == [] and len(lex.sections) == before - 4
    assert lex.section_ranking(tokenize("horticultural"), 5) == []


def test_a_note_of_thousands_of_sections_keeps_the_first_and_is_found_by_all_its_words(tmp_path: Path) -> None:
    """A note of 3,000 headings is at most MAX_SECTIONS section documents, and a note of
    sections of distinct words at most MAX_SECTION_TERMS terms of them; a word past those is
    still found, by the note's own words."""
    (tmp_path / "Many.md").write_text("".join(f"## Part {i}\n\nword{i} here\n\n" for i in range(3000)))
    sections = [" ".join(f"w{j}s{i}" for j in range(15_000)) for i in range(8)]  # 120,000 terms
    sections[7] += " lastword lastword"
    (tmp_path / "Wide.md").write_text("".join(f"## S{i}\n\n{text}\n\n" for i, text in enumerate(sections)))
    lex = LexicalIndex()
    lex.refresh(tmp_path)
    assert len(lex.section_documents("Many.md")) == lexical.MAX_SECTIONS
    assert sum(len(c) for c, _ in lex.section_documents("Wide.md")) <= lexical.MAX_SECTION_TERMS
    assert len(lex.section_documents("Wide.md")) < 8
    assert lex.search("word2999", 3)[0][0] == "Many.md"
    assert lex.search("lastword", 3)[0][0] == "Wide.md"
    assert lex.section_ranking(["lastword"], 3) == []


_WORDS = st.sampled_from(["Garden", "beds", "the", "a", "Watering", "watered", "café", "naïve", "12.04",
                          "x_y", "don't", "IS", "notes", "note", "—", "!", "compost", "sessionId", "HTTPServer",
                          "gardenBeds.wateredNotes", "iOS", "IPv4"])
_TEXT = st.lists(_WORDS, max_size=12).map(" ".join)


@given(title=_TEXT, headings=st.lists(_TEXT, max_size=4), folders=st.lists(_TEXT, max_size=3),
       stem=_TEXT, about=_TEXT, body=st.lists(_TEXT, max_size=6).map("\n".join))
@settings(max_examples=300, deadline=None)
def test_field_counts_are_each_fields_terms_times_its_weight(
    title: str, headings: list[str], folders: list[str], stem: str, about: str, body: str
) -> None:
    """field_counts counts words before stemming them (for speed): the same counts as
    tokenizing each field and repeating its terms by the field's weight; the note's length is
    its words' (a compound's own term, "12.04"'s "1204", adds none; a camelCase name is one word)."""
    fields = NoteFields(title=title, headings=headings, folders=folders, stem=stem, about=about, body=body)
    in_title = set(tokenize(title))

    def weighted(tokens: Callable[[str], list[str]]) -> Counter[str]:
        return Counter(
            tokens(title) * lexical.TITLE_WEIGHT
            + [t for h in headings if h.strip() != title for t in tokens(h)] * lexical.HEADING_WEIGHT
            + [t for f in folders for t in tokens(f)] * lexical.PATH_WEIGHT
            + [t for t in tokens(stem) if t not in in_title] * lexical.PATH_WEIGHT
            + tokens(about) * lexical.ABOUT_WEIGHT + tokens(body))

    counts, total = field_counts(fields)
    assert counts == dict(weighted(tokenize))
    # each word as written is one (a word's term; a camelCase name's whole, its last)
    assert total == sum(weighted(lambda text: [t for w in lexical._WORD.findall(text) for t in tokenize(w)[-1:]]).values())


_TERMS = st.sampled_from(["garden", "bed", "water", "compost", "seed", "frost", "lantern", "x"])
_OPS = st.lists(st.tuples(st.sampled_from(["add", "add-deferred", "remove", "post"]),
                          st.sampled_from(["a", "b", "c", "d", "e"]),
                          st.dictionaries(_TERMS, st.integers(1, 5), max_size=5)), max_size=30)


@given(ops=_OPS, query=st.lists(_TERMS, min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_documents_added_deferred_are_found_and_scored_as_posted_ones(
    ops: list[tuple[str, str, dict[str, int]]], query: list[str]
) -> None:
    """A first build leaves its documents out of the inverted index until `post()` (the first
    search scans them instead): every search, idf and count is the same as with them posted.
    So it is once the postings of removed documents are dropped (`compacting` rewrites them
    as soon as they outnumber the live ones)."""
    eager, deferred, compacting = Bm25(), Bm25(), Bm25()
    compacting.COMPACT_MIN = 0
    for op, doc, counts in ops:
        if op == "remove":
            eager.remove(doc)
            deferred.remove(doc)
            compacting.remove(doc)
        elif op == "post":
            deferred.post()
        else:
            length = sum(counts.values())
            eager.add_counts(doc, dict(counts), length)
            deferred.add_counts(doc, dict(counts), length, deferred=op == "add-deferred")
            compacting.add_counts(doc, dict(counts), length)
        assert deferred.search(query, 5) == eager.search(query, 5)
        assert [deferred.idf(t) for t in query] == [eager.idf(t) for t in query]
        assert compacting.scores(query) == pytest.approx(eager.scores(query))
        assert sorted(compacting.vocabulary()) == sorted(eager.vocabulary())
        assert {d: compacting.counts(d) for d in "abcde"} == {d: eager.counts(d) for d in "abcde"}
        # each document's length norm is kept between searches: the same as from scratch
        fresh = Bm25()
        for doc in "abcde":
            if doc in eager:
                fresh.add_counts(doc, eager.counts(doc), eager.length(doc))
        assert eager.scores(query) == pytest.approx(fresh.scores(query))
    assert len(deferred) == len(eager)
    assert {d: deferred.counts(d) for d in "abcde"} == {d: eager.counts(d) for d in "abcde"}
    deferred.post()
    assert deferred.search(query, 5) == eager.search(query, 5)
    assert sorted(deferred.vocabulary()) == sorted(eager.vocabulary())


def test_a_document_added_again_and_again_keeps_the_index_small() -> None:
    """The watcher adds a note again on each save: the postings of its old versions are
    dropped once they outnumber the live ones, so a long session's index does not grow."""
    bm = Bm25()
    bm.add("other", tokenize("a quiet note about pottery glazes"))
    words = [f"word{i}" for i in range(100)]
    for version in range(3000):  # 300,000 postings added in all
        bm.add("edited", [*words, f"version{version}"])
    assert bm.postings <= Bm25.COMPACT_MIN + 2 * 101 + 5
    assert bm.search(["version2999"], 5)[0][0] == "edited"
    assert bm.search(["version1"], 5) == [] and bm.search(["glaze"], 5)[0][0] == "other"
    assert bm.counts("edited") == {**dict.fromkeys(words, 1), "version2999": 1}
    assert "version1" not in set(bm.vocabulary())
    for _ in range(Bm25.COMPACT_MIN + 10):  # an empty note saved again and again: no postings, but numbers
        bm.add("empty", [])
    assert len(bm._ids) <= 2 * len(bm) + Bm25.COMPACT_MIN + 1
    assert bm.search(["version2999"], 5)[0][0] == "edited" and "empty" in bm


def test_snippet_centres_on_the_query() -> None:
    text = "intro words " * 50 + "the important garlic sentence is here " + "tail " * 50
    s = snippet(text, "garlic")
    assert "garlic" in s and s.startswith("… ") and s.endswith(" …") and len(s) <= 310
    assert snippet("short text\n\nwith lines", "x") == "short text with lines"


def test_a_lexical_index_loaded_to_search_leaves_nothing_to_scan(tiny_kiln: Path) -> None:
    """`load_lexical` (not deferred), from the files and from what it saved: every document of
    both rankings, notes and sections, is in the inverted index, none left for each search to
    scan (at 10,000 notes that scan made every search ~50 ms). Loaded from the saved file even
    `deferred` (as a session loads it), nothing is left to post: a second start's first
    search does not wait for ~1.7 s of posting at 10,000 notes."""
    for _ in range(2):  # built from the files, then loaded from the saved file
        lex, _changed = lexical.load_lexical(tiny_kiln, "c")
        assert len(lex.bm25) == 3 and len(lex.sections) >= 3
        assert lex.bm25.unposted == 0 and lex.sections.unposted == 0
        (tiny_kiln / ".crucible").mkdir(exist_ok=True)
        lexical.lexical_file(tiny_kiln, "c").write_bytes(lex.to_bytes())
    loaded, changed = lexical.load_lexical(tiny_kiln, "c", deferred=True)
    assert not changed and len(loaded.bm25) == 3 and len(loaded.sections) == len(lex.sections)
    assert loaded.bm25.unposted == 0 and loaded.sections.unposted == 0


def test_a_saved_lexical_index_past_its_bound_is_read_from_the_notes_instead(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saved index is read only up to MAX_SAVED_BYTES: past it, the notes are read again.
    Seen here by a saved title the note does not have, kept from the file while it is within
    the bound."""
    lex, _changed = lexical.load_lexical(tiny_kiln, "c")
    path = next(iter(lex.titles))
    real_title = lex.titles[path]
    lex.titles[path] = "A title only the saved file has"
    saved = lex.to_bytes()
    lex.titles[path] = real_title
    (tiny_kiln / ".crucible").mkdir(exist_ok=True)
    lexical.lexical_file(tiny_kiln, "c").write_bytes(saved)
    assert lexical.load_lexical(tiny_kiln, "c")[0].titles[path] == "A title only the saved file has"
    monkeypatch.setattr(lexical, "MAX_SAVED_BYTES", len(saved) - 1)
    read_again, changed = lexical.load_lexical(tiny_kiln, "c")
    assert read_again.titles[path] == lex.titles[path] != "A title only the saved file has"
    assert changed and read_again.search("spaghetti", 3)


def _saved_arrays(lex: LexicalIndex) -> tuple[dict[str, Any], dict[str, Any]]:
    header, arrays = lexical._unpack(lex.to_bytes())
    return header, {k: v.copy() for k, v in arrays.items()}


def test_a_loaded_lexical_index_ranks_as_the_index_it_was_saved_from(tiny_kiln: Path) -> None:
    """A saved index, read back, ranks as the index it was saved from (the same scores) with
    nothing left to post; a saved file whose numbers are past what the index holds (a count of
    0 or below, a length past a 64-bit integer's reach, a posting of a document that is not
    there, postings that do not add up, a note posted twice for a term, a section of no note) is no index (it is read from the
    notes again), rather than a crash or a wrong answer."""
    built = LexicalIndex()
    built.refresh(tiny_kiln)
    loaded = LexicalIndex.from_bytes(built.to_bytes())
    assert loaded is not None and loaded.bm25.unposted == 0
    queries = ["spaghetti", "chili flakes garlic", "compost heap worms", "wikilinks notes", "nothing-like-it"]
    before = [loaded.search(q, 5) for q in queries]
    assert before == [built.search(q, 5) for q in queries]
    assert before[0] and before[1] and not before[-1]

    def damaged(name: str, edit: Callable[[Any], None]) -> bytes:
        header, arrays = _saved_arrays(built)
        edit(arrays[name])
        return lexical._pack({k: v for k, v in header.items() if k != "arrays"}, arrays)

    assert LexicalIndex.from_bytes(damaged("notes.tfs", lambda a: None)) is not None  # (as saved)
    for name, edit in (("notes.tfs", lambda a: a.__setitem__(0, 0)),
                       ("sections.tfs", lambda a: a.__setitem__(-1, -1)),
                       ("notes.lengths", lambda a: a.__setitem__(0, 2**62)),
                       ("notes.docs", lambda a: a.__setitem__(0, 3)),  # 3 notes: numbered 0 to 2
                       ("notes.offsets", lambda a: a.__setitem__(1, a[2])),
                       ("sections.ids", lambda a: a.__setitem__(0, ord("#"))),
                       ("paths.ends", lambda a: a.__setitem__(0, a[-1] + 1))):
        assert LexicalIndex.from_bytes(damaged(name, edit)) is None, name
    header, arrays = _saved_arrays(built)
    shared = next(j for j in range(len(arrays["notes.offsets"]) - 1)
                  if arrays["notes.offsets"][j + 1] - arrays["notes.offsets"][j] >= 2)  # a term of 2 notes
    first = arrays["notes.offsets"][shared]
    arrays["notes.docs"][first + 1] = arrays["notes.docs"][first]  # the same note posted twice for it
    assert LexicalIndex.from_bytes(lexical._pack({"format": LexicalIndex.FORMAT}, arrays)) is None
    header, arrays = _saved_arrays(built)
    arrays["notes.tfs"] = arrays["notes.tfs"].astype("<i8") * 2**32  # a count past 32 bits
    assert LexicalIndex.from_bytes(lexical._pack({"format": LexicalIndex.FORMAT}, arrays)) is None
    assert LexicalIndex.from_bytes(lexical._pack({"format": 8}, _saved_arrays(built)[1])) is None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_saved_lexical_index_damaged_anywhere_loads_or_is_refused_never_raises(data: st.DataObject) -> None:
    """Any byte of a saved index changed, or the file cut short: `from_bytes` gives an index or
    None (the notes read again), never an exception that fails the search."""
    saved = bytearray(_SAVED_SAMPLE)
    if data.draw(st.booleans()):
        del saved[data.draw(st.integers(1, len(saved) - 1)):]
    for _ in range(data.draw(st.integers(1, 4))):
        saved[data.draw(st.integers(0, len(saved) - 1))] = data.draw(st.integers(0, 255))
    lex = LexicalIndex.from_bytes(bytes(saved))
    if lex is not None:  # it searches, and takes changes (its saved links read then)
        lex.search("spaghetti garlic", 5)
        for path in list(lex.titles)[:1]:
            lex.drop_note(path)
        lex.set_note("New.md", "# New\n\nSee [[Soup]] for garlic.\n")
        lex.resolve_links()
        assert lex.search("garlic", 5)
        assert LexicalIndex.from_bytes(lex.to_bytes()) is not None


def _sample_saved() -> bytes:
    lex = LexicalIndex()
    lex.set_note("Cooking/Pasta.md", "# Pasta\n\n## Sauce\n\nSpaghetti with garlic and chili flakes. See [[Soup]].\n")
    lex.set_note("Soup.md", "# Soup\n\nLeeks and garlic.\n")
    lex.resolve_links()
    return lex.to_bytes()


_SAVED_SAMPLE = _sample_saved()


def test_the_notes_stamps_alone_follow_the_files_and_are_never_saved(tiny_kiln: Path) -> None:
    """The index worker's lexical index (`words=False`): the saved titles and stamps, brought up to
    date with the files as the whole index is, with no words; writing it out is refused (it
    would replace the saved words with none)."""
    built = LexicalIndex()
    built.refresh(tiny_kiln)
    saved = built.to_bytes()
    stamps = LexicalIndex.from_bytes(saved, words=False)
    assert stamps is not None and not stamps.words
    assert stamps.titles == built.titles and stamps.stamps == built.stamps
    assert len(stamps.bm25) == len(stamps.sections) == 0 and stamps.search("spaghetti", 5) == []
    (tiny_kiln / "Cooking" / "Pasta.md").write_text("# Pasta, changed\n\nOnly water now.\n")
    (tiny_kiln / "Cooking" / "Soup.md").write_text("# Soup\n\nLeeks.\n")
    (tiny_kiln / "Links.md").unlink()
    assert sorted(stamps.refresh(tiny_kiln)) == ["Cooking/Pasta.md", "Cooking/Soup.md", "Links.md"]
    again = LexicalIndex()
    again.refresh(tiny_kiln)
    assert stamps.titles == again.titles and stamps.stamps == again.stamps
    assert len(stamps.bm25) == len(stamps.sections) == 0
    with pytest.raises(ValueError, match="not saved"):
        stamps.to_bytes()
    header, arrays = _saved_arrays(built)
    arrays["stamps"] = arrays["stamps"][:-1]  # a note's stamp cut short
    assert LexicalIndex.from_bytes(lexical._pack(header, arrays), words=False) is None  # read from the notes


def test_lexical_index_is_saved_and_follows_other_processes(
    tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.kiln import store as store_mod

    def no_chroma_reads(*args: object, **kwargs: object) -> None:
        raise AssertionError("the BM25 index was rebuilt from Chroma instead of loaded")

    handles: list[KilnIndex] = []

    def fresh() -> KilnIndex:  # another process, as far as the in-memory index goes
        handles.append(KilnIndex.open(tiny_kiln, Config()))
        return handles[-1]

    old_json = tiny_kiln / ".crucible" / "lexical-kiln.json"
    old_json.parent.mkdir(mode=0o700, exist_ok=True)
    old_json.write_text('{"format": 8, "notes": {}}')
    try:
        a = fresh()
        a.update()
        assert a.lexical_search("spaghetti", 3)[0][0] == "Cooking/Pasta.md"
        saved = tiny_kiln / ".crucible" / "lexical-kiln.idx"
        assert saved.is_file() and str(tiny_kiln).encode() not in saved.read_bytes()
        assert not old_json.exists()  # what an earlier version saved: replaced

        b = fresh()
        with monkeypatch.context() as m:
            m.setattr(store_mod, "pages", no_chroma_reads)
            assert b.lexical_search("spaghetti", 3)[0][0] == "Cooking/Pasta.md"

        (tiny_kiln / "Links.md").write_text("# Linking notes\n\nZeppelins float over the harbour.\n")
        b.update()
        # a (which b's update bypassed) sees the new words at its next search
        assert a.lexical_search("zeppelins", 3)[0][0] == "Links.md"
        assert a.lexical_search("wikilinks", 3) == []
        # b patched its index along and saved it: a third process loads it as it is
        with monkeypatch.context() as m:
            m.setattr(store_mod, "pages", no_chroma_reads)
            assert fresh().lexical_search("zeppelin", 3)[0][0] == "Links.md"

        # a watcher-style update is saved when the index closes
        (tiny_kiln / "Garden/Compost.md").write_text("# Compost heap\n\nWorms love coffee grounds.\n")
        b.update_paths(["Garden/Compost.md"])
        b.close()
        handles.remove(b)
        with monkeypatch.context() as m:
            m.setattr(store_mod, "pages", no_chroma_reads)
            assert fresh().lexical_search("coffee worms", 3)[0][0] == "Garden/Compost.md"

        saved.write_bytes(saved.read_bytes()[:-100])  # a damaged saved index is rebuilt from the notes
        rebuilt = fresh()
        assert rebuilt.lexical_search("coffee worms", 3)[0][0] == "Garden/Compost.md"
        rebuilt.close()  # and saved (by close, off the first search's path)
        handles.remove(rebuilt)
        written = LexicalIndex.from_bytes(saved.read_bytes())  # written again
        assert written is not None and written.search("coffee worms", 3)[0][0] == "Garden/Compost.md"
    finally:
        for h in handles:
            h.close()


def test_property_search_reuses_what_it_parsed(tiny_kiln: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crucible.kiln import filesearch as search_mod

    def new_process() -> None:
        monkeypatch.setattr(search_mod, "_stores", {})
        monkeypatch.setattr(search_mod, "_cache", search_mod._NoteCache())

    assert [r.path for r in property_search(tiny_kiln, "status:draft")] == ["Cooking/Pasta.md"]
    saved = tiny_kiln / ".crucible" / "properties.json"
    assert saved.is_file() and str(tiny_kiln) not in saved.read_text()

    new_process()
    parsed: list[str] = []
    real_parse = search_mod.parse_note

    def counting_parse(text: str, path: str) -> Any:
        parsed.append(path)
        return real_parse(text, path)

    monkeypatch.setattr(search_mod, "parse_note", counting_parse)
    (tiny_kiln / "Garden/Compost.md").write_text("---\nstatus: draft\n---\n# Compost heap\n")
    (tiny_kiln / "Links.md").unlink()
    hits = property_search(tiny_kiln, "status:draft")
    assert [r.path for r in hits] == ["Cooking/Pasta.md", "Garden/Compost.md"]
    assert parsed == ["Garden/Compost.md"]  # only the changed note was parsed again
    assert hits[0].snippet == "status: draft" and hits[0].title == "Pasta night"
    assert "Links.md" not in json.loads(saved.read_text())["notes"]

    saved.write_text("[1, 2")  # damaged: everything is parsed again, nothing breaks
    new_process()
    parsed.clear()
    assert [r.path for r in property_search(tiny_kiln, "#food")] == ["Cooking/Pasta.md"]
    assert sorted(parsed) == ["Cooking/Pasta.md", "Garden/Compost.md"]


def test_a_word_only_one_note_has_brings_that_note_first(tmp_path: Path, fixture_kiln_src: Path) -> None:
    """A person searching for a name they remember ("quokka", in one note alone) with a word
    the model does read ("migration"): the embedder cannot read the name (its best similarity
    is low) and ranks notes about migrations first; its weight in the fusion follows how well
    it read the query, so the note with the name comes first. A paraphrase, which the model
    reads, still finds its note by meaning."""
    import shutil

    root = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, root, ignore=shutil.ignore_patterns(".crucible"))
    (root / "Storage Schema.md").write_text(
        "# Schema migrations\n\nThe database has one migration ladder. Each migration adds a table or a "
        "column; migrations run in order at startup, and a failed migration is rolled back.\n\n"
        "## Adding a migration\n\nWrite the migration, bump the schema version, test the upgrade.\n")
    (root / "Birds.md").write_text(
        "# Birds\n\nSwallows nest under the eaves from May; in September they gather on the wires, and "
        "their migration takes them south to Africa for the winter. Robins stay all year and sing even "
        "in December.\n")
    (root / "Field Trip.md").write_text(
        "# Weekend log\n\n## Saturday\n\nFerry at eight, bikes from the jetty, lunch at the bakery: two "
        "pies, a flat white, the paper. Snorkelling at the basin in the afternoon, then a nap on the sand "
        "and a swim out to the reef marker. Read three chapters of the novel; the detective is clearly "
        "the brother. Sunset from the lighthouse, a quokka under the bench, whales far out on their "
        "migration north. Fish and chips on the wall, gulls everywhere, then the last ferry back at six, "
        "sunburnt and happy.\n\n## Sunday\n\nRain. Laundry, the market, a long call home.\n")
    ix = KilnIndex.open(root, Config())
    try:
        ix.update()
        assert ix.embedder.related_similarity is not None  # the built-in model says its scale
        by_meaning = [d.path for d, _ in search_module.dense_ranking(ix, ix.embed_query("quokka migration"), 5)]
        assert by_meaning[0] == "Storage Schema.md" and "Field Trip.md" not in by_meaning[:3]
        assert [p for p, _ in search_module.lexical_ranking(ix, "quokka migration", 3)][:2] == [
            "Field Trip.md", "Storage Schema.md"]
        assert [r.path for r in hybrid_search(ix, "quokka migration", 3)][0] == "Field Trip.md"
        assert [r.path for r in hybrid_search(ix, "how do tables and columns get upgraded when the app starts", 3)][0] == (
            "Storage Schema.md")
    finally:
        ix.close()


def test_a_compound_a_person_remembers_whole_brings_its_note_first(tmp_path: Path) -> None:
    """Identifiers and hyphenated words are what a developer remembers of a note: `--cap-add`,
    `config.toml`, `session_id`. Their parts are common words that other notes hold more often
    ("add a cap", "the config ... in toml"); the note holding the compound whole comes first,
    found the same when written solid or with another joiner ("re-index" finds "reindexed")."""
    root = tmp_path / "kiln"
    root.mkdir()
    notes = {
        "Docker.md": "# Running the VPN container\n\nStart it with --cap-add NET_ADMIN, so the tunnel can "
                     "set its routes, and mount the secrets read-only.\n",
        "Hats.md": "# Hats\n\nAdd a cap to the outfit. A flat cap, a baseball cap: add one, add two, the cap "
                   "is the thing to add when it rains. Add a scarf too.\n",
        "Bottles.md": "# Bottling\n\nAdd the sugar, add the yeast, cap each bottle; the cap must be tight. "
                      "Add a label after you cap it.\n",
        "Settings.md": "# Where settings live\n\nEverything is in config.toml beside the kiln.\n",
        "Formats.md": "# Formats\n\nThe config format is toml: a config in toml, toml for every config, and "
                      "a config.json is refused. Config, config, toml.\n",
        "Search.md": "# Keeping search current\n\nThe watcher reindexed every note that changed.\n",
        "Catalogue.md": "# Catalogue\n\nA catalogue of notes, with an index at the back, re-read when the "
                        "notes change.\n",
    }
    for name, text in notes.items():
        (root / name).write_text(text, encoding="utf-8")
    lex = LexicalIndex()
    lex.refresh(root)
    assert "capadd" in tokenize("--cap-add") and "configtoml" in tokenize("config.toml")
    assert "reindex" in tokenize("re-index") and "reindex" in tokenize("reindexed")
    for query, note in [("cap-add", "Docker.md"), ("cap_add flag", "Docker.md"), ("config.toml", "Settings.md")]:
        assert [p for p, _ in lex.search(query, 3)][0] == note, query
    # ("re" and "index" alone are not in it: only the compound finds it)
    assert "Search.md" in [p for p, _ in lex.search("re-index", 5)]
    ix = KilnIndex.open(root, Config())
    try:
        ix.update()
        assert [r.path for r in hybrid_search(ix, "config.toml", 3)][0] == "Settings.md"
        # The model reads "cap-add" as hats (Docker.md is not in its first four): the compound's
        # share of the query is left to the words, so the fused ranking has Docker.md first.
        assert [d.path for d, _ in search_module.dense_ranking(ix, ix.embed_query("cap-add"), 4)][0] == "Hats.md"
        assert ix.literal_share("cap-add") == 1.0 and ix.literal_share("cap-add for hats") == pytest.approx(2 / 3)
        assert ix.literal_share("add a cap") == 0.0 and ix.literal_share("flat-pack") == 0.0  # held by no note
        found = hybrid_search(ix, "cap-add", 3)
        assert found[0].path == "Docker.md" and "--cap-add" in found[0].snippet
        assert hybrid_search(ix, "how do I add a cap to my outfit", 1)[0].path == "Hats.md"
    finally:
        ix.close()


def test_a_camel_case_name_is_found_by_its_words_and_whole(tmp_path: Path) -> None:
    """A developer writes `mcpServers` in a config note and later asks for "mcp servers", or
    writes `sessionId` and asks for "session id" or `session_id`: the note holding the name is
    found by its words, and the name typed whole still finds it first. An acronym and a name of
    one letter and a word ("iOS", "IPv4") stay whole."""
    root = tmp_path / "kiln"
    root.mkdir()
    notes = {
        "Bridge.md": "# Wiring the bridge\n\nAdd an entry under `mcpServers` for each tool, with its command.\n",
        "Tools.md": "# Tools\n\nEach tool has a command and an entry; the command runs the tool.\n",
        "Store.md": "# The status bar\n\nIt reads `statusBarStore.activeSessionId` and shows it.\n",
        "Sessions.md": "# Sessions\n\nA session is shown in the bar while it is active.\n",
        "Phones.md": "# Phones\n\nThe app runs on iOS and speaks IPv4 only.\n",
        # a long note that names it once, and short ones about its words
        "Architecture.md": "# Component architecture\n\n" + "The renderer draws each frame from the model. " * 60
                           + "A draft becomes a note through `GraduationState`.\n",
        "State.md": "# State\n\nThe state of a machine: each state and the next state.\n",
        "Graduation.md": "# Graduation\n\nThe graduation day, and the graduation ceremony after it.\n",
        "Web stories.md": "# Web stories\n\n" + "The page shows the list, and the list shows the cards. " * 60
                          + "A spinner shows while `isLoading` is set.\n",
        "Loader.md": "# Loader\n\nThe loader sets is_loading, clears is_loading when done, and is_loading is read.\n",
    }
    for name, text in notes.items():
        (root / name).write_text(text, encoding="utf-8")
    assert tokenize("sessionId") == tokenize("session_id") == ["session", "id", "sessionid"]
    assert tokenize("HTTPServer") == ["http", "server", "httpserver"]
    assert tokenize("iOS IPv4") == ["io", "ipv4"]
    # a capital that lower-cases to two letters ("İ" to "i̇") is read as it is lower-cased
    assert tokenize("İstanbul") == ["stanbul", "istanbul"]
    assert lexical.counts_of(tokenize("istanbul"), "Notes from İstanbul") == {"istanbul": 1}
    lex = LexicalIndex()
    lex.refresh(root)
    for query, note in [("mcp servers", "Bridge.md"), ("mcp_servers", "Bridge.md"), ("mcpServers", "Bridge.md"),
                        ("activeSessionId", "Store.md"), ("status bar store", "Store.md"), ("ios", "Phones.md"),
                        # typed whole, the name alone counts: its words would rank the short notes first
                        ("GraduationState", "Architecture.md")]:
        assert [p for p, _ in lex.search(query, 3)][0] == note, query
    # its words apart: found (it held none of them), beside the note titled "Sessions"
    assert set([p for p, _ in lex.search("active session id", 3)][:2]) == {"Sessions.md", "Store.md"}
    # a name is one word of its note's length, as "mcpservers" would be
    assert lex.bm25.length("Bridge.md") == lexical.field_counts(
        lexical.note_fields(notes["Bridge.md"].replace("mcpServers", "mcpservers"), "Bridge.md"))[1]
    ix = KilnIndex.open(root, Config())
    try:
        ix.update()
        found = hybrid_search(ix, "where do mcp servers go", 3)
        assert found[0].path == "Bridge.md" and "mcpServers" in found[0].snippet
        # a name typed whole is left to the words (the model reads it as its common words), and
        # both notes that hold it, as `isLoading` or `is_loading`, come before any other
        assert ix.literal_share("isLoading") == 1.0
        assert {r.path for r in hybrid_search(ix, "isLoading", 5)[:2]} == {"Web stories.md", "Loader.md"}
    finally:
        ix.close()


def test_a_name_typed_as_its_words_apart_finds_the_note_that_holds_it_whole(tmp_path: Path) -> None:
    """A developer remembers `SessionConfigRpc` as "session config rpc", or "OpenRouter" as "open
    router": the query's neighbouring words run together are the name's term, so the note that
    holds the name (among other things) comes before the short notes that hold its words apart.
    "set up" finds "setup" so; a letter alone joins nothing ("a head", "system's")."""
    root = tmp_path / "kiln"
    root.mkdir()
    notes = {
        "Product.md": "# Product\n\n" + "The renderer draws each frame from the model. " * 3
                      + "The daemon answers `SessionConfigRpc` with the current settings.\n",
        "Sessions.md": "# Sessions\n\nA session keeps its config while it runs, and a session ends when you leave.\n",
        "Settings.md": "# Settings\n\nThe config file holds the keys of each session.\n",
        "Calls.md": "# Calls\n\nEvery rpc is a request and a reply, sent over a pipe.\n",
        "Providers.md": "# Providers\n\nA provider serves models over HTTP; one of them is OpenRouter.\n",
        "Setup.md": "# Setup\n\nThe setup runs once; plan ahead.\n",
    }
    # what else a kiln holds: the name's term is rare among many notes, as it is in a real one
    notes |= {f"Walk {i}.md": f"# Walk {i}\n\nBy the river on day {i}, with the dog.\n" for i in range(40)}
    for name, text in notes.items():
        (root / name).write_text(text, encoding="utf-8")
    lex = LexicalIndex()
    lex.refresh(root)
    for query, note in [("session config rpc", "Product.md"), ("the session config rpc reply", "Product.md"),
                        ("SessionConfigRpc", "Product.md")]:
        assert [p for p, _ in lex.search(query, 3)][0] == note, query
    assert lex.query_terms("where is the session config rpc") == ["session", "config", "rpc", "sessionconfigrpc"]
    # each word is in one run only (not "sessionconfig" beside it); a name typed whole is its own
    # term already
    assert lex.joined_terms("SessionConfigRpc") == [] and lex.joined_terms("open router") == ["openrout"]
    assert lex.joined_terms("set up the kiln") == ["setup"]
    for phrase in ["plan a head", "the system's setup", "in to the"]:
        assert lex.joined_terms(phrase) == [], phrase
    # a name among the first JOINED_QUERY_WORDS words only: a hostile megabyte of a query is not
    # stemmed run by run (18 s for 1.3 MB; the search takes 0.4 s with or without this)
    filler = "river " * (lexical.JOINED_QUERY_WORDS - 3)
    assert lex.joined_terms(filler + "session config rpc") == ["sessionconfigrpc"]
    assert lex.joined_terms(filler + "dog session config rpc") == []
    # The snippet is the section that holds the name, not the one with most of its words apart
    # (by words alone, while the note is not embedded yet, and from its stored chunks after).
    (root / "Daemon.md").write_text(
        "# Daemon\n\n## Sessions\n\nEach session has a config: the session config is read when a session "
        "starts, and a session reads its config again on reload.\n\n## Calls\n\nIt answers `SessionConfigRpc` "
        "with the current settings.\n", encoding="utf-8")
    lex.refresh(root)
    found = {r.path: r for r in search_module.words_search(LexicalView(root, lex, threading.RLock()),
                                                           "session config rpc", 5)}
    assert "SessionConfigRpc" in found["Daemon.md"].snippet, found["Daemon.md"]
    ix = KilnIndex.open(root, Config())
    try:
        ix.update()
        found = {r.path: r for r in hybrid_search(ix, "session config rpc", 5)}
        assert set(list(found)[:2]) == {"Product.md", "Daemon.md"}  # the two that hold the name first
        assert "SessionConfigRpc" in found["Daemon.md"].snippet and found["Daemon.md"].heading == "Daemon > Calls"
    finally:
        ix.close()


def test_an_endless_compound_is_its_words_alone() -> None:
    """A hostile run of joined words (a megabyte of "a-b-a-b…") is counted as its words: no
    term of a megabyte, and the tokenizer's pattern is linear (possessive)."""
    run = "-".join(["alpha", "beta"] * 100_000)
    counts, length = lexical.term_counts([run])
    assert counts == {"alpha": 100_000, "beta": 100_000} and length == 200_000
    assert set(tokenize(run + " x-y")) == {"alpha", "beta", "x", "y", "xy"}  # the short one beside it is one
    # a camelCase run of a megabyte is not cut into words: one word, as a long run of letters is
    assert tokenize("alphaBeta" * 100_000 + " xxYy") == ["alphabeta" * 100_000, "xx", "yy", "xxyy"]


def test_the_meaning_weight_follows_the_embedders_best_similarity() -> None:
    assert search_module.meaning_weight(0.9, 0.6) == search_module.FUSION_ALPHA
    assert search_module.meaning_weight(0.3, 0.6) == pytest.approx(search_module.FUSION_ALPHA / 2)
    assert search_module.meaning_weight(-0.2, 0.6) == 0.0
    assert search_module.meaning_weight(0.1, None) == search_module.FUSION_ALPHA  # a scale not known here


_TRICKY = ["dying", "lying", "tying", "die", "lie", "tie", "skies", "sky", "possibility", "possible", "happy",
           "happiness", "generously", "news", "early", "only", "ugly", "idly", "gently", "singly", "running",
           "ran", "relational", "organization", "sensitivity", "Ärger", "straße", "ﬁle", "12", "04", "12.04",
           "the", "and", "a", "I", "y", "yes", "kiln", "kilns", "notes", "noted", "noting", "x_y",
           "cap-add", "to-do", "todo", "how-to", "re-index", "reindexed", "config.toml", "a-b_c.d", "-x-", "e.g.",
           "sessionId", "SessionID", "HTTPServer", "mcpServers", "statusBar.activeSessionId", "iOS", "IPv4", "aB-cD",
           "İstanbul", "fİ49b"]


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(_TRICKY) | st.text(min_size=1, max_size=8), max_size=40).map(" ".join),
       query=st.lists(st.sampled_from(_TRICKY) | st.text(min_size=1, max_size=8), min_size=1, max_size=6).map(" ".join))
def test_counts_of_a_querys_terms_are_the_counts_tokenize_gives(text: str, query: str) -> None:
    terms = set(tokenize(query))
    expected = {t: n for t, n in Counter(tokenize(text)).items() if t in terms}
    assert lexical.counts_of(terms, text) == expected


def test_a_stem_is_its_words_start_but_its_last_letter_save_the_irregular_ones(fixture_kiln_src: Path) -> None:
    """What counts_of relies on, over the fixture kiln's words and the tricky ones."""
    words = set(_TRICKY)
    for path in fixture_kiln_src.rglob("*.md"):
        words |= set(lexical._WORD.findall(path.read_text(encoding="utf-8").lower()))
    for word in words:
        stem = lexical._stem(word.lower())
        assert word.lower().startswith(stem[:-1]) or stem in lexical._IRREGULAR_STEMS, (word, stem)


def _shared_read_kiln(tmp_kiln: Path) -> Path:
    """The fixture kiln with notes a first reading must get right however it is shared: links
    between halves, names, a note that is not text, one too large to be a note."""
    for n in range(12):
        (tmp_kiln / f"extra-{n:02d}.md").write_text(
            f"# Extra {n}\n\nSee [[extra-{(n + 7) % 12:02d}]] about sessionId and cap-add.\n\n## Part\n\nwords {n}\n",
            encoding="utf-8")
    (tmp_kiln / "zz-last.md").write_text("# Last\n\nThe last note of the listing.\n", encoding="utf-8")
    (tmp_kiln / "binary.md").write_bytes(b"\x00\xff\xfe" * 10)
    (tmp_kiln / "huge.md").write_text("x" * (lexical.MAX_NOTE_BYTES + 1), encoding="utf-8")
    return tmp_kiln


def _index_data(lex: LexicalIndex) -> dict[str, Any]:
    """What a lexical index holds of each note, as plain data to compare."""
    return {p: [lex.stamps[p], t, lex.bm25.length(p), lex.bm25.counts(p), lex.graph.links.get(p, {}),
                lex.section_documents(p)] for p, t in lex.titles.items()}


def _index_as_saved(root: Path) -> str:
    lex, _ = lexical.load_lexical(root, "c", deferred=True)
    lex.read_links()
    lex.post()
    return json.dumps(_index_data(lex), sort_keys=True)


def test_a_first_reading_shared_with_a_worker_process_reads_what_one_process_reads(
    tmp_kiln: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A large first reading counts the notes' words in a second process (a real one) from the
    first note on while this one counts from the last back: the index is the same as read by
    this process alone (counts, lengths, sections, titles, the words of links across the two
    parts, the notes left out as unreadable). A worker that fails leaves its notes to this
    process: the same index, and a log line that says so; one that writes a lot on its stderr
    still counts its share."""
    root = _shared_read_kiln(tmp_kiln)
    monkeypatch.setattr(lexical, "SHARED_READ_MIN", 10**9)
    alone = _index_as_saved(root)
    assert "extra-07.md" in alone and "binary.md" not in alone and "huge.md" not in alone

    # This process slowed (as by `cru mcp`'s imports), so that the worker counts most notes.
    read = lexical._read_counted
    here: list[str] = []

    def slow_read(path: str, rel: str, words: bool) -> Any:
        here.append(rel)
        time.sleep(0.03)
        return read(path, rel, words)

    taken: list[int] = []
    stop = lexical._Reader.stop

    def counted_stop(self: Any) -> Any:
        results = stop(self)
        taken.append(len(results))
        return results

    monkeypatch.setattr(lexical, "_read_counted", slow_read)
    monkeypatch.setattr(lexical._Reader, "stop", counted_stop)
    monkeypatch.setattr(lexical, "_spare_cpus", lambda: 1)
    monkeypatch.setattr(lexical, "SHARED_READ_MIN", 10)
    assert _index_as_saved(root) == alone
    notes = len(list(root.rglob("*.md")))
    assert taken and taken[0] > 0 and 0 < len(here) < notes  # the worker counted some, this process the others
    assert sorted(here)[-1] == "zz-last.md"  # this process counts from the last note back

    taken.clear()
    here.clear()
    counting = lexical.READ_WORKER[-1]
    monkeypatch.setattr(lexical, "READ_WORKER", [sys.executable, "-c", "import sys; sys.exit('no luck')"])
    with caplog.at_level("WARNING", logger="crucible.kiln.lexical"):
        assert _index_as_saved(root) == alone
    assert taken == [0]
    assert "the notes' words worker failed after 0 notes (no luck): counted here" in caplog.text

    # A worker that writes a lot on its stderr (warnings of some library, say) still counts:
    # nothing it writes there waits for this process to read it.
    taken.clear()
    noisy = "import sys; sys.stderr.write('w' * 1_000_000); sys.stderr.flush(); "
    monkeypatch.setattr(lexical, "READ_WORKER", [sys.executable, "-c", noisy + counting])
    assert _index_as_saved(root) == alone
    assert taken and taken[0] > 0


def test_a_reading_started_early_is_taken_by_the_first_reading_unless_the_kiln_changed(
    tmp_kiln: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cru mcp` starts a worker on a kiln never indexed before it imports the MCP SDK
    (`read_early`); the first reading takes it, and reads what one process reads. A note added
    in between: the early worker is stopped (its notes are not the kiln's any more) and the
    reading is as fresh as ever. A kiln with a saved index starts nothing early."""
    root = _shared_read_kiln(tmp_kiln)
    monkeypatch.setattr(lexical, "SHARED_READ_MIN", 10**9)
    alone = _index_as_saved(root)
    monkeypatch.setattr(lexical, "_spare_cpus", lambda: 1)
    monkeypatch.setattr(lexical, "SHARED_READ_MIN", 10)
    taken: list[bool] = []
    take = lexical._take_early

    def counted_take(files: Any) -> Any:
        worker = take(files)
        taken.append(worker is not None)
        return worker

    monkeypatch.setattr(lexical, "_take_early", counted_take)
    lexical.read_early(root, "c")
    assert _index_as_saved(root) == alone
    assert taken[0] is True

    taken.clear()
    lexical.read_early(root, "c")
    (root / "late.md").write_text("# Late\n\nWritten after the early start: marmalade.\n", encoding="utf-8")
    late = _index_as_saved(root)
    assert taken[0] is False and "late.md" in late and "marmalad" in late

    taken.clear()
    (root / ".crucible").mkdir(exist_ok=True)
    lexical.lexical_file(root, "c").write_bytes(lexical.load_lexical(root, "c")[0].to_bytes())
    lexical.read_early(root, "c")
    assert lexical._early is None
