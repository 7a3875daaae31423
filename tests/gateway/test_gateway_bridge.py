"""The gateway behind a bridge, in-process, against real upstream servers: server-everything
(npm, stdio) and an mcp-SDK server over streamable HTTP and SSE on 127.0.0.1. The bridge's
client is the mcp SDK's own client."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from conftest import (
    SECRET,
    UPSTREAM,
    children_of,
    cmdline,
    everything_spec,
    http_spec,
    http_upstream,
    running,
    texts,
    upstream_pid,
    wait_for,
)
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from proc_state import pid_alive  # fixtures/ (on the path from conftest)

from crucible.kiln_mcp import CrucibleKilnBackend
from crucible.permissions import PermissionPolicy, ToolKey
from mcp_bridge.gateway import Gateway, UpstreamSpec, file_root
from mcp_bridge.server import BridgeServer
from mcp_bridge.tools import KILN_TOOLS

KILN_NAMES = {s.name for s in KILN_TOOLS}


def bridge_for(kiln: Path, gateway: Gateway, *, card: dict[str, Any] | None = None, **kw: Any) -> BridgeServer:
    policy = None
    if card is not None:
        rules = PermissionPolicy(card_rules=card, card_name="test")

        def policy(name: str) -> Any:
            return rules.decide(ToolKey(name, bridge=True, read_only=True)).rule

    return BridgeServer(CrucibleKilnBackend(kiln), gateway=gateway, policy=policy,
                        roots=[file_root(str(kiln))], **kw)


async def test_upstream_tools_listed_with_prefix_and_intact(kiln: Path, everything: list[str]) -> None:
    async with Client(StdioServerParameters(command=everything[0], args=everything[1:]), mode="legacy",
                      elicitation_callback=_decline, list_roots_callback=_roots) as direct:
        direct_tools = {t.name: t for t in (await direct.list_tools()).tools}
    async with running(everything_spec(everything)) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
    assert KILN_NAMES <= set(listed)
    upstream = {n for n in listed if n.startswith("everything_")}
    assert upstream == {"everything_" + n for n in direct_tools}
    assert {"everything_echo", "everything_get-sum", "everything_trigger-long-running-operation",
            "everything_get-structured-content", "everything_trigger-elicitation-request"} <= upstream
    for name, tool in direct_tools.items():
        mine = listed["everything_" + name]
        # Everything but the name is the upstream's own: schemas, annotations, output schema.
        assert mine.model_dump(exclude={"name"}) == tool.model_dump(exclude={"name"}), name
    assert listed["everything_get-structured-content"].output_schema is not None


async def _decline(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


async def _roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[])


async def test_calls_reach_the_upstream_and_return(kiln: Path, everything: list[str]) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with running(everything_spec(everything)) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        r = await c.call_tool("everything_echo", {"message": "hello gateway"})
        assert not r.is_error and texts(r) == "Echo: hello gateway"
        r = await c.call_tool("everything_get-sum", {"a": 2, "b": 40})
        assert not r.is_error and "42" in texts(r)
        r = await c.call_tool("everything_get-structured-content", {"location": "New York"})
        assert not r.is_error and r.structured_content is not None and "temperature" in r.structured_content
        r = await c.call_tool("everything_trigger-long-running-operation", {"duration": 1, "steps": 4},
                              progress_callback=on_progress)
        assert not r.is_error, texts(r)
        assert [p[0] for p in progress] == [1, 2, 3, 4] and progress[-1][1] == 4
        # the upstream's own refusal of bad arguments reaches the agent as an error result
        r = await c.call_tool("everything_get-sum", {"a": "two"})
        assert r.is_error
        # kiln tools still work beside them
        r = await c.call_tool("get_kiln_info", {})
        assert not r.is_error and r.structured_content is not None


async def test_blocked_and_allowed_tools(kiln: Path, everything: list[str]) -> None:
    spec = everything_spec(everything, allowed_tools=("get-*", "echo"), blocked_tools=("get-env", "get-tiny*"))
    async with running(spec) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        names = {t.name for t in (await c.list_tools()).tools if t.name.startswith("everything_")}
        assert "everything_echo" in names and "everything_get-sum" in names
        assert "everything_get-env" not in names and "everything_get-tiny-image" not in names
        assert "everything_trigger-long-running-operation" not in names  # not allowed
        for blocked in ("everything_get-env", "everything_trigger-long-running-operation"):
            r = await c.call_tool(blocked, {})
            assert r.is_error and texts(r).startswith(f"Unknown tool '{blocked}'")


async def test_a_card_that_denies_everything_hides_and_refuses(kiln: Path, everything: list[str]) -> None:
    async with running(everything_spec(everything)) as gw:
        bridge = bridge_for(kiln, gw, card={"everything_*": "deny", "everything_echo": "allow"})
        async with Client(bridge.server, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {n for n in names if n.startswith("everything_")} == {"everything_echo"}
            assert KILN_NAMES <= names
            r = await c.call_tool("everything_get-sum", {"a": 1, "b": 2})
            assert r.is_error and texts(r).startswith("Unknown tool 'everything_get-sum'")
            r = await c.call_tool("everything_echo", {"message": "still here"})
            assert texts(r) == "Echo: still here"


async def test_ask_rule_asks_the_person_for_an_upstream_tool(kiln: Path, everything: list[str]) -> None:
    asked: list[str] = []

    async def ask(tool: str, arguments: dict[str, Any]) -> bool:
        asked.append(tool)
        return arguments.get("message") == "yes"

    async with running(everything_spec(everything)) as gw:
        bridge = bridge_for(kiln, gw, card={"everything_e*": "ask"}, ask=ask)
        async with Client(bridge.server, mode="legacy") as c:
            r = await c.call_tool("everything_echo", {"message": "no"})
            assert r.is_error and texts(r) == "The person did not allow tool 'everything_echo' to run"
            r = await c.call_tool("everything_echo", {"message": "yes"})
            assert texts(r) == "Echo: yes"
    assert asked == ["everything_echo", "everything_echo"]


async def test_killed_upstream_is_down_at_once_then_comes_back(kiln: Path, everything: list[str]) -> None:
    async with running(everything_spec(everything)) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        r = await c.call_tool("everything_echo", {"message": "one"})
        assert texts(r) == "Echo: one"
        upstream = gw.upstreams["everything"]
        pid = upstream_pid(os.getpid(), "server-everything")
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: upstream.state != "up", what="the gateway to notice the exit")
        with trio.fail_after(2):  # answered at once, not at the 30 s timeout
            r = await c.call_tool("everything_echo", {"message": "during"})
        assert r.is_error and "MCP server 'everything' is down" in texts(r)
        assert "exited" in texts(r) or "closed" in texts(r)
        await wait_for(lambda: upstream.state == "up", what="the restart")
        r = await c.call_tool("everything_echo", {"message": "after"})
        assert texts(r) == "Echo: after"
        assert gw.status()[0].restarts == 1
        assert upstream_pid(os.getpid(), "server-everything") != pid


async def test_a_crashed_upstream_is_down_with_its_stderr_tail(kiln: Path) -> None:
    spec = UpstreamSpec(name="up", prefix="up_", transport="stdio", command=sys.executable,
                        args=(str(UPSTREAM), "stdio"), auto_reconnect=False)
    async with running(spec) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        assert texts(await c.call_tool("up_add", {"a": 1, "b": 1})) == "2"
        r = await c.call_tool("up_crash", {})
        assert r.is_error
        await wait_for(lambda: gw.upstreams["up"].state == "stopped")
        with trio.fail_after(2):
            r = await c.call_tool("up_add", {"a": 1, "b": 1})
        text = texts(r)
        assert text.startswith("MCP server 'up' is down and will not be restarted (auto_reconnect = false): "), text
        assert "closed" in text and text.endswith("; its last stderr lines: fatal: the database is locked"), text


async def test_an_upstream_writing_an_endless_line_is_cut_off_not_buffered(kiln: Path) -> None:
    from mcp_bridge.upstream_stdio import LINE_MAX_BYTES

    spec = UpstreamSpec(name="up", prefix="up_", transport="stdio", command=sys.executable,
                        args=(str(UPSTREAM), "stdio"), auto_reconnect=False)
    async with running(spec) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        assert texts(await c.call_tool("up_add", {"a": 1, "b": 1})) == "2"
        pid = upstream_pid(os.getpid(), str(UPSTREAM))
        with trio.fail_after(20):  # at the cap, not at the call's 30 s timeout
            r = await c.call_tool("up_flood_line", {"megabytes": LINE_MAX_BYTES // (1 << 20) + 8})
        assert r.is_error
        await wait_for(lambda: gw.upstreams["up"].state == "stopped")
        r = await c.call_tool("up_add", {"a": 1, "b": 1})
        assert r.is_error and "the server wrote a line longer than 32 MiB" in texts(r), texts(r)
        await wait_for(lambda: not pid_alive(pid), what="the runaway server to be stopped")


async def test_slow_call_ends_at_the_servers_timeout_with_the_documented_message(kiln: Path) -> None:
    async with http_upstream() as up, running(http_spec(up, timeout=1)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            with trio.fail_after(10):
                r = await c.call_tool("web_slow", {"seconds": 20})
            assert r.is_error and texts(r) == "Tool 'web_slow' timed out after 1 seconds"
            r = await c.call_tool("web_add", {"a": 1, "b": 2})
            assert not r.is_error and "3" in texts(r)


async def test_default_timeout_is_the_dispatchers(kiln: Path) -> None:
    async with http_upstream() as up, running(http_spec(up)) as gw:
        bridge = bridge_for(kiln, gw, tool_timeout=0.5)
        async with Client(bridge.server, mode="legacy") as c:
            r = await c.call_tool("web_slow", {"seconds": 5})
            assert texts(r) == "Tool 'web_slow' timed out after 0.5 seconds"


async def test_list_changed_from_an_upstream_reaches_the_client(kiln: Path) -> None:
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with http_upstream() as up, running(http_spec(up)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy", message_handler=on_message) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "web_extra" not in names
            r = await c.call_tool("web_grow", {})
            assert texts(r) == "grown"
            with trio.fail_after(10):
                await changed.wait()
            names = {t.name for t in (await c.list_tools(cache_mode="bypass")).tools}
            assert "web_extra" in names
            assert texts(await c.call_tool("web_extra", {})) == "extra!"


async def test_http_upstream_with_a_secret_header_and_a_restart(kiln: Path) -> None:
    async with http_upstream(token=SECRET) as up:
        spec = http_spec(up, headers={"Authorization": f"Bearer {SECRET}"},
                         secrets={SECRET: "{env:GATEWAY_TOKEN}"})
        async with running(spec) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            r = await c.call_tool("web_auth_header", {})
            assert texts(r) == "Bearer {env:GATEWAY_TOKEN}"  # it was sent, and is never shown
            up.kill()
            r = await c.call_tool("web_add", {"a": 1, "b": 1})
            assert r.is_error and "MCP server 'web' is down" in texts(r) and SECRET not in texts(r)
            status = json.dumps([s.__dict__ for s in gw.status()])
            assert SECRET not in status


async def test_an_http_upstreams_oversized_answer_is_not_read_and_the_connection_goes_on(kiln: Path) -> None:
    from mcp_bridge.upstream_http import BODY_MAX_BYTES

    async with http_upstream("http-json") as up, running(http_spec(up)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            r = await c.call_tool("web_big_answer", {"megabytes": 1})  # a large answer under the bound
            assert not r.is_error and len(texts(r)) == 1 << 20
            with trio.fail_after(30):
                r = await c.call_tool("web_big_answer", {"megabytes": BODY_MAX_BYTES // (1 << 20) + 4})
            # An error for that one call, with the limit; the connection goes on (not restarted).
            assert r.is_error and texts(r).startswith(
                "MCP server 'web' refused the call: the server's answer is longer than 32 MiB"), texts(r)[:300]
            assert gw.upstreams["web"].state == "up" and gw.status()[0].restarts == 0
            r = await c.call_tool("web_add", {"a": 2, "b": 3})
            assert not r.is_error and "5" in texts(r)


async def test_sse_upstream(kiln: Path) -> None:
    async with http_upstream("sse") as up, running(http_spec(up, "sse")) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            assert texts(await c.call_tool("web_add", {"a": 20, "b": 22})) == "42"


async def test_resources_and_prompts_are_prefixed_and_routed(kiln: Path) -> None:
    async with http_upstream() as up, running(http_spec(up)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            resources = {r.name: str(r.uri) for r in (await c.list_resources()).resources}
            assert resources["web_greeting"] == "test://greeting"
            assert any(uri.startswith("kiln://notes/") for uri in resources.values())
            read = await c.read_resource("test://greeting")
            content = read.contents[0]
            assert isinstance(content, types.TextResourceContents) and content.text == "hello from upstream"
            prompts = [p.name for p in (await c.list_prompts()).prompts]
            assert "web_haiku" in prompts
            got = await c.get_prompt("web_haiku", {"topic": "bread"})
            message = got.messages[0].content
            assert isinstance(message, types.TextContent) and "haiku about bread" in message.text


async def test_sampling_is_declined_and_roots_are_the_kiln(kiln: Path, everything: list[str]) -> None:
    async with http_upstream() as up, running(http_spec(up), everything_spec(everything)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            r = await c.call_tool("web_ask_sampling", {})
            assert "sampling refused" in texts(r)
            await wait_for(lambda: bool(gw.upstreams["everything"].tools))
            r = await c.call_tool("everything_get-roots-list", {})
            assert kiln.as_uri() in texts(r), texts(r)


async def test_elicitation_goes_to_the_callers_person(kiln: Path) -> None:
    seen: list[tuple[str, str]] = []

    async def person(server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen.append((server, params.message))
        return types.ElicitResult(action="accept", content={"name": "Grace"})

    async with http_upstream() as up, running(http_spec(up)) as gw:
        async with Client(bridge_for(kiln, gw, elicit=person).server, mode="legacy") as c:
            r = await c.call_tool("web_elicit_name", {})
            assert texts(r) == "action=accept content={'name': 'Grace'}"
        assert seen == [("web", "What is your name?")]
        # no one to ask: declined, the call still ends
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            r = await c.call_tool("web_elicit_name", {})
            assert texts(r) == "action=decline content=None"


async def test_elicitation_time_does_not_count_against_the_timeout(kiln: Path) -> None:
    async def slow_person(server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        await trio.sleep(1.5)  # the person takes longer than the tool's whole time limit
        return types.ElicitResult(action="accept", content={"name": "Slow"})

    async with http_upstream() as up, running(http_spec(up, timeout=1)) as gw:
        async with Client(bridge_for(kiln, gw, elicit=slow_person).server, mode="legacy") as c:
            r = await c.call_tool("web_elicit_name", {})
            assert texts(r) == "action=accept content={'name': 'Slow'}"


async def test_discovery_tools_past_the_schema_budget(kiln: Path, everything: list[str]) -> None:
    async with running(everything_spec(everything), schema_budget_bytes=1000) as gw:
        bridge = bridge_for(kiln, gw, card={"everything_get-env": "deny"})
        async with Client(bridge.server, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert gw.listed_bytes() > 1000
            assert not any(n.startswith("everything_") for n in names)
            assert {"discover_tools", "get_tool_schema", "invoke_tool"} <= names and KILN_NAMES <= names
            found = (await c.call_tool("discover_tools", {"query": "sum"})).structured_content
            assert found is not None and [t["name"] for t in found["tools"]] == ["everything_get-sum"]
            everything_all = (await c.call_tool("discover_tools", {"limit": 200})).structured_content
            assert everything_all is not None
            assert "everything_get-env" not in [t["name"] for t in everything_all["tools"]]  # denied: not revealed
            schema = (await c.call_tool("get_tool_schema", {"name": "everything_get-sum"})).structured_content
            assert schema is not None and set(schema["input_schema"]["properties"]) == {"a", "b"}
            r = await c.call_tool("invoke_tool", {"name": "everything_get-sum", "arguments": {"a": 3, "b": 4}})
            assert not r.is_error and "7" in texts(r)
            r = await c.call_tool("invoke_tool", {"name": "everything_get-env", "arguments": {}})
            assert r.is_error and texts(r).startswith("Unknown tool 'everything_get-env'")
    async with running(everything_spec(everything)) as gw:  # off by default: every tool listed
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "everything_echo" in names and "discover_tools" not in names


async def test_upstreams_start_on_the_first_list_not_before(kiln: Path, everything: list[str]) -> None:
    async with running(everything_spec(everything)) as gw:
        bridge = bridge_for(kiln, gw)
        assert gw.status()[0].state == "idle"
        assert not [p for p in _children() if "server-everything" in p]
        async with Client(bridge.server, mode="legacy") as c:
            await c.list_tools()
            assert gw.status()[0].state == "up"


async def test_a_server_that_cannot_start_is_reported_and_the_rest_work(kiln: Path, everything: list[str]) -> None:
    broken = everything_spec(["no-such-mcp-server-program"], name="broken", prefix="broken_", auto_reconnect=False)
    async with running(broken, everything_spec(everything)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "everything_echo" in names
            states = {s.name: s for s in gw.status()}
            assert states["broken"].state == "stopped"
            assert "could not start `no-such-mcp-server-program`" in (states["broken"].last_error or "")


def _children() -> list[str]:
    return [cmdline(p) for p in children_of(os.getpid())]


async def test_a_call_before_a_slow_servers_first_listing_says_it_is_starting(kiln: Path, tmp_path: Path) -> None:
    # The first tools/list waits `startup_wait` for the servers; one slower than that is listed
    # later (list_changed). An agent that calls its tool meanwhile is told it is starting, not down.
    slow = tmp_path / "slow_upstream.py"
    slow.write_text(f"import runpy, sys, time\ntime.sleep(3)\nsys.argv = [{str(UPSTREAM)!r}, 'stdio']\n"
                    f"runpy.run_path({str(UPSTREAM)!r}, run_name='__main__')\n")
    spec = everything_spec([sys.executable, str(slow)], name="slow", prefix="slow_")
    async with running(spec, startup_wait=0.5) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            assert not [t for t in (await c.list_tools()).tools if t.name.startswith("slow_")]
            early = await c.call_tool("slow_add", {"a": 1, "b": 2})
            assert early.is_error
            assert texts(early) == ("MCP server 'slow' is still starting (its first connection is not up yet, "
                                    "so its tools are not listed); try again in a moment")
            with trio.fail_after(30):
                await gw.upstreams["slow"].settled()
            assert texts(await c.call_tool("slow_add", {"a": 1, "b": 2})) == "3"
