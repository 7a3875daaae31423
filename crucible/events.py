"""A Crucible session's events, from the agent to every screen, in one place.

The pipeline: `Pipeline(session, renderers).run()` reads the session's events in batches (one
scheduler round per batch, not per event: a flood of chunks then costs one wake-up per read),
has the session's transcript record each batch once (`TranscriptRecorder`), then hands the batch
to every renderer in order. What does not come from the agent's stream joins the same fan-out: a
delegated child's events (`ChildEvent`) and what the session has to tell the person (`Notice`).

A renderer is one class: subclass `Renderer` and define the handlers of the event types it
draws (`message`, `tool_call`, `turn_ended`, …, the names in `HANDLERS`); `render(batch)`
calls them by the event's type. A renderer that does better with a whole batch (one write for
a run of chunks) overrides `render`. Renderers: the transcript recorder (here), the headless
text and JSON printers and `cru acp`'s replay of a saved conversation to the editor
(crucible/renderers.py), the TUI's transcript feed and a delegated child's section in it
(crucible/tui/feed.py, children.py), a delegation job's view of its child (crucible/delegation.py).
`cru acp` forwards the backend's frames to the editor before they are parsed
(crucible/acp_forward.py); their typed events come through here into the transcript.

The saved history goes the other way: `saved_events` turns a transcript's records back into
events, which the same renderers draw.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import trio

from acp_host.session import (
    CommandsChanged,
    ConfigOptionsChanged,
    Event,
    HistoryReplay,
    MessageChunk,
    ModeChanged,
    PermissionRequested,
    PermissionResolved,
    PlanChanged,
    RawUpdate,
    ServiceCall,
    SessionError,
    SessionInfoChanged,
    TerminalExited,
    ThoughtChunk,
    ToolCall,
    ToolCallEvent,
    TurnEnded,
    UsageChanged,
    UserChunk,
)
from crucible.session_store import clean_title
from crucible.terminal import human_size, sanitize_line

if TYPE_CHECKING:
    from crucible.session_store import SessionWriter
    from crucible.sessions import CrucibleSession

# Events taken from the session's stream per read: a batch is recorded and rendered as one.
BATCH = 4096
# After a turn's answer, how long its last events may take to reach the renderers.
DRAIN_SECS = 5.0


# -- events beyond ACP's ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChildStatus:
    """A child's life, as the parent sees it (not an ACP event)."""

    status: Literal["queued", "started", "finished", "notice"]
    detail: str = ""
    # With "started": what a terminal of the child printed so far, by terminal id, for as long
    # as the child runs (the TUI draws a child's terminal output from it).
    terminal_output: Callable[[str], str | None] | None = field(default=None, compare=False, repr=False)
    # With "notice": the child's `Notice.permission`, so its section draws a decision Crucible
    # asked itself as it draws the child agent's own asks.
    permission: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class ChildEvent:
    """One event of a delegated child (or grandchild), for the parent's `on_child_event`."""

    label: str  # the provenance chain, e.g. "claude › reviewer"
    job_id: str
    session_id: str | None  # the child's Crucible session id (None while it is queued)
    depth: int  # 1 for a child, 2 for a grandchild
    event: Event | ChildStatus


ChildEventHook = Callable[[ChildEvent], None]


@dataclass(frozen=True, slots=True)
class Notice:
    """What the session tells the person outside the agent's stream (a bridge-side permission
    answer, a warning). `permission`: (title, decision, reason) when it is a decision Crucible
    asked or made itself, for a screen that draws those as it draws the agent's asks."""

    text: str
    permission: tuple[str, str, str] | None = None


# -- renderers ----------------------------------------------------------------------------------

# Event type -> the `Renderer` method that handles it.
HANDLERS: dict[type, str] = {
    MessageChunk: "message",
    ThoughtChunk: "thought",
    UserChunk: "user_message",
    ToolCallEvent: "tool_call",
    PlanChanged: "plan",
    ModeChanged: "mode",
    ConfigOptionsChanged: "config_options",
    CommandsChanged: "commands",
    UsageChanged: "usage",
    SessionInfoChanged: "session_info",
    RawUpdate: "raw_update",
    PermissionRequested: "permission_requested",
    PermissionResolved: "permission",
    HistoryReplay: "history_replay",
    TurnEnded: "turn_ended",
    SessionError: "error",
    ServiceCall: "service_call",
    TerminalExited: "terminal_exited",
    ChildEvent: "child",
    ChildStatus: "child_status",
    Notice: "notice",
}


class Renderer:
    """Turns a session's events into output; each handler does nothing unless overridden."""

    _table: ClassVar[dict[type, Callable[[Any, Any], None]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._table = {kind: getattr(cls, name) for kind, name in HANDLERS.items()}

    def render(self, events: Sequence[Any]) -> None:
        """A batch of events, in order."""
        table = self._table
        for event in events:
            handler = table.get(type(event))
            if handler is not None:
                handler(self, event)

    def show(self, event: Any) -> None:
        """One event."""
        self.render((event,))

    def message(self, event: MessageChunk) -> None: ...
    def thought(self, event: ThoughtChunk) -> None: ...
    def user_message(self, event: UserChunk) -> None: ...
    def tool_call(self, event: ToolCallEvent) -> None: ...
    def plan(self, event: PlanChanged) -> None: ...
    def mode(self, event: ModeChanged) -> None: ...
    def config_options(self, event: ConfigOptionsChanged) -> None: ...
    def commands(self, event: CommandsChanged) -> None: ...
    def usage(self, event: UsageChanged) -> None: ...
    def session_info(self, event: SessionInfoChanged) -> None: ...
    def raw_update(self, event: RawUpdate) -> None: ...
    def permission_requested(self, event: PermissionRequested) -> None: ...
    def permission(self, event: PermissionResolved) -> None: ...
    def history_replay(self, event: HistoryReplay) -> None: ...
    def turn_ended(self, event: TurnEnded) -> None: ...
    def error(self, event: SessionError) -> None: ...
    def service_call(self, event: ServiceCall) -> None: ...
    def terminal_exited(self, event: TerminalExited) -> None: ...
    def child(self, event: ChildEvent) -> None: ...
    def child_status(self, event: ChildStatus) -> None: ...
    def notice(self, event: Notice) -> None: ...


Renderer._table = {kind: getattr(Renderer, name) for kind, name in HANDLERS.items()}


def permission_line(title: str, decision: str, reason: str) -> str:
    """A permission decision as a line of text (`-p`'s stderr): `[permission] TITLE: DECISION (why)`."""
    return f"[permission] {sanitize_line(title)}: {decision} ({reason})"


def permission_decision(event: PermissionResolved) -> tuple[str, str]:
    """What was decided on a permission request, and why: for every renderer alike."""
    if event.decision is not None:
        return event.decision.kind, event.decision.reason
    return str(event.outcome.get("outcome", "")), event.note


def shown_tool_call(event: ToolCallEvent) -> bool:
    """A tool call worth a line where each change cannot be redrawn: its start and its end."""
    return event.created or event.call.status in ("completed", "failed")


# -- recording: events -> the saved transcript, and back ---------------------------------------


def joined_chunks(events: Sequence[Event]) -> list[Event]:
    """`events` with each run of chunks of one message (or thought) joined into one chunk: the
    transcript stores such a run as one record anyway. A joined chunk keeps the first one's
    `content`, which the recorder does not read."""
    out: list[Event] = []
    run: list[Any] = []
    for event in events:
        kind = type(event)
        if kind is MessageChunk or kind is ThoughtChunk:
            if run and (type(run[0]) is not kind or run[0].message_id != event.message_id):  # type: ignore[union-attr]
                out.append(_join(run))
                run = []
            run.append(event)
            continue
        if run:
            out.append(_join(run))
            run = []
        out.append(event)
    if run:
        out.append(_join(run))
    return out


def _join(run: list[Any]) -> Any:
    if len(run) == 1:
        return run[0]
    return replace(run[0], text="".join([c.text for c in run]))


# What an agent replays of a resumed conversation (session/load): the saved transcript holds it
# already, and it is not the answer to a prompt. (`crucible.acp_forward.CONVERSATION` names the
# same updates by their raw kinds, for an editor that resumed: keep the two in step.)
_REPLAYED = (MessageChunk, ThoughtChunk, UserChunk, ToolCallEvent, PlanChanged)


class ReplayFilter:
    """A session's events without what the agent replays between HistoryReplay(started) and its
    end (the markers kept): for the renderers that save or print only the live conversation."""

    def __init__(self) -> None:
        self.replaying = False

    def live(self, events: Sequence[Any]) -> Sequence[Any]:
        if not (self.replaying or any(type(e) is HistoryReplay for e in events)):
            return events  # the usual batch: one scan, nothing copied
        kept = []
        for event in events:
            if type(event) is HistoryReplay:
                self.replaying = event.started
            elif self.replaying and isinstance(event, _REPLAYED):
                continue
            kept.append(event)
        return kept


class TranscriptRecorder(Renderer):
    """A session's events as the records of its saved transcript (crucible/session_store.py),
    the agent's replay of a resumed conversation left out (each resume saved it once more)."""

    def __init__(self, writer: SessionWriter) -> None:
        self.writer = writer
        self._replay = ReplayFilter()

    def render(self, events: Sequence[Any]) -> None:
        events = self._replay.live(events)
        super().render(joined_chunks(events) if len(events) > 1 else events)

    def message(self, event: MessageChunk) -> None:
        self.writer.append({"type": "agent_message", "text": event.text})

    def thought(self, event: ThoughtChunk) -> None:
        self.writer.append({"type": "agent_thought", "text": event.text})

    def user_message(self, event: UserChunk) -> None:
        self.writer.append({"type": "history_user_message", "text": event.text})

    def tool_call(self, event: ToolCallEvent) -> None:
        if shown_tool_call(event):
            c = event.call
            record = {"type": "tool_call", "id": c.tool_call_id, "title": c.title, "kind": c.kind,
                      "status": c.status}
            if c.status in ("completed", "failed"):
                record.update(tool_call_details(c))
            self.writer.append(record)

    def permission(self, event: PermissionResolved) -> None:
        decision, reason = permission_decision(event)
        self.writer.append({"type": "permission", "title": event.request.tool_call.title,
                            "decision": decision if event.decision else event.outcome.get("outcome"),
                            "reason": reason})

    def turn_ended(self, event: TurnEnded) -> None:
        self.writer.append({"type": "turn_end", "stop_reason": event.stop_reason, "error": event.error})

    def plan(self, event: PlanChanged) -> None:
        self.writer.append({"type": "plan", "entries": [e.model_dump(mode="json") for e in event.entries]})

    def error(self, event: SessionError) -> None:
        self.writer.append({"type": "error", "message": event.message})

    def session_info(self, event: SessionInfoChanged) -> None:
        # The agent's own title for the conversation wins over its first prompt.
        title = clean_title(event.title or "")
        meta = self.writer.meta
        if title and (title, "agent") != (meta.title, meta.title_source):
            meta.title, meta.title_source = title, "agent"
            self.writer.save_meta()


    def service_call(self, event: ServiceCall) -> None:
        kind = "terminal" if event.method == "terminal/create" else "file_write"
        self.writer.append({"type": kind, "what": event.summary, "status": "started" if event.allowed else "refused",
                            "reason": event.reason})

    def terminal_exited(self, event: TerminalExited) -> None:
        self.writer.append({"type": "terminal", "what": event.command, "status": "exited",
                            "exit_code": event.exit_code, "signal": event.signal})


# What a saved tool call keeps of its arguments and of its result (characters each).
TOOL_DETAIL_MAX = 4000


def _capped(text: str, limit: int = TOOL_DETAIL_MAX) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def content_text(block: dict[str, Any]) -> str | None:
    """An ACP content block as text for a person: a text block's text; an image, audio, a link or
    an embedded resource as one bracketed line saying what it is (a resource's text after it).
    None for a block of no known type. Not sanitized: the caller shows it."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        data = block.get("data")
        # base64: 3 bytes in 4 characters, less its padding
        size = (f", {human_size(len(data) * 3 // 4 - (len(data) - len(data.rstrip('='))))}"
                if isinstance(data, str) and data else "")
        where = f" {block['uri']}" if isinstance(block.get("uri"), str) else ""
        return f"[{kind}: {block.get('mimeType') or 'unknown type'}{size}{where}]"
    if kind == "resource_link":
        name = block.get("title") or block.get("name") or ""
        return f"[link: {name} {block.get('uri', '')}]".replace("  ", " ")
    if kind == "resource":
        given = block.get("resource")
        res: dict[str, Any] = given if isinstance(given, dict) else {}
        uri = str(res.get("uri", ""))
        if isinstance(res.get("text"), str):
            return f"[resource {uri}]\n{res['text']}"
        return f"[resource {uri}: {res.get('mimeType') or 'binary'}]"
    return None


def tool_call_details(call: ToolCall) -> dict[str, Any]:
    """A finished tool call's arguments and result as the transcript keeps them: `input` (its
    raw input as JSON), `output` (the text it returned, else its raw output), `diffs` (the
    paths it changed), each bounded."""
    out: dict[str, Any] = {}
    if call.raw_input not in (None, {}, ""):
        out["input"] = _capped(json.dumps(call.raw_input, ensure_ascii=False, default=str))
    texts = []
    for item in call.content:
        inner = item.get("content") if item.get("type") == "content" else None
        text = content_text(inner) if isinstance(inner, dict) else None
        if text is not None:
            texts.append(text)
    if texts:
        out["output"] = _capped("\n".join(texts))
    elif call.raw_output not in (None, {}, ""):
        raw = call.raw_output
        out["output"] = _capped(raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str))
    paths = [str(d.get("path")) for d in call.diffs if d.get("path")]
    if paths:
        out["diffs"] = paths[:50]
    return out


def saved_events(records: Iterable[dict[str, Any]]) -> list[Event]:
    """The conversation of a saved transcript (the person's and the agent's messages, thoughts and
    tool calls) as events again, for the renderers that draw a live session."""
    out: list[Event] = []
    seen: set[str] = set()
    for number, record in enumerate(records):
        kind = record.get("type")
        text = record.get("text")
        if kind in ("user_message", "history_user_message") and isinstance(text, str):
            # Each record is a whole message: its own id keeps two in a row apart.
            out.append(UserChunk(text, {"type": "text", "text": text}, f"saved-{number}"))
        elif kind == "agent_message" and isinstance(text, str):
            out.append(MessageChunk(text, {"type": "text", "text": text}))
        elif kind == "agent_thought" and isinstance(text, str):
            out.append(ThoughtChunk(text, {"type": "text", "text": text}))
        elif kind == "tool_call":
            call_id = str(record.get("id") or "")
            call = ToolCall(call_id, title=_str_or_none(record.get("title")), kind=_str_or_none(record.get("kind")),
                            status=_str_or_none(record.get("status")), announced=True)
            out.append(ToolCallEvent(call, call_id not in seen))
            seen.add(call_id)
    return out


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# -- the pipeline -------------------------------------------------------------------------------


async def batches(session: CrucibleSession, max_events: int = BATCH) -> AsyncIterator[list[Event]]:
    """The one place a session's events are read: in batches, each recorded in the session's
    transcript before anyone sees it. Ends when the session's stream closes."""
    acp = session.acp
    assert acp is not None, "the session has no ACP session yet"
    recorder = TranscriptRecorder(session.writer)
    while True:
        try:
            batch = await acp.receive_batch(max_events)
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return
        recorder.render(batch)
        yield batch


class Pipeline:
    """One session's events, recorded once and fanned out to `renderers`; also what the
    session tells the person (`Notice`) and its delegated children's events (`ChildEvent`)."""

    def __init__(self, session: CrucibleSession, renderers: Iterable[Renderer]) -> None:
        self.session = session
        self.renderers = list(renderers)
        session.on_notice = self.notice
        session.on_permission = self.permission_notice
        session.on_child_event = self.child

    def fan_out(self, events: Sequence[Any]) -> None:
        for renderer in self.renderers:
            renderer.render(events)

    def notice(self, text: str) -> None:
        self.fan_out((Notice(text),))

    def permission_notice(self, title: str, decision: str, reason: str) -> None:
        self.fan_out((Notice(permission_line(title, decision, reason), (title, decision, reason)),))

    def child(self, event: ChildEvent) -> None:
        self.fan_out((event,))

    async def run(self, *, until_turn_end: bool = False) -> TurnEnded | None:
        """Until the session's stream closes, or with `until_turn_end` until a turn ends (the
        rest of that batch is recorded, not drawn). Returns the turn's end, if one came."""
        async for batch in batches(self.session):
            if until_turn_end:
                for i, event in enumerate(batch):
                    if type(event) is TurnEnded:
                        self.fan_out(batch[: i + 1])
                        return event
            self.fan_out(batch)
        return None

    async def turn(self, text: str, extra_blocks: list[dict[str, Any]] | None = None) -> TurnEnded:
        """One prompt, its events fanned out until the turn's end."""
        drained = trio.Event()

        async def pump() -> None:
            await self.run(until_turn_end=True)
            drained.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            ended = await self.session.prompt(text, extra_blocks)
            with trio.move_on_after(DRAIN_SECS):
                await drained.wait()
            nursery.cancel_scope.cancel()
        return ended
