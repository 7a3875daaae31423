"""Session events as the output of `cru chat -p`: text (`TextPrinter`) or one JSON object per
event (`JsonPrinter`), with the `[child …]` lines of delegated children (`ChildLines`); and a
saved conversation as the updates `cru acp` replays to an editor (`EditorReplay`).

Both printers write a batch at once: a run of message chunks is one write and one flush, so a
flood of chunks costs a write per batch read from the agent, not per chunk. Text on stdout is
flushed before any line goes to stderr, so in a terminal the two interleave as they came.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from typing import IO, Any

from acp_host.session import (
    HistoryReplay,
    MessageChunk,
    PermissionResolved,
    RawUpdate,
    SessionError,
    ThoughtChunk,
    ToolCallEvent,
    TurnEnded,
    UserChunk,
)
from crucible.events import (
    ChildEvent,
    ChildEventHook,
    ChildStatus,
    Notice,
    Renderer,
    ReplayFilter,
    permission_decision,
    permission_line,
    shown_tool_call,
)
from crucible.kiln_calls import bridge_call
from crucible.redaction import StreamRedactor, redact
from crucible.terminal import json_safe, sanitize, sanitize_line


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return str(value)


# `json.dumps(..., ensure_ascii=False)` builds an encoder per call; one is enough.
_encode = json.JSONEncoder(ensure_ascii=False).encode
_roundtrip = json.JSONEncoder(default=_json_default).encode
_CHUNK_TYPES = {MessageChunk: "message_chunk", ThoughtChunk: "thought_chunk", UserChunk: "user_chunk"}


def event_json(event: Any) -> dict[str, Any]:
    """A session event as one JSON object with a `type` (the event class in snake case)."""
    kind = _CHUNK_TYPES.get(type(event))
    if kind is not None:  # the flood's case: its fields are JSON already (content is the wire's)
        return {"type": kind, "text": event.text, "content": event.content, "message_id": event.message_id}
    name = type(event).__name__
    kind = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    data: dict[str, Any] = asdict(event) if is_dataclass(event) and not isinstance(event, type) else {}
    return {"type": kind, **json.loads(_roundtrip(data))}


def tool_line(event: ToolCallEvent) -> str:
    """`[tool] semantic_search "sourdough" (search): completed`: Crucible's own tools by their
    clean title, whatever the agent calls them (`mcp__crucible__semantic_search`), as in the chat."""
    c = event.call
    bridge = bridge_call(c)
    title = bridge.title if bridge is not None else c.title or c.tool_call_id
    return f"[tool] {sanitize_line(title)} ({sanitize_line(c.kind or 'other')}): {c.status or 'pending'}"


def resolved_line(event: PermissionResolved) -> str:
    decision, reason = permission_decision(event)
    return permission_line(event.request.tool_call.title or event.request.tool_call.tool_call_id, decision, reason)


class ChildLines:
    """A delegated child's events as `[child claude › reviewer] ...` lines on `err`, its message
    text cut at newlines (what is left of a line waits for the next chunk or the end)."""

    def __init__(self, err: IO[str]) -> None:
        self.err = err
        self.pending: dict[str, str] = {}  # job -> message text not yet ended by a newline

    def line(self, label: str, text: str) -> None:
        self.err.write(sanitize(f"[child {label}] {text}") + "\n")
        self.err.flush()

    def flush(self, ev: ChildEvent) -> None:
        rest = self.pending.pop(ev.job_id, "")
        if rest.strip():
            self.line(ev.label, rest)

    def show(self, ev: ChildEvent) -> None:
        e = ev.event
        if isinstance(e, MessageChunk):
            text = self.pending.get(ev.job_id, "") + e.text
            *done, rest = text.split("\n")
            for part in done:
                self.line(ev.label, part)
            self.pending[ev.job_id] = rest
        elif isinstance(e, ToolCallEvent):
            if shown_tool_call(e):
                self.line(ev.label, tool_line(e))
        elif isinstance(e, PermissionResolved):
            self.line(ev.label, resolved_line(e))
        elif isinstance(e, SessionError):
            self.line(ev.label, f"[error] {e.message}")
        elif isinstance(e, TurnEnded):
            self.flush(ev)
        elif isinstance(e, ChildStatus):
            if e.status == "finished":
                self.flush(ev)
            if e.status != "queued":
                self.line(ev.label, f"{e.status}" + (f": {e.detail}" if e.detail else ""))


def child_json(ev: ChildEvent) -> dict[str, Any]:
    """{"type": "child_event", "label", "job", "session", "depth", "event"}."""
    e = ev.event
    payload = ({"type": "child_status", "status": e.status, "detail": e.detail}
               if isinstance(e, ChildStatus) else event_json(e))
    return {"type": "child_event", "label": ev.label, "job": ev.job_id, "session": ev.session_id,
            "depth": ev.depth, "event": payload}


logger = logging.getLogger(__name__)
# How many different malformed updates one chat says (each once): an agent sending thousands
# of distinct ones would otherwise bury the answer.
MAX_UNREADABLE_SAID = 10


class TextPrinter(Renderer):
    """`cru chat -p`: the agent's message text on `out`; tool calls, permissions, errors, notices
    and children as short lines on `err`."""

    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.children = ChildLines(self.err)
        self._text: list[str] = []  # message text of the batch being rendered
        self._redactor = StreamRedactor()  # a secret the agent streams in pieces is masked too
        self._ended_line = True
        self._replay = ReplayFilter()  # the agent's replay of a resumed conversation: not the answer
        self._unreadable: set[str] = set()  # the reasons of malformed updates said so far

    def render(self, events: Sequence[Any]) -> None:
        super().render(self._replay.live(events))
        self._write_text()

    def _write_text(self, *, end: bool = False) -> None:
        """The batch's message text on stdout; with `end`, also what was held back as the
        possible start of a secret (the message is interrupted or over)."""
        text = self._redactor.feed("".join(self._text)) if self._text else ""
        self._text.clear()
        if end:
            text += self._redactor.end()
        if text:
            self.out.write(sanitize(text))
            self.out.flush()
            self._ended_line = text.endswith("\n")

    def _line(self, text: str) -> None:
        self._write_text(end=True)  # stdout first: the two streams interleave as the events came
        self.err.write(sanitize(text) + "\n")
        self.err.flush()

    def message(self, event: MessageChunk) -> None:
        self._text.append(event.text)

    def tool_call(self, event: ToolCallEvent) -> None:
        if shown_tool_call(event):
            self._line(tool_line(event))

    def raw_update(self, event: RawUpdate) -> None:
        # A kind this chat does not know (a newer protocol) is said with -v only; a malformed
        # update may have carried text or a tool call that is then not shown: said, once a reason.
        if event.reason.startswith("unknown session update"):
            logger.info("skipped an update from the agent: %s", event.reason)
        elif event.reason not in self._unreadable and len(self._unreadable) < MAX_UNREADABLE_SAID:
            self._unreadable.add(event.reason)
            self._line(f"[warning] the agent sent an update this chat cannot read ({event.reason}); "
                       "what it carried is not shown (`--format json` prints it)")

    def history_replay(self, event: HistoryReplay) -> None:
        if not event.started:
            self._line("[history] the agent replayed the conversation so far (not printed: "
                       "`cru session show` prints it)")

    def permission(self, event: PermissionResolved) -> None:
        self._line(resolved_line(event))

    def error(self, event: SessionError) -> None:
        self._line(f"[error] {event.message}")

    def turn_ended(self, event: TurnEnded) -> None:
        self._write_text(end=True)
        if not self._ended_line:
            self.out.write("\n")
            self.out.flush()
            self._ended_line = True

    def notice(self, event: Notice) -> None:
        self._write_text(end=True)
        self.err.write(f"{event.text}\n")
        self.err.flush()

    def child(self, event: ChildEvent) -> None:
        self._write_text(end=True)
        self.children.show(event)

    def note(self, text: str) -> None:
        self.show(Notice(text))


class JsonPrinter(Renderer):
    """`cru chat -p --format json`: one JSON object per line on `out` for every event; a notice
    is {"type": "note", "message"}, a child's event {"type": "child_event", …}."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        # Per chunk type: the streamed text, redacted across chunks (a secret cut between two
        # chunks is masked too); held text goes out as one more chunk before any other event.
        self._streams: dict[str, tuple[StreamRedactor, str | None]] = {}

    def _chunk(self, event: Any, kind: str) -> dict[str, Any] | None:
        data = event_json(event)
        content = data.get("content")
        if not isinstance(content, dict) or content.get("type") != "text":
            return data
        redactor, _ = self._streams.get(kind) or (StreamRedactor(), None)
        self._streams[kind] = (redactor, event.message_id)
        shown = redactor.feed(event.text)
        if shown == event.text:  # the flood's case: nothing held, nothing masked
            return data
        if not shown:
            return None
        return {**data, "text": shown, "content": {**content, "text": shown}}

    def _held(self, keep: str | None = None) -> list[str]:
        """What the chunk streams held back (but `keep`'s), as chunk events."""
        lines = []
        for kind, (redactor, message_id) in list(self._streams.items()):
            if kind == keep:
                continue
            del self._streams[kind]
            rest = redactor.end()
            if rest:
                lines.append(_encode({"type": kind, "text": rest, "content": {"type": "text", "text": rest},
                                      "message_id": message_id}))
        return lines

    def render(self, events: Sequence[Any]) -> None:
        lines = []
        for event in events:
            kind = type(event)
            chunk_type = _CHUNK_TYPES.get(kind)
            if chunk_type is not None:
                lines.extend(self._held(keep=chunk_type))
                data = self._chunk(event, chunk_type)
                if data is not None:
                    lines.append(_encode(data))
                continue
            lines.extend(self._held())
            if kind is Notice:
                lines.append(json.dumps({"type": "note", "message": event.text}))
            elif kind is ChildEvent:
                lines.append(_encode(child_json(event)))
            else:
                lines.append(_encode(event_json(event)))
        if not lines:
            return
        lines.append("")
        # C1 and bidi controls escaped (the same JSON values), secrets masked: a terminal may show it.
        self.out.write(json_safe(redact("\n".join(lines))))
        self.out.flush()

    def note(self, text: str) -> None:
        self.show(Notice(text))


Printer = TextPrinter | JsonPrinter


def printer_for(fmt: str, out: IO[str] | None = None, err: IO[str] | None = None) -> Printer:
    return JsonPrinter(out) if fmt == "json" else TextPrinter(out, err)


def child_event_printer(fmt: str, out: IO[str], err: IO[str]) -> ChildEventHook:
    """A delegated child's events as the printer of `fmt` shows them (a session's
    `on_child_event` hook)."""
    printer = printer_for(fmt, out, err)
    return printer.show


class EditorReplay(Renderer):
    """A saved conversation as the `session/update` chunks an editor shows (`updates`)."""

    def __init__(self, editor_id: str) -> None:
        self.editor_id = editor_id
        self.updates: list[dict[str, Any]] = []

    def _chunk(self, kind: str, text: str) -> None:
        if text:
            self.updates.append({"sessionId": self.editor_id, "update": {
                "sessionUpdate": kind, "content": {"type": "text", "text": text}}})

    def message(self, event: MessageChunk) -> None:
        self._chunk("agent_message_chunk", event.text)

    def thought(self, event: ThoughtChunk) -> None:
        self._chunk("agent_thought_chunk", event.text)

    def user_message(self, event: UserChunk) -> None:
        self._chunk("user_message_chunk", event.text)
