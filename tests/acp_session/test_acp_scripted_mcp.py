"""The scripted agent's MCP hook against a real MCP server (mcp SDK), stdio and HTTP: it
lists tools during session/new and calls one in a turn, as the real agents do."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import trio
from acp_session_helpers import Scripted, run_turn

from acp_host.client import connect_agent
from acp_host.session import ToolCallEvent

ECHO_SERVER = Path(__file__).with_name("acp_mcp_echo_server.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_mcp_call_over_stdio_and_http(scripted: Scripted, tmp_path: Path) -> None:
    port = _free_port()
    argv = scripted.argv(
        {
            "new_session": {"list_mcp_tools": True},
            "prompts": [
                [
                    {"mcp_call": {"server": "echo", "tool": "echo", "arguments": {"text": "over stdio"}}, "announce": True},
                    {"mcp_call": {"server": "web", "tool": "add", "arguments": {"a": 2, "b": 3}}},
                    {"mcp_call": {"server": "nowhere", "tool": "x"}},
                ]
            ],
        }
    )
    stdio = {"name": "echo", "command": sys.executable, "args": [str(ECHO_SERVER)], "env": []}
    http = {"type": "http", "name": "web", "url": f"http://127.0.0.1:{port}/mcp", "headers": []}
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            server = await trio.lowlevel.open_process(
                [sys.executable, str(ECHO_SERVER), "--http", str(port)], stderr=subprocess.PIPE
            )
            try:
                assert server.stderr is not None
                seen = b""
                while b"Uvicorn running" not in seen:  # the server says when it listens
                    chunk = await server.stderr.receive_some()
                    assert chunk, seen
                    seen += chunk
                client = await connect_agent(nursery, argv)
                session = await client.new_session(tmp_path, [stdio, http])
                result, events = await run_turn(session, "use the tools")
                await client.aclose()
            finally:
                server.terminate()
                await server.wait()
    tools = {r["server"]: r.get("tools") for r in scripted.records() if r["kind"] == "mcp_tools"}
    assert tools == {"echo": ["echo", "add"], "web": ["echo", "add"]}
    over_stdio, over_http, missing = scripted.results("mcp_call")
    assert over_stdio["result"]["content"] == [{"type": "text", "text": "over stdio"}]
    assert over_http["result"]["structuredContent"] == {"result": 5}
    assert "no MCP server named nowhere" in missing["failed"]
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert calls[-1].status == "completed" and calls[-1].title == "echo: echo"
    assert result.stop_reason == "end_turn"
