"""The session bridge's streamable-HTTP GET stream opens with an SSE `retry:` hint, so the
agents' MCP clients give up on an ended session quickly (gemini stays alive until they do),
and a real MCP client still works over it."""

from __future__ import annotations

import httpx
import httpx2
import trio
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_bridge.server import SSE_RETRY_MS, BridgeHTTP, BridgeServer, new_token, serving_http

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


async def test_turn_get_stream_starts_with_a_retry_hint_and_clients_still_work() -> None:
    token = new_token()
    async with BridgeHTTP() as app, serving_http(app) as port:
        await app.mount(BridgeServer(None), token=token, base="/s/one")
        url = f"http://127.0.0.1:{port}/s/one/mcp"
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=10, headers=auth) as h:
            r = await h.post(url, json=INIT, headers={"Accept": "application/json, text/event-stream"})
            assert r.status_code == 200, r.text
            sid = {"mcp-session-id": r.headers["mcp-session-id"]}
            await h.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers={**sid, "Accept": "application/json, text/event-stream"})
            async with h.stream("GET", url, headers={**sid, "Accept": "text/event-stream"}) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                with trio.fail_after(10):
                    first = await stream.aiter_raw().__anext__()
        assert first == f"retry: {SSE_RETRY_MS}\n\n".encode()
        # The SDK's own client (which opens the same GET stream) lists the tools as before.
        http = httpx2.AsyncClient(headers=auth)
        async with Client(streamable_http_client(url, http_client=http)) as c:
            tools = await c.list_tools()
        assert "read_note" in {t.name for t in tools.tools}
        app.unmount("/s/one")
