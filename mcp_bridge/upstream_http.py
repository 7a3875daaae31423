"""An HTTP upstream's client: the mcp SDK's, with a bound on an answer's body.

The SDK reads a streamable-HTTP server's JSON answer whole (`response.aread()`), however long:
a server that sends without end (broken, or hostile) would grow cru's memory without limit.
Here the transport counts a JSON answer's bytes and fails the read past `BODY_MAX_BYTES`; the
SDK turns that into an error for that one call, and the connection goes on. An event stream
(SSE) is left as it is: the SDK bounds each of its events itself (1 MiB).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

__all__ = ["BODY_MAX_BYTES", "bounded_http_client"]

# As a stdio upstream's line (upstream_stdio.LINE_MAX_BYTES): one answer, one message.
BODY_MAX_BYTES = 32 * 1024 * 1024


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, cap: int) -> None:
        self._inner, self._cap = inner, cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._cap:
                raise httpx2.ReadError(f"the server's answer is longer than {self._cap // (1024 * 1024)} MiB "
                                       "(not an MCP message): it was not read")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, cap: int) -> None:
        self._inner, self._cap = inner, cap

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _BoundedBody(response.stream, self._cap)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_http_client(headers: dict[str, str] | None = None, max_body_bytes: int | None = None,
                        ) -> httpx2.AsyncClient:
    """What the SDK's `create_mcp_http_client` makes (its timeouts, no redirects followed by
    the client), on a transport that bounds a JSON answer's body."""
    cap = BODY_MAX_BYTES if max_body_bytes is None else max_body_bytes
    return httpx2.AsyncClient(
        headers=headers, timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=_BoundedTransport(httpx2.AsyncHTTPTransport(), cap))
