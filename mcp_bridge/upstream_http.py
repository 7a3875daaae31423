"""An HTTP upstream's client: the mcp SDK's, with a bound on an answer's body.

The SDK reads a streamable-HTTP server's JSON answer whole (`response.aread()`), however long:
a server that sends without end (broken, or hostile) would grow cru's memory without limit.
Here the transport counts a JSON answer's bytes and fails the read past `BODY_MAX_BYTES` (at
once when its Content-Length says so); the SDK turns that into an error for that one call (it
catches a `StreamError`), and the connection goes on. An event stream (SSE) is read by the SDK,
which bounds each of its events itself: the gateway sets that bound to `BODY_MAX_BYTES` too
(`SSE_EVENT_MAX_BYTES`), so an answer has the same limit whichever way the server sends it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

__all__ = ["BODY_MAX_BYTES", "SSE_EVENT_MAX_BYTES", "TOO_LONG", "AnswerTooLong", "bounded_http_client"]

# How the error for an answer past the bound begins (the gateway finds it in what the SDK relays).
TOO_LONG = "the server's answer is longer than"
# As a stdio upstream's line (upstream_stdio.LINE_MAX_BYTES): one answer, one message.
BODY_MAX_BYTES = 32 * 1024 * 1024
SSE_EVENT_MAX_BYTES = BODY_MAX_BYTES


class AnswerTooLong(httpx2.StreamError):
    """An answer past the bound: a `StreamError`, which the SDK reports for the one call."""


def too_long(cap: int, size: int | None = None) -> AnswerTooLong:
    said = f", and it says it is {size / (1 << 20):.1f} MiB" if size is not None else ""
    return AnswerTooLong(f"{TOO_LONG} {cap / (1 << 20):g} MiB (the limit for one answer{said}): it was not read; "
                         "the connection goes on")


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, cap: int, size: int | None) -> None:
        self._inner, self._cap, self._size = inner, cap, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._size is not None and self._size > self._cap:
            raise too_long(self._cap, self._size)
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._cap:
                raise too_long(self._cap)
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
            length = response.headers.get("content-length", "")
            response.stream = _BoundedBody(response.stream, self._cap, int(length) if length.isdigit() else None)
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
