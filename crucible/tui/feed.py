"""Session events as transcript entries (the `Feed` renderer): streamed text, thoughts, the
person's messages, tool calls (each a `ToolEntry`, drawn by tool_calls.py), permission
answers, notices and errors. The chat has one for its session, each child section one for its
child: a child's events are drawn exactly as the session's own, only nested."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
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
from crucible.kiln_calls import WRITE_TOOLS, BridgeCall, bridge_call, proposed_write
from crucible.replayed import shown_user_text
from crucible.terminal import sanitize, sanitize_line
from crucible.tui.status import plan_lines
from crucible.tui.tool_calls import ToolEntry
from crucible.tui.transcript import BlockEntry, Entry, TextEntry

if TYPE_CHECKING:
    from acp_host.session import PlanChanged, UsageChanged
    from crucible.tui.app import ChatUI


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
        text = shown_user_text(event.text)
        if not text:
            return
        cur = self.current
        if (cur is None or cur.kind != "user" or cur.history != self.history
                or event.message_id != self._user_message):
            self.end_text()
            self._user_message = event.message_id
            self.text("user", "› " + text, markdown=False)
        else:
            cur.append(text)

    def tool_call(self, event: ToolCallEvent) -> None:
        self.draw_tool_call(event.call)

    def permission(self, event: PermissionResolved) -> None:
        if event.decision is not None and not event.decision.asked and event.decision.kind.startswith("allow"):
            return  # a rule let it run: its tool call says so; a line per read would bury the answer
        decision, reason = permission_decision(event)
        call = event.request.tool_call
        bridge = bridge_call(call)
        title = bridge.title if bridge is not None else call.title or call.tool_call_id
        self.add_notice(_permission_text(title, decision, reason))

    def turn_ended(self, event: TurnEnded) -> None:
        self.end_text()

    def error(self, event: SessionError) -> None:
        self.add_notice(event.message, "class:error")

    def notice(self, event: Notice) -> None:
        # A decision Crucible asked itself reads as one the agent asked for.
        self.add_notice(_permission_text(*event.permission) if event.permission else event.text)


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
        entry.asking = self.ui.queue.asks_about(event.call)
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
        self.ui.keys.forget_ctrl_c()
        if event.error:
            self.add_notice(f"the turn failed: {event.error}", "class:error")
            self.ui.check_agent()
        elif event.stop_reason == "cancelled":
            self.add_notice("the turn was cancelled")
            session = self.ui.session
            if session is not None and (defect := session.cancel_defect_once()) is not None:
                self.add_notice(f"note: {defect}", "class:warning")
        elif event.stop_reason != "end_turn":
            self.add_notice(f"the turn ended: {event.stop_reason}")

    def error(self, event: SessionError) -> None:
        super().error(event)
        self.ui.check_agent()

    def child(self, event: ChildEvent) -> None:
        self.ui.children.show(event)


def _permission_text(title: str, decision: str, reason: str) -> str:
    return f"permission: {sanitize_line(title)} → {decision}" + (f" ({reason})" if reason else "")
