"""Helpers for the JSON-RPC peer tests (a module name unique across the test folders)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from acp_host.jsonrpc import JsonRpcPeer


@dataclass
class RawEnd:
    """The far side of a peer, speaking raw bytes, for wire-level tests."""

    send: trio.abc.SendStream
    receive: trio.abc.ReceiveStream
    buf: bytes = b""

    async def write(self, data: bytes) -> None:
        await self.send.send_all(data)

    async def read_frame(self) -> dict[str, Any]:
        import json

        while b"\n" not in self.buf:
            chunk = await self.receive.receive_some()
            if not chunk:
                raise EOFError("peer closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        result: dict[str, Any] = json.loads(line)
        return result


def peer_with_raw_end(**kwargs: Any) -> tuple[JsonRpcPeer, RawEnd]:
    a_send, b_receive = trio.testing.memory_stream_one_way_pair()
    b_send, a_receive = trio.testing.memory_stream_one_way_pair()
    return JsonRpcPeer(a_send, a_receive, **kwargs), RawEnd(b_send, b_receive)


def peer_pair(
    a_kwargs: dict[str, Any] | None = None, b_kwargs: dict[str, Any] | None = None
) -> tuple[JsonRpcPeer, JsonRpcPeer]:
    a_send, b_receive = trio.testing.memory_stream_one_way_pair()
    b_send, a_receive = trio.testing.memory_stream_one_way_pair()
    a = JsonRpcPeer(a_send, a_receive, name="a", **(a_kwargs or {}))
    b = JsonRpcPeer(b_send, b_receive, name="b", **(b_kwargs or {}))
    return a, b
