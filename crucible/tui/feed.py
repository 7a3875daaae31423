"""Session events as transcript entries (the `Feed` renderer): streamed text, thoughts, the
person's messages, tool calls with their diffs, terminal output and results, permission
answers, notices and errors. The chat has one for its session, each child section one for its
child: a child's events are drawn exactly as the session's own, only nested."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from acp_host.session import (
    HistoryReplay,
    MessageChunk,
    PermissionResolved,
    SessionError,
    ThoughtChunk,
    ToolCallEvent,
    TurnEnded,
    UserChunk,
)
from crucible.events import ChildEvent, Notice, Renderer, joined_chunks, permission_decision
from crucible.terminal import sanitize
from crucible.tui.markdown import Fragments
from crucible.tui.transcript import BlockEntry, Entry, TextEntry

if TYPE_CHECKING:
    from acp_host.session import PlanChanged, UsageChanged
    from crucible.tui.app import ChatUI

SECTION_LINES = 40  # of a tool call's diff / input / output shown in the transcript

_STATUS_STYLE = {"completed": "class:tool.ok", "failed": "class:tool.failed", "in_progress": "class:tool.running",
                 "pending": "class:tool.pending"}


def _capped(lines: list[Fragments], limit: int = SECTION_LINES) -> list[Fragments]:
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [[("class:dim", f"  … {len(lines) - limit} more lines")]]


def diff_lines(diff: dict[str, Any]) -> list[Fragments]:
    """A diff content block as red/green unified-diff lines."""
    old = diff.get("oldText") or ""
    new = diff.get("newText") or ""
    path = sanitize(str(diff.get("path", "")))
    out: list[Fragments] = []
    for line in difflib.unified_diff(str(old).splitlines(), str(new).splitlines(), fromfile=f"a/{path}",
                                     tofile=f"b/{path}", lineterm="", n=2):
        line = sanitize(line)
        if line.startswith(("+++", "---")):
            style = "class:diff.file"
        elif line.startswith("+"):
            style = "class:diff.add"
        elif line.startswith("-"):
            style = "class:diff.del"
        elif line.startswith("@@"):
            style = "class:diff.hunk"
        else:
            style = "class:diff.ctx"
        out.append([(style, "  " + line)])
    if not out:
        out.append([("class:dim", f"  {path}: no changes")])
    return _capped(out)


def text_block_lines(text: str, style: str = "class:tool.output", indent: str = "  ") -> list[Fragments]:
    lines = sanitize(text).split("\n")
    return _capped([[(style, indent + line)] for line in lines])


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_call_lines(call: Any, terminal_text: Callable[[str], str | None] | None = None) -> list[Fragments]:
    """A tool call: title, kind, status, then its diffs, terminal output or result."""
    status = call.status or "pending"
    mark = {"completed": "✓", "failed": "✗", "in_progress": "…"}.get(status, "•")
    head: Fragments = [
        (_STATUS_STYLE.get(status, "class:tool.pending"), f"{mark} "),
        ("class:tool.title", sanitize(call.title or call.tool_call_id)),
        ("class:dim", f"  [{sanitize(call.kind or 'other')}] "),
        (_STATUS_STYLE.get(status, "class:tool.pending"), status),
    ]
    lines: list[Fragments] = [head]
    for loc in call.locations[:3]:
        if isinstance(loc.get("path"), str):
            lines.append([("class:dim", "  at " + sanitize(loc["path"]))])
    shown_content = False
    for block in call.content:
        kind = block.get("type")
        if kind == "diff":
            lines.extend(diff_lines(block))
            shown_content = True
        elif kind == "terminal":
            term_id = str(block.get("terminalId", ""))
            out = terminal_text(term_id) if terminal_text else None
            lines.append([("class:dim", f"  $ terminal {sanitize(term_id)}")])
            if out:
                lines.extend(text_block_lines(out.rstrip("\n"), "class:terminal"))
            shown_content = True
        elif kind == "content":
            inner = block.get("content")
            if isinstance(inner, dict) and inner.get("type") == "text" and status in ("completed", "failed"):
                lines.extend(text_block_lines(str(inner.get("text", "")).rstrip("\n")))
                shown_content = True
    if not shown_content and call.raw_output is not None and status in ("completed", "failed"):
        lines.extend(text_block_lines(pretty(call.raw_output).rstrip("\n")))
    return lines


class Feed(Renderer):
    """A session's events as entries, added with `add`."""

    def __init__(self, add: Callable[[Entry], object], *,
                 terminal_text: Callable[[str], str | None] | None = None,
                 on_thought: Callable[[TextEntry], None] | None = None) -> None:
        self.add = add
        self.terminal_text = terminal_text
        self.on_thought = on_thought
        self.history = False  # entries made now are replayed history
        self.current: TextEntry | None = None
        self.tools: dict[str, BlockEntry] = {}
        self.messages = 0  # agent message entries made
        self._user_message: str | None = None  # the id of the person's message being drawn

    # -- entries ------------------------------------------------------------------------
    def end_text(self) -> None:
        if self.current is not None:
            self.current.finish()
            self.current = None

    def text(self, kind: str, text: str, *, markdown: bool = True) -> None:
        cur = self.current
        if cur is None or cur.kind != kind or cur.history != self.history:
            self.end_text()
            cur = TextEntry(kind, markdown=markdown, history=self.history)
            if kind == "thought" and self.on_thought is not None:
                self.on_thought(cur)
            if kind == "agent":
                self.messages += 1
            self.add(cur)
            self.current = cur
        cur.append(text)

    def add_notice(self, text: str, style: str = "class:notice") -> None:
        self.end_text()
        self.add(BlockEntry([[(style, line)] for line in sanitize(text).split("\n")], history=self.history))

    def draw_tool_call(self, call: Any) -> BlockEntry:
        self.end_text()
        entry = self.tools.get(call.tool_call_id)
        if entry is None:
            entry = BlockEntry(history=self.history)
            self.tools[call.tool_call_id] = entry
            self.add(entry)
        entry.set_lines(tool_call_lines(call, self.terminal_text))
        return entry

    # -- events -------------------------------------------------------------------------
    def render(self, events: Sequence[Any]) -> None:
        # A run of chunks of one message is one append: the same text, a fraction of the work.
        super().render(joined_chunks(events) if len(events) > 1 else events)

    def message(self, event: MessageChunk) -> None:
        self.text("agent", event.text)

    def thought(self, event: ThoughtChunk) -> None:
        self.text("thought", event.text, markdown=False)

    def user_message(self, event: UserChunk) -> None:
        """The person's message as an agent replays it (or a saved one): as the chat shows the
        person's own prompt, `› ` first; another message id starts another message."""
        cur = self.current
        if (cur is None or cur.kind != "user" or cur.history != self.history
                or event.message_id != self._user_message):
            self.end_text()
            self._user_message = event.message_id
            self.text("user", "› " + event.text, markdown=False)
        else:
            cur.append(event.text)

    def tool_call(self, event: ToolCallEvent) -> None:
        self.draw_tool_call(event.call)

    def permission(self, event: PermissionResolved) -> None:
        decision, reason = permission_decision(event)
        title = event.request.tool_call.title or event.request.tool_call.tool_call_id
        self.add_notice(f"permission: {title} → {decision}" + (f" ({reason})" if reason else ""))

    def turn_ended(self, event: TurnEnded) -> None:
        self.end_text()

    def error(self, event: SessionError) -> None:
        self.add_notice(event.message, "class:error")

    def notice(self, event: Notice) -> None:
        self.add_notice(event.text)


class ChatFeed(Feed):
    """The chat's own session: drawn as a child's is, and what only the chat shows: the plan and
    usage (status bar), the brackets of a replayed history, how a turn ended, a dead agent, the
    children's sections. One paced redraw per batch."""

    def __init__(self, ui: ChatUI) -> None:
        super().__init__(ui.transcript.add, terminal_text=ui.terminal_text, on_thought=ui.new_thought)
        self.ui = ui
        self.skipping_replay = False  # /restart: the agent's replay of what is on the screen already

    def render(self, events: Sequence[Any]) -> None:
        if self.skipping_replay or self.ui.restarted:
            events = [e for e in events if self._drawn(e)]
        super().render(events)
        self.ui.refresh()

    def _drawn(self, event: Any) -> bool:
        if self.skipping_replay:
            if type(event) is HistoryReplay and not event.started:
                self.skipping_replay = False
            return False
        if type(event) is HistoryReplay and event.started:
            self.skipping_replay = True
            return False
        return True

    def tool_call(self, event: ToolCallEvent) -> None:
        self.ui.children.track_call(event.call)
        super().tool_call(event)

    def plan(self, event: PlanChanged) -> None:
        self.ui.status.plan_changed(event)

    def usage(self, event: UsageChanged) -> None:
        self.ui.status.usage(event)

    def history_replay(self, event: HistoryReplay) -> None:
        if event.started:
            self.add_notice("── history (replayed by the agent) ──", "class:history")
            self.history = True
        else:
            self.end_text()
            self.history = False
            self.add_notice("── end of history ──", "class:history")

    def turn_ended(self, event: TurnEnded) -> None:
        super().turn_ended(event)
        self.ui.status.turn_ended(event)
        if event.error:
            self.add_notice(f"the turn failed: {event.error}", "class:error")
            self.ui.check_agent()
        elif event.stop_reason == "cancelled":
            self.add_notice("the turn was cancelled")
        elif event.stop_reason != "end_turn":
            self.add_notice(f"the turn ended: {event.stop_reason}")

    def error(self, event: SessionError) -> None:
        super().error(event)
        self.ui.check_agent()

    def child(self, event: ChildEvent) -> None:
        self.ui.children.show(event)
