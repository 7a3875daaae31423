"""Note parsing: frontmatter round-trip, title/tag/link/heading rules, and reading from disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crucible.kiln.atomic import content_hash
from crucible.kiln.notes import (
    MAX_NOTE_BYTES,
    FrontmatterError,
    Heading,
    NoteReadError,
    WikiLink,
    dump_frontmatter,
    load_frontmatter,
    merge_frontmatter,
    parse_note,
    read_note,
    replace_body,
    split_frontmatter,
)
from crucible.kiln.paths import KilnNotFoundError, KilnPathError

COMMENTED = """\
---
# who wrote this
title: "Garden plan"   # quoted on purpose
tags:
  - garden
  - plan  # the second tag
status: draft
created: 2024-03-01
nested:
  level: 2
  items: [a, b]
---
# Heading

Body text with a [[Link]].
"""


# --- frontmatter --------------------------------------------------------------------------


def test_split_frontmatter() -> None:
    yaml_text, body, start = split_frontmatter(COMMENTED)
    assert yaml_text is not None and yaml_text.startswith("# who wrote this\ntitle:")
    assert yaml_text.endswith("items: [a, b]\n")
    assert body == "# Heading\n\nBody text with a [[Link]].\n"
    assert start == 12
    assert split_frontmatter("# no frontmatter\n") == (None, "# no frontmatter\n", 0)
    assert split_frontmatter("---\nunclosed: yes\nbody") == (None, "---\nunclosed: yes\nbody", 0)
    assert split_frontmatter("---\n---\nbody") == ("", "body", 2)
    assert split_frontmatter("text\n---\na: 1\n---\n")[0] is None  # only at the very start


def test_yaml_round_trip_keeps_comments_order_and_quotes() -> None:
    yaml_text, _, _ = split_frontmatter(COMMENTED)
    assert yaml_text is not None
    data = load_frontmatter(yaml_text)
    assert list(data) == ["title", "tags", "status", "created", "nested"]
    assert dump_frontmatter(data, style_from=yaml_text) == yaml_text


def test_merge_frontmatter_updates_in_place() -> None:
    out = merge_frontmatter(COMMENTED, {"status": "done", "reviewed": True, "tags": ["garden", "plan", "2024"]},
                            remove=["created"])
    yaml_text, body, _ = split_frontmatter(out)
    assert body == "# Heading\n\nBody text with a [[Link]].\n"  # untouched
    assert yaml_text == (
        "# who wrote this\n"
        'title: "Garden plan"   # quoted on purpose\n'
        "tags:\n"
        "  - garden\n"
        "  - plan\n"
        "  - '2024'\n"
        "status: done\n"
        "nested:\n"
        "  level: 2\n"
        "  items: [a, b]\n"
        "reviewed: true\n"
    )


def test_merge_keeps_comments_of_untouched_keys() -> None:
    out = merge_frontmatter(COMMENTED, {"status": "done"})
    assert "# who wrote this" in out and "# quoted on purpose" in out and "# the second tag" in out
    assert out.replace("status: done", "status: draft") == COMMENTED


def test_merge_into_note_without_frontmatter() -> None:
    out = merge_frontmatter("# Title\n\ntext\n", {"tags": ["a", "b"], "status": "new"})
    assert out == "---\ntags:\n  - a\n  - b\nstatus: new\n---\n# Title\n\ntext\n"
    assert parse_note(out, "x.md").frontmatter == {"tags": ["a", "b"], "status": "new"}


def test_merge_keeps_sequence_style_of_the_note() -> None:
    note = "---\ntags:\n- a\n- b\n---\nbody\n"
    assert merge_frontmatter(note, {"x": 1}) == "---\ntags:\n- a\n- b\nx: 1\n---\nbody\n"


def test_merge_removing_every_key_drops_the_block() -> None:
    assert merge_frontmatter("---\na: 1\n---\nbody\n", {}, remove=["a"]) == "body\n"


def test_merge_crlf_note() -> None:
    note = "---\r\ntitle: T\r\n---\r\nbody line\r\n"
    out = merge_frontmatter(note, {"status": "x"})
    assert out == "---\r\ntitle: T\r\nstatus: x\r\n---\r\nbody line\r\n"


def test_merge_refuses_broken_yaml() -> None:
    with pytest.raises(FrontmatterError, match="not valid YAML"):
        merge_frontmatter("---\ntags: [a\n---\nbody", {"x": 1})


def test_replace_body() -> None:
    assert replace_body(COMMENTED, "new body\n") == COMMENTED.split("# Heading")[0] + "new body\n"
    assert replace_body("just text", "other") == "other"


def test_frontmatter_values_are_plain_json() -> None:
    note = parse_note(COMMENTED + "", "x.md")
    assert note.frontmatter == {
        "title": "Garden plan", "tags": ["garden", "plan"], "status": "draft",
        "created": "2024-03-01", "nested": {"level": 2, "items": ["a", "b"]},
    }
    text = "---\nwhen: 2024-03-01T10:30:00\nn: 0x10\nf: 1.50\nok: true\nnothing:\n1: one\n---\n"
    fm = parse_note(text, "y.md").frontmatter
    assert fm == {"when": "2024-03-01T10:30:00", "n": 16, "f": 1.5, "ok": True, "nothing": None, "1": "one"}
    assert json.loads(json.dumps(fm)) == fm
    assert [type(v) for v in fm.values()] == [str, int, float, bool, type(None), str]


def test_broken_yaml_is_a_problem_not_an_exception() -> None:
    note = parse_note("---\ntitle: x\ntags: [a\n---\n# Real title\nbody #tag\n", "b.md")
    assert note.frontmatter == {}
    assert len(note.problems) == 1 and note.problems[0].startswith("frontmatter is not valid YAML: ")
    assert "line" in note.problems[0]
    assert note.title == "Real title" and note.tags == ["tag"]
    assert note.body == "# Real title\nbody #tag\n" and note.body_start_line == 4


@pytest.mark.parametrize("yaml_text,reason", [
    ("a: 1\na: 2\n", 'found duplicate key "a"'),
    ("[" * 5000 + "\n", "nested too deeply"),
    ("title: [unclosed\n", "line"),
])
def test_hostile_frontmatter_is_a_problem(yaml_text: str, reason: str) -> None:
    note = parse_note(f"---\n{yaml_text}---\nbody #ok\n", "h.md")
    assert note.frontmatter == {} and note.tags == ["ok"] and note.body == "body #ok\n"
    assert note.problems[0].startswith("frontmatter is not valid YAML: ") and reason in note.problems[0]


def test_frontmatter_that_is_not_a_mapping() -> None:
    note = parse_note("---\n- a\n- b\n---\nbody\n", "l.md")
    assert note.frontmatter == {} and "not a mapping" in note.problems[0]


# --- title --------------------------------------------------------------------------------


def test_title_rules() -> None:
    assert parse_note("---\ntitle: From FM\n---\n# H1\n", "a/b.md").title == "From FM"
    assert parse_note("---\ntitle: ''\n---\n## H2\n# First H1\n# Second\n", "a/b.md").title == "First H1"
    assert parse_note("```\n# not a heading\n```\nplain\n", "a/My note.md").title == "My note"
    assert parse_note("", "dir/Empty.md").title == "Empty"
    assert parse_note("---\ntitle: 2024\n---\n", "n.md").title == "2024"


# --- tags ---------------------------------------------------------------------------------


def test_frontmatter_tag_forms() -> None:
    assert parse_note("---\ntags: [a, '#b', c/d]\n---\n", "x.md").tags == ["a", "b", "c/d"]
    assert parse_note("---\ntags: a, b c,#d\n---\n", "x.md").tags == ["a", "b", "c", "d"]
    assert parse_note("---\ntags:\n  - one\n  - two\n---\n", "x.md").tags == ["one", "two"]
    assert parse_note("---\ntag: solo\n---\n", "x.md").tags == ["solo"]
    assert parse_note("---\ntags:\n---\n", "x.md").tags == []


def test_inline_tags_and_where_they_do_not_count() -> None:
    body = (
        "# Heading #inheading\n"
        "Text #tag, #nested/tag and (#paren) #under_score #dash-ed #Ünïcode\n"
        "Not: C#sharp, issue #123, #2024, \\#escaped, `#inline code`, ``#double `code` ``\n"
        "URL https://example.com/page#fragment and <https://x.org/#frag> and [l](http://y/#z)\n"
        "```python\n"
        "# comment #notatag\n"
        "```\n"
        "~~~\n"
        "#alsonot\n"
        "~~~\n"
        "#last\n"
    )
    note = parse_note(body, "t.md")
    assert note.tags == ["inheading", "tag", "nested/tag", "under_score", "dash-ed", "Ünïcode", "last"]


def test_tags_deduplicated_case_insensitively_in_order() -> None:
    note = parse_note("---\ntags: [Project, b]\n---\n#project #B #c #c\n", "x.md")
    assert note.tags == ["Project", "b", "c"]


# --- links --------------------------------------------------------------------------------


def test_wikilink_forms() -> None:
    body = (
        "[[Plain]] [[Folder/Note|Shown]] [[Note#Section]] [[Note#Section|Alias]] ![[image.png]]\n"
        "![[Other#Part|x]] [[ spaced |  alias ]] [[#Local heading]]\n"
        "| table | [[Table\\|alias]] |\n"
    )
    assert parse_note(body, "x.md").links == [
        WikiLink("Plain", None, None, False),
        WikiLink("Folder/Note", "Shown", None, False),
        WikiLink("Note", None, "Section", False),
        WikiLink("Note", "Alias", "Section", False),
        WikiLink("image.png", None, None, True),
        WikiLink("Other", "x", "Part", True),
        WikiLink("spaced", "alias", None, False),
        WikiLink("", None, "Local heading", False),
        WikiLink("Table", "alias", None, False),
    ]


def test_links_not_in_code() -> None:
    body = "`[[inline]]` [[Real]]\n```\n[[fenced]]\n```\n    \n````md\n```\n[[still code]]\n```\n````\n[[After]]\n"
    assert [link.target for link in parse_note(body, "x.md").links] == ["Real", "After"]


# --- headings -----------------------------------------------------------------------------


def test_headings() -> None:
    text = "---\ntitle: t\n---\n# One\ntext\n## Two ##\n```\n# code\n```\n###### Six\n####### seven\n#nospace\n   ### Indented\n#\n"
    assert parse_note(text, "x.md").headings == [
        Heading(1, "One", 3), Heading(2, "Two", 5), Heading(6, "Six", 9), Heading(3, "Indented", 12),
    ]


def test_note_fields(fixture_kiln_src: Path) -> None:
    note = read_note(fixture_kiln_src, "Projects/Lantern/Overview.md")
    assert note.path == "Projects/Lantern/Overview.md"
    assert note.title == "Lantern"
    assert note.aliases == ["Lantern project", "home dashboard"]
    assert note.frontmatter["status"] == "active" and note.frontmatter["started"] == "2023-09-14"
    assert note.tags == ["project", "lantern", "project/active"]
    assert WikiLink("Projects/Lantern/Architecture", "the data flow", "Data flow", False) in note.links
    assert note.content_hash == content_hash(note.text)
    assert note.text == (fixture_kiln_src / "Projects/Lantern/Overview.md").read_text()
    assert [h.text for h in note.headings] == ["Lantern", "Goals", "Components", "Status"]
    lines = note.text.split("\n")
    assert all(lines[h.line].lstrip("#").strip() == h.text for h in note.headings)


def test_fixture_kiln_specials(fixture_kiln_src: Path) -> None:
    inbox = read_note(fixture_kiln_src, "Inbox.md")
    assert inbox.frontmatter == {} and inbox.problems == [] and inbox.title == "Inbox"
    assert "notatag" not in inbox.tags and "42" not in inbox.tags
    broken = read_note(fixture_kiln_src, "Scratch/Broken frontmatter.md")
    assert broken.problems and broken.problems[0].startswith("frontmatter is not valid YAML")
    assert broken.title == "Notes from the conference" and broken.tags == ["talks"]
    arch = read_note(fixture_kiln_src, "Projects/Lantern/Architecture.md")
    assert "notatag" not in arch.tags and all(link.target != "notalink" for link in arch.links)
    standup = read_note(fixture_kiln_src, "Meetings/2024-03-04 Lantern standup.md")
    assert standup.tags == ["meeting", "lantern", "standup", "todo"]


# --- reading from disk --------------------------------------------------------------------


def test_read_note_errors(tmp_path: Path) -> None:
    (tmp_path / "bin.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00IHDR")
    (tmp_path / "latin1.md").write_bytes("caf\xe9 au lait".encode("latin-1"))
    big = tmp_path / "big.md"
    with big.open("wb") as f:
        f.truncate(MAX_NOTE_BYTES + 1)
    (tmp_path / "folder.md").mkdir()
    cases = {"bin.md": "binary file", "latin1.md": "not UTF-8 text", "big.md": "too large",
             "folder.md": "folder"}
    for rel, reason in cases.items():
        with pytest.raises(NoteReadError) as ei:
            read_note(tmp_path, rel)
        assert ei.value.reason == reason
        assert str(ei.value).startswith(f"{rel}: ")
        assert str(tmp_path) not in str(ei.value)
    with pytest.raises(KilnNotFoundError):
        read_note(tmp_path, "missing.md")
    with pytest.raises(KilnPathError):
        read_note(tmp_path, "../etc/passwd")


def test_read_note_at_the_size_limit_and_with_bom(tmp_path: Path) -> None:
    (tmp_path / "edge.md").write_bytes(b"a" * MAX_NOTE_BYTES)
    assert len(read_note(tmp_path, "edge.md").text) == MAX_NOTE_BYTES
    (tmp_path / "bom.md").write_bytes("\ufeff---\ntitle: BOM\n---\nbody\n".encode())
    note = read_note(tmp_path, ".\\bom.md")
    assert note.path == "bom.md" and note.title == "BOM" and note.body == "body\n"
