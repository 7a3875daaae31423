"""The peer over a real agent process's pipes: the flood agent, huge lines, a dying agent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from acp_host.jsonrpc import ConnectionClosed, JsonRpcPeer
from acp_host.process import AgentProcess

FLOOD_AGENT = Path(__file__).resolve().parents[2] / "fixtures" / "flood_agent.py"


async def test_every_flood_update_arrives_in_order_over_real_pipes() -> None:
    n = 20000
    texts: list[str] = []

    async def on_note(method: str, params: Any) -> None:
        assert method == "session/update"
        texts.append(params["update"]["content"]["text"])

    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, [sys.executable, str(FLOOD_AGENT), str(n)])
        async with proc:
            peer = JsonRpcPeer(proc.stdin, proc.stdout, name="flood", notification_handler=on_note)
            nursery.start_soon(peer.run)
            assert (await peer.request("initialize", {"protocolVersion": 1}))[
                "protocolVersion"
            ] == 1
            session = await peer.request("session/new", {"cwd": "/", "mcpServers": []})
            result = await peer.request(
                "session/prompt", {"sessionId": session["sessionId"], "prompt": []}
            )
            assert result == {"stopReason": "end_turn"}
            assert texts == [f"word{i} " for i in range(n)]
            await peer.aclose()
        assert proc.returncode == 0


async def test_fifty_mib_line_and_garbage_over_a_real_pipe() -> None:
    # An agent that prints a log line, then a 50 MiB notification, then answers.
    code = (
        "import sys, json\n"
        "sys.stdin.readline()\n"
        "out = sys.stdout\n"
        "out.write('Starting agent v1...\\n')\n"
        "out.write(json.dumps({'jsonrpc': '2.0', 'method': 'big', 'params': {'t': 'y' * (50 * 1024 * 1024)}}) + '\\n')\n"
        "out.write(json.dumps({'jsonrpc': '2.0', 'id': 1, 'result': 'done'}) + '\\n')\n"
        "out.flush()\n"
    )
    sizes: list[int] = []

    async def on_note(method: str, params: Any) -> None:
        sizes.append(len(params["t"]))

    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, [sys.executable, "-c", code])
        async with proc:
            peer = JsonRpcPeer(proc.stdin, proc.stdout, name="big", notification_handler=on_note)
            nursery.start_soon(peer.run)
            assert await peer.request("go") == "done"
            assert sizes == [50 * 1024 * 1024]
            assert peer.stats.invalid_lines == 1
            await peer.aclose()


async def test_agent_dying_mid_request_fails_it_with_its_name_and_stderr_is_kept() -> None:
    code = (
        "import sys; sys.stdin.readline(); sys.stderr.write('fatal: out of tokens\\n'); sys.exit(2)"
    )
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, [sys.executable, "-c", code], name="claude-acp")
        async with proc:
            peer = JsonRpcPeer(proc.stdin, proc.stdout, name="claude-acp")
            nursery.start_soon(peer.run)
            with pytest.raises(ConnectionClosed, match="claude-acp"):
                await peer.request("session/prompt", {})
            assert await proc.wait() == 2
            assert proc.stderr_tail().strip() == "fatal: out of tokens"
            await peer.aclose()
