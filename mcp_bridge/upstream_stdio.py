"""A stdio upstream's transport: the mcp SDK's `stdio_client`, with a bound on a line.

The SDK's client reads a server's stdout into a buffer that grows until a newline comes: an
upstream that writes without end (broken, or hostile) would grow cru's memory without limit.
Here stdout is read as bytes, and a line longer than `LINE_MAX_BYTES` ends the connection,
with that reason for the person (`cru mcp servers`, /mcp, the failed call), instead. Spawning
and the shutdown sequence (stdin closed, a grace, then the server's process tree killed) are
the SDK's own helpers, so the two transports stop a server the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
from mcp.client import stdio as sdk_stdio
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

__all__ = ["LINE_MAX_BYTES", "bounded_stdio_client"]

# A tool result is one line: large enough for a screenshot or a long file as base64, small
# enough that a runaway server cannot take the machine's memory with it.
LINE_MAX_BYTES = 32 * 1024 * 1024
_READ_SIZE = 1 << 16


@asynccontextmanager
async def bounded_stdio_client(server: StdioServerParameters, *, errlog: TextIO,
                               on_oversized: Callable[[str], None],
                               max_line_bytes: int | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """The server started, and (read stream, write stream) of its messages. A line over
    `max_line_bytes` (default `LINE_MAX_BYTES`) calls `on_oversized(reason)`, then closes the
    read stream: to the session, the connection ended."""
    cap = LINE_MAX_BYTES if max_line_bytes is None else max_line_bytes
    process = await sdk_stdio._create_platform_compatible_process(
        command=server.command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    # No awaits until the task group is entered (as the SDK): a cancel there would leak the server.
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()  # the line being read; no newline in it
        try:
            async with read_writer:
                try:
                    while True:
                        scanned = len(buffer)  # only the new bytes can hold a newline
                        try:
                            buffer += await process.stdout.receive(_READ_SIZE)
                        except anyio.EndOfStream:
                            return
                        start = 0
                        while (end := buffer.find(b"\n", max(start, scanned))) >= 0:
                            line, start = bytes(buffer[start:end]), end + 1
                            if len(line) > cap:
                                break
                            await read_writer.send(sdk_stdio._parse_line(line.decode("utf-8", "replace")))
                        else:
                            del buffer[:start]
                            if len(buffer) <= cap:
                                continue
                        on_oversized(f"the server wrote a line longer than {cap // (1024 * 1024)} MiB "
                                     "(not an MCP message): the connection was closed")
                        await read_writer.aclose()  # now: the drain below lasts until the server is stopped
                        return
                finally:
                    await sdk_stdio._drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # our own shutdown, or the session went away: it sees the stream end either way

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the server may live on: end the session's reads, not hang them
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()  # the reader drains: a server blocked writing can read its stdin again
        write_stream.close()
        with anyio.move_on_after(0.5):
            await writer_done.wait()
        await sdk_stdio._stop_server_process(process)
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # every wait inside is bounded
                await shutdown()
            tg.cancel_scope.cancel()
