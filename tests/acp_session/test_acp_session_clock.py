"""Turn timing in zero wall time: the client against an in-memory agent (a JsonRpcPeer on
the other end of a trio memory stream pair) under trio's autojump clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from acp_session_helpers import run_turn

from acp_host.client import AcpClient
from acp_host.jsonrpc import JsonRpcError, JsonRpcPeer
from acp_host.session import (
    AcpSession,
    Decision,
    MessageChunk,
    PermissionRequest,
    PermissionResolved,
)

Prompt = Callable[[JsonRpcPeer, dict[str, Any]], Awaitable[Any]]
OPTIONS = [
    {"optionId": "ok", "name": "Allow", "kind": "allow_once"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


@asynccontextmanager
async def in_memory_agent(
    on_prompt: Prompt, tmp_path: Path, cancelled: trio.Event | None = None, **session_kwargs: Any
) -> AsyncIterator[AcpSession]:
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    agent = JsonRpcPeer(agent_stream, agent_stream, name="agent")
    cancels: list[Any] = []

    async def agent_requests(method: str, params: Any) -> Any:
        if method == "initialize":
            return {"protocolVersion": 1, "agentCapabilities": {}}
        if method == "session/new":
            return {"sessionId": "s1"}
        if method == "session/prompt":
            return await on_prompt(agent, params)
        raise JsonRpcError(-32601, method)

    async def agent_notifications(method: str, params: Any) -> None:
        cancels.append(params)
        if method == "session/cancel" and cancelled is not None:
            cancelled.set()

    agent.request_handler = agent_requests
    agent.notification_handler = agent_notifications
    async with trio.open_nursery() as nursery:
        peer = JsonRpcPeer(client_stream, client_stream, name="client")
        client = AcpClient(peer, nursery)
        nursery.start_soon(agent.run)
        nursery.start_soon(peer.run)
        await client.initialize()
        session = await client.new_session(tmp_path, **session_kwargs)
        session.agent_cancels = cancels  # type: ignore[attr-defined]
        yield session
        await client.aclose()
        await agent.aclose()


async def say(agent: JsonRpcPeer, text: str) -> None:
    await agent.notify(
        "session/update",
        {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}},
    )


async def test_waiting_for_the_person_does_not_trip_the_watchdog(autojump_clock: Any, tmp_path: Path) -> None:
    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        answer = await agent.request(
            "session/request_permission",
            {"sessionId": "s1", "toolCall": {"toolCallId": "t"}, "options": OPTIONS},
        )
        await say(agent, f"got {answer['outcome']['optionId']}")
        return {"stopReason": "end_turn"}

    async def slow_person(request: PermissionRequest) -> Decision:
        await trio.sleep(1000)  # virtual time: the person thinks for a long while
        return Decision("allow_once")

    async with in_memory_agent(on_prompt, tmp_path, policy=slow_person, inactivity_timeout=10) as session:
        start = trio.current_time()
        result, events = await run_turn(session, "go")
        elapsed = trio.current_time() - start
    assert result.ok and result.stop_reason == "end_turn"
    assert [e.text for e in events if isinstance(e, MessageChunk)] == ["got ok"]
    assert elapsed >= 1000


async def test_silence_trips_the_watchdog_at_the_timeout(autojump_clock: Any, tmp_path: Path) -> None:
    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        await say(agent, "starting")
        await trio.sleep(5)
        await say(agent, "still going")
        await trio.sleep_forever()

    async with in_memory_agent(on_prompt, tmp_path, inactivity_timeout=60) as session:
        start = trio.current_time()
        result, events = await run_turn(session, "go")
        elapsed = trio.current_time() - start
        cancels = list(session.agent_cancels)  # type: ignore[attr-defined]
    assert result.error is not None and "sent nothing for 60 s" in result.error
    assert 65 <= elapsed < 66  # the last activity came at 5 s
    assert [e.text for e in events if isinstance(e, MessageChunk)] == ["starting", "still going"]
    assert {"sessionId": "s1"} in cancels


async def test_agent_ignoring_cancel_ends_after_cancel_timeout(autojump_clock: Any, tmp_path: Path) -> None:
    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        # Deaf to $/cancel_request too (for an hour of virtual time, so the test can end).
        with trio.CancelScope(shield=True):
            await say(agent, "busy")
            await trio.sleep(3600)

    async with in_memory_agent(on_prompt, tmp_path, inactivity_timeout=300, cancel_timeout=20) as session:
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await trio.sleep(1)
                await session.cancel()

            nursery.start_soon(cancel_soon)
            start = trio.current_time()
            result, _ = await run_turn(session, "go")
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    assert result.error is not None and "within 20 s of the cancel" in result.error
    assert 21 <= elapsed < 22


async def test_permission_after_the_turn_is_answered_cancelled(autojump_clock: Any, tmp_path: Path) -> None:
    late_answers: list[Any] = []
    answered = trio.Event()

    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        async def ask_late() -> None:
            await trio.sleep(1)
            late_answers.append(
                await agent.request(
                    "session/request_permission",
                    {"sessionId": "s1", "toolCall": {"toolCallId": "late"}, "options": OPTIONS},
                )
            )
            answered.set()

        agent.start_soon(ask_late)
        return {"stopReason": "end_turn"}

    async def allow(request: PermissionRequest) -> Decision:
        return Decision("allow_once")

    async with in_memory_agent(on_prompt, tmp_path, policy=allow) as session:
        result, _ = await run_turn(session, "go")
        await answered.wait()
        events = []
        while True:
            try:
                events.append(session.events.receive_nowait())
            except trio.WouldBlock:
                break
    assert result.stop_reason == "end_turn"
    assert late_answers == [{"outcome": {"outcome": "cancelled"}}]
    resolved = [e for e in events if isinstance(e, PermissionResolved)]
    assert resolved and resolved[0].note == "no turn in progress"


async def test_cancel_answered_with_request_cancelled_error(autojump_clock: Any, tmp_path: Path) -> None:
    cancelled = trio.Event()

    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        await say(agent, "working")
        await cancelled.wait()
        raise JsonRpcError(-32800, "request cancelled")  # not the stopReason the spec asks for

    async with in_memory_agent(on_prompt, tmp_path, cancelled=cancelled) as session:
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await trio.sleep(1)
                await session.cancel()

            nursery.start_soon(cancel_soon)
            result, _ = await run_turn(session, "go")
    assert result.ok and result.stop_reason == "cancelled"


async def test_agent_error_is_shown_with_its_data(autojump_clock: Any, tmp_path: Path) -> None:
    async def on_prompt(agent: JsonRpcPeer, params: Any) -> Any:
        raise JsonRpcError(-32603, "Internal error", {"details": "Unable to connect to API\x1b[31m"})

    async with in_memory_agent(on_prompt, tmp_path) as session:
        result, _ = await run_turn(session, "go")
    assert result.error is not None
    assert "Internal error (code -32603)" in result.error and "Unable to connect to API" in result.error
    assert "\x1b" not in result.error  # control characters never reach the terminal
