"""Upstreams that answer with errors, break, leak or overreach: what the agent and the person
are told, and that one server's trouble stays its own (its connection, the other calls)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import (
    SECRET,
    UPSTREAM,
    http_spec,
    http_upstream,
    running,
    texts,
    upstream_pid,
    wait_for,
    write_config,
)
from mcp.client.client import Client

from crucible.kiln_mcp import CrucibleKilnBackend
from mcp_bridge import gateway as gateway_module
from mcp_bridge.gateway import Gateway, UpstreamSpec, file_root
from mcp_bridge.server import BridgeServer


def bridge_for(kiln: Path, gateway: Gateway) -> BridgeServer:
    return BridgeServer(CrucibleKilnBackend(kiln), gateway=gateway, roots=[file_root(str(kiln))])


def up_spec(mode: str = "stdio", **kw: Any) -> UpstreamSpec:
    spec: dict[str, Any] = {"name": "up", "prefix": "up_", "transport": "stdio", "command": sys.executable,
                            "args": (str(UPSTREAM), mode)}
    spec.update(kw)
    return UpstreamSpec(**spec)


async def test_an_error_answer_with_code_32000_is_that_calls_error_not_a_lost_connection(kiln: Path) -> None:
    # -32000 opens JSON-RPC's server-error range (and is the SDK's own "connection closed"): a
    # server that answers with it refused one call; its connection, and the calls in flight, go on.
    async with running(up_spec()) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        assert texts(await c.call_tool("up_add", {"a": 1, "b": 1})) == "2"
        pid = upstream_pid(os.getpid(), str(UPSTREAM))
        other: list[str] = []

        async def in_flight() -> None:
            async with Client(bridge_for(kiln, gw).server, mode="legacy") as c2:
                other.append(texts(await c2.call_tool("up_slow", {"seconds": 2})))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_flight)
            for code in (-32000, -32001, -32603):
                r = await c.call_tool("up_fail_with", {"code": code, "message": "bad token"})
                assert r.is_error
                assert texts(r) == f"MCP server 'up' refused the call: bad token (error {code})"
        assert other == ["slept 2.0"]
        status = gw.status()[0]
        assert status.state == "up" and status.restarts == 0 and status.last_error is None
        assert texts(await c.call_tool("up_add", {"a": 2, "b": 2})) == "4"
        assert upstream_pid(os.getpid(), str(UPSTREAM)) == pid


@pytest.mark.parametrize("transport", ["http", "http-json"])
async def test_an_http_answer_past_the_bound_fails_that_call_only_and_says_the_limit(kiln: Path,
                                                                                    transport: str) -> None:
    from mcp_bridge.upstream_http import BODY_MAX_BYTES

    async with http_upstream(transport) as up, running(http_spec(up)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            r = await c.call_tool("web_big_answer", {"megabytes": 2})  # large, under the bound (an event, too)
            assert not r.is_error and len(texts(r)) == 2 << 20
            r = await c.call_tool("web_big_answer", {"megabytes": BODY_MAX_BYTES // (1 << 20) + 8})
            assert r.is_error
            assert texts(r).startswith("MCP server 'web' refused the call: the server's answer is longer than "
                                       "32 MiB (the limit for one answer"), texts(r)[:300]
            assert texts(r).endswith("it was not read; the connection goes on"), texts(r)[:300]
            if transport == "http-json":  # its length was said: not read at all
                assert re.search(r"and it says it is \d+\.\d MiB\)", texts(r)), texts(r)[:300]
            status = gw.status()[0]
            assert status.state == "up" and status.restarts == 0, status
            r = await c.call_tool("web_add", {"a": 2, "b": 3})
            assert not r.is_error and "5" in texts(r)


def test_a_prefix_starting_with_lua_is_refused_at_config_load(cru_bin: str, gw_env: dict[str, str]) -> None:
    folder = Path(gw_env["XDG_CONFIG_HOME"]) / "crucible"
    write_config(folder, f'[[mcp.servers]]\nname = "bomb"\nprefix = "lua_bomb_"\n[mcp.servers.transport]\n'
                         f'type = "stdio"\ncommand = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n')
    done = subprocess.run([cru_bin, "mcp", "servers"], env=gw_env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    err = done.stderr
    assert "[[mcp.servers]] 'bomb': prefix: 'lua_bomb_' starts with 'lua_', which is reserved for Crucible's " \
           "Lua plugin tools" in err, err
    assert 'choose a prefix that does not start with \'lua_\', e.g. prefix = "bomb_"' in err, err


async def test_a_tool_named_like_a_kiln_tool_is_left_out_with_a_log_line(kiln: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcp_bridge.gateway")
    async with running(up_spec(prefix="get_")) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        names = [t.name for t in (await c.list_tools()).tools]
        assert names.count("get_kiln_info") == 1 and "get_add" in names
        r = await c.call_tool("get_kiln_info", {})
        assert not r.is_error and "upstream kiln_info" not in texts(r) and r.structured_content is not None
    said = [r.getMessage() for r in caplog.records if "get_kiln_info" in r.getMessage()]
    assert said == ["MCP tool get_kiln_info of server up is left out: Crucible has a tool of that name, and "
                    "Crucible's tool wins (choose another prefix for the server)"]


async def test_secrets_in_an_upstreams_lists_are_redacted_and_a_secret_name_left_out(
        kiln: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcp_bridge.gateway")
    spec = up_spec(env={"UPSTREAM_LEAK": SECRET}, secrets={SECRET: "{env:GATEWAY_TOKEN}"})
    async with running(spec) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        prompts = {p.name: p for p in (await c.list_prompts()).prompts}
        resources = {r.name: r for r in (await c.list_resources()).resources}
        listed = json.dumps([x.model_dump(mode="json") for x in [*tools.values(), *prompts.values(),
                                                                  *resources.values()]])
        assert SECRET not in listed
        assert not [n for n in tools if n.startswith("up_named_")]  # a redacted name could not be called
        assert tools["up_described"].description == "uses the token {env:GATEWAY_TOKEN} to log in"
        assert prompts["up_leaky_prompt"].description == "a prompt that knows {env:GATEWAY_TOKEN}"
        assert resources["up_leaky_resource"].description == "read with {env:GATEWAY_TOKEN}"
        assert texts(await c.call_tool("up_described", {})) == "leaky"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in logged
    assert ("MCP server up: left out the tool 'named_{env:GATEWAY_TOKEN}': its name holds a secret "
            "(shown here by its name)") in logged


async def test_an_unreadable_tool_list_says_why_at_once(kiln: Path) -> None:
    # Its answer to tools/list is nested deeper than the client's JSON parser goes: the attempt
    # fails with that reason (not "still starting", then the handshake's time limit).
    async with running(up_spec("raw-deep", auto_reconnect=False)) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            await c.list_tools()
            await wait_for(lambda: gw.upstreams["up"].state == "stopped")
            r = await c.call_tool("up_deep", {})
    assert r.is_error
    assert texts(r).startswith("MCP server 'up' is down and will not be restarted (auto_reconnect = false): "
                               "a message from the server could not be read: Invalid JSON: recursion limit "
                               "exceeded"), texts(r)
    assert "handshake" not in texts(r)


async def test_an_unreadable_tool_list_is_retried_with_its_reason(kiln: Path) -> None:
    async with running(up_spec("raw-deep")) as gw:
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            await c.list_tools()
            await wait_for(lambda: gw.upstreams["up"].restarts >= 1)
            r = await c.call_tool("up_deep", {})
    assert r.is_error and "could not be read: Invalid JSON: recursion limit exceeded" in texts(r), texts(r)
    assert "still starting" not in texts(r)


async def test_a_line_past_the_bound_in_the_handshake_is_said(kiln: Path) -> None:
    async with running(up_spec("raw-flood-init", auto_reconnect=False)) as gw:
        await gw.ensure_started(wait=60)
        await wait_for(lambda: gw.upstreams["up"].state == "stopped", bound=60)
        status = gw.status()[0]
    assert status.last_error == ("the server wrote a line longer than 32 MiB (not an MCP message): "
                                 "the connection was closed"), status.last_error


async def test_a_crash_during_a_call_is_told_to_that_caller_with_why(kiln: Path) -> None:
    async with running(up_spec(auto_reconnect=False)) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        assert texts(await c.call_tool("up_add", {"a": 1, "b": 1})) == "2"
        r = await c.call_tool("up_crash", {})
    assert r.is_error
    text = texts(r)
    assert text.startswith("MCP server 'up' is down and will not be restarted (auto_reconnect = false): "
                           "the server exited or closed the connection"), text
    assert text.endswith("; its last stderr lines: fatal: the database is locked"), text
    assert "not connected" not in text


async def test_a_tool_name_too_long_with_its_prefix_is_left_out(kiln: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcp_bridge.gateway")
    async with running(up_spec(env={"UPSTREAM_LONG_NAME": "126"})) as gw:  # 129 with `up_`
        async with Client(bridge_for(kiln, gw).server, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
    assert "up_add" in names and not [n for n in names if n.startswith("up_nnn")]
    assert f"MCP server up: left out the tool {('n' * 80)!r}: its name is longer than 128 characters with its " \
           "prefix" in [r.getMessage() for r in caplog.records]


async def test_the_tools_taken_from_one_server_are_bounded(kiln: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger="mcp_bridge.gateway")
    monkeypatch.setattr(gateway_module, "TOOLS_MAX", 3)
    async with running(up_spec()) as gw, Client(bridge_for(kiln, gw).server, mode="legacy") as c:
        names = [t.name for t in (await c.list_tools()).tools if t.name.startswith("up_")]
    assert len(names) == 3
    assert ("MCP server up lists more than 3 tools: the rest are left out (narrow them with allowed_tools)"
            in [r.getMessage() for r in caplog.records])
