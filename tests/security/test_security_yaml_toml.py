"""17.2 (and 17.8's parse tracebacks): YAML and TOML reads are bounded everywhere.

A billion-laughs frontmatter is indexed as text with its frontmatter marked degraded; as a
card it is refused, naming its file; a TOML config nested 100,000 deep is a clear error.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BOMB_YAML, SMALL_BOMB_YAML, memory_capped
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from ruamel.yaml import YAML

from crucible.bounded_load import BoundedLoadError, load_json, load_toml, load_yaml
from crucible.cards import CardError, load_cards, parse_card
from crucible.kiln.lexical import _MAGIC
from crucible.kiln.notes import parse_note

# -- the loader ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text,reason", [
    (BOMB_YAML, "expand to more than"),
    (SMALL_BOMB_YAML, "expand to more than"),
    ("[" * 100_000, "nested too deeply"),
    ("- " * 5000 + "x\n", "nested too deeply"),  # block nesting on one line
    ("a: &a [1, *a]\n", "recursive alias"),
    ("x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(1001)), "more than 1000 aliases"),
])
def test_load_yaml_refuses_bombs_at_once(text: str, reason: str) -> None:
    started = time.monotonic()
    with pytest.raises(BoundedLoadError) as err:
        load_yaml(text)
    assert reason in str(err.value)
    assert time.monotonic() - started < 5  # a bound, not a benchmark: today's code never returns


@pytest.mark.parametrize("text", [
    "title: A\ntags: [a, b]\nnested: {x: {y: [1, 2, {z: 3}]}}\n",
    "base: &base {a: 1, b: 2}\nmore:\n  <<: *base\n  c: 3\nagain: *base\n",
    "deep: " + "[" * 90 + "]" * 90 + "\n",
])
def test_load_yaml_loads_what_people_write_as_ruamel_does(text: str) -> None:
    assert json.dumps(load_yaml(text)) == json.dumps(YAML(typ="rt").load(text))


@pytest.mark.parametrize("text", ["a = " + "[" * 100_000, "x = " + "{a = " * 5000, "a." * 200 + "b = 1"])
def test_load_toml_refuses_deep_nesting_without_recursion_error(text: str) -> None:
    with pytest.raises(BoundedLoadError, match="nested too deeply"):
        load_toml(text)


# -- notes --------------------------------------------------------------------------------------


def test_bomb_frontmatter_is_a_problem_and_the_body_still_parses() -> None:
    note = parse_note(f"---\n{BOMB_YAML}---\n# Laughs\nbody #kept [[Link]]\n", "bomb.md")
    assert note.frontmatter == {}
    assert note.problems and "expand to more than" in note.problems[0]
    assert note.title == "Laughs" and note.tags == ["kept"] and note.links[0].target == "Link"


def test_kiln_index_marks_a_bomb_note_degraded_and_indexes_its_text(cru_bin: str, clean_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    kiln = tmp_path / "kiln"
    kiln.mkdir()
    (kiln / "plain.md").write_text("# Plain\nnothing special here\n")
    (kiln / "bomb.md").write_text(f"---\n{SMALL_BOMB_YAML}---\n# Laughs\nquokka marmalade\n")
    done = subprocess.run([cru_bin, "kiln", "index", "--kiln", str(kiln)], env=clean_env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "indexed with problems (1):" in done.stdout
    assert "bomb.md: frontmatter is not valid YAML: its aliases expand to more than" in done.stdout
    found = subprocess.run([cru_bin, "kiln", "search", "quokka marmalade", "--mode", "text", "--json", "--kiln",
                            str(kiln)], env=clean_env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr
    assert "bomb.md" in found.stdout


async def test_read_metadata_of_a_planted_bomb_answers_at_once(cru_bin: str, clean_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """An agent plants the bomb with create_note, then reads it back: a quick answer naming the
    problem (today the parse outlives the 30 s tool timeout in a thread, growing)."""
    kiln = tmp_path / "kiln"
    kiln.mkdir()
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=clean_env)
    async with Client(params) as client:
        made = await client.call_tool("create_note", {"path": "bomb.md",
                                                      "content": f"---\n{SMALL_BOMB_YAML}---\nbody\n"})
        assert not made.is_error
        started = time.monotonic()
        meta = await client.call_tool("read_metadata", {"path": "bomb.md"})
        assert time.monotonic() - started < 10
        data: Any = meta.structured_content
        assert data is not None and data["frontmatter"] == {}
        assert any("expand to more than" in p for p in data["problems"])


async def test_a_kiln_that_came_with_deep_json_in_its_crucible_folder_is_searched(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A kiln is not trusted: one cloned with a `.crucible` folder whose properties and build
    status are 200,000 nested brackets, and whose saved words' JSON header is 60,000. Each is
    read as a damaged file (built again from the notes), not as a RecursionError that failed
    every search."""
    kiln = tmp_path / "kiln"
    (kiln / ".crucible").mkdir(parents=True)
    (kiln / "Garden.md").write_text("---\nstatus: growing\n---\n# Garden\n\nTomatoes and basil by the fence.\n")
    for name in ("properties.json", "index-build.json"):
        (kiln / ".crucible" / name).write_text("[" * 200_000)
    deep = b"[" * 60_000  # the saved words' header (JSON, naming its arrays)
    (kiln / ".crucible" / "lexical-kiln.idx").write_bytes(_MAGIC + len(deep).to_bytes(4, "little") + deep)
    (kiln / ".crucible" / "index.lock").touch()  # so the build status is read
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=clean_env)
    async with Client(params) as client:
        found = await client.call_tool("semantic_search", {"query": "tomatoes", "limit": 2})
        assert not found.is_error, found.content
        assert found.structured_content is not None
        assert [r["path"] for r in found.structured_content["results"]] == ["Garden.md"]
        props = await client.call_tool("property_search", {"query": "status:growing"})
        assert not props.is_error, props.content
        assert props.structured_content is not None
        assert [r["path"] for r in props.structured_content["results"]] == ["Garden.md"]


@pytest.mark.parametrize("text", ["[" * 200_000, "[" * 101 + "]" * 101, '{"a":' * 150 + "1" + "}" * 150])
def test_load_json_refuses_deep_nesting_without_recursion_error(text: str) -> None:
    with pytest.raises(BoundedLoadError, match="nested too deeply"):
        load_json(text)
    assert load_json('{"notes": {"a.md": [1, 2, {"t": 3}]}}') == {"notes": {"a.md": [1, 2, {"t": 3}]}}


# -- cards --------------------------------------------------------------------------------------


def test_a_bomb_card_is_refused_naming_its_file() -> None:
    with pytest.raises(CardError, match=r"card kiln:bomb\.md: frontmatter refused at line \d+: its aliases"):
        parse_card(f"---\ndescription: x\n{BOMB_YAML}---\nbody\n", "kiln:bomb.md", origin="kiln")
    with pytest.raises(CardError, match=r"card kiln:deep\.md: frontmatter refused: nested too deeply"):
        parse_card("---\ndescription: " + "[" * 5000 + "\n---\n", "kiln:deep.md", origin="kiln")


def _bomb_card(kiln: Path) -> None:
    folder = kiln / ".crucible" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bomb.md").write_text(f"---\ndescription: laughs\n{BOMB_YAML}---\nYou laugh.\n")


def test_cru_cards_show_refuses_a_bomb_card_at_once(cru_bin: str, clean_env: dict[str, str], kiln: Path) -> None:
    _bomb_card(kiln)
    done = subprocess.run([cru_bin, "cards", "show", "bomb", "--kiln", str(kiln)], env=clean_env,
                          capture_output=True, text=True, timeout=60, preexec_fn=memory_capped())
    assert done.returncode == 1
    assert "card kiln:bomb.md: frontmatter refused" in done.stderr and "Traceback" not in done.stderr


def test_cru_chat_with_a_bomb_card_is_refused_before_the_agent_starts(chat: Any, kiln: Path) -> None:
    _bomb_card(kiln)
    argv = chat.argv(None, "hello", "--card", "bomb")
    done = subprocess.run(argv, env=chat.env, capture_output=True, text=True, timeout=60, cwd=chat.tmp,
                          preexec_fn=memory_capped())
    assert done.returncode == 1
    assert "card kiln:bomb.md: frontmatter refused" in done.stderr and "Traceback" not in done.stderr
    assert chat.agent_log() == []  # the agent never started


def test_load_cards_names_a_card_too_big_to_be_one(tmp_path: Path) -> None:
    folder = tmp_path / "kiln" / ".crucible" / "agents"
    folder.mkdir(parents=True)
    (folder / "huge.md").write_text("---\ndescription: big\n---\n" + "x" * (2 << 20))
    problems: list[CardError] = []
    cards = load_cards(tmp_path / "kiln", env={"HOME": str(tmp_path)}, problems=problems)
    assert "huge" not in cards and "librarian" in cards
    assert [p.message for p in problems] == ["card kiln:huge.md: too large (over 1024 KiB)"]


# -- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["a = " + "[" * 100_000, "[agents.x]\nenv = " + "{a = " * 5000])
def test_a_config_nested_too_deeply_is_a_clear_error(cru_bin: str, clean_env: dict[str, str], tmp_path: Path,
                                                     text: str) -> None:
    config = tmp_path / "deep.toml"
    config.write_text(text)
    done = subprocess.run([cru_bin, "--config", str(config), "kiln", "info", "--kiln", str(tmp_path)], env=clean_env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"{config}: refused: nested too deeply" in done.stderr and "Traceback" not in done.stderr
