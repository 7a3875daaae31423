"""Session events as transcript entries (the `Feed` renderer): streamed text, thoughts, the
person's messages, tool calls with their diffs, terminal output and results, permission
answers, notices and errors. The chat has one for its session, each child section one for its
child: a child's events are drawn exactly as the session's own, only nested."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import trio

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
from crucible.tui.kiln_calls import (
    SEARCH_TOOLS,
    WRITE_TOOLS,
    BridgeCall,
    ProposedWrite,
    bridge_call,
    call_arguments,
    proposed_write,
    search_hits,
    summary_line,
)
from crucible.tui.markdown import Fragments
from crucible.tui.status import plan_lines
from crucible.tui.transcript import BlockEntry, Entry, TextEntry

if TYPE_CHECKING:
    from acp_host.session import PlanChanged, UsageChanged
    from crucible.tui.app import ChatUI

SECTION_LINES = 40  # of a tool call's diff / input / output shown in the transcript (Ctrl-E: all)
EXPAND_KEY = "Ctrl-E"

_STATUS_STYLE = {"completed": "class:tool.ok", "failed": "class:tool.failed", "in_progress": "class:tool.running",
                 "pending": "class:tool.pending"}


def _capped(lines: list[Fragments], limit: int | None = SECTION_LINES) -> list[Fragments]:
    if limit is None or len(lines) <= limit:
        return lines
    return lines[:limit] + [[("class:dim", f"  … {len(lines) - limit} more lines ({EXPAND_KEY} shows all)")]]


def display_path(path: str, cwd: Path | None = None) -> str:
    """A diff's path as the person reads it: relative to the session's folder when inside it."""
    if cwd is not None and path.startswith("/"):
        try:
            return PurePath(path).relative_to(cwd).as_posix()
        except ValueError:
            pass
    return path


def diff_lines(diff: dict[str, Any], limit: int | None = SECTION_LINES, cwd: Path | None = None) -> list[Fragments]:
    """A diff content block as red/green unified-diff lines (`a/`, `b/` before a relative path;
    an absolute one is shown as it is)."""
    old = diff.get("oldText") or ""
    new = diff.get("newText") or ""
    path = sanitize(display_path(str(diff.get("path", "")), cwd))
    prefix_a, prefix_b = ("", "") if path.startswith("/") else ("a/", "b/")
    out: list[Fragments] = []
    for line in difflib.unified_diff(str(old).splitlines(), str(new).splitlines(), fromfile=prefix_a + path,
                                     tofile=prefix_b + path, lineterm="", n=2):
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
    return _capped(out, limit)


def text_block_lines(text: str, style: str = "class:tool.output", indent: str = "  ",
                     limit: int | None = SECTION_LINES) -> list[Fragments]:
    lines = sanitize(text).split("\n")
    return _capped([[(style, indent + line)] for line in lines], limit)


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def write_lines(write: ProposedWrite, limit: int | None = SECTION_LINES) -> list[Fragments]:
    """A note write as a diff against the note (a new note: all of it added)."""
    return diff_lines({"path": write.path, "oldText": write.old, "newText": write.new}, limit)


def kiln_lines(bridge: BridgeCall, call: Any, write: ProposedWrite | None, limit: int | None) -> list[Fragments] | None:
    """A bridge tool's body as a person wants it, or None to show its raw result."""
    status = call.status or "pending"
    if bridge.name in SEARCH_TOOLS:
        found = search_hits(call)
        if found is None:
            return [] if status not in ("completed", "failed") else None
        hits, total = found
        lines: list[Fragments] = [[("class:tool.output", "  "), ("class:tool.path", sanitize(path)),
                                   ("class:dim", " — "), ("class:tool.output", sanitize(title))]
                                  for path, title in hits]
        if total > len(hits):
            lines.append([("class:dim", f"  … {total - len(hits)} more")])
        if not hits:
            lines.append([("class:dim", "  no matches")])
        return lines
    if bridge.name in WRITE_TOOLS and write is not None:
        lines = write_lines(write, limit)
        done = summary_line(bridge, call) if status in ("completed", "failed") else None
        return lines + ([[("class:dim", "  " + sanitize(done))]] if done else [])
    if status in ("completed", "failed"):
        done = summary_line(bridge, call)
        if done is not None:
            return [[("class:tool.output", "  " + sanitize(done))]]
    if bridge.name in WRITE_TOOLS:  # no note to diff against (yet): what is to be written
        body = bridge.args.get("content", bridge.args.get("body"))
        if isinstance(body, str) and status not in ("completed", "failed"):
            return _capped([[("class:diff.add", "  +" + line)] for line in sanitize(body).split("\n")], limit)
    return None


def tool_call_lines(call: Any, terminal_text: Callable[[str], str | None] | None = None, *,
                    limit: int | None = SECTION_LINES, args: dict[str, Any] | None = None,
                    write: ProposedWrite | None = None, diffs_elsewhere: bool = False,
                    cwd: Path | None = None) -> list[Fragments]:
    """A tool call: title, kind, status, then its diffs, terminal output or result. A bridge
    (kiln) tool reads as `create_note notes/x.md` with its hits or its diff (`kiln_lines`).
    `diffs_elsewhere`: the permission dialog shows this call's diff now (not twice)."""
    status = call.status or "pending"
    mark = {"completed": "✓", "failed": "✗", "in_progress": "…"}.get(status, "•")
    bridge = bridge_call(call, args)
    title = bridge.title if bridge is not None else (call.title or call.tool_call_id)
    head: Fragments = [
        (_STATUS_STYLE.get(status, "class:tool.pending"), f"{mark} "),
        ("class:tool.title", sanitize(title)),
        ("class:dim", "  [kiln] " if bridge is not None else f"  [{sanitize(call.kind or 'other')}] "),
        (_STATUS_STYLE.get(status, "class:tool.pending"), status),
    ]
    lines: list[Fragments] = [head]
    if bridge is not None:
        body = kiln_lines(bridge, call, None if diffs_elsewhere else write, limit)
        if diffs_elsewhere and bridge.name in WRITE_TOOLS:
            return lines + [[("class:dim", "  (its diff is in the permission dialog below)")]]
        if body is not None:
            return lines + body
    for loc in call.locations[:3]:
        if isinstance(loc.get("path"), str):
            lines.append([("class:dim", "  at " + sanitize(display_path(loc["path"], cwd)))])
    shown_content = False
    seen_diffs: set[tuple[str, str, str]] = set()
    for block in call.content:
        kind = block.get("type")
        if kind == "diff":
            shown_content = True
            ident = (str(block.get("path")), str(block.get("oldText")), str(block.get("newText")))
            if ident in seen_diffs:
                continue
            seen_diffs.add(ident)
            if diffs_elsewhere:
                lines.append([("class:dim", "  (its diff is in the permission dialog below)")])
                continue
            lines.extend(diff_lines(block, limit, cwd))
        elif kind == "terminal":
            term_id = str(block.get("terminalId", ""))
            out = terminal_text(term_id) if terminal_text else None
            lines.append([("class:dim", f"  $ terminal {sanitize(term_id)}")])
            if out:
                lines.extend(text_block_lines(out.rstrip("\n"), "class:terminal", limit=limit))
            shown_content = True
        elif kind == "content":
            inner = block.get("content")
            if isinstance(inner, dict) and inner.get("type") == "text" and status in ("completed", "failed"):
                lines.extend(text_block_lines(str(inner.get("text", "")).rstrip("\n"), limit=limit))
                shown_content = True
    if not shown_content and call.raw_output is not None and status in ("completed", "failed"):
        lines.extend(text_block_lines(pretty(call.raw_output).rstrip("\n"), limit=limit))
    return lines


class ToolEntry(BlockEntry):
    """A tool call in the transcript: redrawn as its call changes; cut at SECTION_LINES unless
    expanded (Ctrl-E on the focused one); marked while focused (Alt-↑/Alt-↓)."""

    def __init__(self, feed: Feed, call: Any, *, history: bool = False) -> None:
        super().__init__(history=history)
        self.feed = feed
        self.call = call
        self.args: dict[str, Any] | None = None  # the first arguments seen (a result may replace them)
        self.write: ProposedWrite | None = None  # a note write: the note before and after
        self.expanded = False
        self.focused = False
        self.asking = False  # the permission dialog shows this call now

    def update(self, call: Any) -> None:
        self.call = call
        if not self.args:  # (Claude's first update of a call has empty arguments)
            self.args = call_arguments(call)
        self.redraw()

    def redraw(self) -> None:
        lines = tool_call_lines(self.call, self.feed.terminal_text, limit=None if self.expanded else SECTION_LINES,
                                args=self.args, write=self.write, diffs_elsewhere=self.asking, cwd=self.feed.cwd)
        if self.focused:
            lines[0] = [("class:focus", "▶ "), *lines[0]]
        self.set_lines(lines)


class Feed(Renderer):
    """A session's events as entries, added with `add`."""

    def __init__(self, add: Callable[[Entry], object], *,
                 terminal_text: Callable[[str], str | None] | None = None,
                 on_thought: Callable[[TextEntry], None] | None = None, cwd: Path | None = None) -> None:
        self.add = add
        self.terminal_text = terminal_text
        self.on_thought = on_thought
        self.cwd = cwd  # diffs' paths are shown relative to it
        self.history = False  # entries made now are replayed history
        self.current: TextEntry | None = None
        self.tools: dict[str, ToolEntry] = {}
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

    def draw_tool_call(self, call: Any) -> ToolEntry:
        self.end_text()
        entry = self.tools.get(call.tool_call_id)
        if entry is None:
            entry = ToolEntry(self, call, history=self.history)
            self.tools[call.tool_call_id] = entry
            self.add(entry)
        entry.update(call)
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
        call = event.request.tool_call
        bridge = bridge_call(call)
        title = bridge.title if bridge is not None else call.title or call.tool_call_id
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
        super().__init__(ui.transcript.add, terminal_text=ui.terminal_text, on_thought=ui.new_thought,
                         cwd=ui.opts.cwd)
        self.ui = ui
        self.skipping_replay = False  # /restart: the agent's replay of what is on the screen already
        self._reading: set[str] = set()  # note-write calls whose note is being read for their diff

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
        entry = self.draw_tool_call(event.call)
        entry.asking = self.ui.queue.asks_about(event.call.tool_call_id)
        if entry.asking:
            entry.redraw()
        call = event.call
        if (entry.write is None and call.tool_call_id not in self._reading and not self.history
                and call.status not in ("completed", "failed")):
            bridge = bridge_call(call, entry.args)
            if bridge is not None and bridge.name in WRITE_TOOLS and bridge.args.get("path"):
                self._reading.add(call.tool_call_id)
                self.ui.start_soon(self._read_note_before, entry, bridge)

    async def _read_note_before(self, entry: ToolEntry, bridge: BridgeCall) -> None:
        """The note as it is before the write, for the call's diff (read while the write waits for
        its permission, or races it: a note read after it was written is not shown as a diff)."""
        write = await trio.to_thread.run_sync(proposed_write, self.ui.opts.kiln, bridge)
        if write is not None and (write.old != write.new or entry.call.status not in ("completed", "failed")):
            entry.write = write
            entry.redraw()
            self.ui.refresh()

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

    def unpin_plan(self) -> None:
        """The last turn's plan, as it finished, goes into the transcript (a new turn starts)."""
        status = self.ui.status
        if status.plan:
            self.end_text()
            self.add(BlockEntry([[("class:plan", "Plan")], *plan_lines(status.plan)]))
            status.plan = ()

    def turn_ended(self, event: TurnEnded) -> None:
        super().turn_ended(event)
        self.ui.status.turn_ended(event)
        self.ui.forget_ctrl_c()
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
