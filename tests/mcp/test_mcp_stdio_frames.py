"""`cru mcp` over real pipes, fed lines an MCP client should not send: each is answered with a
JSON-RPC error (the request's own id when it has one, else null) instead of leaving the client
waiting, a lone surrogate is read as U+FFFD, an over-long line is skipped and refused, and the
next request is served."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from mcp_bridge.server import MAX_FRAME_ENV

INIT = [
    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


class Wire:
    """The client's end of `cru mcp`'s stdin and stdout: raw lines out, JSON replies in."""

    def __init__(self, proc: trio.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.stdin, self.stdout = proc.stdin, proc.stdout
        self._buf = b""

    async def send(self, *lines: bytes | dict[str, Any]) -> None:
        data = b"".join((json.dumps(x).encode() if isinstance(x, dict) else x) + b"\n" for x in lines)
        await self.stdin.send_all(data)

    async def reply(self) -> dict[str, Any]:
        with trio.fail_after(30):
            while b"\n" not in self._buf:
                chunk = await self.stdout.receive_some(65536)
                assert chunk, "cru mcp closed its stdout"
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def replies(self, n: int) -> list[dict[str, Any]]:
        return [await self.reply() for _ in range(n)]


@asynccontextmanager
async def cru_mcp(cru_bin: str, kiln: Path, env: dict[str, str]) -> AsyncIterator[Wire]:
    proc = await trio.lowlevel.open_process(
        [cru_bin, "mcp", "--kiln", str(kiln)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env)
    try:
        wire = Wire(proc)
        await wire.send(*INIT)
        assert (await wire.reply())["id"] == 0
        yield wire
    finally:
        assert proc.stdin is not None
        await proc.stdin.aclose()
        proc.terminate()
        await proc.wait()


def error_of(reply: dict[str, Any]) -> tuple[Any, int, str]:
    assert "error" in reply, reply
    return reply["id"], reply["error"]["code"], reply["error"]["message"]


async def test_every_unreadable_line_is_answered_and_the_next_request_served(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    async with cru_mcp(cru_bin, mcp_kiln, cru_env) as wire:
        # Each line alone, its answer read before the next goes: the answers' order is theirs.
        cases: list[tuple[bytes, Any, int, str]] = [
            (b"not json", None, -32700, "not JSON: "),
            (b"[1,2,3]", None, -32600, "a batch (a JSON array) is not read"),
            (b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":"x"}',
             3, -32600, "the request's params must be an object"),
            (b'{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"n":' + b"9" * 5000 + b"}}",
             "big", -32700, "numbers of more than 4300 digits are not read"),
            (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"n":' + b"[" * 250 + b"]" * 250 + b"}}",
             5, -32700, "JSON nested 200 deep or more is not read"),
            (b'{"jsonrpc":"2.0","method":"notifications/progress","params":"x"}',
             None, -32600, "the notification's params must be an object"),
            (b'{"id":6}', None, -32600, "the message has no jsonrpc"),
        ]
        for line, want_id, want_code, want_text in cases:
            await wire.send(line)
            got_id, code, message = error_of(await wire.reply())
            assert (got_id, code) == (want_id, want_code), (line[:80], message)
            assert want_text in message, (line[:80], message)
        # a blank line is no message: nothing answers it, and the next request is served
        await wire.send(b"", b"  ", {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        reply = await wire.reply()
        assert reply["id"] == 7 and reply["result"]["tools"], reply


async def test_a_lone_surrogate_is_read_as_a_replacement_character(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    async with cru_mcp(cru_bin, mcp_kiln, cru_env) as wire:
        # a JSON escape the SDK's parser refuses: the request is served with U+FFFD in its place
        await wire.send(b'{"jsonrpc":"2.0","id":2,"method":"tools/call",'
                        b'"params":{"name":"read_note","arguments":{"path":"a\\udc80.md"}}}')
        reply = await wire.reply()
        assert reply["id"] == 2 and reply["result"]["isError"], reply
        text = reply["result"]["content"][0]["text"]
        assert "not found" in text.lower() and "a\ufffd.md" in text, text
        # mended, then still invalid: answered with its id
        await wire.send(b'{"jsonrpc":"2.0","id":"s","method":"tools/call","params":"\\ud800"}')
        assert error_of(await wire.reply())[:2] == ("s", -32600)


async def test_a_line_over_the_cap_is_refused_and_the_server_goes_on(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    env = dict(cru_env, **{MAX_FRAME_ENV: str(64 * 1024)})
    pad = "x" * (200 * 1024)  # over the cap, and many of the reader's 64 KiB chunks
    async with cru_mcp(cru_bin, mcp_kiln, env) as wire:
        await wire.send({"jsonrpc": "2.0", "id": 8, "method": "no/such", "params": {"pad": pad}},
                        {"jsonrpc": "2.0", "id": 9, "method": "no/such", "params": {"pad": pad[:60_000]}})
        got_id, code, message = error_of(await wire.reply())
        assert got_id is None and code == -32600
        assert "a message of 201 KiB is over the 64 KiB this server reads" in message, message
        # the line just under the cap is read whole: its method is looked up and not found
        assert error_of(await wire.reply())[:2] == (9, -32601)
        await wire.send({"jsonrpc": "2.0", "id": 10, "method": "tools/list"})
        reply = await wire.reply()
        assert reply["id"] == 10 and reply["result"]["tools"], reply
