"""Agent cards: markdown files whose YAML frontmatter configures an agent and whose body is
its system prompt.

Lookup, later overriding earlier: `cards/` built in -> `~/.config/crucible/agents` ->
`KILN/.crucible/agents` -> `PROJECT/.crucible/agents`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from crucible.errors import CrucibleError
from crucible.permissions import Rule, normalize_rule

BUILTIN_CARDS_DIR = Path(__file__).resolve().parent.parent / "cards"


class CardError(CrucibleError):
    pass


class CardDelegation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    targets: list[str] | None = None  # cards or agents this card may delegate to; None = any allowed by config
    max_depth: int | None = None


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    version: str | None = None
    agent: str | None = None  # backend agent or config profile
    model: str | None = None
    mode: str | None = None
    tools: dict[str, Rule] = Field(default_factory=dict)
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    delegation: CardDelegation = Field(default_factory=CardDelegation)
    tags: list[str] = Field(default_factory=list)
    body: str = ""
    origin: str = "builtin"  # builtin | user | kiln | project
    file: str = ""  # file name relative to its card folder (never an absolute path)

    @field_validator("tools", mode="before")
    @classmethod
    def _rules(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            raise ValueError("tools must be a map of tool name or glob -> true/allow, ask, false/deny")
        return {str(k): normalize_rule(v) for k, v in value.items()}

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        return None if value is None else str(value)


def _plain(value: Any) -> Any:
    """ruamel's round-trip types -> plain python, for pydantic."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse_card(text: str, file_label: str, *, origin: str = "builtin", stem: str | None = None) -> Card:
    """Parse a card. Errors name the file and the field."""
    if not text.startswith("---"):
        raise CardError(f"card {file_label}: no YAML frontmatter",
                        "start the file with a '---' line, the card's settings (at least `description:`), and '---'")
    lines = text.splitlines(keepends=True)
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        raise CardError(f"card {file_label}: the frontmatter is not closed", "add a '---' line after the settings")
    yaml_text = "".join(lines[1:end])
    body = "".join(lines[end + 1:]).strip("\n")
    try:
        data = YAML(typ="rt").load(yaml_text) or {}
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        raise CardError(f"card {file_label}: frontmatter is not valid YAML{where}: {getattr(exc, 'problem', exc)}",
                        "fix the YAML between the '---' lines") from None
    if not isinstance(data, Mapping):
        raise CardError(f"card {file_label}: frontmatter must be a map of settings", None)
    data = _plain(data)
    data.setdefault("name", stem or Path(file_label).stem)
    try:
        return Card(**data, body=body, origin=origin, file=file_label)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(card)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(k for k in Card.model_fields if k not in ("body", "origin", "file"))
            msg = f"unknown field; allowed: {allowed}"
        elif err["type"] == "missing":
            msg = "required field is missing"
        raise CardError(f"card {file_label}: field `{field}`: {msg}") from None


def card_dirs(kiln: Path | None = None, project: Path | None = None,
              env: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    env = os.environ if env is None else env
    config_home = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    dirs: list[tuple[str, Path]] = [("builtin", BUILTIN_CARDS_DIR), ("user", config_home / "crucible" / "agents")]
    if kiln is not None:
        dirs.append(("kiln", kiln / ".crucible" / "agents"))
    if project is not None and (kiln is None or project.resolve() != kiln.resolve()):
        dirs.append(("project", project / ".crucible" / "agents"))
    return dirs


def load_cards(kiln: Path | None = None, project: Path | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, Card]:
    """All cards by name; a later folder's card overrides an earlier one of the same name."""
    cards: dict[str, Card] = {}
    for origin, folder in card_dirs(kiln, project, env):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.md")):
            label = f"{origin}:{path.name}"
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CardError(f"card {label}: cannot be read ({exc.__class__.__name__})") from None
            card = parse_card(text, label, origin=origin, stem=path.stem)
            cards[card.name] = card
    return cards


def get_card(name: str, kiln: Path | None = None, project: Path | None = None,
             env: Mapping[str, str] | None = None) -> Card:
    cards = load_cards(kiln, project, env)
    if name not in cards:
        known = ", ".join(sorted(cards)) or "none"
        raise CardError(f"no card named {name!r} (known cards: {known})",
                        "add NAME.md to ~/.config/crucible/agents or KILN/.crucible/agents")
    return cards[name]


def _kiln_for(args: argparse.Namespace) -> Path | None:
    from crucible.config import load_config, resolve_kiln

    try:
        return resolve_kiln(getattr(args, "kiln", None), load_config(getattr(args, "config", None)))
    except CrucibleError:
        return None


def cmd_list(args: argparse.Namespace) -> int:
    cards = load_cards(_kiln_for(args), Path.cwd())
    width = max((len(n) for n in cards), default=4)
    for card in sorted(cards.values(), key=lambda c: c.name):
        agent = f" [{card.agent}]" if card.agent else ""
        print(f"{card.name:<{width}}  {card.origin:<7}  {card.description}{agent}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    card = get_card(args.name, _kiln_for(args), Path.cwd())
    print(json.dumps(card.model_dump(exclude={"body"}), indent=2))
    print()
    print(card.body)
    return 0
