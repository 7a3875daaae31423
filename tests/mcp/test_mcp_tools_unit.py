"""The tool layer and `BridgeServer` in-process, through the mcp SDK's client, on a fake backend."""

from __future__ import annotations

import json
import threading
from typing import Any

import mcp_types as types
import pytest
from conftest import FakeBackend, texts
from mcp.client.client import Client
from pydantic import BaseModel

from mcp_bridge.kiln_api import IndexShare, RankedResults
from mcp_bridge.server import BridgeServer, ToolEvent
from mcp_bridge.tools import KILN_TOOLS, NoArgs, ToolContext, ToolSpec, input_schema

READ_ONLY = {"read_note", "read_metadata", "list_notes", "semantic_search", "text_search",
             "property_search", "get_kiln_info", "get_kiln_roots", "get_kiln_stats"}
MODES = ["legacy", "auto"]


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_schemas_and_annotations(mode: str) -> None:
    bridge = BridgeServer(FakeBackend())
    async with Client(bridge.server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {s.name for s in KILN_TOOLS}
    for name, tool in tools.items():
        schema = tool.input_schema
        assert schema["type"] == "object" and "properties" in schema, name
        assert schema["additionalProperties"] is False, name
        assert "anyOf" not in json.dumps(schema), name  # plain schemas for picky clients
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        ann = tool.annotations
        assert ann is not None
        assert ann.read_only_hint is (name in READ_ONLY), name
        if name not in READ_ONLY:
            assert ann.destructive_hint is (name in {"update_note", "delete_note"}), name
    assert tools["get_kiln_info"].input_schema == {"type": "object", "properties": {},
                                                   "additionalProperties": False}
    assert tools["semantic_search"].input_schema["required"] == ["query"]
    assert set(tools["semantic_search"].input_schema["properties"]) == {"query", "limit"}


@pytest.mark.parametrize("mode", MODES)
async def test_bad_arguments_name_the_argument_and_server_keeps_serving(mode: str) -> None:
    bridge = BridgeServer(FakeBackend())
    async with Client(bridge.server, mode=mode) as client:
        r = await client.call_tool("read_note", {})
        assert r.is_error
        assert texts(r) == ("Invalid arguments for tool 'read_note': missing required argument 'path': "
                            "expected a string (kiln-relative path of a markdown note, e.g. 'Projects/Idea.md')")
        r = await client.call_tool("semantic_search", {"query": "x", "limit": "lots"})
        assert r.is_error and "argument 'limit'" in texts(r) and "expected an integer" in texts(r)
        assert '"lots"' in texts(r)
        r = await client.call_tool("semantic_search", {"query": "x", "limit": 0})
        assert r.is_error and "argument 'limit'" in texts(r) and "greater than or equal to 1" in texts(r)
        r = await client.call_tool("read_note", {"path": "A.md", "colour": "red"})
        assert r.is_error and "unknown argument 'colour'" in texts(r) and "path, start_line, end_line" in texts(r)
        r = await client.call_tool("update_note", {"path": "A.md"})
        assert r.is_error and "nothing to update" in texts(r)
        r = await client.call_tool("read_note", {"path": "A.md", "start_line": 5, "end_line": 2})
        assert r.is_error and "end_line (2) is before start_line (5)" in texts(r)
        r = await client.call_tool("no_such_tool", {"a": 1})
        assert r.is_error and texts(r).startswith("Unknown tool 'no_such_tool'. Available tools: create_note")
        # still serving
        r = await client.call_tool("read_note", {"path": "A.md"})
        assert not r.is_error and r.structured_content is not None
        assert r.structured_content["content"] == "# A\nalpha\n"
        assert json.loads(texts(r)) == r.structured_content


async def test_timeout_message_uses_the_configured_seconds() -> None:
    backend = FakeBackend()
    backend.block = threading.Event()
    bridge = BridgeServer(backend, tool_timeout=0.25)
    try:
        async with Client(bridge.server, mode="legacy") as client:
            r = await client.call_tool("get_kiln_info", {})
            assert r.is_error
            assert texts(r) == "Tool 'get_kiln_info' timed out after 0.25 seconds"
            backend.block.set()  # the abandoned worker finishes; the server answers again
            r = await client.call_tool("get_kiln_info", {})
            assert not r.is_error and r.structured_content == {
                "name": "fake", "total_files": 2, "markdown_files": 2, "total_size_bytes": 37}
    finally:
        backend.block.set()


def test_default_timeout_is_30_seconds() -> None:
    assert BridgeServer(FakeBackend()).tool_timeout == 30.0


async def test_unexpected_exception_becomes_a_redacted_error_result() -> None:
    backend = FakeBackend()
    async with Client(BridgeServer(backend).server, mode="legacy") as client:
        r = await client.call_tool("read_note", {"path": "boom.md"})
    assert r.is_error
    assert texts(r) == "Tool 'read_note' failed: RuntimeError: disk error at <kiln>/boom.md"


async def test_folder_null_means_root_and_pagination() -> None:
    backend = FakeBackend({f"N{i:02}.md": "x" for i in range(5)} | {"Sub/S.md": "y"})
    async with Client(BridgeServer(backend).server, mode="legacy") as client:
        for folder in (None, "null", "", "/"):
            args: dict[str, Any] = {"limit": 4} if folder is None else {"folder": folder, "limit": 4}
            r = await client.call_tool("list_notes", args)
            assert r.structured_content is not None
            assert r.structured_content["total"] == 6
            assert [n["path"] for n in r.structured_content["notes"]] == ["N00.md", "N01.md", "N02.md", "N03.md"]
            assert r.structured_content["next_cursor"] == "4"
        r = await client.call_tool("list_notes", {"cursor": "4", "limit": 4})
        assert r.structured_content is not None
        assert [n["path"] for n in r.structured_content["notes"]] == ["N04.md", "Sub/S.md"]
        assert r.structured_content["next_cursor"] is None
        r = await client.call_tool("list_notes", {"pattern": "S*"})
        assert r.structured_content is not None
        assert [n["path"] for n in r.structured_content["notes"]] == ["Sub/S.md"]
        r = await client.call_tool("list_notes", {"cursor": "garbage"})
        assert r.is_error and "argument 'cursor'" in texts(r)
    assert backend.calls.count("list:''") == 7


async def test_policy_hides_denied_tools_and_refuses_calls_observer_sees_all() -> None:
    events: list[ToolEvent] = []
    asked: list[str] = []

    async def ask(tool: str, arguments: dict[str, Any]) -> bool:
        asked.append(tool)
        return False

    def policy(name: str) -> Any:
        return {"delete_note": "deny", "create_note": "ask"}.get(name, "allow")

    backend = FakeBackend()
    bridge = BridgeServer(backend, policy=policy, ask=ask, observer=events.append)
    async with Client(bridge.server, mode="legacy") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "delete_note" not in names and "create_note" in names
        r = await client.call_tool("delete_note", {"path": "A.md"})
        assert r.is_error and texts(r).startswith("Unknown tool 'delete_note'")
        assert "A.md" in backend.notes
        r = await client.call_tool("create_note", {"path": "C.md", "content": "c"})
        assert r.is_error and texts(r) == "The person did not allow tool 'create_note' to run"
        assert "C.md" not in backend.notes and asked == ["create_note"]
        r = await client.call_tool("get_kiln_roots", {})
        assert r.structured_content == {"roots": [{"uri": "kiln://notes/", "name": "fake"}]}
    kinds = [(e.kind, e.tool, e.decision) for e in events]
    assert kinds == [("list", None, None), ("call", "delete_note", "deny"),
                     ("call", "create_note", "ask"), ("call", "get_kiln_roots", "allow")]
    assert events[0].tools == names
    assert events[1].result is not None and events[1].result.is_error


class EchoArgs(BaseModel):
    model_config = {"extra": "forbid"}
    text: str


class EchoResult(BaseModel):
    echoed: str
    session: str


async def _echo(ctx: ToolContext, args: EchoArgs) -> EchoResult:
    return EchoResult(echoed=args.text, session=str(ctx.extra["session_id"]))


async def test_extra_tools_per_instance() -> None:
    spec = ToolSpec("echo_session", "Echo with the session id.", EchoArgs, EchoResult, _echo, read_only=True)
    a = BridgeServer(FakeBackend(), extra={"session_id": "s-1"})
    a.add_tool(spec)
    b = BridgeServer(FakeBackend(), extra={"session_id": "s-2"})
    async with Client(a.server, mode="legacy") as ca, Client(b.server, mode="legacy") as cb:
        r = await ca.call_tool("echo_session", {"text": "hi"})
        assert r.structured_content == {"echoed": "hi", "session": "s-1"}
        assert "echo_session" not in [t.name for t in (await cb.list_tools()).tools]
        r = await cb.call_tool("echo_session", {"text": "hi"})
        assert r.is_error


async def test_first_semantic_search_reports_progress_while_the_index_opens() -> None:
    backend = FakeBackend()
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(BridgeServer(backend).server, mode="legacy") as client:
        r = await client.call_tool("semantic_search", {"query": "alpha", "limit": 1}, progress_callback=on_progress)
        assert not r.is_error and backend.opened
        assert r.structured_content == {"results": [
            {"path": "A.md", "title": "A.md", "score": 1.0, "heading": None, "snippet": "# A\nalpha\n"}],
            "index": {"embedded": 1.0, "notes": 2}}
        assert json.loads(texts(r)) == r.structured_content  # complete index: no extra line
        first = len(seen)
        await client.call_tool("semantic_search", {"query": "alpha"}, progress_callback=on_progress)
    assert first >= 3 and seen[0][2] == "Opening the kiln's search index (first search)"
    assert (1.0, 2.0, "loading") in seen
    assert len(seen) == first  # the second search loads nothing


async def test_a_partial_index_says_so_in_one_line() -> None:
    class Partial(FakeBackend):
        def semantic_search(self, query: str, limit: int) -> RankedResults:
            found = super().semantic_search(query, limit)
            found.index = IndexShare(embedded=0.34, notes=10000)
            return found

    async with Client(BridgeServer(Partial()).server, mode="legacy") as client:
        r = await client.call_tool("semantic_search", {"query": "alpha", "limit": 1})
    assert not r.is_error and r.structured_content is not None
    assert r.structured_content["index"] == {"embedded": 0.34, "notes": 10000}
    first, line = [c.text for c in r.content if isinstance(c, types.TextContent)]
    assert json.loads(first) == r.structured_content
    assert line.startswith("Index: 34% of the kiln's 10000 notes are embedded so far;")
    assert r.structured_content["notice"] == line  # what Claude Code's model reads


def test_no_arg_schema_is_never_empty() -> None:
    assert input_schema(NoArgs) == {"type": "object", "properties": {}, "additionalProperties": False}


class CardPrompts:
    """What the cards issue will plug in: cards as MCP prompts."""

    def list_prompts(self) -> list[types.Prompt]:
        return [types.Prompt(name="librarian", description="Finds notes")]

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        text = f"You are the {name}. Topic: {(arguments or {}).get('topic', '')}"
        return types.GetPromptResult(messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=text))])


async def test_prompt_hook_serves_prompts_only_when_given() -> None:
    async with Client(BridgeServer(FakeBackend(), prompts=CardPrompts()).server, mode="legacy") as client:
        assert [p.name for p in (await client.list_prompts()).prompts] == ["librarian"]
        got = await client.get_prompt("librarian", {"topic": "bread"})
        content = got.messages[0].content
        assert isinstance(content, types.TextContent) and content.text == "You are the librarian. Topic: bread"
    async with Client(BridgeServer(FakeBackend()).server, mode="legacy") as client:
        assert client.server_capabilities.prompts is None


async def test_a_tools_own_timeout_error_is_not_reported_as_ours() -> None:
    async def raises(ctx: ToolContext, args: NoArgs) -> EchoResult:
        raise TimeoutError("upstream socket timed out")

    bridge = BridgeServer(FakeBackend(), tools=[ToolSpec("slow_upstream", "x", NoArgs, EchoResult, raises,
                                                         read_only=True)])
    async with Client(bridge.server, mode="legacy") as client:
        r = await client.call_tool("slow_upstream", {})
    assert r.is_error and texts(r) == "Tool 'slow_upstream' failed: TimeoutError: upstream socket timed out"


async def test_a_failing_watcher_does_not_stop_the_server() -> None:
    class NoWatch(FakeBackend):
        async def watch_changes(self, on_change: Any, on_armed: Any = None) -> None:
            raise OSError("OS file watch limit reached under /home/someone/notes")

    bridge = BridgeServer(NoWatch())
    await bridge.run_watcher()  # returns (logged), instead of raising into the serving task group
    async with Client(bridge.server, mode="legacy") as client:
        assert not (await client.call_tool("get_kiln_info", {})).is_error
