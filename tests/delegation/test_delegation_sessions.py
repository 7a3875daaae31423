"""Delegation through the session API in this process, so a test can be the parent's person
(the asker) and see the child events hook; every agent is still a real subprocess speaking
ACP, and every tool call goes over the bridge's real MCP endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from delegation_helpers import (
    Setup,
    agent_script,
    delegate_step,
    pids_running,
    tool_json,
    tool_step,
    tool_text,
)

from acp_host.registry import resolve_agent
from acp_host.session import Decision, MessageChunk, PermissionResolved, TurnEnded
from crucible.cards import get_card
from crucible.config import load_config
from crucible.delegation import ChildEvent, ChildStatus
from crucible.session_store import SessionStore
from crucible.sessions import (
    BridgeHost,
    CrucibleSession,
    PermissionAsk,
    SessionOptions,
    open_session,
)


class Person:
    """The parent's person: records every question and answers allow_once."""

    def __init__(self) -> None:
        self.asked: list[PermissionAsk] = []

    async def __call__(self, ask: PermissionAsk) -> Decision:
        self.asked.append(ask)
        return Decision("allow_once", "the test person said yes")


@asynccontextmanager
async def parent_session(setup: Setup, asker: Any, card: str | None = None) -> AsyncIterator[CrucibleSession]:
    setup.write()
    config = load_config(setup.config)
    opts = SessionOptions(agent=resolve_agent("parent", profiles=config.agents), kiln=setup.kiln, cwd=setup.tmp,
                          config=config, card=get_card(card, setup.kiln, setup.tmp) if card else None,
                          asker=asker, store=SessionStore(setup.tmp / "sessions"))
    async with BridgeHost().running() as host, open_session(opts, host) as session:
        yield session


async def run_turn(session: CrucibleSession, text: str = "go") -> tuple[TurnEnded, str]:
    out: list[str] = []

    async def drain() -> None:
        async for event in session.events():
            if isinstance(event, MessageChunk):
                out.append(event.text)
            if isinstance(event, TurnEnded):
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        ended = await session.prompt(text)
    return ended, "".join(out)


EXECUTE = {"toolCallId": "t1", "title": "rm -rf build", "kind": "execute", "rawInput": {"command": "rm -rf build"}}
EDIT = {"toolCallId": "t2", "title": "Edit notes.txt", "kind": "edit", "rawInput": {"path": "notes.txt"}}
OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
           {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]


async def test_child_policy_is_bounded_by_the_parent_and_asks_go_to_the_parents_person(setup: Setup) -> None:
    # The parent's card denies `execute`; the child's card allows it: still denied, nobody asked.
    setup.card("boss", "The parent's card", "Be careful.", tools={"execute": "deny"},
               delegation={"enabled": True})
    setup.card("helper", "The child's card", "Help.", agent="child", tools={"execute": "allow"})
    setup.scripts["parent"] = agent_script(delegate_step("helper", "clean up"))
    setup.scripts["child"] = agent_script(
        {"permission": {"toolCall": EXECUTE, "options": OPTIONS}, "as": "execute", "echo": True},
        {"permission": {"toolCall": EDIT, "options": OPTIONS}, "as": "edit", "echo": True})
    person = Person()
    events: list[ChildEvent] = []
    async with parent_session(setup, person, card="boss") as parent:
        parent.on_child_event = events.append
        ended, _ = await run_turn(parent)
    assert ended.stop_reason == "end_turn", ended
    [execute] = setup.results("child", "execute")
    assert execute["result"]["outcome"] == {"outcome": "selected", "optionId": "reject"}
    [edit] = setup.results("child", "edit")
    assert edit["result"]["outcome"] == {"outcome": "selected", "optionId": "allow"}
    # Only the child's `ask` (edit) reached the person, labelled with the chain.
    assert [(a.label, a.key.name, a.title) for a in person.asked] == [("parent › boss › helper", "edit",
                                                                       "Edit notes.txt")]
    reasons = [e.event.decision.reason for e in events
               if isinstance(e.event, PermissionResolved) and e.event.decision is not None]
    assert "parent policy (card boss: execute = deny)" in reasons
    assert {e.label for e in events} == {"parent › boss › helper"}
    assert tool_json(setup.results("parent", "delegate")[0])["status"] == "completed"


async def test_parent_cancel_kills_the_child(setup: Setup) -> None:
    setup.scripts["parent"] = agent_script(delegate_step("child", "work forever"), {"text": "not reached"})
    setup.scripts["child"] = agent_script({"text": "working"}, {"stall": None})
    events: list[ChildEvent] = []
    started = trio.Event()

    def on_child(event: ChildEvent) -> None:
        events.append(event)
        if isinstance(event.event, MessageChunk):
            started.set()

    async with parent_session(setup, Person()) as parent:
        parent.on_child_event = on_child
        async with trio.open_nursery() as nursery:
            async def cancel_when_the_child_works() -> None:
                await started.wait()
                assert pids_running(str(setup.script_path("child")))
                await parent.cancel()

            nursery.start_soon(cancel_when_the_child_works)
            with trio.fail_after(30):
                ended, _ = await run_turn(parent)
        # The turn is over only once the child's process is gone.
        assert not pids_running(str(setup.script_path("child")))
    assert ended.stop_reason == "cancelled", ended
    result = setup.results("parent", "delegate")[0]
    assert result["result"]["isError"]
    assert "the child session was cancelled: the parent turn was cancelled" in tool_text(result)
    finished = [e.event for e in events if isinstance(e.event, ChildStatus) and e.event.status == "finished"]
    assert [f.detail.split(":")[0] for f in finished] == ["cancelled"]


async def test_background_jobs_list_wait_cancel_and_end_with_the_turn(setup: Setup) -> None:
    setup.scripts["parent"] = agent_script(
        delegate_step("quick", "be quick", as_="bg1", background=True),
        tool_step("get_job_result", {"job_id": "job-1", "wait": True}, "wait1"),
        delegate_step("slow", "be slow", as_="bg2", background=True),
        tool_step("list_jobs", {}, "list"),
        tool_step("cancel_job", {"job_id": "job-2"}, "cancel2"),
        tool_step("get_job_result", {"job_id": "job-9"}, "nosuch"),
        delegate_step("slow", "left running", as_="bg3", background=True),
        {"text": "turn over"})
    setup.scripts["quick"] = agent_script({"text": "quick reply"})
    setup.scripts["slow"] = agent_script({"text": "slow start"}, {"stall": None})
    async with parent_session(setup, Person()) as parent:
        ended, text = await run_turn(parent)
        # The turn ended: the job it left running was cancelled and its process is gone.
        assert not pids_running(str(setup.script_path("slow")))
        assert parent.delegation is not None
        assert {j.id: j.status for j in parent.delegation.jobs.values()} == {
            "job-1": "completed", "job-2": "cancelled", "job-3": "cancelled"}
        assert parent.delegation.jobs["job-3"].error == "the child session was cancelled: the parent turn ended"
    assert ended.stop_reason == "end_turn" and "turn over" in text
    started = tool_json(setup.results("parent", "bg1")[0])
    assert (started["job_id"], started["status"], started["reply"]) == ("job-1", "queued", "")
    waited = tool_json(setup.results("parent", "wait1")[0])
    assert waited["status"] == "completed" and waited["reply"] == "quick reply"
    jobs = tool_json(setup.results("parent", "list")[0])["jobs"]
    assert [(j["job_id"], j["target"], j["background"]) for j in jobs] == [("job-1", "quick", True),
                                                                          ("job-2", "slow", True)]
    assert jobs[0]["status"] == "completed" and jobs[1]["status"] in ("queued", "running")
    assert tool_json(setup.results("parent", "cancel2")[0])["status"] == "cancelled"
    assert "no delegated job 'job-9'" in tool_text(setup.results("parent", "nosuch")[0])


async def test_over_the_limit_delegations_queue_or_are_refused(setup: Setup) -> None:
    setup.delegation = {"max_concurrent": 1, "queue": True}
    setup.scripts["parent"] = agent_script(
        delegate_step("sleepy", "one", as_="a", background=True),
        delegate_step("sleepy", "two", as_="b", background=True),
        tool_step("list_jobs", {}, "list"),
        tool_step("get_job_result", {"job_id": "job-2", "wait": True}, "wait2"),
        tool_step("get_job_result", {"job_id": "job-1"}, "get1"))
    setup.scripts["sleepy"] = agent_script({"text": "slept"}, {"sleep": 0.5})
    async with parent_session(setup, Person()) as parent:
        ended, _ = await run_turn(parent)
    assert ended.stop_reason == "end_turn"
    statuses = [j["status"] for j in tool_json(setup.results("parent", "list")[0])["jobs"]]
    assert statuses == ["running", "queued"]
    assert tool_json(setup.results("parent", "wait2")[0])["status"] == "completed"
    assert tool_json(setup.results("parent", "get1")[0])["status"] == "completed"
    # One child at a time: the second agent started only after the first one's turn ended.
    kinds = [e.get("kind") if e.get("kind") != "in" else e["frame"].get("method") for e in setup.entries("sleepy")]
    first_end = kinds.index("turn_end")
    assert kinds.count("initialize") == 2 and kinds.index("initialize", 1) > first_end

    setup.delegation = {"max_concurrent": 1, "queue": False}
    setup.scripts["parent"] = agent_script(
        delegate_step("sleepy", "one", as_="c", background=True),
        delegate_step("sleepy", "two", as_="d"))
    async with parent_session(setup, Person()) as parent:
        await run_turn(parent)
    refused = setup.results("parent", "d")[0]
    assert refused["result"]["isError"]
    assert "1 child sessions are already running, the limit is 1" in tool_text(refused)
    assert "queue = false" in tool_text(refused)


async def test_a_waiting_call_sends_progress_over_mcp(setup: Setup, monkeypatch: Any) -> None:
    """Clients that reset their timeout on progress (OpenCode cuts at 60 s otherwise) keep waiting."""
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    import crucible.delegation

    monkeypatch.setattr(crucible.delegation, "HEARTBEAT_SECS", 0.2)
    setup.scripts["parent"] = agent_script()
    setup.scripts["sleepy"] = agent_script({"text": "slept"}, {"sleep": 1.5})
    setup.write()
    config = load_config(setup.config)
    opts = SessionOptions(agent=resolve_agent("parent", profiles=config.agents), kiln=setup.kiln, cwd=setup.tmp,
                          config=config, asker=Person(), store=SessionStore(setup.tmp / "sessions"))
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async with BridgeHost().running() as host, open_session(opts, host) as parent:
        assert host.app is not None
        [mount] = [m for m in host.app.mounts if m.bridge is parent.bridge]
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {mount.token}"})
        async with Client(streamable_http_client(host.url(mount.base), http_client=http)) as client:
            result = await client.call_tool("delegate_session", {"target": "sleepy", "prompt": "nap"},
                                            progress_callback=on_progress)
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["reply"] == "slept"
    assert len(seen) >= 3, seen
    assert all(m is not None and m.startswith("parent › sleepy: running for") for _, m in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
