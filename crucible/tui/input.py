"""The input box: its buffer, completion (slash commands, `@note` paths), and what becomes of
what was typed (its keys are keys.py): a slash command runs; a prompt joins the queue
(prompts.py) and, when its turn comes, is sent with its attachments (crucible/attachments.py:
each `@note` of the kiln, each image)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import History, InMemoryHistory

from crucible.attachments import prompt_attachments
from crucible.tui.commands import OWN_COMMANDS, parse_slash
from crucible.tui.prompts import Queued

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


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
        for path in note_matches(m.group(2), self.notes()):
            text = f'@"{path}"' if " " in path else f"@{path}"
            yield Completion(text, start_position=-(len(m.group(0))), display=path)


def _in_order(typed: str, text: str) -> bool:
    """Every character of `typed` in `text`, in order (`clicfg` in `help/cli/config.md`)."""
    at = 0
    for ch in typed:
        at = text.find(ch, at) + 1
        if not at:
            return False
    return True


def note_matches(typed: str, paths: list[str], limit: int = 50) -> list[str]:
    """The notes `@typed` offers, best first, as a file finder ranks them: the note named so, then
    names that start with it, names that hold it, paths that hold it, paths that hold its letters
    in order; within each, the shallower and shorter path first."""
    want = typed.lower()
    tiers: list[list[tuple[int, int, str]]] = [[] for _ in range(5)]
    loose: list[str] = []
    for path in paths:
        low = path.lower()
        name = low.rsplit("/", 1)[-1].removesuffix(".md")
        if want == name:
            tier = 0
        elif name.startswith(want):
            tier = 1
        elif want in name:
            tier = 2
        elif want in low:
            tier = 3
        else:
            loose.append(path)
            continue
        tiers[tier].append((path.count("/"), len(path) if want else 0, path))
    found = sum(len(t) for t in tiers)
    if found < limit and len(want) >= 2:  # only what the closer matches leave room for
        tiers[4] = [(p.count("/"), len(p), p) for p in loose if _in_order(want, p.lower())]
    return [path for tier in tiers for _, _, path in sorted(tier)][:limit]


class ChatInput:
    """What the person types, and what becomes of it."""

    def __init__(self, ui: ChatUI, history: History | None = None) -> None:
        self.ui = ui
        self.buffer = Buffer(
            multiline=True, history=history or InMemoryHistory(), complete_while_typing=True,
            completer=ChatCompleter(ui.agent_commands, lambda: ui.notes),
            on_text_changed=lambda _: self._typed(),
        )
        self.typed_at = float("-inf")

    def _typed(self) -> None:
        self.typed_at = time.monotonic()

    def typing(self, within: float) -> bool:
        """The person is typing: text in the box, changed less than `within` seconds ago (a box
        emptied, its prompt sent, is someone waiting: a question then takes its keys at once)."""
        return bool(self.buffer.text) and time.monotonic() - self.typed_at < within

    def edit_queued(self, number: int | None) -> bool:
        """A queued prompt back into the input box, out of the queue (the last by default)."""
        if self.buffer.text.strip():
            self.ui.say_flash("the input box is not empty: send or clear it first")
            return False
        item = self.ui.prompts.take(number)
        if item is None:
            return False
        self.buffer.set_document(Document(item.text))
        return True

    def submit(self) -> None:
        text = self.buffer.text
        if not text.strip():
            return
        self.buffer.append_to_history()
        self.buffer.reset()
        ui = self.ui
        ui.transcript.scroll = 0
        command = parse_slash(text, ui.agent_commands())
        if command is not None and command.own:
            ui.to_trio(ui.commands.run, command.name, command.args)
            return
        self.queue_prompt(text)

    def queue_prompt(self, text: str, *, steer: bool = False) -> None:
        """The prompt waits for its turn (at once when the agent is idle)."""
        ui = self.ui
        if not ui.prompts.put(Queued(text, steer=steer), first=steer):
            ui.error("too many prompts are queued; wait for the turn to end, or /queue drop some")
            return
        if not ui.agent_alive and ui.status.state not in ("starting", "starting agent"):  # else: sent when it is up
            ui.notice("the agent is not running: the prompt waits in the queue; /restart starts the agent "
                      "and sends it (/queue drop all drops it)")

    async def attachments(self, text: str) -> list[dict[str, Any]]:
        """The blocks sent with a prompt: its `@notes` and its images (what became of each is a
        notice)."""
        ui = self.ui
        session = ui.session
        caps = session.client.capabilities if session is not None and session.client is not None else None
        return await prompt_attachments(text, kiln=ui.opts.kiln, cwd=ui.opts.cwd,
                                        prompt_caps=getattr(caps, "prompt_capabilities", None), say=ui.notice)
