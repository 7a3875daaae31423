"""The permission dialog: its model (the session's `Asker` for the terminal chat) and its view.

Every question (an ACP permission request or a bridge-side ask) waits in one FIFO queue;
the dialog shows the first one. A question leaves the queue exactly once: answered by a
key, or withdrawn when its asker is cancelled (the turn was cancelled or ended), so none is
lost or answered twice. "Always" answers are remembered by the session's policy (the
session does it); `s` / `x` also save a rule to the config file's `[permissions]`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tomlkit
import trio
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.dimension import Dimension
from tomlkit.exceptions import TOMLKitError

from acp_host.session import Decision, DecisionKind
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text
from crucible.sessions import PermissionAsk
from crucible.terminal import sanitize
from crucible.tui.feed import diff_lines, pretty, text_block_lines
from crucible.tui.markdown import Fragments

if TYPE_CHECKING:
    from crucible.tui.elicitation import ElicitationQueue

# key -> (decision, save a rule to the config, label)
KEYS: dict[str, tuple[DecisionKind, bool, str]] = {
    "y": ("allow_once", False, "allow once"),
    "a": ("allow_always", False, "allow always"),
    "s": ("allow_always", True, "allow always + save rule"),
    "n": ("reject_once", False, "reject once"),
    "N": ("reject_always", False, "reject always"),
    "x": ("reject_always", True, "reject always + save rule"),
}


@dataclass(eq=False)
class Pending:
    ask: PermissionAsk
    answered: trio.Event = field(default_factory=trio.Event)
    decision: Decision | None = None


class PermissionQueue:
    """The TUI's `Asker`: `await queue(ask)` waits for the person's key."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.items: deque[Pending] = deque()
        self.on_change = on_change

    async def __call__(self, ask: PermissionAsk) -> Decision:
        pending = Pending(ask)
        self.items.append(pending)
        self.on_change()
        try:
            await pending.answered.wait()
        finally:
            if pending in self.items:  # withdrawn (cancelled) before an answer
                self.items.remove(pending)
                self.on_change()
        assert pending.decision is not None
        return pending.decision

    @property
    def current(self) -> Pending | None:
        return self.items[0] if self.items else None

    def offered_keys(self, pending: Pending) -> list[str]:
        """The keys for the choices the agent offered (a bridge ask has all of them)."""
        request = pending.ask.request
        if request is None:
            return list(KEYS)
        kinds = {o.kind for o in request.options}
        keys = [key for key, (kind, _, _) in KEYS.items() if kind in kinds]
        return keys or ["y", "n"]  # an agent that labels its options oddly still gets yes / no

    def answer(self, key: str) -> tuple[str, tuple[str, str] | None] | None:
        """Answer the first question with a key. Returns what was chosen and the
        (tool, rule) to save in the config, or None when the key is not an offered choice."""
        pending = self.current
        if pending is None or key not in KEYS or key not in self.offered_keys(pending):
            return None
        kind, save, label = KEYS[key]
        self.items.popleft()
        pending.decision = Decision(kind, f"the person chose {label}")
        pending.answered.set()
        self.on_change()
        rule = (pending.ask.key.name, "allow" if kind == "allow_always" else "deny") if save else None
        return label, rule


def dialog_lines(queue: PermissionQueue, questions: ElicitationQueue | None = None) -> list[Fragments]:
    """The dialog: the first permission request waiting, else an upstream server's question."""
    """The first question: who wants to run what (its diff or arguments), and the keys."""
    pending = queue.current
    if pending is None:
        return questions.dialog_lines() if questions is not None else []
    ask = pending.ask
    request = ask.request
    call = request.tool_call if request is not None else None
    kind = (call.kind if call is not None else None) or ("bridge tool" if ask.key.bridge else "other")
    lines: list[Fragments] = [
        [("class:dialog.title", f"Permission: {sanitize(ask.label)} wants to run "),
         ("class:tool.title", sanitize(ask.title)), ("class:dim", f"  [{sanitize(kind)}]")],
    ]
    details: list[Fragments] = []
    if call is not None and call.diffs:
        for diff in call.diffs:
            details.extend(diff_lines(diff))
    else:
        raw = call.raw_input if call is not None else ask.arguments
        if raw is None and ask.key.summary:
            raw = ask.key.summary
        if raw is not None:
            details.extend(text_block_lines(pretty(raw)))
    if len(details) > 6:
        details = details[:6] + [[("class:dim", f"  … {len(details) - 6} more lines")]]
    lines.extend(details)
    choices: Fragments = []
    for key in queue.offered_keys(pending):
        choices += [("class:dialog.key", f" {key} "), ("", f" {KEYS[key][2]}  ")]
    more = len(queue.items) - 1
    if more:
        choices.append(("class:dim", f"(+{more} waiting)"))
    lines.append(choices)
    return lines


def dialog_text(queue: PermissionQueue, questions: ElicitationQueue | None = None) -> StyleAndTextTuples:
    out: StyleAndTextTuples = []
    for i, line in enumerate(dialog_lines(queue, questions)):
        if i:
            out.append(("", "\n"))
        out.extend(line)
    return out


def dialog_height(queue: PermissionQueue, questions: ElicitationQueue | None = None) -> Dimension:
    return Dimension(min=2, max=10, preferred=len(dialog_lines(queue, questions)))


def save_permission_rule(path: Path, tool: str, rule: str) -> None:
    """Add or replace `tool = rule` under `[permissions]`, keeping everything else in the file,
    comments and order included (tomlkit round-trips the document)."""
    doc = tomlkit.document()
    if path.exists():
        try:
            doc = tomlkit.parse(path.read_text(encoding="utf-8"))
        except TOMLKitError as exc:
            raise CrucibleError(f"{path.name} is not valid TOML ({exc})", "fix the file, then save the rule again") from None
    if "permissions" not in doc:
        doc["permissions"] = tomlkit.table()
    section = doc["permissions"]
    if not isinstance(section, dict):
        raise CrucibleError(f"{path.name}: `permissions` is not a table", "make it a [permissions] table")
    section[tool] = rule
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, tomlkit.dumps(doc))
