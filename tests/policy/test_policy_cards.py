import subprocess
from pathlib import Path

import pytest

from crucible.cards import CardError, get_card, load_cards, parse_card


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_builtin_cards_parse_and_have_real_prompts() -> None:
    cards = load_cards(env={"HOME": "/nonexistent"})
    for name in ("librarian", "reviewer", "planner"):
        assert name in cards
        assert cards[name].origin == "builtin"
        assert len(cards[name].body) > 300


def test_name_defaults_to_stem_and_tools_are_a_permission_map() -> None:
    card = parse_card("---\ndescription: d\ntools:\n  read_note: true\n  delete_*: false\n  x: ask\n---\nBody\n",
                      "kiln:helper.md", origin="kiln", stem="helper")
    assert card.name == "helper"
    assert card.tools == {"read_note": "allow", "delete_*": "deny", "x": "ask"}
    assert card.body == "Body"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("---\nname: x\n---\nbody", "field `description`: required field is missing"),
        ("---\ndescription: d\ncolour: red\n---\n", "field `colour`: unknown field; allowed: name, description"),
        ("---\ndescription: d\ntools:\n  read_note: maybe\n---\n", "field `tools`: expected true/allow, ask or false/deny"),
        ("---\ndescription: [unclosed\n---\n", "frontmatter is not valid YAML"),
        ("no frontmatter", "no YAML frontmatter"),
    ],
)
def test_parse_errors_name_the_file_and_field(text: str, expected: str) -> None:
    with pytest.raises(CardError) as err:
        parse_card(text, "user:bad.md", origin="user")
    assert "card user:bad.md" in str(err.value)
    assert expected in str(err.value)


def test_later_folders_override_earlier(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    kiln = tmp_path / "kiln"
    project = tmp_path / "project"
    write(tmp_path / "cfg/crucible/agents/reviewer.md", "---\ndescription: user reviewer\n---\nU")
    write(kiln / ".crucible/agents/reviewer.md", "---\ndescription: kiln reviewer\n---\nK")
    write(project / ".crucible/agents/scout.md", "---\ndescription: project scout\n---\nP")
    cards = load_cards(kiln, project, env)
    assert cards["reviewer"].description == "kiln reviewer" and cards["reviewer"].origin == "kiln"
    assert cards["scout"].origin == "project"
    assert cards["librarian"].origin == "builtin"
    with pytest.raises(CardError, match="known cards: .*librarian"):
        get_card("nope", kiln, project, env)


def test_cru_cards_list_and_show(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    out = subprocess.run([cru_bin, "cards", "list", "--kiln", str(tmp_path)], env=clean_env,
                         capture_output=True, text=True, check=True).stdout
    assert "librarian" in out and "reviewer" in out and "planner" in out
    res = subprocess.run([cru_bin, "cards", "show", "reviewer", "--kiln", str(tmp_path)], env=clean_env,
                         capture_output=True, text=True, check=True)
    assert '"edit": "deny"' in res.stdout and "You review a change" in res.stdout
    res = subprocess.run([cru_bin, "cards", "show", "nope", "--kiln", str(tmp_path)], env=clean_env,
                         capture_output=True, text=True)
    assert res.returncode == 1 and "no card named 'nope'" in res.stderr and "Traceback" not in res.stderr
