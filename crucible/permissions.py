"""The one permission policy engine.

Used for the agent's ACP permission requests (mapped from the tool call's kind, title and
raw input to a tool key) and for the bridge's own tools (enforced server-side). Order of
precedence: explicit card rule -> config rules -> remembered answers -> defaults
(read-only runs, mutating asks). Every decision records which rule made it.

A delegated child's policy is the intersection with its parent's: the strictest of the
two wins (deny > ask > allow), so a child can never widen what its parent had.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Rule = Literal["allow", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}

# The bridge's own MCP server name, as agents prefix its tools.
BRIDGE_SERVER = "crucible"

# Bridge tools that only read. Anything else on the bridge mutates (or delegates) and asks.
READ_ONLY_BRIDGE_TOOLS = frozenset({
    "read_note", "read_metadata", "list_notes", "semantic_search", "text_search",
    "property_search", "get_kiln_info", "get_kiln_roots", "get_kiln_stats",
    "list_jobs", "get_job_result",
})

# ACP tool kinds that only look; everything else (edit, delete, move, execute, fetch, other)
# is treated as risky and asks by default.
READ_ONLY_KINDS = frozenset({"read", "search", "think"})
# The kinds of the agent's own fs/terminal requests, which Crucible gates like tool calls.
GATED_KINDS = frozenset({"execute", "edit"})

# How each agent names an MCP tool: claude `mcp__crucible__x`, gemini `mcp_crucible_x`
# (toolCallId `mcp_crucible_x__<id>`), opencode `crucible_x`.
# Tool names: the kiln's (`read_note`) and the gateway's upstream tools, prefixed
# (`everything_get-sum`, `gh_searchIssues`): MCP's name characters.
_BRIDGE_TOOL_RE = re.compile(
    rf"^(?:mcp__{BRIDGE_SERVER}__|mcp_{BRIDGE_SERVER}_|{BRIDGE_SERVER}_)(?P<tool>[A-Za-z][A-Za-z0-9_.-]*?)(?:__.*)?$"
)


def normalize_rule(value: object) -> Rule:
    """Card and config rules accept true/allow, ask, false/deny."""
    if value is True or value == "allow" or value == "true":
        return "allow"
    if value is False or value == "deny" or value == "false":
        return "deny"
    if value == "ask":
        return "ask"
    raise ValueError(f"expected true/allow, ask or false/deny, got {value!r}")


def stricter(a: Rule, b: Rule) -> Rule:
    return a if _STRICTNESS[a] >= _STRICTNESS[b] else b


@dataclass(frozen=True)
class ToolKey:
    """What a permission request is about, as the policy sees it."""

    name: str  # bridge tool name ("create_note") or the agent's tool title/kind ("execute")
    bridge: bool  # one of Crucible's own bridge tools
    read_only: bool
    summary: str = ""  # short human description: the command, the path, the arguments


@dataclass(frozen=True)
class PolicyDecision:
    rule: Rule
    reason: str  # which rule decided, e.g. "card reviewer: delete_* = deny"


def bridge_tool_name(text: str | None) -> str | None:
    """The bridge tool a title or toolCallId names, or None when it is not one of ours."""
    if not text:
        return None
    m = _BRIDGE_TOOL_RE.match(text.strip())
    return m.group("tool") if m else None


def tool_key_from_acp(tool_call: Mapping[str, Any]) -> ToolKey:
    """Map an ACP tool call (as merged so far; may be only what the permission request carried)."""
    title = str(tool_call.get("title") or "")
    kind = str(tool_call.get("kind") or "other")
    tool_call_id = str(tool_call.get("toolCallId") or "")
    raw_input = tool_call.get("rawInput")
    name = bridge_tool_name(title) or bridge_tool_name(tool_call_id)
    if name is None:
        # Claude titles bridge calls like "mcp__crucible__create_note" but some adapters use a
        # display title; look for our prefix anywhere in the title as a last resort.
        for word in re.split(r"[\s:()]+", title):
            name = bridge_tool_name(word)
            if name:
                break
    summary = _summarize(raw_input) or title
    if name is not None:
        return ToolKey(name=name, bridge=True, read_only=name in READ_ONLY_BRIDGE_TOOLS, summary=summary)
    return ToolKey(name=kind, bridge=False, read_only=kind in READ_ONLY_KINDS, summary=summary)


def _summarize(raw_input: object, limit: int = 160) -> str:
    if raw_input is None:
        return ""
    if isinstance(raw_input, Mapping):
        for key in ("command", "cmd", "path", "file_path", "filePath", "url", "query"):
            if key in raw_input and isinstance(raw_input[key], str | list):
                value = raw_input[key]
                text = " ".join(map(str, value)) if isinstance(value, list) else value
                return text[:limit]
    try:
        text = json.dumps(raw_input, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = str(raw_input)
    return text[:limit]


def _match(rules: Mapping[str, Rule], name: str) -> tuple[str, Rule] | None:
    """Exact rule first, then the most specific glob (longest pattern)."""
    if name in rules:
        return name, rules[name]
    globs = [(p, r) for p, r in rules.items() if any(c in p for c in "*?[") and fnmatch.fnmatchcase(name, p)]
    if not globs:
        return None
    return max(globs, key=lambda pr: len(pr[0]))


@dataclass
class PermissionPolicy:
    """A session's effective policy. Mutable only through `remember`."""

    card_rules: Mapping[str, Rule] = field(default_factory=dict)
    config_rules: Mapping[str, Rule] = field(default_factory=dict)
    card_name: str | None = None
    parent: PermissionPolicy | None = None
    remembered: dict[str, Rule] = field(default_factory=dict)
    label: str = ""  # e.g. "claude" or "claude › reviewer", used to show provenance

    def decide(self, key: ToolKey) -> PolicyDecision:
        own = self._decide_own(key)
        if self.parent is None:
            return own
        parent = self.parent.decide(key)
        if _STRICTNESS[parent.rule] > _STRICTNESS[own.rule]:
            return PolicyDecision(parent.rule, f"parent policy ({parent.reason})")
        return own

    def _decide_own(self, key: ToolKey) -> PolicyDecision:
        hit = _match(self.card_rules, key.name)
        if hit:
            who = f"card {self.card_name}" if self.card_name else "card"
            return PolicyDecision(hit[1], f"{who}: {hit[0]} = {hit[1]}")
        hit = _match(self.config_rules, key.name)
        if hit:
            return PolicyDecision(hit[1], f"config [permissions]: {hit[0]} = {hit[1]}")
        if key.name in self.remembered:
            return PolicyDecision(self.remembered[key.name], f"remembered answer for {key.name}")
        if key.read_only:
            return PolicyDecision("allow", "default: read-only tools run")
        return PolicyDecision("ask", "default: tools that change things ask")

    def hidden(self, tool_name: str) -> bool:
        """Bridge tools denied by policy are hidden from tools/list (and refused if called)."""
        key = ToolKey(name=tool_name, bridge=True, read_only=tool_name in READ_ONLY_BRIDGE_TOOLS)
        return self.decide(key).rule == "deny"

    def remember(self, tool_name: str, rule: Rule) -> None:
        """An "always" answer from the person, for the rest of this session."""
        self.remembered[tool_name] = rule

    def rules(self) -> list[tuple[str, str, Rule]]:
        """Every rule this session's decisions come from, in the order they are consulted:
        (where it is from, tool pattern, rule); a delegated child's parent's bound last."""
        who = f"card {self.card_name}" if self.card_name else "card"
        out: list[tuple[str, str, Rule]] = [(who, k, v) for k, v in self.card_rules.items()]
        out += [("config [permissions]", k, v) for k, v in self.config_rules.items()]
        out += [("remembered this session", k, v) for k, v in self.remembered.items()]
        if self.parent is not None:
            out += [(f"parent: {source}", k, v) for source, k, v in self.parent.rules()]
        return out

    def forget(self, tool_name: str) -> list[str]:
        """Drop the remembered answer and the config rule named exactly `tool_name` (the person
        saved it with a key, perhaps by mistake); what was dropped, as text."""
        dropped = []
        if tool_name in self.remembered:
            dropped.append(f"the remembered answer {tool_name} = {self.remembered.pop(tool_name)}")
        if tool_name in self.config_rules:
            rule = self.config_rules[tool_name]
            self.config_rules = {k: v for k, v in self.config_rules.items() if k != tool_name}
            dropped.append(f"the config rule {tool_name} = {rule}")
        return dropped

    def child(self, card_rules: Mapping[str, Rule], card_name: str | None) -> PermissionPolicy:
        """A delegated child's policy: its card's rules, bounded by everything this one allows."""
        label = f"{self.label} › {card_name}" if self.label and card_name else (card_name or self.label)
        return PermissionPolicy(
            card_rules=dict(card_rules), config_rules=self.config_rules, card_name=card_name,
            parent=self, label=label,
        )
