"""Chunking by heading sections with a size cap; the fixture kiln and its query set."""

from __future__ import annotations

import json
from pathlib import Path

from crucible.kiln.atomic import content_hash
from crucible.kiln.chunking import Chunk, chunk_note
from crucible.kiln.lexical import note_fields
from crucible.kiln.notes import parse_note, read_note
from crucible.kiln.paths import iter_markdown

NOTE = """\
---
title: Trip
---
Intro paragraph before any heading.

# Plan
## Day 1
Walk the old town.

## Day 2

### Morning
Museum.
# Packing

```bash
# not a heading
echo hi
```
"""


def test_sections_heading_paths_and_prefix() -> None:
    chunks = chunk_note(parse_note(NOTE, "t/Trip.md"))
    lead = "\nIntro paragraph before any heading."  # every chunk says what the note is for
    assert [(c.ordinal, c.heading_path, c.text) for c in chunks] == [
        (0, (), f"Trip{lead}\n\nIntro paragraph before any heading."),
        (1, ("Plan", "Day 1"), f"Trip > Plan > Day 1{lead}\n\nWalk the old town."),
        (2, ("Plan", "Day 2", "Morning"), f"Trip > Plan > Day 2 > Morning{lead}\n\nMuseum."),
        (3, ("Packing",), f"Trip > Packing{lead}\n\n```bash\n# not a heading\necho hi\n```"),
    ]
    # "# Plan" and "## Day 2" have no text of their own: skipped
    lines = NOTE.split("\n")
    assert [lines[c.start_line] for c in chunks] == [
        "Intro paragraph before any heading.", "Walk the old town.", "Museum.", "```bash"]
    assert [c.id for c in chunks] == [f"t/Trip.md#{i}" for i in range(4)]
    assert all(c.note_path == "t/Trip.md" and c.content_hash == content_hash(c.text) for c in chunks)


def test_long_section_splits_at_paragraphs() -> None:
    paras = [f"Paragraph {i} " + "word " * 50 for i in range(8)]  # ~265 chars each
    text = "## Big\n\n" + "\n\n".join(paras) + "\n"
    chunks = chunk_note(parse_note(text, "long.md"), max_chars=600)
    bodies = [c.text.removeprefix("long > Big\n\n") for c in chunks]
    assert all(c.text.startswith("long > Big\n\n") for c in chunks)
    assert all(len(b) <= 600 for b in bodies)
    # nothing lost, nothing duplicated, every cut at a paragraph boundary
    assert "\n\n".join(bodies) == "\n\n".join(paras)
    assert len(chunks) == 4
    lines = text.split("\n")
    assert all(lines[c.start_line].startswith("Paragraph") for c in chunks)


def test_huge_paragraph_is_cut_hard() -> None:
    long_line = "x" * 2500
    words = " ".join(["lorem"] * 400)  # one 2399-char line with spaces
    text = f"{long_line}\n{words}\n"
    chunks = chunk_note(parse_note(text, "h.md"), max_chars=1000)
    assert all(c.text.startswith("h\nlorem lorem") for c in chunks)  # its first line of words: the lead
    bodies = [c.text.split("\n\n", 1)[1] for c in chunks]
    assert all(0 < len(b) <= 1000 for b in bodies)
    assert "".join(bodies[:3]) == long_line
    assert " ".join(bodies[3:]) == words  # cut at spaces, not inside words
    assert all(c.heading_path == () for c in chunks)


def test_blank_line_inside_code_does_not_split_a_block() -> None:
    code = "```\nline one\n\nline two\n```"
    chunks = chunk_note(parse_note(f"# C\n{code}\n\nafter\n", "c.md"), max_chars=30)
    assert chunks[0].text == "C\n\n" + code  # the H1 is the title: not repeated


def test_note_without_text_gets_a_title_chunk() -> None:
    chunks = chunk_note(parse_note("---\ntitle: Only a title\ntags: [x]\n---\n# Head\n\n", "e.md"))
    assert chunks == [Chunk("e.md", 0, (), "Only a title", 4, content_hash("Only a title"))]


def test_editing_one_section_changes_only_its_chunk() -> None:
    before = chunk_note(parse_note(NOTE, "t.md"))
    after = chunk_note(parse_note(NOTE.replace("Museum.", "Museum and lunch."), "t.md"))
    changed = [b.ordinal for b, a in zip(before, after, strict=True) if b.content_hash != a.content_hash]
    assert changed == [2]


def test_title_change_changes_every_chunk() -> None:
    before = chunk_note(parse_note(NOTE, "t.md"))
    after = chunk_note(parse_note(NOTE.replace("title: Trip", "title: Journey"), "t.md"))
    assert all(b.content_hash != a.content_hash for b, a in zip(before, after, strict=True))
    assert after[1].text.startswith("Journey > Plan > Day 1\nIntro paragraph before any heading.\n\n")


def test_fixture_kiln_chunks(fixture_kiln_src: Path) -> None:
    total = 0
    for rel in iter_markdown(fixture_kiln_src):
        note = read_note(fixture_kiln_src, rel)
        chunks = chunk_note(note)
        assert chunks, rel
        assert len({c.id for c in chunks}) == len(chunks)
        total += len(chunks)
    assert total > 60
    ddia = chunk_note(read_note(fixture_kiln_src, "Reading/Books/Designing Data-Intensive Applications.md"))
    assert [c.heading_path for c in ddia] == [
        ("Designing Data-Intensive Applications", "Chapter 3: Storage and retrieval"),
        ("Designing Data-Intensive Applications", "Chapter 5: Replication"),
        ("Designing Data-Intensive Applications", "Chapter 7: Transactions"),
        (),  # what the frontmatter says it is about: its aliases here
    ]
    assert "write skew" in ddia[2].text
    assert ddia[3].text == "Designing Data-Intensive Applications\n\nAlso called: DDIA"
    assert ddia[3].start_line == 2  # the aliases line (0-based)


def test_about_chunk_from_the_description(tmp_path: Path) -> None:
    (tmp_path / "n.md").write_text("---\ndescription: >\n  How to keep\n  bread alive\n---\n# Starter\n\nFeed it.\n")
    chunks = chunk_note(read_note(tmp_path, "n.md"))
    # every section is embedded with what the note is for, on the second line of its prefix
    assert [c.text for c in chunks] == ["Starter\nHow to keep bread alive\n\nFeed it.",
                                        "Starter\n\nHow to keep bread alive"]
    assert chunks[1].start_line == 1 and chunks[1].heading_path == ()
    (tmp_path / "plain.md").write_text("# Plain\n\nNo frontmatter.\n")
    assert [c.text for c in chunk_note(read_note(tmp_path, "plain.md"))] == ["Plain\n\nNo frontmatter."]
    # a long description: its first 200 characters, cut at a word, in each section's prefix
    (tmp_path / "long.md").write_text("---\ndescription: " + "grain " * 100 + "\n---\n# Long\n\nA.\n\n## B\n\nB.\n")
    sections = chunk_note(read_note(tmp_path, "long.md"))[:-1]
    assert [c.text.split("\n")[0] for c in sections] == ["Long", "Long > B"]
    context = {c.text.split("\n")[1] for c in sections}
    assert context == {"grain " * 32 + "grain …"} and all(len(line) <= 202 for line in context)


def test_query_set_points_at_existing_notes(fixture_kiln_src: Path) -> None:
    queries = json.loads((Path(__file__).parent / "queries.json").read_text())
    notes = set(iter_markdown(fixture_kiln_src))
    assert len(queries) >= 10
    for q in queries:
        assert set(q) == {"query", "expected"}
        assert q["expected"] in notes, q


def test_about_is_a_lexical_field_too() -> None:
    folded = note_fields("---\ndescription: >\n  How to keep\n  bread alive\nstatus: x\n---\n# Starter\n", "n.md")
    assert folded.about.split() == ["How", "to", "keep", "bread", "alive"]
    quoted = note_fields('---\nsummary: "Keep it fed" # why\naliases:\n  - levain\n---\nbody\n', "n.md")
    assert quoted.about.split() == ["Keep", "it", "fed", "-", "levain"]
    assert note_fields("# Plain\n\nNo frontmatter.\n", "p.md").about == ""


def test_a_megabyte_title_and_long_headings_do_not_multiply_into_every_chunk() -> None:
    """A 10 MB note of a 1 MB H1 and long H2s made 900 MB of chunk text (the title and heading
    path prefix every chunk). Titles and headings are one line of at most 200 characters."""
    text = "# " + "word " * 200_000 + "\n" + "".join(f"## {'deep ' * 2000}{i}\nx\n" for i in range(50))
    note = parse_note(text, "Long.md")
    assert len(note.title) == 200 and note.title.endswith("…") and note.title.startswith("word word")
    chunks = chunk_note(note)
    assert len(chunks) == 50
    assert max(len(c.text) for c in chunks) <= 200 + 3 + 200 + 2 + 1
    assert all(len(h) <= 200 for c in chunks for h in c.heading_path)
    multi = parse_note("---\ntitle: |\n  first line\n  second   line\n---\nbody\n", "Multi.md")
    assert multi.title == "first line second line"
    assert note_fields(text, "Long.md").title.startswith("word word")  # its words still count


def test_an_undescribed_note_carries_its_lead_sentence(tmp_path: Path) -> None:
    def prefixes(text: str) -> list[list[str]]:
        (tmp_path / "n.md").write_text(text)
        return [c.text.split("\n\n")[0].split("\n") for c in chunk_note(read_note(tmp_path, "n.md"))]

    lead = "Sourdough needs a starter fed every day. It keeps for years."
    assert prefixes(f"# Bread\n\n{lead}\n\n## Feeding\n\nFlour and water.\n") == [
        ["Bread", "Sourdough needs a starter fed every day."],
        ["Bread > Feeding", "Sourdough needs a starter fed every day."],
    ]
    # code, lists, quotes, tables, embeds and short lines are not its introduction
    assert prefixes("# Bread\n\n```\nprint('this is code not prose at all')\n```\n- a list item of words here\n"
                    "> a quote of enough words here\n| a | table | of | five | cells |\n![[image.png]]\n"
                    "Short line.\n\nThe loaf rises overnight in the fridge\n")[0] == [
        "Bread", "The loaf rises overnight in the fridge"]
    # a numbered list or a rule is not prose either; a line that starts in bold is
    assert prefixes("# Bread\n\n1. Mix the flour and the water well\n***\n**Sourdough** is bread raised by "
                    "wild yeast. More.\n")[0] == ["Bread", "**Sourdough** is bread raised by wild yeast."]
    # prose only under a subsection: no introduction, no context line
    assert prefixes("# Bread\n\n## Feeding\n\nFlour and water keep the starter alive.\n") == [["Bread > Feeding"]]
    # a description wins over the lead
    assert prefixes(f"---\ndescription: Notes on baking\n---\n# Bread\n\n{lead}\n")[0] == ["Bread", "Notes on baking"]
    # a hostile line: bounded
    long = prefixes("# Bread\n\n" + "word " * 200_000 + "\n")[0]
    assert long[1].startswith("word word") and len(long[1]) <= 202
