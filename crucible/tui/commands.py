"""Slash commands and `@note` mentions: parsing and completion."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document

# Crucible's own commands (the agent's `available_commands` come beside them).
OWN_COMMANDS: dict[str, str] = {
    "help": "list the commands and keys",
    "cancel": "cancel the running turn (Ctrl-C)",
    "sessions": "list saved sessions",
    "card": "show the agent card of this session",
    "mcp": "the upstream MCP servers: up or down, their tools, the last error",
    "usage": "tokens and cost, this turn and this session",
    "children": "expand/collapse the delegated child sessions (/children open|close)",
    "mode": "list the agent's modes, or /mode ID to switch (Shift-Tab cycles)",
    "model": "list the models, or /model VALUE to switch",
    "restart": "start the agent again, the conversation going on",
    "exit": "leave the chat (Ctrl-D on an empty line)",
}

# `@path` or `@"path with spaces"`, starting a word.
MENTION = re.compile(r'(?<!\S)@(?:"([^"]+)"|([^\s"]+))')


@dataclass(frozen=True)
class SlashCommand:
    name: str
    args: str
    own: bool


def parse_slash(text: str, agent_commands: Iterable[str]) -> SlashCommand | None:
    """`/name args` → a command of ours or of the agent; None for plain text (or `//text`)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, args = stripped[1:].partition(" ")
    if name in OWN_COMMANDS or name == "quit":
        return SlashCommand("exit" if name == "quit" else name, args.strip(), True)
    if name in set(agent_commands):
        return SlashCommand(name, args.strip(), False)
    return SlashCommand(name, args.strip(), True)  # unknown: the app says so


def mentions(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in MENTION.finditer(text)]


class ChatCompleter(Completer):
    """Slash commands at the start of the input, note paths after `@`."""

    def __init__(self, agent_commands: Callable[[], dict[str, str]], notes: Callable[[], list[str]]) -> None:
        self.agent_commands = agent_commands
        self.notes = notes

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and " " not in before and "\n" not in before:
            word = before[1:]
            seen = set()
            for name, desc in [*OWN_COMMANDS.items(), *self.agent_commands().items()]:
                if name.startswith(word) and name not in seen:
                    seen.add(name)
                    yield Completion("/" + name, start_position=-len(before), display="/" + name,
                                     display_meta=desc[:60])
            return
        m = re.search(r'(?<!\S)@("?)([^\s"]*)$', before)
        if m is None:
            return
        typed = m.group(2).lower()
        count = 0
        for path in self.notes():
            low = path.lower()
            if typed in low:
                text = f'@"{path}"' if " " in path else f"@{path}"
                yield Completion(text, start_position=-(len(m.group(0))), display=path)
                count += 1
                if count >= 50:
                    return
