"""An upstream MCP server for the gateway tests, built with the mcp SDK's `MCPServer`.

    python gateway_upstream.py http|http-json|sse|stdio
    python gateway_upstream.py raw-deep|raw-flood-init   (stdio, a broken server: see `raw`)

HTTP and SSE listen on 127.0.0.1 (a port the OS picks) and print `listening on PORT` on stdout;
with $UPSTREAM_TOKEN set they refuse requests without `Authorization: Bearer $UPSTREAM_TOKEN`.
Tools: add, slow, grow (adds a tool and says so with tools/list_changed), ask_sampling,
elicit_name, elicit_form (a form of the spec's field kinds), crash (the process exits), flood_line (an endless line on stdout), big_answer, auth_header (what Authorization header came),
fail_with (answers with a JSON-RPC error of the code given), kiln_info (a name a prefix can turn
into a kiln tool's). With $UPSTREAM_LEAK set: a tool named with it, a tool, a prompt and a
resource described with it (a server that puts a secret in its lists). With $UPSTREAM_LONG_NAME
set: a tool whose name has that many characters.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("gateway-test-upstream")
WIRE = os.dup(1)  # stdout as the client reads it (the SDK's stdio server diverts fd 1 to stderr)
SEEN_AUTH: dict[str, str] = {}


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra` and tell the client its tool list changed."""

    def extra() -> str:
        """A tool that appeared later."""
        return "extra!"

    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
async def ask_sampling(ctx: Context) -> str:
    """Ask the client's model something (sampling/createMessage)."""
    try:
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(text="hi"))], max_tokens=5)
    except Exception as exc:
        return f"sampling refused: {exc}"
    return f"sampling answered: {result}"


@server.tool()
async def elicit_name(ctx: Context) -> str:
    """Ask the person for a name (elicitation/create)."""
    schema: dict[str, Any] = {"type": "object", "properties": {"name": {"type": "string", "default": "Ada"}},
                              "required": ["name"]}
    result = await ctx.session.elicit_form("What is your name?", schema)  # type: ignore[arg-type]
    return f"action={result.action} content={result.content}"


# A form with the field kinds of the MCP spec (2025-11-25): a required text, a number with bounds,
# a single select with titles, a multi-select, the older enum with `enumNames`, a date.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Your name"},
        "count": {"type": "integer", "minimum": 1, "maximum": 100, "default": 42},
        "hero": {"type": "string", "oneOf": [{"const": "hero-1", "title": "Superman"},
                                             {"const": "hero-3", "title": "Wonder Woman"}], "default": "hero-1"},
        "instruments": {"type": "array", "minItems": 1, "maxItems": 3, "default": ["Guitar"],
                        "items": {"type": "string", "enum": ["Guitar", "Piano", "Violin", "Drums"]}},
        "pet": {"type": "string", "enum": ["pet-1", "pet-2"], "enumNames": ["Cats", "Dogs"], "default": "pet-1"},
        "born": {"type": "string", "format": "date"},
    },
    "required": ["name"],
}


@server.tool()
async def elicit_form(ctx: Context) -> str:
    """Ask the person to fill a form of every field kind (elicitation/create)."""
    result = await ctx.session.elicit_form("Tell me about you", FORM)  # type: ignore[arg-type]
    content = dict(sorted(result.content.items())) if result.content is not None else None
    return f"action={result.action} content={content}"


@server.tool()
def crash() -> str:
    """Exit the server process at once, saying why on stderr."""
    print("fatal: the database is locked", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
async def flood_line(megabytes: int) -> str:
    """Write `megabytes` MiB to stdout with no newline (a runaway server), then wait."""
    block = b"x" * (1 << 20)
    for _ in range(megabytes):
        os.write(WIRE, block)
    await anyio.sleep(60)
    return "never"


@server.tool()
def big_answer(megabytes: int) -> str:
    """An answer of `megabytes` MiB (a runaway server over HTTP)."""
    return "x" * (megabytes << 20)


@server.tool()
def auth_header() -> str:
    """The Authorization header of the last HTTP request."""
    return SEEN_AUTH.get("value", "")


@server.tool()
def fail_with(code: int, message: str) -> str:
    """Answer with a JSON-RPC error of this code and message (not a tool result)."""
    raise MCPError(code=code, message=message)


@server.tool()
def kiln_info() -> str:
    """A tool whose name, behind the prefix `get_`, is a kiln tool's."""
    return "upstream kiln_info"


LEAK = os.environ.get("UPSTREAM_LEAK", "")
if LEAK:
    def _leaky() -> str:
        return "leaky"

    server.add_tool(_leaky, name=f"named_{LEAK}", description="a tool named with a secret")
    server.add_tool(_leaky, name="described", description=f"uses the token {LEAK} to log in")

    @server.prompt(name="leaky_prompt", description=f"a prompt that knows {LEAK}")
    def leaky_prompt() -> str:
        return "hi"

    @server.resource("test://leaky", name="leaky_resource", description=f"read with {LEAK}")
    def leaky_resource() -> str:
        return "leaky"

if os.environ.get("UPSTREAM_LONG_NAME"):
    server.add_tool(add, name="n" * int(os.environ["UPSTREAM_LONG_NAME"]), description="a tool with a long name")


@server.resource("test://greeting", name="greeting", mime_type="text/plain")
def greeting() -> str:
    return "hello from upstream"


@server.prompt(name="haiku")
def haiku(topic: str) -> str:
    """A haiku about a topic."""
    return f"Write a haiku about {topic}."


def guarded(app: Any) -> Any:
    token = os.environ.get("UPSTREAM_TOKEN")

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            auth = dict(scope.get("headers", [])).get(b"authorization", b"").decode()
            SEEN_AUTH["value"] = auth
            if token and auth != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return asgi


def raw(mode: str) -> None:
    """A stdio server written by hand, broken in one way: raw-deep lists a tool whose schema is
    nested deeper than the client's JSON parser goes (its answer cannot be read); raw-flood-init
    answers the handshake with a line over the client's bound (32 MiB)."""
    import json

    out = sys.stdout
    print("raw upstream starting", mode, file=sys.stderr, flush=True)
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, ident = msg.get("method"), msg.get("id")
        if method == "initialize":
            if mode == "raw-flood-init":
                out.write('{"jsonrpc":"2.0","id":' + json.dumps(ident) + ',"result":"' + "x" * (33 << 20) + '"}\n')
                out.flush()
                continue
            result: dict[str, Any] = {"protocolVersion": msg["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}}
            out.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\n")
        elif method == "tools/list":
            depth = 200
            schema = '{"type":"object","properties":{"a":' * depth + "{}" + "}}" * depth
            out.write('{"jsonrpc":"2.0","id":' + json.dumps(ident) + ',"result":{"tools":[{"name":"deep","inputSchema":'
                      + schema + "}]}}\n")
        elif ident is not None and method is not None:
            out.write(json.dumps({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}}) + "\n")
        out.flush()


def main() -> None:
    transport = sys.argv[1] if len(sys.argv) > 1 else "http"
    if transport.startswith("raw-"):
        raw(transport)
        return
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    # http-json: streamable HTTP answering each request with one JSON body instead of an event stream
    app = (server.sse_app() if transport == "sse"
           else server.streamable_http_app(json_response=transport == "http-json"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(guarded(app), fd=sock.fileno(), log_level="warning", lifespan="on")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
