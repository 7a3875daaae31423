"""Delegated child sessions in the transcript: a collapsible section per child, placed under
the delegate_session call that started it (a grandchild inside its parent's section), drawing
the child's events as the session's own (`SectionFeed`), only indented."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from acp_host.session import ToolCall
from crucible.events import ChildEvent, ChildStatus, Notice
from crucible.permissions import tool_key_from_acp
from crucible.terminal import counted, sanitize
from crucible.tui.feed import Feed
from crucible.tui.markdown import Fragment, Fragments, wrap
from crucible.tui.transcript import MAX_ENTRIES, Entry, TextEntry, TranscriptControl

MAX_SECTIONS = 500  # child sections the chat keeps track of (they stay in the transcript)

CHILD_INDENT = "  │ "
_CHILD_STATUS_STYLE = {"done": "class:tool.ok", "failed": "class:tool.failed", "timed out": "class:tool.failed",
                       "cancelled": "class:tool.failed", "running": "class:tool.running",
                       "queued": "class:tool.pending"}


def child_status_word(status: str, detail: str = "") -> str:
    """A `ChildStatus` (crucible/events.py) as the word on its section's header."""
    if status == "queued":
        return "queued"
    if status == "finished":
        outcome = detail.split(":", 1)[0].strip()
        return {"completed": "done", "timed_out": "timed out"}.get(outcome, outcome or "done")
    return "running"  # started, notices


class SectionFeed(Feed):
    """A child's events in its section: as the session's own, and the child's life."""

    def __init__(self, section: ChildSection, *, on_thought: Callable[[TextEntry], None] | None = None) -> None:
        super().__init__(section.entries.append, on_thought=on_thought)
        self.section = section

    def child_status(self, event: ChildStatus) -> None:
        self.section.status_changed(event)


class ChildSection(Entry):
    """A delegated child session: a header (chain label and status) over its own events,
    drawn indented; collapsed, the header and a one-line summary. Expanded while it runs,
    collapsed when it ends well (a failed or cancelled child stays open so its error shows),
    unless the person chose otherwise for this section."""

    def __init__(self, label: str, job_id: str, *, on_thought: Callable[[TextEntry], None] | None = None) -> None:
        self.label = sanitize(label)
        self.job_id = job_id
        self.session_id: str | None = None  # the child's Crucible session, once started
        self.status = "queued"
        self.entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self.feed = SectionFeed(self, on_thought=on_thought)
        self.collapsed = False
        self.user_toggled = False
        self.started = time.monotonic()
        self.seconds: float | None = None

    @property
    def finished(self) -> bool:
        return self.seconds is not None

    @property
    def tool_calls(self) -> int:
        return len(self.feed.tools)

    def add_child(self, section: ChildSection) -> None:
        """A grandchild's section, nested in this one."""
        self.feed.end_text()
        self.entries.append(section)

    def set_collapsed(self, collapsed: bool, *, by_user: bool = True) -> None:
        self.collapsed = collapsed
        self.user_toggled = self.user_toggled or by_user

    def show(self, event: Any) -> None:
        """One of the child's events: an `acp_host.session` event or a `ChildStatus`."""
        self.feed.show(event)

    def status_changed(self, event: ChildStatus) -> None:
        self.status = child_status_word(event.status, event.detail)
        if event.status == "started":
            self.feed.terminal_text = event.terminal_output  # read while the child runs
        elif event.status == "notice":
            self.feed.notice(Notice(event.detail, event.permission))
        elif event.status == "finished":
            self.feed.terminal_text = None  # the child's session is closing: hold nothing of it
            self.feed.end_text()
            self.seconds = round(time.monotonic() - self.started, 1)
            _, _, error = event.detail.partition(":")
            if error.strip() and self.status != "done":
                self.feed.add_notice(error.strip(), "class:error")
            if not self.user_toggled:
                self.collapsed = self.status == "done"

    def header(self) -> Fragments:
        return [("class:child.head", ("▸ " if self.collapsed else "▾ ") + self.label),
                ("class:dim", " — "), (_CHILD_STATUS_STYLE.get(self.status, "class:dim"), self.status)]

    def summary(self) -> str:
        ended = f"{self.status} in {self.seconds:g} s" if self.seconds is not None else self.status
        return f"{counted(self.feed.messages, 'message')}, {counted(self.tool_calls, 'tool call')} · {ended}"

    def rows_reversed(self, width: int) -> Iterator[Fragments]:
        width = max(1, width)
        if self.collapsed:
            yield from reversed(wrap([("class:child.bar", "  └ "), ("class:dim", self.summary())], width))
        else:
            inner = max(1, width - len(CHILD_INDENT))
            bar: Fragment = ("class:child.bar", CHILD_INDENT)
            first = True
            for entry in reversed(self.entries):
                if not first:
                    yield [("class:child.bar", CHILD_INDENT.rstrip())]
                first = False
                for row in entry.rows_reversed(inner):
                    yield [bar, *row]
        yield from reversed(wrap(self.header(), width))


class Children:
    """The sections of a session's delegated children, and where each goes: a child under the
    delegate_session call that started it (the oldest running one not taken yet), else at the
    end; a grandchild inside its parent's section."""

    def __init__(self, transcript: TranscriptControl, feed: Feed,
                 on_thought: Callable[[TextEntry], None] | None = None) -> None:
        self.transcript = transcript
        self.feed = feed  # the session's: where its delegate_session calls are
        self.on_thought = on_thought
        self.sections: dict[tuple[str, str], ChildSection] = {}  # by (chain label, job id)
        self.order: deque[tuple[ChildSection, int]] = deque(maxlen=MAX_SECTIONS)  # (section, depth)
        self._delegate_calls: dict[str, ToolCall] = {}  # running calls without a section yet, in order
        self._anchored: set[str] = set()

    def track_call(self, call: ToolCall) -> None:
        """A tool call of the session: a running delegate_session call waits for its section."""
        raw = {"toolCallId": call.tool_call_id, "title": call.title, "kind": call.kind}
        if tool_key_from_acp(raw).name != "delegate_session":
            return
        if call.status in ("completed", "failed"):  # too late to start a child now
            self._delegate_calls.pop(call.tool_call_id, None)
            self._anchored.discard(call.tool_call_id)
        elif call.tool_call_id not in self._anchored:
            self._delegate_calls[call.tool_call_id] = call

    def show(self, ev: ChildEvent) -> None:
        """A child's (or grandchild's) event, drawn in that child's section."""
        key = (ev.label, ev.job_id)
        section = self.sections.get(key)
        restarted = isinstance(ev.event, ChildStatus) and ev.event.status == "queued"
        if section is None or (section.finished and restarted):  # job ids restart with a new session
            section = ChildSection(ev.label, ev.job_id, on_thought=self.on_thought)
            if len(self.sections) >= MAX_SECTIONS:
                self.sections = {k: s for k, s in self.sections.items() if not s.finished}
            self.sections[key] = section
            self._place(section, ev.depth)
            self.order.append((section, ev.depth))
        section.session_id = ev.session_id or section.session_id
        section.show(ev.event)

    def _place(self, section: ChildSection, depth: int) -> None:
        if depth > 1:
            parent_label = section.label.rsplit(" › ", 1)[0]
            for parent, _ in reversed(self.order):
                if parent.label == parent_label and not parent.finished:
                    parent.add_child(section)
                    return
        anchor = None
        call_id = next(iter(self._delegate_calls), None) if depth == 1 else None
        if call_id is not None:
            del self._delegate_calls[call_id]
            self._anchored.add(call_id)
            anchor = self.feed.tools.get(call_id)
        if anchor is None:
            self.feed.end_text()
        self.transcript.insert_after(anchor, section)

    def newest(self) -> ChildSection | None:
        """The newest child of this session (a grandchild is inside its section)."""
        return next((s for s, depth in reversed(self.order) if depth == 1), None)

    def all(self) -> list[ChildSection]:
        return [s for s, _ in self.order]
