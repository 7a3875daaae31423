"""Agent cards: markdown files whose YAML frontmatter configures an agent and whose body is
its system prompt.

Lookup, later overriding earlier: `crucible/builtin_cards/` built in -> `~/.config/crucible/agents` ->
`KILN/.crucible/agents` -> `PROJECT/.crucible/agents`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml.error import YAMLError

from crucible.bounded_load import BoundedLoadError, load_yaml
from crucible.config import Config, ConfigError, _interpolate, load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.permissions import Rule, normalize_rule
from mcp_bridge import BRIDGE_NAME

BUILTIN_CARDS_DIR = Path(__file__).resolve().parent / "builtin_cards"  # package data: in the wheel too
# A card is a page of settings and instructions; anything far bigger is not one.
MAX_CARD_BYTES = 1024 * 1024


class CardError(CrucibleError):
    """A card that cannot be used; `stem`: its file's name without `.md`, when it is a file's."""

    stem: str | None = None


class CardDelegation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    targets: list[str] | None = None  # cards or agents this card may delegate to; None = any allowed by config
    max_depth: int | None = None


_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


_HTTP_SCHEMES = ("http://", "https://")


class CardMcpServer(BaseModel):
    """An MCP server the card gives its agent, as a card author writes it:
    `command` (+ `args`, `env`) for a local program over stdio, or `url` (+ `headers`) for
    http/sse. Strings may hold `{env:VAR}`, filled in when a session starts (not when the
    card is read, so `cru cards show` never prints a secret). Relative paths stay as written:
    the agent starts the server in its own working directory."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    type: Literal["stdio", "http", "sse"] | None = None  # None: stdio with `command`, http with `url`
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("args", "env", "headers", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: object) -> object:
        # YAML reads `--port, 8080` or `RETRIES: 3` as numbers; a program sees text anyway.
        def text(v: object) -> object:
            return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v

        if isinstance(value, list):
            return [text(v) for v in value]
        if isinstance(value, Mapping):
            return {k: text(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _transport(self) -> CardMcpServer:
        who = f"MCP server {self.name!r}"
        if not _SERVER_NAME.fullmatch(self.name):
            raise ValueError(f"{who}: a name is letters, digits, '-' and '_' (agents build tool names from it)")
        if self.name == BRIDGE_NAME:
            raise ValueError(f"{who}: the name {BRIDGE_NAME!r} is Crucible's own kiln bridge; pick another name")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"{who}: give exactly one of `command` (a program the agent starts, stdio) "
                             "or `url` (a running server, http or sse)")
        if self.command is not None:
            if self.type not in (None, "stdio"):
                raise ValueError(f"{who}: type {self.type!r} needs `url`, not `command`")
            if not self.command.strip():
                raise ValueError(f"{who}: `command` is empty")
            if self.headers:
                raise ValueError(f"{who}: `headers` are for `url` servers; a `command` server takes `env`")
            self.type = "stdio"
        else:
            if self.type == "stdio":
                raise ValueError(f"{who}: type 'stdio' needs `command`, not `url`")
            # A url from the environment (`{env:DOCS_URL}`) is checked once filled in.
            if not str(self.url).startswith((*_HTTP_SCHEMES, "{env:")):
                raise ValueError(f"{who}: `url` must start with http:// or https://")
            if self.args or self.env:
                raise ValueError(f"{who}: `args` and `env` are for `command` servers; a `url` server takes `headers`")
            self.type = self.type or "http"
        return self


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    version: str | None = None
    agent: str | None = None  # backend agent or config profile
    model: str | None = None
    mode: str | None = None
    tools: dict[str, Rule] = Field(default_factory=dict)
    mcp_servers: list[CardMcpServer] = Field(default_factory=list)
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

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(cls, value: list[CardMcpServer]) -> list[CardMcpServer]:
        names = [s.name for s in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two MCP servers are named {twice[0]!r}; give each a unique `name`")
        return value

    def acp_mcp_servers(self, capabilities: Any, agent: str,
                        env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """This card's MCP servers as ACP `mcpServers` entries for session/new, `{env:VAR}`
        filled in from `env` (default: this process's environment). An http/sse server for an
        agent that did not advertise that transport in `mcpCapabilities` is an error, not a
        warning: the card's instructions count on those tools."""
        # acp.schema (~0.5 s): only when a session starts, not for `cru cards list`
        from acp.schema import EnvVariable, HttpHeader, HttpMcpServer, McpServerStdio, SseMcpServer

        env = os.environ if env is None else env
        mcp_caps = getattr(capabilities, "mcp_capabilities", None)
        out: list[dict[str, Any]] = []
        for i, server in enumerate(self.mcp_servers):
            raw = server.model_dump(include={"command", "args", "env", "url", "headers"})
            try:
                # Path(): the card's label stands where config errors name their file.
                filled = _interpolate(raw, ("mcp_servers", i), env, Path(f"card {self.file or self.name}"))
            except ConfigError as exc:
                raise CardError(f"{exc.message} (needed to start the card's MCP server {server.name!r})",
                                exc.fix) from None
            entry: McpServerStdio | HttpMcpServer | SseMcpServer
            if server.type == "stdio":
                # No `type` key on stdio (claude-agent-acp reads any `type` as http); args and
                # env always present (SDK-based agents drop entries without them).
                entry = McpServerStdio(name=server.name, command=filled["command"], args=filled["args"],
                                       env=[EnvVariable(name=k, value=v) for k, v in filled["env"].items()])
            else:
                if not getattr(mcp_caps, server.type or "http", False):
                    raise CardError(
                        f"card {self.file or self.name}: MCP server {server.name!r} is an {server.type} server, "
                        f"and the agent {agent} does not take {server.type} MCP servers "
                        f"(its mcpCapabilities do not list {server.type})",
                        "give the server a `command` the agent can start (stdio, which every agent takes), "
                        f"or run the card with an agent that supports {server.type} MCP servers "
                        "(the card's `agent:` or `cru chat -a`)")
                if not filled["url"].startswith(_HTTP_SCHEMES):
                    # The value itself is not shown: it came from the environment and may hold a token.
                    raise CardError(
                        f"card {self.file or self.name}: mcp_servers[{i}].url of MCP server {server.name!r}, "
                        "once filled in from the environment, is not an http:// or https:// address",
                        f"set the variable to the server's address (http://host:port/path), or change "
                        f"mcp_servers[{i}].url in card {self.file or self.name}")
                headers = [HttpHeader(name=k, value=v) for k, v in filled["headers"].items()]
                if server.type == "sse":
                    entry = SseMcpServer(type="sse", name=server.name, url=filled["url"], headers=headers)
                else:
                    entry = HttpMcpServer(type="http", name=server.name, url=filled["url"], headers=headers)
            out.append(entry.model_dump(by_alias=True, exclude_none=True))
        return out


def _plain(value: Any) -> Any:
    """ruamel's round-trip types -> plain python, for pydantic."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# Sections of a card that are models of their own (for "unknown field; allowed: ...").
_NESTED: dict[str, type[BaseModel]] = {"mcp_servers": CardMcpServer, "delegation": CardDelegation}


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
        data = load_yaml(yaml_text) or {}
    except BoundedLoadError as exc:
        where = f" at line {exc.line + 1}" if exc.line is not None else ""
        raise CardError(f"card {file_label}: frontmatter refused{where}: {exc.reason}",
                        "write the card's settings as plain keys and values (no aliases, little nesting)") from None
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
        loc = err["loc"]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(card)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            nested = _NESTED.get(str(loc[0])) if len(loc) > 1 else None
            model: type[BaseModel] = nested or Card
            allowed = ", ".join(k for k in model.model_fields if k not in ("body", "origin", "file"))
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
               env: Mapping[str, str] | None = None, *,
               problems: list[CardError] | None = None) -> dict[str, Card]:
    """All cards by name; a later folder's card overrides an earlier one of the same name.
    A card that cannot be read or parsed is left out (its error, naming the file, is added to
    `problems` when given): one broken card never hides the others."""
    cards: dict[str, Card] = {}
    for origin, folder in card_dirs(kiln, project, env):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.md")):
            try:
                card = _read_card(path, origin)
            except CardError as exc:
                exc.stem = path.stem
                if problems is not None:
                    problems.append(exc)
                continue
            cards[card.name] = card
    return cards


def _read_card(path: Path, origin: str) -> Card:
    label = f"{origin}:{path.name}"
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CARD_BYTES + 1)
        if len(data) > MAX_CARD_BYTES:
            raise CardError(f"card {label}: too large (over {MAX_CARD_BYTES // 1024} KiB)",
                            "keep a card to its settings and instructions")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CardError(f"card {label}: cannot be read ({exc.__class__.__name__})") from None
    return parse_card(text, label, origin=origin, stem=path.stem)


def get_card(name: str, kiln: Path | None = None, project: Path | None = None,
             env: Mapping[str, str] | None = None, *, why_no_kiln: str | None = None) -> Card:
    """The card `name`; a broken card file of that name raises its own error. `why_no_kiln`:
    why the kiln's cards could not be looked at (said when the card is not found)."""
    problems: list[CardError] = []
    cards = load_cards(kiln, project, env, problems=problems)
    if name not in cards:
        for problem in reversed(problems):  # the last folder's file would have won
            if problem.stem == name:
                raise problem
        known = ", ".join(sorted(cards)) or "none"
        broken = "".join(f"; {p.message}" for p in problems)
        missing = f"; the kiln's cards were not looked at: {why_no_kiln}" if why_no_kiln else ""
        raise CardError(f"no card named {name!r} (known cards: {known}){broken}{missing}",
                        "add NAME.md to ~/.config/crucible/agents or KILN/.crucible/agents")
    return cards[name]


def _kiln_for(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """(the kiln whose cards to read, or None and why not)."""
    config_error: str | None = None
    try:
        config = load_config(getattr(args, "config", None))
    except CrucibleError as exc:
        # `--kiln` needs no config; without it the config is where the kiln comes from.
        config, config_error = Config(), exc.message
    try:
        kiln = resolve_kiln(getattr(args, "kiln", None), config)
    except CrucibleError as exc:
        return None, exc.message
    if config_error is not None and not getattr(args, "kiln", None) and not os.environ.get("CRUCIBLE_KILN"):
        return None, config_error
    return kiln, None


def cmd_list(args: argparse.Namespace) -> int:
    kiln, why_no_kiln = _kiln_for(args)
    problems: list[CardError] = []
    cards = load_cards(kiln, Path.cwd(), problems=problems)
    width = max((len(n) for n in cards), default=4)
    for card in sorted(cards.values(), key=lambda c: c.name):
        agent = f" [{card.agent}]" if card.agent else ""
        print(f"{card.name:<{width}}  {card.origin:<7}  {card.description}{agent}")
    sys.stdout.flush()
    for problem in problems:
        print(f"cru: left out {problem}", file=sys.stderr)
    if why_no_kiln:
        print(f"cru: the kiln's cards are not listed: {why_no_kiln}", file=sys.stderr)
    return 1 if problems or why_no_kiln else 0


def cmd_show(args: argparse.Namespace) -> int:
    kiln, why_no_kiln = _kiln_for(args)
    card = get_card(args.name, kiln, Path.cwd(), why_no_kiln=why_no_kiln)
    print(json.dumps(card.model_dump(exclude={"body"}), indent=2, ensure_ascii=False))  # stdout escapes controls
    print()
    print(card.body)
    return 0
