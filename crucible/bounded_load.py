"""Bounded YAML and TOML loading: what a note, a card, a plugin manifest or a config file holds
is hostile until bounded.

YAML: aliases make a few hundred bytes stand for billions of values ("billion laughs"); the
values are shared while loaded, but every walk over them (to plain Python, to JSON, to the
index) expands them. `load_yaml` counts, while composing, how many values the document would
hold with every alias expanded, and refuses it past `MAX_YAML_VALUES`; it also refuses more
than `MAX_YAML_ALIASES` aliases, an alias inside the node it names (a cycle), and nesting
deeper than `MAX_DEPTH` (before the parser recurses that deep, so "[[[[…" fails at once).

TOML: `tomllib` recurses on nested arrays and inline tables; `load_toml` turns its
RecursionError into a clear error and refuses a table nested deeper than `MAX_DEPTH`.

Both raise `BoundedLoadError` (a ValueError) for a refused document; YAML syntax errors stay
ruamel's `YAMLError`, TOML's stay `tomllib.TOMLDecodeError`, so callers report them as before.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.events import AliasEvent

__all__ = [
    "MAX_DEPTH",
    "MAX_YAML_ALIASES",
    "MAX_YAML_VALUES",
    "BoundedLoadError",
    "bounded_yaml",
    "check_depth",
    "load_json",
    "load_json_head",
    "load_toml",
    "load_yaml",
]

# Far beyond what a person writes in frontmatter, a card, a manifest or a config, and far
# below what costs noticeable memory or time (each value is a few hundred bytes at most).
MAX_DEPTH = 100
_SCALARS = frozenset({str, int, float, bool, type(None)})
MAX_YAML_ALIASES = 1000
MAX_YAML_VALUES = 100_000


class BoundedLoadError(ValueError):
    """A document refused for its shape (too deep, too many aliases, expanding too far).
    `line` is 1-based in the text given, when known."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason + (f" (line {line})" if line is not None else ""))
        self.reason = reason
        self.line = line


class _BoundedComposer(Composer):
    """ruamel's composer, counting as it goes (see the module docstring)."""

    def compose_document(self: Any) -> Any:
        self._expanded = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(anchored node) -> values it stands for, expanded
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, AliasEvent):
            node = super().compose_node(parent, index)
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise BoundedLoadError(f"more than {MAX_YAML_ALIASES} aliases (*name)", line)
            size = self._sizes.get(id(node))
            if size is None:
                raise BoundedLoadError(f"the alias *{event.anchor} is inside the node it names "
                                       "(a recursive alias)", line)
            self._count(size, line)
            return node
        if self.depth >= MAX_DEPTH:
            raise BoundedLoadError(f"nested too deeply (more than {MAX_DEPTH} levels)", line)
        start = self._expanded
        node = super().compose_node(parent, index)
        self._count(1, line)
        if event.anchor is not None:
            self._sizes[id(node)] = self._expanded - start
        return node

    def _count(self, values: int, line: int | None) -> None:
        self._expanded += values
        if self._expanded > MAX_YAML_VALUES:
            raise BoundedLoadError(
                f"its aliases expand to more than {MAX_YAML_VALUES} values "
                "(a 'billion laughs' document?)", line)


def bounded_yaml(typ: str = "rt") -> YAML:
    """A ruamel `YAML` that loads within the bounds (pure-Python parser: the C one has no
    composer to count in). Set its round-trip options as usual."""
    yaml = YAML(typ=typ, pure=True)
    yaml.Composer = _BoundedComposer
    return yaml


def load_yaml(text: str, yaml: YAML | None = None) -> Any:
    """`text` loaded by `yaml` (a `bounded_yaml()`; default round-trip). Raises
    BoundedLoadError past the bounds, ruamel's YAMLError on a syntax error."""
    loader = yaml if yaml is not None else bounded_yaml()
    if not issubclass(loader.Composer, _BoundedComposer):
        raise TypeError("load_yaml needs a YAML made by bounded_yaml()")
    if _bracket_depth(text) > MAX_DEPTH:
        # ruamel's scanner looks ~1024 tokens ahead for a simple key, at a cost that grows
        # with the flow depth: "[[[[…" would take over a second to reach the composer's bound.
        raise BoundedLoadError(f"nested too deeply (more than {MAX_DEPTH} levels)")
    try:
        return loader.load(text)
    except RecursionError:  # a backstop: the depth bound stops well before this
        raise BoundedLoadError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None


def _bracket_depth(text: str) -> int:
    """The deepest run of unclosed '[' / '{' (quotes not considered: a cheap upper bound)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0  # the common case, in C
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def check_depth(data: Any, max_depth: int = MAX_DEPTH) -> None:
    """BoundedLoadError when lists/dicts in `data` nest deeper than `max_depth` (level by
    level, so it works on data too deep to recurse into). Only containers are visited: a
    saved index of millions of numbers is checked in a tenth of the time of its parse."""
    level: list[Any] = [data] if isinstance(data, (dict, list)) else []
    seen: set[int] = set()
    depth = 0
    while level:
        if depth >= max_depth:
            raise BoundedLoadError(f"nested too deeply (more than {max_depth} levels)")
        below: list[Any] = []
        for value in level:
            if id(value) in seen:  # shared (YAML aliases): each once
                continue
            seen.add(id(value))
            children = value.values() if isinstance(value, dict) else value
            kinds = set(map(type, children))  # in C: most containers hold scalars only
            if not kinds <= _SCALARS:
                below.extend([c for c in children if isinstance(c, (dict, list))])
        level = below
        depth += 1


def load_json(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """`text` parsed by json, refused (BoundedLoadError) when nested deeper than `max_depth`:
    for JSON nobody vouches for (the files in a kiln's `.crucible`, which came with the kiln as
    far as anyone knows; a package index's answer). json's RecursionError is no ValueError."""
    try:
        data = json.loads(text)
    except RecursionError:  # the C scanner stops at the interpreter's recursion limit
        raise BoundedLoadError(f"nested too deeply (more than {max_depth} levels)") from None
    check_depth(data, max_depth)
    return data


def load_json_head(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value `text` begins with, what follows it ignored, bounded as `load_json`: an
    agent's tool output may be a tool's JSON with lines after it (OpenCode joins the text blocks
    of an MCP result, e.g. semantic_search's JSON and its line on the index)."""
    try:
        data, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except RecursionError:
        raise BoundedLoadError(f"nested too deeply (more than {max_depth} levels)") from None
    check_depth(data, max_depth)
    return data


def load_toml(text: str) -> dict[str, Any]:
    """`text` parsed by tomllib, refused (BoundedLoadError) when nested deeper than
    `MAX_DEPTH`; a syntax error stays tomllib.TOMLDecodeError."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise BoundedLoadError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    check_depth(data)
    return data
