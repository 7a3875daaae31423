"""The prompts waiting for the agent: a visible, editable queue.

A prompt typed while a turn runs, while the agent starts, or while it is stopped waits here
and is shown above the input; the person can take the last one back into the input (↑ on an
empty line), or edit and drop any with `/queue`. After Ctrl-C cancels a turn the queue is
held: nothing is sent until the person says to keep or drop it. `/steer TEXT` puts its prompt
first and cancels the running turn, so it is what the agent reads next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from prompt_toolkit.formatted_text import StyleAndTextTuples

from crucible.terminal import sanitize

MAX_QUEUED = 64
SHOWN = 3  # queued prompts listed above the input (the rest are counted)
STEER_NOTE = ("(This message interrupts your previous turn, which was cancelled before it finished. "
              "Take it into account and go on from there.)")


@dataclass(eq=False)
class Queued:
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)  # attachments (@notes, images)
    steer: bool = False  # it interrupts a turn (/steer)


class PromptQueue:
    """FIFO of prompts; `get` waits for one while the queue is not held."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.items: deque[Queued] = deque()
        self.held = False
        self.on_change = on_change
        self._wake = trio.Event()

    def _changed(self) -> None:
        self._wake.set()
        self.on_change()

    def put(self, item: Queued, *, first: bool = False) -> bool:
        """Queue a prompt; False when the queue is full."""
        if len(self.items) >= MAX_QUEUED:
            return False
        if first:
            self.items.appendleft(item)
        else:
            self.items.append(item)
        self._changed()
        return True

    async def get(self) -> Queued:
        while not self.items or self.held:
            self._wake = trio.Event()
            await self._wake.wait()
        item = self.items.popleft()
        self._changed()
        return item

    def hold(self) -> None:
        self.held = True
        self._changed()

    def release(self) -> None:
        self.held = False
        self._changed()

    def take(self, number: int | None = None) -> Queued | None:
        """Take a queued prompt out (1-based; the last by default), e.g. to edit it."""
        if not self.items:
            return None
        index = len(self.items) - 1 if number is None else number - 1
        if not 0 <= index < len(self.items):
            return None
        item = self.items[index]
        del self.items[index]
        self._changed()
        return item

    def clear(self) -> int:
        count = len(self.items)
        self.items.clear()
        self.held = False
        self._changed()
        return count

    # -- the view above the input -----------------------------------------------------------
    def height(self) -> int:
        return min(len(self.items), SHOWN) + (1 if len(self.items) > SHOWN else 0) + 1 if self.items else 0

    def text(self, width: int = 80) -> StyleAndTextTuples:
        out: StyleAndTextTuples = []
        count = len(self.items)
        head = f"queued ({count}) — " + ("held: nothing is sent until you answer above" if self.held
                                          else "sent one per turn · ↑ edits the last · /queue edit N, drop N|all")
        out.append(("class:queue.head", head[:width] + "\n"))
        for number, item in enumerate(list(self.items)[:SHOWN], 1):
            first = sanitize(item.text.strip().split("\n", 1)[0])
            lines = item.text.strip().count("\n")
            extra = (f" (+{lines} lines)" if lines else "") + (" [steer]" if item.steer else "")
            room = max(10, width - 6 - len(extra))
            shown = first if len(first) <= room else first[: room - 1] + "…"
            out.append(("class:queue", f" {number}. {shown}{extra}\n"))
        if count > SHOWN:
            out.append(("class:queue", f"  … {count - SHOWN} more (/queue lists them)\n"))
        return out

    def listing(self) -> str:
        if not self.items:
            return "no prompts are queued"
        lines = [f"Queued prompts ({len(self.items)}), sent one per turn"
                 + (" — held until you answer" if self.held else "") + ":"]
        for number, item in enumerate(self.items, 1):
            body = sanitize(item.text.strip()).replace("\n", "\n      ")
            lines.append(f"  {number}. {body}" + ("  [steer]" if item.steer else ""))
        lines.append("/queue edit N takes one back into the input; /queue drop N (or all) drops")
        return "\n".join(lines)
