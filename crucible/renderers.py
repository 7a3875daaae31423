"""Session events as output: the headless printers of `cru chat -p` (text and JSON) and the
`[child …]` lines of delegated children."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, is_dataclass
from typing import IO, Any

from acp_host.session import (
    MessageChunk,
    PermissionResolved,
    SessionError,
    ToolCallEvent,
    TurnEnded,
)
from crucible.events import ChildEvent, ChildEventHook, ChildStatus
from crucible.terminal import sanitize


def event_json(event: Any) -> dict[str, Any]:
    """A session event as one JSON object with a `type` (the event class in snake case)."""
    name = type(event).__name__
    kind = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    data: dict[str, Any] = asdict(event) if is_dataclass(event) and not isinstance(event, type) else {}
    return {"type": kind, **json.loads(json.dumps(data, default=_json_default))}


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return str(value)


class HeadlessPrinter:
    def __init__(self, fmt: str, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> None:
        self.fmt = fmt
        self.out = out
        self.err = err
        self._ended_line = True

    def note(self, text: str) -> None:
        if self.fmt == "json":
            self.out.write(json.dumps({"type": "note", "message": text}) + "\n")
            self.out.flush()
        else:
            self.err.write(f"{text}\n")
            self.err.flush()

    def show(self, event: Any) -> None:
        if self.fmt == "json":
            self.out.write(json.dumps(event_json(event), ensure_ascii=False) + "\n")
            self.out.flush()
            return
        if isinstance(event, MessageChunk):
            self.out.write(sanitize(event.text))
            self.out.flush()
            self._ended_line = event.text.endswith("\n")
        elif isinstance(event, ToolCallEvent):
            c = event.call
            if event.created or c.status in ("completed", "failed"):
                status = c.status or "pending"
                self.err.write(sanitize(f"[tool] {c.title or c.tool_call_id} ({c.kind or 'other'}): {status}") + "\n")
        elif isinstance(event, PermissionResolved):
            decision = event.decision.kind if event.decision else event.outcome.get("outcome", "")
            reason = event.decision.reason if event.decision else event.note
            title = event.request.tool_call.title or event.request.tool_call.tool_call_id
            self.err.write(sanitize(f"[permission] {title}: {decision} ({reason})") + "\n")
        elif isinstance(event, SessionError):
            self.err.write(sanitize(f"[error] {event.message}") + "\n")
        elif isinstance(event, TurnEnded):
            if not self._ended_line:
                self.out.write("\n")
                self.out.flush()
        self.err.flush()


def child_event_printer(fmt: str, out: IO[str], err: IO[str]) -> ChildEventHook:
    """`[child claude › reviewer] ...` lines on `err` (text), or one JSON object per child event
    on `out` (`--format json`: {"type": "child_event", "label", "job", "session", "depth", "event"})."""
    pending: dict[str, str] = {}  # job -> message text not yet ended by a newline

    def line(label: str, text: str) -> None:
        err.write(sanitize(f"[child {label}] {text}") + "\n")
        err.flush()

    def flush(ev: ChildEvent) -> None:
        rest = pending.pop(ev.job_id, "")
        if rest.strip():
            line(ev.label, rest)

    def show(ev: ChildEvent) -> None:
        e = ev.event
        if fmt == "json":
            payload = ({"type": "child_status", "status": e.status, "detail": e.detail}
                       if isinstance(e, ChildStatus) else event_json(e))
            out.write(json.dumps({"type": "child_event", "label": ev.label, "job": ev.job_id,
                                  "session": ev.session_id, "depth": ev.depth, "event": payload},
                                 ensure_ascii=False) + "\n")
            out.flush()
            return
        if isinstance(e, MessageChunk):
            text = pending.get(ev.job_id, "") + e.text
            *done, rest = text.split("\n")
            for part in done:
                line(ev.label, part)
            pending[ev.job_id] = rest
        elif isinstance(e, ToolCallEvent):
            c = e.call
            if e.created or c.status in ("completed", "failed"):
                line(ev.label, f"[tool] {c.title or c.tool_call_id} ({c.kind or 'other'}): {c.status or 'pending'}")
        elif isinstance(e, PermissionResolved):
            decision = e.decision.kind if e.decision else e.outcome.get("outcome", "")
            reason = e.decision.reason if e.decision else e.note
            line(ev.label, f"[permission] {e.request.tool_call.title or e.request.tool_call.tool_call_id}: "
                           f"{decision} ({reason})")
        elif isinstance(e, SessionError):
            line(ev.label, f"[error] {e.message}")
        elif isinstance(e, TurnEnded):
            flush(ev)
        elif isinstance(e, ChildStatus):
            if e.status == "finished":
                flush(ev)
            if e.status != "queued":
                line(ev.label, f"{e.status}" + (f": {e.detail}" if e.detail else ""))

    return show
