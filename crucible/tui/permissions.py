"""The permission dialog: its model (the session's `Asker` for the terminal chat) and its view.

Every question (an ACP permission request or a bridge-side ask) waits in one FIFO queue;
the dialog shows the first one: a note write (create_note, update_note) as a diff against the
note, other calls' arguments as `key: value` lines, and the keys on one row that fits the
width. The same place shows the chat's own questions (`Question`: keep or drop the queue after
Ctrl-C, a mode that bypasses permissions), and, when nothing else asks, an upstream MCP
server's question (elicitation.py; typed in the input box). While a permission or the chat's
own question is up, keys that are not answers do nothing (they never reach the input box). A
question leaves the queue exactly once: answered by a
key, or withdrawn when its asker is cancelled (the turn was cancelled or ended), so none is
lost or answered twice. "Always" answers are remembered by the session's policy (the
session does it); `s` / `x` also save a rule to the config file's `[permissions]`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomlkit
import trio
from prompt_toolkit.application.current import get_app
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.dimension import Dimension
from tomlkit.exceptions import TOMLKitError

from acp_host.session import Decision, DecisionKind, ToolCall
from crucible.bounded_load import BoundedLoadError, load_toml
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text
from crucible.kiln_calls import (
    WRITE_TOOLS,
    BridgeCall,
    ProposedWrite,
    bridge_call,
    bridge_source,
    proposed_write,
)
from crucible.private_files import FILE_MODE, private_dir
from crucible.sessions import PermissionAsk
from crucible.terminal import sanitize, sanitize_line
from crucible.tui.markdown import Fragments, wrap
from crucible.tui.tool_calls import diff_lines, pretty, write_lines

if TYPE_CHECKING:
    from crucible.tui.elicitation import ElicitationQueue

# A question that opens while the person types in the input box (a queued prompt, mid-turn)
# would take their next letter as its answer ("say…" → s, allow always and save): its keys are
# held until the typing pauses this long. Keys typed into an empty box never started a hold.
TYPING_GAP = 1.0  # typed this recently when the question opened: they were typing
HOLD = 0.6  # held until no key came for this long
SETTLE = 0.3  # a choice's key acts when no other key follows it this soon (else: typing)

# key -> (decision, save a rule to the config, label)
KEYS: dict[str, tuple[DecisionKind, bool, str]] = {
    "y": ("allow_once", False, "allow once"),
    "a": ("allow_always", False, "allow always"),
    "s": ("allow_always", True, "allow always + save rule"),
    "n": ("reject_once", False, "reject once"),
    "N": ("reject_always", False, "reject always"),
    "x": ("reject_always", True, "reject always + save rule"),
}
# The choices as the key row shows them: all six fit in one row of 120 columns; narrower, the
# row breaks between choices; in a very narrow terminal the short labels are used.
ROW_LABELS = {"y": "allow once", "a": "allow always", "s": "save: always allow", "n": "reject once",
              "N": "reject always", "x": "save: always reject"}
SHORT_LABELS = {"y": "once", "a": "always", "s": "always+save", "n": "reject", "N": "never", "x": "never+save"}


@dataclass(eq=False)
class Pending:
    ask: PermissionAsk
    answered: trio.Event = field(default_factory=trio.Event)
    decision: Decision | None = None
    write: ProposedWrite | None = None  # a note write: the note before and after


@dataclass(eq=False)
class Question:
    """One of the chat's own questions in the dialog: each key answers it with its action."""

    title: str
    choices: dict[str, tuple[str, Callable[[], None]]]  # key -> (label, what it does)
    details: list[str] = field(default_factory=list)


def ask_bridge_call(ask: PermissionAsk) -> BridgeCall | None:
    """The bridge tool an ask is about, with its arguments (from the agent's request, or the
    bridge's own ask)."""
    if ask.request is not None:
        return bridge_call(ask.request.tool_call)
    if ask.key.bridge:
        return BridgeCall(ask.key.name, dict(ask.arguments or {}))
    return None


class PermissionQueue:
    """The TUI's `Asker`: `await queue(ask)` waits for the person's key."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.items: deque[Pending] = deque()
        self.on_change = on_change
        self.view: tuple[Any, list[Fragments]] | None = None  # the dialog as last drawn, and for what
        self.kiln: Path | None = None  # where a note write's note is read, for its diff
        self.cwd: Path | None = None  # the agent's diffs' paths are shown relative to it
        self.typing: Callable[[float], bool] = lambda within: False  # the input box's (ChatUI sets it)
        self.hold_until = 0.0

    def _opened(self) -> None:
        """A question is now first in line (the dialog shows it)."""
        if self.typing(TYPING_GAP):
            self.hold()

    def hold(self) -> None:
        """The person is typing: the dialog's keys go into the input box until a pause of HOLD."""
        self.hold_until = time.monotonic() + HOLD

    def holding(self) -> bool:
        """A key pressed while the dialog is up: True while it is held (the person was typing
        when the question opened and has not paused since); each held key extends the hold."""
        now = time.monotonic()
        if now >= self.hold_until:
            return False
        self.hold_until = now + HOLD
        return True

    async def __call__(self, ask: PermissionAsk) -> Decision:
        pending = Pending(ask)
        bridge = ask_bridge_call(ask)
        if self.kiln is not None and bridge is not None and bridge.name in WRITE_TOOLS:
            pending.write = await trio.to_thread.run_sync(proposed_write, self.kiln, bridge)
        self.items.append(pending)
        if len(self.items) == 1:
            self._opened()
        self.on_change()
        try:
            await pending.answered.wait()
        finally:
            if pending in self.items:  # withdrawn (cancelled) before an answer
                first = self.items[0] is pending
                self.items.remove(pending)
                if first and self.items:
                    self._opened()
                self.on_change()
        assert pending.decision is not None
        return pending.decision

    @property
    def current(self) -> Pending | None:
        return self.items[0] if self.items else None

    def asks_about(self, call: ToolCall) -> bool:
        """The dialog shows this tool call now (its diff is there, not in the transcript): the
        agent's request for it, or the bridge's own ask for the same tool and arguments while
        the call runs (OpenCode calls a kiln tool without asking; the bridge asks)."""
        current = self.current
        if current is None:
            return False
        request = current.ask.request
        if request is not None:
            return request.tool_call.tool_call_id == call.tool_call_id
        asked = ask_bridge_call(current.ask)
        if asked is None or call.status not in ("pending", "in_progress", None):
            return False
        running = bridge_call(call)
        return running is not None and (running.name, running.args) == (asked.name, asked.args)

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
        if self.items:
            self._opened()
        pending.decision = Decision(kind, f"the person chose {label}")
        pending.answered.set()
        self.on_change()
        rule = (pending.ask.key.name, "allow" if kind == "allow_always" else "deny") if save else None
        return label, rule


def args_lines(args: Any) -> list[Fragments]:
    """A call's arguments as `key: value` lines; a text with line breaks as its lines, indented
    (not JSON with `\\n` escapes)."""
    if not isinstance(args, dict):
        return [[("class:tool.output", "  " + line)] for line in sanitize(pretty(args)).split("\n")]
    out: list[Fragments] = []
    for key, value in args.items():
        label = f"  {sanitize(str(key))}: "
        if isinstance(value, str) and "\n" in value:
            out.append([("class:dim", label.rstrip())])
            out.extend([("class:tool.output", "    " + line)] for line in sanitize(value).split("\n"))
        else:
            text = value if isinstance(value, str) else pretty(value).replace("\n", " ")
            out.append([("class:dim", label), ("class:tool.output", sanitize(str(text)))])
    return out


def key_rows(choices: list[tuple[str, str, str]], width: int, extra: str = "") -> list[Fragments]:
    """The keys, `[(key, label, short label)]`, as rows of at most `width` cells, broken between
    two choices, never inside one (short labels when a long one alone does not fit)."""
    index = 1 if all(len(c[0]) + len(c[1]) + 5 <= width for c in choices) else 2
    rows: list[Fragments] = []
    row: Fragments = []
    used = 0
    for choice in choices:
        piece: Fragments = [("class:dialog.key", f" {choice[0]} "), ("", f" {choice[index]}  ")]
        size = sum(len(t) for _, t in piece)
        if row and used + size > width:
            rows.append(row)
            row, used = [], 0
        row += piece
        used += size
    if extra:
        if row and used + len(extra) > width:
            rows.append(row)
            row = []
        row.append(("class:dim", extra))
    rows.append(row)
    return rows


def dialog_lines(queue: PermissionQueue, question: Question | None = None,
                 questions: ElicitationQueue | None = None, width: int = 80, max_rows: int = 10) -> list[Fragments]:
    """The first permission question (who wants to run what: its diff or its arguments, then the
    keys), else the chat's own question, else an upstream server's question; at most `max_rows`
    rows of `width`. Made once per question and size: every frame draws it (and a diff of a big
    note is not cheap)."""
    current = questions.current if questions is not None else None
    key = (queue.current, len(queue.items), question, current, questions is not None and questions.answering,
           width, max_rows)
    if queue.view is not None and queue.view[0] == key:
        return queue.view[1]
    lines = _dialog_lines(queue, question, questions, width, max_rows)
    queue.view = (key, lines)
    return lines


def _dialog_lines(queue: PermissionQueue, question: Question | None, questions: ElicitationQueue | None,
                  width: int, max_rows: int) -> list[Fragments]:
    pending = queue.current
    if pending is None:
        if question is None:
            elicitation = questions.dialog_lines() if questions is not None else []
            return _fit(elicitation[:1], elicitation[1:-1], elicitation[-1:], width, max_rows) if elicitation else []
        choices = [(key, label, label) for key, (label, _) in question.choices.items()]
        body = [[("class:tool.output", "  " + sanitize(line))] for line in question.details]
        return _fit([[("class:dialog.title", sanitize(question.title))]], body, key_rows(choices, width), width,
                    max_rows)
    ask = pending.ask
    request = ask.request
    call = request.tool_call if request is not None else None
    bridge = ask_bridge_call(ask)
    kind = bridge_source(bridge.name) if bridge is not None else (call.kind if call is not None else None) or "other"
    title = bridge.title if bridge is not None else ask.title
    head: list[Fragments] = [
        [("class:dialog.title", f"Permission: {sanitize_line(ask.label)} wants to run "),
         ("class:tool.title", sanitize_line(title)), ("class:dim", f"  [{sanitize_line(kind)}]")],
    ]
    details: list[Fragments] = []
    if pending.write is not None:
        details = write_lines(pending.write, limit=None)
    elif call is not None and call.diffs:
        seen: set[tuple[str, str, str]] = set()
        for diff in call.diffs:
            ident = (str(diff.get("path")), str(diff.get("oldText")), str(diff.get("newText")))
            if ident not in seen:
                seen.add(ident)
                details.extend(diff_lines(diff, limit=None, cwd=queue.cwd))
    else:
        raw = (call.raw_input if call is not None else None) or (bridge.args if bridge is not None else None)
        if raw is None:
            raw = ask.arguments
        if raw is None and ask.key.summary:
            raw = ask.key.summary
        if raw is not None:
            details = args_lines(raw)
    choices = [(key, ROW_LABELS[key], SHORT_LABELS[key]) for key in queue.offered_keys(pending)]
    more = len(queue.items) - 1
    return _fit(head, details, key_rows(choices, width, f"(+{more} waiting)" if more else ""), width, max_rows)


def _fit(head: list[Fragments], details: list[Fragments], keys: list[Fragments], width: int,
         max_rows: int) -> list[Fragments]:
    """Head, details and keys as rows of `width`; the details cut to what fits in `max_rows`,
    and the head to half of it (an agent's title of a page still leaves the keys in view)."""
    head_rows = [row for line in head for row in wrap(line, width)]
    most = max(1, (max_rows - len(keys)) // 2)
    if len(head_rows) > most:
        head_rows = head_rows[:most]
        head_rows[-1] = [*head_rows[-1], ("class:dim", "…")]
    room = max(1, max_rows - len(head_rows) - len(keys))
    shown: list[list[Fragments]] = []  # the rows of each detail line that fits whole
    used = 0
    for line in details:  # (the lines that do not fit are counted, not wrapped)
        wrapped = wrap(line, width)
        if used + len(wrapped) > room:
            break
        shown.append(wrapped)
        used += len(wrapped)
    if len(shown) < len(details):
        while shown and used > room - 1:  # a row for the count of what is left out
            used -= len(shown.pop())
        shown.append([[("class:dim", f"  … {len(details) - len(shown)} more lines")]])
    return head_rows + [row for rows in shown for row in rows] + keys


def _screen() -> tuple[int, int]:
    size = get_app().output.get_size()
    return size.columns, size.rows


def dialog_text(queue: PermissionQueue, question: Question | None = None,
                questions: ElicitationQueue | None = None) -> StyleAndTextTuples:
    columns, rows = _screen()
    out: StyleAndTextTuples = []
    for i, line in enumerate(dialog_lines(queue, question, questions, columns, max(6, rows // 2))):
        if i:
            out.append(("", "\n"))
        out.extend(line)
    return out


def dialog_height(queue: PermissionQueue, question: Question | None = None,
                  questions: ElicitationQueue | None = None) -> Dimension:
    columns, rows = _screen()
    return Dimension.exact(len(dialog_lines(queue, question, questions, columns, max(6, rows // 2))))


def _config_doc(path: Path) -> tomlkit.TOMLDocument:
    """The config file as a tomlkit document (comments and order kept); empty when absent."""
    if not path.exists():
        return tomlkit.document()
    try:
        text = path.read_text(encoding="utf-8")
        load_toml(text)  # bounded first: tomlkit recurses on deep nesting too
        return tomlkit.parse(text)
    except (TOMLKitError, BoundedLoadError, ValueError) as exc:
        raise CrucibleError(f"{path.name} is not valid TOML ({exc})", "fix the file, then try again") from None


def drop_permission_rule(path: Path, tool: str) -> bool:
    """Remove `tool = …` from `[permissions]`, keeping the rest of the file; False when absent."""
    doc = _config_doc(path)
    section = doc.get("permissions")
    if not isinstance(section, dict) or tool not in section:
        return False
    del section[tool]
    atomic_write_text(path, tomlkit.dumps(doc), new_file_mode=FILE_MODE)
    return True


def save_permission_rule(path: Path, tool: str, rule: str) -> None:
    """Add or replace `tool = rule` under `[permissions]`, keeping everything else in the file,
    comments and order included (tomlkit round-trips the document)."""
    doc = _config_doc(path)
    if "permissions" not in doc:
        doc["permissions"] = tomlkit.table()
    section = doc["permissions"]
    if not isinstance(section, dict):
        raise CrucibleError(f"{path.name}: `permissions` is not a table", "make it a [permissions] table")
    section[tool] = rule
    private_dir(path.parent)
    atomic_write_text(path, tomlkit.dumps(doc), new_file_mode=FILE_MODE)  # it may hold keys: 0600
