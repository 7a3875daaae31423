"""The one event pipeline (crucible/events.py) and the printers of `cru chat -p`
(crucible/renderers.py): batches read in one place, recorded once, fanned out by type."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from acp_host.session import (
    AcpSession,
    MessageChunk,
    PermissionRequest,
    PermissionResolved,
    PlanChanged,
    ThoughtChunk,
    ToolCall,
    ToolCallEvent,
    TurnEnded,
    UsageChanged,
    UserChunk,
)
from crucible.events import (
    ChildEvent,
    ChildStatus,
    Notice,
    Pipeline,
    Renderer,
    TranscriptRecorder,
    saved_events,
)
from crucible.renderers import JsonPrinter, TextPrinter, event_json
from crucible.session_store import SessionMeta, SessionStore, message_records

REPO = Path(__file__).resolve().parents[2]
FLOOD = REPO / "fixtures" / "flood_agent.py"


def chunk(text: str) -> MessageChunk:
    return MessageChunk(text, {"type": "text", "text": text})


class Kept(Renderer):
    """Keeps what it is given, batch by batch; draws only messages and tool calls."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.drawn: list[str] = []

    def render(self, events: Any) -> None:
        self.batches.append(list(events))
        super().render(events)

    def message(self, event: MessageChunk) -> None:
        self.drawn.append(f"message:{event.text}")

    def tool_call(self, event: ToolCallEvent) -> None:
        self.drawn.append(f"tool:{event.call.title}")

    def notice(self, event: Notice) -> None:
        self.drawn.append(f"notice:{event.text}")

    def child(self, event: ChildEvent) -> None:
        self.drawn.append(f"child:{event.label}")


def test_a_renderer_gets_each_event_by_its_type_and_skips_what_it_does_not_draw() -> None:
    kept = Kept()
    kept.render([chunk("a"), ThoughtChunk("hm", {}), UsageChanged(1, 2),
                 ToolCallEvent(ToolCall("t1", title="Read"), True), object(), chunk("b")])
    assert kept.drawn == ["message:a", "tool:Read", "message:b"]


class FakeConnection:
    async def request(self, method: str, params: Any) -> Any:
        raise AssertionError("not used")

    async def notify(self, method: str, params: Any) -> None:
        pass

    async def describe_exit(self, when: str = "") -> str:
        return "gone"


class FakeSession:
    """What the pipeline reads of a CrucibleSession: its ACP session and its transcript writer."""

    def __init__(self, acp: AcpSession, store: SessionStore) -> None:
        self.acp = acp
        self.id = "20261203-120000-abcdef"
        self.writer = store.create(SessionMeta(id=self.id, agent="flood", created=0, updated=0, cwd="/"))
        self.on_notice: Any = None
        self.on_child_event: Any = None


async def test_the_pipeline_reads_in_batches_records_once_and_fans_out(tmp_path: Path) -> None:
    acp = AcpSession(FakeConnection(), "s1", event_buffer=4096)
    store = SessionStore(tmp_path)
    session = FakeSession(acp, store)
    first, second = Kept(), Kept()
    pipeline = Pipeline(session, [first, second])  # type: ignore[arg-type]
    n = 3000
    for i in range(n):  # queued before anyone reads, as under a flood
        assert acp.handle_update_nowait({"update": {"sessionUpdate": "agent_message_chunk",
                                                    "content": {"type": "text", "text": f"w{i} "}}})
    # What does not come from the agent's stream joins the same fan-out.
    session.on_notice("the bridge asked")
    session.on_child_event(ChildEvent("a › b", "job-1", None, 1, ChildStatus("queued")))
    await acp.aclose()
    assert await pipeline.run() is None
    expected = ["notice:the bridge asked", "child:a › b"] + [f"message:w{i} " for i in range(n)]
    assert first.drawn == second.drawn == expected
    # Read in batches: the 3000 queued chunks came in one read, not one wake-up each.
    assert max(len(b) for b in first.batches) == n
    session.writer.close()
    records = list(store.events(session.id))
    assert [r["type"] for r in records] == ["agent_message"]  # recorded once, the run joined
    assert records[0]["text"] == "".join(f"w{i} " for i in range(n))


class CountingIO(io.StringIO):
    def __init__(self, log: list[str], name: str) -> None:
        super().__init__()
        self.log, self.name = log, name

    def write(self, s: str) -> int:
        self.log.append(f"{self.name}:write")
        return super().write(s)

    def flush(self) -> None:
        self.log.append(f"{self.name}:flush")


def test_the_text_printer_writes_a_batch_at_once_and_stdout_before_stderr() -> None:
    log: list[str] = []
    out, err = CountingIO(log, "out"), CountingIO(log, "err")
    printer = TextPrinter(out, err)
    printer.render([chunk(f"{i} ") for i in range(1000)])
    assert log == ["out:write", "out:flush"]
    log.clear()
    printer.render([chunk("before the tool \x1b[31m"), ToolCallEvent(ToolCall("t1", title="Read", kind="read"), True),
                    chunk("after"), TurnEnded("end_turn")])
    assert log == ["out:write", "out:flush", "err:write", "err:flush", "out:write", "out:flush",
                   "out:write", "out:flush"]
    assert out.getvalue().endswith("999 before the tool ^[[31mafter\n")
    assert err.getvalue() == "[tool] Read (read): pending\n"


def _old_event_json(event: Any) -> dict[str, Any]:
    """The format `--format json` always printed: the event's fields, by dataclasses.asdict."""
    name = type(event).__name__
    kind = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return {"type": kind, **json.loads(json.dumps(asdict(event), default=lambda v: v.model_dump(
        mode="json", by_alias=True, exclude_none=True) if hasattr(v, "model_dump") else str(v)))}


def test_the_json_printer_keeps_the_format_of_every_event() -> None:
    from acp import schema

    from crucible.redaction import forget_all

    # Secrets other tests of this process remembered (bridge tokens) would hold back a chunk's
    # end that could begin one and split it: this test is about the format only.
    forget_all()

    events: list[Any] = [
        MessageChunk("é\n", {"type": "text", "text": "é\n"}, "m1"), ThoughtChunk("hm", {"type": "text", "text": "hm"}),
        UserChunk("hi", {"type": "text", "text": "hi"}),
        PlanChanged((schema.PlanEntry(content="step", priority="high", status="pending"),)),
        ToolCallEvent(ToolCall("t1", title="Edit", kind="edit", status="completed"), False),
        TurnEnded("end_turn"),
    ]
    for event in events:
        assert event_json(event) == _old_event_json(event)
    out = io.StringIO()
    JsonPrinter(out).render([*events, Notice("[warning] ü"),
                             ChildEvent("a › b", "job-1", "s2", 1, ChildStatus("started", "b"))])
    lines = out.getvalue().splitlines()
    assert lines[:len(events)] == [json.dumps(_old_event_json(e), ensure_ascii=False) for e in events]
    assert json.loads(lines[-2]) == {"type": "note", "message": "[warning] ü"}
    assert json.loads(lines[-1]) == {"type": "child_event", "label": "a › b", "job": "job-1", "session": "s2",
                                     "depth": 1, "event": {"type": "child_status", "status": "started",
                                                           "detail": "b"}}


def test_a_saved_transcript_becomes_the_conversations_events_again(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    writer = store.create(SessionMeta(id="s1", agent="a", created=0, updated=0, cwd="/"))
    recorder = TranscriptRecorder(writer)
    request = PermissionRequest(1, "s", ToolCall("t1", title="Edit"), (), True)
    writer.append({"type": "user_message", "text": "first"})
    recorder.render([chunk("Hel"), chunk("lo"), ThoughtChunk("hm", {}),
                     ToolCallEvent(ToolCall("t1", title="Edit", kind="edit", status="pending"), True),
                     PermissionResolved(request, {"outcome": "cancelled"}, None, "no turn"),
                     ToolCallEvent(ToolCall("t1", title="Edit", kind="edit", status="completed"), False),
                     TurnEnded("end_turn")])
    writer.append({"type": "user_message", "text": "second"})
    writer.close()
    events = saved_events(store.events("s1"))
    assert [(type(e).__name__, getattr(e, "text", None)) for e in events] == [
        ("UserChunk", "first"), ("MessageChunk", "Hello"), ("ThoughtChunk", "hm"), ("ToolCallEvent", None),
        ("ToolCallEvent", None), ("UserChunk", "second")]
    first_call, last_call = events[3], events[4]
    assert isinstance(first_call, ToolCallEvent) and isinstance(last_call, ToolCallEvent)
    assert first_call.created and not last_call.created and last_call.call.status == "completed"
    # Two saved messages of the person stay two messages.
    assert events[0].message_id != events[5].message_id  # type: ignore[union-attr]


def test_chat_p_shows_a_whole_flood_in_order(tmp_path: Path, clean_env: dict[str, str], cru_bin: str) -> None:
    n = 20000
    (tmp_path / "kiln").mkdir()
    argv = [cru_bin, "chat", "--agent-command", f"{sys.executable} {FLOOD} {n}", "--kiln", str(tmp_path / "kiln"),
            "-p", "go"]
    text = subprocess.run(argv, env=clean_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout == "".join(f"word{i} " for i in range(n)) + "\n"
    js = subprocess.run([*argv, "--format", "json"], env=clean_env, capture_output=True, text=True, timeout=120,
                        cwd=tmp_path)
    assert js.returncode == 0, js.stderr
    lines = [json.loads(line) for line in js.stdout.splitlines()]
    assert [e["text"] for e in lines[:-1]] == [f"word{i} " for i in range(n)]
    assert lines[-1]["type"] == "turn_ended" and lines[-1]["stop_reason"] == "end_turn"
    # Each run saved its flood once, as one message (written in parts when a timed flush cut it).
    store = SessionStore(Path(clean_env["XDG_DATA_HOME"]) / "crucible" / "sessions")
    assert len(store.list()) == 2
    for meta in store.list():
        messages = [r for r in message_records(store.events(meta.id)) if r["type"] == "agent_message"]
        assert [m["text"] for m in messages] == ["".join(f"word{i} " for i in range(n))]

