"""The ACP client and session driving real agent subprocesses: the scripted agent (its script
says what to stream, ask, stall or crash), a replayed recording, and the SDK-based agent."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from acp_session_helpers import SCRIPTED_AGENT, SDK_AGENT, Scripted, run_turn, texts

from acp_host.client import AcpClient, AgentStartError, connect_agent
from acp_host.session import (
    CommandsChanged,
    Decision,
    Event,
    HistoryReplay,
    MessageChunk,
    ModeChanged,
    PermissionRequest,
    PermissionRequested,
    PermissionResolved,
    PlanChanged,
    RawUpdate,
    SessionInfoChanged,
    ThoughtChunk,
    ToolCallEvent,
    TurnEnded,
    UsageChanged,
    UserChunk,
)

CLAUDE_OPTIONS = [
    {"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
GEMINI_OPTIONS = [
    {"optionId": "proceed_always", "name": "Allow always", "kind": "allow_always"},
    {"optionId": "proceed_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "cancel", "name": "No", "kind": "reject_once"},
]


@asynccontextmanager
async def connected(argv: list[str], **kwargs: Any) -> AsyncIterator[AcpClient]:
    with trio.fail_after(60):  # a hang is a failure, not a stuck suite
        async with trio.open_nursery() as nursery:
            client = await connect_agent(nursery, argv, **kwargs)
            try:
                yield client
            finally:
                await client.aclose()


def policy_of(kind: str) -> Any:
    async def policy(request: PermissionRequest) -> Decision:
        return Decision(kind, "test")  # type: ignore[arg-type]

    return policy


async def test_streaming_turn_end_to_end(scripted: Scripted, tmp_path: Path) -> None:
    diff = {"type": "diff", "path": str(tmp_path / "notes.md"), "oldText": "a", "newText": "b"}
    argv = scripted.argv(
        {
            "new_session": {"after": [{"commands": [{"name": "init", "description": "Set up"}]}]},
            "prompts": [
                [
                    {"thought": "Let me think."},
                    {"text": "Hello "},
                    {"text": "world"},
                    {"plan": [{"content": "read", "priority": "high", "status": "in_progress"}]},
                    {"tool_call": {"toolCallId": "c1", "title": "Edit notes.md", "kind": "edit",
                                   "status": "pending", "content": [diff]}},
                    {"tool_call_update": {"toolCallId": "c1", "status": "completed"}},
                    {"usage": {"used": 1200, "size": 200000}},
                    {"title": "Greeting"},
                    {"text": "!"},
                ]
            ],
        }
    )
    async with connected(argv) as client:
        assert client.init is not None and client.init.agent_info is not None
        assert client.init.agent_info.name == "scripted-agent"
        session = await client.new_session(tmp_path, [])
        result, events = await run_turn(session, "say hello")
        second, events2 = await run_turn(session, "again")
    assert result == events[-1] and result.stop_reason == "end_turn" and result.ok
    assert [type(e) for e in events] == [
        CommandsChanged, ThoughtChunk, MessageChunk, MessageChunk, PlanChanged, ToolCallEvent,
        ToolCallEvent, UsageChanged, SessionInfoChanged, MessageChunk, TurnEnded,
    ]
    assert texts(events, MessageChunk) == "Hello world!"
    assert texts(events, ThoughtChunk) == "Let me think."
    call = [e for e in events if isinstance(e, ToolCallEvent)][-1].call
    assert (call.title, call.status, call.diffs) == ("Edit notes.md", "completed", [diff])
    assert session.state.plan[0].content == "read"
    assert session.state.usage == UsageChanged(1200, 200000)
    assert session.state.title == "Greeting"
    assert [c.name for c in session.state.commands] == ["init"]
    # Past the script, the agent echoes: a second turn on the same session works.
    assert second.stop_reason == "end_turn" and texts(events2, MessageChunk) == "echo: again"


async def test_tool_call_updates_merge_in_any_order(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"tool_call_update": {"toolCallId": "t1", "status": "in_progress"}},
                    {"tool_call": {"toolCallId": "t1", "title": "Read a.md", "kind": "read", "status": "pending"}},
                    {"tool_call_update": {"toolCallId": "t1", "rawInput": {"path": "a.md"}}},
                    {"tool_call_update": {"toolCallId": "t1", "status": "completed", "rawOutput": "text"}},
                    {"tool_call_update": {"toolCallId": "t1", "status": "completed"}},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        _, events = await run_turn(session, "go")
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [e.created for e in calls] == [True, False, False, False, False]
    assert calls[0].call.title is None and not calls[0].call.announced
    final = calls[-1].call
    assert (final.title, final.kind, final.status) == ("Read a.md", "read", "completed")
    assert final.raw_input == {"path": "a.md"} and final.raw_output == "text" and final.announced


async def test_unknown_and_invalid_updates_arrive_raw(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"update": {"sessionUpdate": "memory_update", "memories": ["x"]}},
                    # Claude's usage update when the LLM omits the cache counts.
                    {"usage": {"used": None, "size": 200000}},
                    {"text": "still here"},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        result, events = await run_turn(session, "go")
    raws = [e for e in events if isinstance(e, RawUpdate)]
    assert [r.update["sessionUpdate"] for r in raws] == ["memory_update", "usage_update"]
    assert "unknown session update" in raws[0].reason and "used" in raws[1].reason
    assert texts(events, MessageChunk) == "still here" and result.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("options", "decision", "expected"),
    [
        (CLAUDE_OPTIONS, "allow_once", "allow"),
        (CLAUDE_OPTIONS, "allow_always", "allow_always"),
        (CLAUDE_OPTIONS, "reject_once", "reject"),
        (CLAUDE_OPTIONS, "reject_always", "reject"),
        (GEMINI_OPTIONS, "allow_once", "proceed_once"),
        (GEMINI_OPTIONS, "allow_always", "proceed_always"),
        (GEMINI_OPTIONS, "reject_once", "cancel"),
    ],
)
async def test_permission_decisions_map_onto_offered_options(
    scripted: Scripted, tmp_path: Path, options: list[dict[str, str]], decision: str, expected: str
) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"tool_call": {"toolCallId": "w1", "title": "Write x.md", "kind": "edit", "status": "pending"}},
                    {"permission": {"toolCall": {"toolCallId": "w1"}, "options": options}, "echo": True},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path, policy=policy_of(decision))
        result, events = await run_turn(session, "go")
    assert scripted.results("permission") == [
        {"result": {"outcome": {"outcome": "selected", "optionId": expected}}}
    ]
    requested = [e.request for e in events if isinstance(e, PermissionRequested)]
    assert len(requested) == 1 and requested[0].had_tool_call
    assert requested[0].tool_call.title == "Write x.md"
    resolved = [e for e in events if isinstance(e, PermissionResolved)]
    assert resolved[0].outcome == {"outcome": "selected", "optionId": expected}
    assert expected in texts(events, MessageChunk) and result.stop_reason == "end_turn"


async def test_permission_without_prior_tool_call(scripted: Scripted, tmp_path: Path) -> None:
    # Gemini asks before announcing the call, arguments as JSON text, no rawInput.
    tool_call = {
        "toolCallId": "mcp_crucible_read_note__17",
        "title": "read_note (crucible MCP Server)",
        "status": "pending",
        "content": [{"type": "content", "content": {"type": "text", "text": '{"path": "a.md"}'}}],
    }
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"permission": {"toolCall": tool_call, "options": GEMINI_OPTIONS}},
                    {"tool_call_update": {"toolCallId": tool_call["toolCallId"], "status": "completed"}},
                ]
            ]
        }
    )
    seen: list[PermissionRequest] = []

    async def policy(request: PermissionRequest) -> Decision:
        seen.append(request)
        return Decision("allow_once")

    async with connected(argv) as client:
        session = await client.new_session(tmp_path, policy=policy)
        result, events = await run_turn(session, "go")
    assert len(seen) == 1 and not seen[0].had_tool_call
    assert seen[0].tool_call.title == "read_note (crucible MCP Server)"
    assert seen[0].tool_call.content[0]["content"]["text"] == '{"path": "a.md"}'
    assert [o.option_id for o in seen[0].options] == ["proceed_always", "proceed_once", "cancel"]
    assert scripted.results("permission")[0]["result"]["outcome"]["optionId"] == "proceed_once"
    final = [e for e in events if isinstance(e, ToolCallEvent)][-1].call
    assert (final.title, final.status) == ("read_note (crucible MCP Server)", "completed")
    assert result.stop_reason == "end_turn"


async def test_cancel_while_permission_pending(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                {
                    "steps": [
                        {"text": "working"},
                        {"permission": {"toolCall": {"toolCallId": "d1", "title": "Delete"}, "options": CLAUDE_OPTIONS}},
                        {"text": " NOT REACHED"},
                    ],
                    "after_cancel": [{"text": " stopped."}],
                }
            ]
        }
    )
    release = trio.Event()
    returned = trio.Event()

    async def slow_policy(request: PermissionRequest) -> Decision:
        # A dialog that ignores the cancel and answers late: the answer must be dropped.
        with trio.CancelScope(shield=True):
            await release.wait()
        returned.set()
        return Decision("allow_once", "too late")

    events: list[Event] = []
    async with connected(argv) as client:
        session = await client.new_session(tmp_path, policy=slow_policy)

        async def consume() -> None:
            async for event in session.events:
                events.append(event)
                if isinstance(event, PermissionRequested):
                    await session.cancel()
                if isinstance(event, TurnEnded):
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            result = await session.prompt("delete it")
        release.set()
        await returned.wait()
        # One more round trip: any late answer would reach the agent before this prompt.
        await run_turn(session, "are you there?")
    assert result.stop_reason == "cancelled" and result.ok, (result, events)
    assert texts(events, MessageChunk) == "working stopped."
    answers = scripted.permission_answers()
    assert [a["result"] for a in answers] == [{"outcome": {"outcome": "cancelled"}}]
    resolved = [e for e in events if isinstance(e, PermissionResolved)]
    assert len(resolved) == 1 and resolved[0].outcome == {"outcome": "cancelled"}
    assert "cancelled" in resolved[0].note
    assert [r.get("stopReason") for r in scripted.records() if r["kind"] == "turn_end"] == [
        "cancelled",
        "end_turn",
    ]


async def test_agent_exit_mid_turn_reports_stderr(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {"prompts": [[{"text": "partial"}, {"crash": {"code": 3, "stderr": "fatal: the model exploded"}}]]}
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        result, events = await run_turn(session, "go")
    assert result.stop_reason is None and result.error is not None
    assert "exit code 3" in result.error and "fatal: the model exploded" in result.error
    assert texts(events, MessageChunk) == "partial"


async def test_agent_that_never_answers_initialize(scripted: Scripted) -> None:
    argv = scripted.argv({"startup": [{"stderr": "waiting for a login"}], "initialize": {"respond": False}})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(AgentStartError) as err:
                await connect_agent(nursery, argv, init_timeout=0.5)
    message = str(err.value)
    assert "did not answer initialize within 0.5 s" in message
    assert str(SCRIPTED_AGENT) in message and "waiting for a login" in message


async def test_agent_that_exits_before_initialize(scripted: Scripted) -> None:
    argv = scripted.argv({"startup": [{"crash": {"code": 7, "stderr": "no API key"}}]})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(AgentStartError) as err:
                await connect_agent(nursery, argv)
    assert "exit code 7" in str(err.value) and "no API key" in str(err.value)


async def test_silent_agent_trips_the_inactivity_watchdog(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv({"prompts": [[{"text": "thinking..."}, {"stall": None}]]})
    async with connected(argv) as client:
        session = await client.new_session(tmp_path, inactivity_timeout=0.5)
        result, events = await run_turn(session, "go")
    assert result.error is not None and "sent nothing for 0.5 s" in result.error
    assert texts(events, MessageChunk) == "thinking..."
    cancels = [r for r in scripted.records() if r["kind"] == "in" and r["frame"].get("method") == "session/cancel"]
    assert len(cancels) == 1


async def test_garbage_and_a_50_mib_line(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "startup": [{"garbage": "Loading model... done"}],
            "prompts": [[{"garbage": "{not json"}, {"big_text_mib": 50}, {"text": "after"}]],
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        result, events = await run_turn(session, "go")
    chunks = [e.text for e in events if isinstance(e, MessageChunk)]
    assert [len(c) for c in chunks] == [50 * 1024 * 1024, 5] and chunks[1] == "after"
    assert result.stop_reason == "end_turn"


async def test_fs_requests_through_the_agent(scripted: Scripted, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.txt").write_text("s3cret")
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"read": {"path": str(work / "new.md")}, "as": "missing"},
                    {"write": {"path": str(work / "new.md"), "content": "one\ntwo\nthree\n"}},
                    {"read": {"path": str(work / "new.md"), "line": 2, "limit": 1}, "as": "line2"},
                    {"read": {"path": str(tmp_path / "secret.txt")}, "as": "escape"},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(work)
        await run_turn(session, "go")
    missing, line2, escape = scripted.results("read")
    assert missing == {"result": {"content": ""}}
    assert line2 == {"result": {"content": "two\n"}}
    assert "error" in escape and str(tmp_path / "secret.txt") in escape["error"]["message"]
    assert "s3cret" not in json.dumps(escape)
    assert (work / "new.md").read_text() == "one\ntwo\nthree\n"


async def test_terminal_requests_through_the_agent(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {
                        "terminal": {
                            "command": sys.executable,
                            "args": ["-c", "print('x' * 100 + 'END')"],
                            "outputByteLimit": 20,
                            "then": ["wait_for_exit", "output", "release", "output"],
                        }
                    },
                    {"terminal": {"command": "sleep", "args": ["60"], "then": ["kill", "wait_for_exit", "release"]}},
                    # Never released by the agent: the session still owns it and kills it.
                    {"terminal": {"command": "sleep", "args": ["3601.5"], "then": []}},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        await run_turn(session, "go")
        assert session.services is not None
        pids = session.services.terminal_pids()
        assert len(pids) == 1 and _alive(pids[0])
    assert not _alive(pids[0])
    assert scripted.results("terminal/wait_for_exit") == [
        {"result": {"exitCode": 0, "signal": None}},
        {"result": {"exitCode": None, "signal": "SIGKILL"}},
    ]
    out, after_release = scripted.results("terminal/output")
    assert out["result"]["truncated"] is True and out["result"]["output"].endswith("xxEND\n")
    assert len(out["result"]["output"]) == 20
    assert "error" in after_release


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (read from /proc, no waiting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _summary(events: list[Event]) -> list[Any]:
    out: list[Any] = []
    for e in events:
        if isinstance(e, MessageChunk | ThoughtChunk):
            out.append((type(e).__name__, e.text))
        elif isinstance(e, ToolCallEvent):
            out.append(("tool", e.call.tool_call_id, e.call.title, e.call.status))
        elif isinstance(e, PermissionRequested):
            out.append(("ask", e.request.tool_call.tool_call_id, [o.option_id for o in e.request.options]))
        elif isinstance(e, PermissionResolved):
            out.append(("answer", e.outcome))
        elif isinstance(e, TurnEnded):
            out.append(("end", e.stop_reason, e.error))
        else:
            out.append((type(e).__name__,))
    return out


async def test_recording_replays_the_same_events(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"thought": "plan"},
                    {"text": "I will edit."},
                    {"tool_call": {"toolCallId": "e1", "title": "Edit", "kind": "edit", "status": "pending"}},
                    {"permission": {"toolCall": {"toolCallId": "e1"}, "options": CLAUDE_OPTIONS}, "echo": True},
                    {"tool_call_update": {"toolCallId": "e1", "status": "completed"}},
                    {"plan": [{"content": "edit", "priority": "low", "status": "completed"}]},
                    {"text": "Done."},
                ],
                [{"text": "second turn"}],
            ]
        }
    )
    recording = tmp_path / "session.jsonl"

    async def scenario(argv: list[str], record_to: Path | None = None) -> list[Any]:
        async with connected(argv, record_to=record_to) as client:
            session = await client.new_session(tmp_path, policy=policy_of("allow_always"))
            _, first = await run_turn(session, "edit please")
            _, second = await run_turn(session, "and?")
        return _summary(first + second)

    live = await scenario(argv, recording)
    header, *records = [json.loads(line) for line in recording.read_text().splitlines()]
    assert header["recording"] == 1 and str(SCRIPTED_AGENT) in header["agent"] and "started" in header
    assert {r["dir"] for r in records} == {"in", "out"}
    assert all(isinstance(r["t_ms"], int | float) and "frame" in r for r in records)
    replayed = await scenario([sys.executable, "-m", "acp_host.recording", "replay", str(recording)])
    assert replayed == live
    assert ("answer", {"outcome": "selected", "optionId": "allow_always"}) in live
    assert live[-1] == ("end", "end_turn", None)


async def test_modes_config_options_and_load(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "new_session": {
                "result": {
                    "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
                    "configOptions": [
                        {"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "fast",
                         "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}]}
                    ],
                }
            },
            "history": [{"user_text": "old question"}, {"text": "old answer"}],
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        assert session.state.current_mode == "ask"
        await session.set_mode("code")
        assert session.state.current_mode == "code"
        event = await session.events.receive()
        assert event == ModeChanged("code")
        options = await session.set_config_option("model", "smart")
        assert [o.current_value for o in options] == ["smart"]
        assert [o.current_value for o in session.state.models] == ["smart"]

        loaded_events: list[Event] = []
        # A short history fits the event buffer, so it can be read after the load.
        loaded = await client.load_session("old-1", tmp_path)
        while True:
            try:
                loaded_events.append(loaded.events.receive_nowait())
            except trio.WouldBlock:
                break
    assert [type(e) for e in loaded_events] == [HistoryReplay, UserChunk, MessageChunk, HistoryReplay]
    assert [e.started for e in loaded_events if isinstance(e, HistoryReplay)] == [True, False]


async def test_a_replay_sent_after_the_load_answer_is_still_history(scripted: Scripted, tmp_path: Path) -> None:
    """Gemini CLI answers session/load before its replay is all sent: what comes after the
    answer, before the agent pauses, is history too, not the live conversation."""
    argv = scripted.argv({"history": [{"user_text": "old question"}],
                          "history_after_answer": [{"text": "old answer, "}, {"sleep": 0.05}, {"text": "late"}]})
    async with connected(argv) as client:
        loaded = await client.load_session("old-1", tmp_path)
        events: list[Event] = []
        while True:
            try:
                events.append(loaded.events.receive_nowait())
            except trio.WouldBlock:
                break
    kinds = [type(e) for e in events]
    assert kinds == [HistoryReplay, UserChunk, MessageChunk, MessageChunk, HistoryReplay], kinds
    assert texts(events, MessageChunk) == "old answer, late"
    assert [e.started for e in events if isinstance(e, HistoryReplay)] == [True, False]


async def test_interop_with_the_sdk_agent(tmp_path: Path) -> None:
    argv = [sys.executable, str(SDK_AGENT)]
    for decision, chosen in (("allow_once", "once"), ("reject_once", "no")):
        async with connected(argv) as client:
            assert client.init is not None and client.init.agent_info is not None
            assert client.init.agent_info.name == "sdk-agent"
            session = await client.new_session(tmp_path, policy=policy_of(decision))
            result, events = await run_turn(session, "hello")
        assert result.stop_reason == "end_turn"
        assert texts(events, MessageChunk) == f"Hello from the SDK agent. permission: {chosen}"
        assert texts(events, ThoughtChunk) == "Thinking about it."
        asked = [e.request for e in events if isinstance(e, PermissionRequested)]
        assert len(asked) == 1 and asked[0].had_tool_call
        calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
        assert calls[0].diffs and calls[0].diffs[0]["newText"] == "hello\n"
        assert calls[-1].status == ("completed" if chosen == "once" else "failed")


async def test_unknown_agent_requests_get_method_not_found(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                [
                    {"request": {"method": "elicitation/create", "params": {"message": "name?"}}},
                    {"request": {"method": "x/brand_new", "params": {}}},
                    {"text": "fine"},
                ]
            ]
        }
    )
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        result, _ = await run_turn(session, "go")
    assert [r["error"]["code"] for r in scripted.results("request")] == [-32601, -32601]
    assert result.stop_reason == "end_turn"


@pytest.mark.parametrize(("crash", "said"), [
    ({"code": 9, "stderr": "out of memory"}, "exited between turns with exit code 9"),
    # A signal's death is said by its name, not as the negative code Python reports.
    ({"signal": "SIGKILL"}, "exited between turns (killed by SIGKILL)"),
])
async def test_agent_exit_reaches_idle_sessions(scripted: Scripted, tmp_path: Path, crash: dict[str, Any],
                                                said: str) -> None:
    argv = scripted.argv({"prompts": [[{"text": "hi"}], [{"crash": crash}]]})
    async with connected(argv) as client:
        session = await client.new_session(tmp_path)
        await run_turn(session, "go")
        # The agent dies in a turn of one session: that turn ends with the error, and
        # the other, idle session is told (no consumer waits forever).
        idle = await client.new_session(tmp_path)
        result, _ = await run_turn(session, "again")
        event = await idle.events.receive()
    assert result.error is not None and said.split(" turns")[1] in result.error, result.error
    assert type(event).__name__ == "SessionError"
    message = event.message  # type: ignore[union-attr]
    assert said in message and "-9" not in message, message
    assert crash.get("stderr", "") in message


async def test_malformed_mcp_server_entry_is_an_error(scripted: Scripted, tmp_path: Path) -> None:
    async with connected(scripted.argv({})) as client:
        with pytest.raises(ValueError, match=r"mcpServers\[0\] \(kiln\): args"):
            await client.new_session(tmp_path, [{"name": "kiln", "command": "cru", "env": []}])
        session = await client.new_session(
            tmp_path,
            [
                {"name": "kiln", "command": "cru", "args": ["mcp"], "env": []},
                {"type": "http", "name": "bridge", "url": "http://127.0.0.1:9/mcp", "headers": []},
            ],
        )
        assert session.session_id
    sent = [r["frame"] for r in scripted.records() if r["kind"] == "in" and r["frame"].get("method") == "session/new"]
    assert sent[-1]["params"]["mcpServers"] == [
        {"name": "kiln", "command": "cru", "args": ["mcp"], "env": []},
        {"type": "http", "name": "bridge", "url": "http://127.0.0.1:9/mcp", "headers": []},
    ]


async def test_flood_through_a_small_buffer_loses_nothing(scripted: Scripted, tmp_path: Path) -> None:
    # 20,000 chunks through a 16-event channel: backpressure, not loss or unbounded memory.
    argv = scripted.argv({"prompts": [[{"flood": {"count": 20000, "text": "x"}}, {"text": "END"}]]})
    received: list[str] = []
    async with connected(argv) as client:
        session = await client.new_session(tmp_path, event_buffer=16)

        async def consume() -> None:
            while True:
                for event in await session.receive_batch():
                    if isinstance(event, MessageChunk):
                        received.append(event.text)
                    elif isinstance(event, TurnEnded):
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            result = await session.prompt("flood")
    assert result.stop_reason == "end_turn"
    assert len(received) == 20001 and received[-1] == "END" and set(received[:-1]) == {"x"}


async def test_cancel_with_the_sdk_agent(tmp_path: Path) -> None:
    async def never(request: PermissionRequest) -> Decision:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    events: list[Event] = []
    async with connected([sys.executable, str(SDK_AGENT)]) as client:
        session = await client.new_session(tmp_path, policy=never)

        async def consume() -> None:
            async for event in session.events:
                events.append(event)
                if isinstance(event, PermissionRequested):
                    await session.cancel()
                if isinstance(event, TurnEnded):
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            result = await session.prompt("hello")
    assert result.stop_reason == "cancelled" and result.ok
    assert texts(events, MessageChunk).endswith("permission: cancelled")
    assert [e.call.status for e in events if isinstance(e, ToolCallEvent)][-1] == "failed"


async def test_recording_with_a_cancel_replays(scripted: Scripted, tmp_path: Path) -> None:
    argv = scripted.argv(
        {
            "prompts": [
                {
                    "steps": [
                        {"text": "about to ask"},
                        {"permission": {"toolCall": {"toolCallId": "k1", "title": "Kill"}, "options": GEMINI_OPTIONS}},
                    ],
                    "after_cancel": [{"text": " cancelled, as you wish."}],
                }
            ]
        }
    )
    recording = tmp_path / "cancel.jsonl"

    async def never(request: PermissionRequest) -> Decision:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def scenario(argv: list[str], record_to: Path | None = None) -> list[Any]:
        events: list[Event] = []
        async with connected(argv, record_to=record_to) as client:
            session = await client.new_session(tmp_path, policy=never)

            async def consume() -> None:
                async for event in session.events:
                    events.append(event)
                    if isinstance(event, PermissionRequested):
                        await session.cancel()
                    if isinstance(event, TurnEnded):
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                await session.prompt("go")
        return _summary(events)

    live = await scenario(argv, recording)
    replayed = await scenario([sys.executable, "-m", "acp_host.recording", "replay", str(recording)])
    assert replayed == live and live[-1] == ("end", "cancelled", None)
    assert ("MessageChunk", " cancelled, as you wish.") in live
