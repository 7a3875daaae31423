"""Fixtures for the JSON-RPC peer and agent-process tests (helpers: acp_core_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio

from acp_host.jsonrpc import JsonRpcPeer


@pytest.fixture
async def running() -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """start(peer, ...): run peers in a nursery that is cancelled when the test ends."""
    async with trio.open_nursery() as nursery:

        async def start(*peers: JsonRpcPeer) -> None:
            for p in peers:
                nursery.start_soon(p.run)

        yield start
        nursery.cancel_scope.cancel()
