"""Serving the kiln tools: one `BridgeServer` per kiln or per session, over stdio, streamable
HTTP or HTTP+SSE.

A `BridgeServer` holds its own state (backend, tools, policy, observer, prompts); nothing is
global, so a host can run one per session. `BridgeHTTP` is a single ASGI app serving many
bridges, each mounted under a path with its own bearer token, on 127.0.0.1 only, with the
Host and Origin headers checked against loopback names.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import logging
import math
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import quote, unquote, urlsplit

import anyio
import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcp_bridge.dispatch import AskFn, Decision, Dispatcher, Policy, Tool
from mcp_bridge.gateway import Gateway
from mcp_bridge.kiln_api import KilnBackend, KilnError, NoteNotFoundError
from mcp_bridge.tools import (
    DEFAULT_TOOL_TIMEOUT,
    KILN_TOOLS,
    ElicitFn,
    ToolContext,
    ToolError,
    ToolSpec,
    input_schema,
    paginate,
)

logger = logging.getLogger("mcp_bridge.server")

NOTE_URI_PREFIX = "kiln://notes/"
RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for resources/read of an unknown URI
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# SSE `retry:` (ms) sent first on every streamable-HTTP GET stream. When a session's bridge is
# unmounted its stream ends; the node MCP clients (gemini, claude, opencode) then reconnect after
# the server's retry, else after 1 s, get 404 and give up. Gemini stays alive until then, so
# this is how long it takes to exit after a session. Reconnects are bounded (2) by the clients.
SSE_RETRY_MS = 50
# How long a subscription waits for the bridge's own watcher to be armed (it takes ~0.2 s).
WATCHER_ARM_WAIT = 10.0

def note_uri(path: str) -> str:
    return NOTE_URI_PREFIX + quote(path, safe="/")


# The most notes subscribed to at once (resources/subscribe), all clients together.
MAX_SUBSCRIBED = 10_000


def uri_to_path(uri: str) -> str:
    if not uri.startswith(NOTE_URI_PREFIX):
        raise MCPError(INVALID_PARAMS, f"Unknown resource {uri!r}: notes are {NOTE_URI_PREFIX}<path>")
    return unquote(uri[len(NOTE_URI_PREFIX) :])


@dataclass
class ToolEvent:
    """What an observer hears: every tools/list, and every tools/call once it is answered."""

    kind: Literal["list", "call"]
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    decision: Decision | None = None
    result: types.CallToolResult | None = None
    seconds: float = 0.0
    tools: list[str] = field(default_factory=list)


Observer = Callable[[ToolEvent], None]


class PromptProvider(Protocol):
    """Agent cards as MCP prompts (the cards issue plugs in here)."""

    def list_prompts(self) -> list[types.Prompt]: ...

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult: ...


class ToolSource(Protocol):
    """More tools for a bridge, decided elsewhere (the Lua plugins): listed and looked up by name."""

    def tools(self) -> Iterable[Tool]: ...

    def lookup(self, name: str) -> Tool | None: ...


class BridgeServer:
    """The kiln tools (plus the session's own tools, plugin tools and the gateway's upstream
    tools) for one kiln or one session. Every call goes through `self.dispatcher`."""

    def __init__(
        self,
        backend: KilnBackend | None,
        *,
        name: str = "crucible",
        version: str = "0.1.0",
        instructions: str | None = None,
        tools: Iterable[ToolSpec] = KILN_TOOLS,
        policy: Policy | None = None,
        ask: AskFn | None = None,
        observer: Observer | None = None,
        prompts: PromptProvider | None = None,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT,
        extra: dict[str, Any] | None = None,
        gateway: Gateway | None = None,
        tool_sources: Iterable[ToolSource] = (),
        elicit: ElicitFn | None = None,
        roots: list[tuple[str, str]] | None = None,
    ) -> None:
        self.backend = backend
        self.observer = observer
        self.prompts = prompts
        self.extra = extra if extra is not None else {}
        self.gateway = gateway if gateway else None
        self.tool_sources = list(tool_sources)
        self.elicit = elicit
        # Offered to upstream servers as roots/list (the kiln, the session's cwd).
        self.roots: list[tuple[str, str]] = list(roots or [])
        self._tools: dict[str, ToolSpec] = {}
        for spec in tools:
            self.add_tool(spec)
        self._meta_tools = {t.name: t for t in _discovery_tools(self)}
        self.dispatcher = Dispatcher(self.lookup, self._listed_names, policy=policy, ask=ask, timeout=tool_timeout,
                                     unknown=self._why_not_callable)
        # Legacy-era `resources/subscribe`: uri -> sessions; 2026-era `subscriptions/listen`: the bus.
        self._subscribers: dict[str, list[ServerSession]] = {}
        self._bus = InMemorySubscriptionBus()
        self._awaits_watcher = False
        self._watch_armed = anyio.Event()
        # Connected clients (one ServerSession each) that hear our list_changed notifications.
        self._clients: dict[int, ServerSession] = {}
        listen = ListenHandler(self._bus)

        async def _listen(ctx: ServerRequestContext[Any], params: Any) -> Any:
            await self._until_watching()  # the ack goes out once changes can be heard
            return await listen(ctx, params)

        handlers: dict[str, Any] = {
            "on_list_tools": self._list_tools,
            "on_call_tool": self._call_tool,
            "on_subscriptions_listen": _listen,
        }
        if backend is not None or self.gateway is not None:
            handlers |= {
                "on_list_resources": self._list_resources,
                "on_read_resource": self._read_resource,
                "on_subscribe_resource": self._subscribe,
                "on_unsubscribe_resource": self._unsubscribe,
            }
        if self.gateway is not None:
            handlers["on_list_resource_templates"] = self._list_resource_templates
        if prompts is not None or self.gateway is not None:
            handlers |= {"on_list_prompts": self._list_prompts, "on_get_prompt": self._get_prompt}
        self.server: Server[Any] = Server(name, version=version, instructions=instructions, **handlers)
        if self.gateway is not None:
            self.gateway.attach(self)

    # --- the dispatcher's view ---------------------------------------------------------

    @property
    def policy(self) -> Policy | None:
        return self.dispatcher.policy

    @property
    def ask(self) -> AskFn | None:
        return self.dispatcher.ask

    @property
    def tool_timeout(self) -> float:
        return self.dispatcher.timeout

    def add_tool(self, spec: ToolSpec) -> None:
        self._tools[spec.name] = spec

    def remove_tool(self, name: str) -> None:
        self._tools.pop(name, None)

    def decision(self, name: str) -> Decision:
        return self.dispatcher.decision(name)

    def _upstream_listed(self) -> bool:
        return self.gateway is not None and not self.gateway.over_budget()

    def lookup(self, name: str) -> Tool | None:
        """The tool a call names: the bridge's own first, then plugins, then upstreams (listed
        or, past the schema budget, reached through invoke_tool)."""
        own = self._tools.get(name)
        if own is not None:
            return own
        for source in self.tool_sources:
            found = source.lookup(name)
            if found is not None:
                return found
        if self.gateway is not None:
            if name in self._meta_tools and self.gateway.over_budget():
                return self._meta_tools[name]
            return self.gateway.lookup(name)
        return None

    def all_tools(self) -> list[Tool]:
        """Every tool a call could reach, whatever the policy says (in listing order)."""
        out: dict[str, Tool] = dict(self._tools)
        for source in self.tool_sources:
            for tool in source.tools():
                out.setdefault(tool.name, tool)
        if self.gateway is not None:
            for gtool in self.gateway.tools():
                out.setdefault(gtool.name, gtool)
        return list(out.values())

    def visible_tools(self) -> list[Tool]:
        """What tools/list shows: everything the policy does not deny; past the schema budget,
        the discovery tools instead of the upstream tools."""
        tools = self.all_tools()
        if self.gateway is not None and self.gateway.over_budget():
            tools = [t for t in tools if t.kind != "upstream"] + list(self._meta_tools.values())
        return [t for t in tools if self.decision(t.name) != "deny"]

    def tool_read_only(self, name: str) -> bool | None:
        """Whether the named tool only reads (None: no such tool), for the session's policy."""
        tool = self.lookup(name)
        return None if tool is None else tool.read_only

    def _why_not_callable(self, name: str) -> str | None:
        """An upstream that is down and never listed its tools (or lost them): say so, not "unknown"."""
        if self.gateway is None or self.decision(name) == "deny":
            return None
        return self.gateway.down_reason_for(name)

    def _listed_names(self) -> list[str]:
        return [t.name for t in self.visible_tools()]

    def _observe(self, event: ToolEvent) -> None:
        if self.observer is None:
            return
        try:
            self.observer(event)
        except Exception:  # an observer's bug must not break the protocol
            logger.exception("tool observer failed")

    def _remember_client(self, ctx: ServerRequestContext[Any]) -> None:
        """Note the client behind a request, to tell it later that our lists changed. The SDK
        has no broadcast; a connection is what stays the same across its requests."""
        connection = getattr(ctx.session, "_connection", None)
        key = id(connection if connection is not None else ctx.session)
        if key in self._clients:
            return
        self._clients[key] = ctx.session
        stack = getattr(connection, "exit_stack", None)
        if stack is not None:
            stack.callback(self._clients.pop, key, None)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._remember_client(ctx)
        if self.gateway is not None:
            await self.gateway.ensure_started()  # the first list starts the upstreams (bounded wait)
        tools = [s.to_mcp() for s in self.visible_tools()]
        self._observe(ToolEvent(kind="list", tools=[t.name for t in tools]))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        async def progress(done: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(done, total, message)

        return await self.call_tool(params.name, params.arguments, report_progress=progress,
                                    elicit=self.elicit or _client_elicit(ctx))

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        *,
        report_progress: Any = None,
        elicit: ElicitFn | None = None,
    ) -> types.CallToolResult:
        """The dispatcher, then the observer; usable in-process as well as over MCP."""
        started = time.monotonic()
        if self.gateway is not None and not self.gateway.started and self.lookup(name) is None:
            await self.gateway.ensure_started()  # a client that calls without listing first
        ctx = ToolContext(tool_name=name, backend=self.backend, extra=self.extra, elicit=elicit or self.elicit)
        if report_progress is not None:
            ctx.report_progress = report_progress
        result, decision = await self.dispatcher.call(name, arguments, ctx)
        self._observe(
            ToolEvent(
                kind="call",
                tool=name,
                arguments=arguments,
                decision=decision,
                result=result,
                seconds=time.monotonic() - started,
            )
        )
        return result

    async def upstream_changed(self, kinds: set[str]) -> None:
        """An upstream's tools, resources or prompts changed: tell our clients (both eras)."""
        sends = {"tools": "send_tool_list_changed", "resources": "send_resource_list_changed",
                 "prompts": "send_prompt_list_changed"}
        events: dict[str, ToolsListChanged | ResourcesListChanged | PromptsListChanged] = {
            "tools": ToolsListChanged(), "resources": ResourcesListChanged(), "prompts": PromptsListChanged()}
        for kind in kinds:
            if kind not in sends:
                continue
            await self._bus.publish(events[kind])
            for key, session in list(self._clients.items()):
                try:
                    await getattr(session, sends[kind])()
                except Exception:  # the client went away: forget it
                    self._clients.pop(key, None)

    def close(self) -> None:
        """Detach from the gateway (the session ended)."""
        if self.gateway is not None:
            self.gateway.detach(self)

    # --- resources --------------------------------------------------------------------

    def _kiln(self) -> KilnBackend:
        assert self.backend is not None  # resources are registered only with a backend
        return self.backend

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        self._remember_client(ctx)
        cursor = params.cursor if params else None
        upstream: list[types.Resource] = []
        if self.gateway is not None and cursor is None:  # the upstreams' resources come on the first page
            await self.gateway.ensure_started()
            upstream = self.gateway.resources()
        if self.backend is None:
            return types.ListResourcesResult(resources=upstream)
        entries = await anyio.to_thread.run_sync(self._kiln().list_notes, "")
        try:
            page, nxt = paginate(entries, cursor, 500)
        except Exception as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None
        resources = upstream + [
            types.Resource(
                uri=note_uri(e.path),
                name=e.path,
                title=e.path.rsplit("/", 1)[-1].removesuffix(".md"),
                mime_type="text/markdown",
                size=e.size_bytes,
            )
            for e in page
        ]
        return types.ListResourcesResult(resources=resources, next_cursor=nxt)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        assert self.gateway is not None
        await self.gateway.ensure_started()
        return types.ListResourceTemplatesResult(resource_templates=self.gateway.resource_templates())

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if self.gateway is not None and not uri.startswith(NOTE_URI_PREFIX):
            try:
                found = await self.gateway.read_resource(uri)
            except ToolError as exc:  # the upstream is down
                raise MCPError(INTERNAL_ERROR, str(exc)) from None
            if found is None:
                raise MCPError(RESOURCE_NOT_FOUND, f"Unknown resource {uri!r}: no kiln note and no MCP server's")
            return found
        kiln = self._kiln()
        path = uri_to_path(uri)
        try:
            note = await anyio.to_thread.run_sync(kiln.read_note, path)
        except NoteNotFoundError as exc:
            raise MCPError(RESOURCE_NOT_FOUND, kiln.redact(str(exc))) from None
        except KilnError as exc:
            raise MCPError(INVALID_PARAMS, kiln.redact(str(exc))) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=str(params.uri), mime_type="text/markdown", text=note.text)]
        )

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        path = uri_to_path(str(params.uri))
        if path.startswith("/") or ".." in path.replace("\\", "/").split("/"):
            raise MCPError(INVALID_PARAMS, f"Unknown resource {str(params.uri)[:200]!r}: a note's path is relative to "
                                           "the kiln, without '..'")
        await self._until_watching()
        uri = str(params.uri)
        if uri not in self._subscribers and len(self._subscribers) >= MAX_SUBSCRIBED:
            # Each subscription is kept until unsubscribed: bounded, as a client may send a million.
            raise MCPError(INVALID_PARAMS, f"{MAX_SUBSCRIBED} notes are subscribed already; unsubscribe some "
                                           "(resources/unsubscribe), or watch the list (resources/list_changed)")
        sessions = self._subscribers.setdefault(uri, [])
        if ctx.session not in sessions:
            sessions.append(ctx.session)
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        sessions = self._subscribers.get(str(params.uri), [])
        if ctx.session in sessions:
            sessions.remove(ctx.session)
        if not sessions:
            self._subscribers.pop(str(params.uri), None)
        return types.EmptyResult()

    async def notes_changed(self, paths: list[str]) -> None:
        """Tell subscribers (both protocol eras) that these notes changed on disk."""
        for path in paths:
            uri = note_uri(path)
            await self._bus.publish(ResourceUpdated(uri=uri))
            for session in list(self._subscribers.get(uri, [])):
                try:
                    await session.send_resource_updated(uri)
                except Exception:  # the client went away: forget it
                    self._subscribers[uri].remove(session)
        await self._bus.publish(ResourcesListChanged())

    async def run_watcher(self) -> None:
        """Forward the backend's change events to subscribers until cancelled."""
        if self.backend is None:
            return
        try:
            await self.backend.watch_changes(self.notes_changed, on_armed=self._watch_armed.set)
        except Exception as exc:  # e.g. the OS's file-watch limit: serve on, without notifications
            logger.warning("not watching the kiln for changes: %s", self.backend.redact(str(exc)))
        finally:
            self._watch_armed.set()  # nobody waits for a watcher that is gone

    def expect_watcher(self) -> None:
        """This bridge runs its own watcher (`run_watcher`, started next): subscriptions wait
        until it is armed, so a change made right after subscribing is not missed."""
        self._awaits_watcher = True

    async def _until_watching(self) -> None:
        if self._awaits_watcher:
            with anyio.move_on_after(WATCHER_ARM_WAIT):
                await self._watch_armed.wait()

    # --- prompts ----------------------------------------------------------------------

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        self._remember_client(ctx)
        prompts = self.prompts.list_prompts() if self.prompts is not None else []
        if self.gateway is not None:
            await self.gateway.ensure_started()
            prompts = prompts + self.gateway.prompts()
        return types.ListPromptsResult(prompts=prompts)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if self.gateway is not None and self.gateway.has_prompt(params.name):
            try:
                found = await self.gateway.get_prompt(params.name, params.arguments)
            except ToolError as exc:
                raise MCPError(INTERNAL_ERROR, str(exc)) from None
            if found is not None:
                return found
        if self.prompts is None:
            raise MCPError(INVALID_PARAMS, f"Unknown prompt {params.name!r}")
        return await self.prompts.get_prompt(params.name, params.arguments)

    # --- serving ----------------------------------------------------------------------

    def initialization_options(self) -> Any:
        upstreams = self.gateway is not None
        return self.server.create_initialization_options(
            NotificationOptions(resources_changed=self.backend is not None or upstreams,
                                tools_changed=upstreams, prompts_changed=upstreams)
        )

    async def serve_stdio(self) -> None:
        """Serve one client on this process's stdin/stdout until it closes."""
        async with anyio.create_task_group() as tg:
            self.expect_watcher()
            tg.start_soon(self.run_watcher)
            async with _stdio_streams() as (read_stream, write_stream):
                await self.server.run(read_stream, write_stream, self.initialization_options())
            tg.cancel_scope.cancel()

    async def serve_streams(self, read_stream: Any, write_stream: Any) -> None:
        """Serve one connection over a stream pair (the SSE transport uses this)."""
        await self.server.run(read_stream, write_stream, self.initialization_options())


# The longest line (one message) read from a stdin pipe. Notes up to 10 MiB are read and written
# whole in one message, and JSON escapes can make text up to six times longer on the wire (a
# control character is `\u0001`, six bytes; a quote or a line break two), so 64 MiB carries the
# largest legitimate note even in that worst case, with room for the envelope. A longer line is
# skipped up to its newline without being held (only counted) and answered with an error.
MAX_FRAME_BYTES = 64 << 20
# Bytes: a lower cap for `cru mcp` (tests set it; sending 64 MiB in a test takes too long).
MAX_FRAME_ENV = "CRUCIBLE_MCP_MAX_FRAME"


def _max_frame() -> int:
    try:
        value = int(os.environ.get(MAX_FRAME_ENV, ""))
    except ValueError:
        return MAX_FRAME_BYTES
    return value if value > 0 else MAX_FRAME_BYTES


def _size(n: int) -> str:
    if n < 1 << 10:
        return f"{n} bytes"
    if n < 1 << 20:
        return f"{math.ceil(n / (1 << 10))} KiB"
    return f"{math.ceil(n * 10 / (1 << 20)) / 10:g} MiB"  # rounded up: never "64 MiB is over 64 MiB"


class _LineReader:
    """A non-blocking pipe's lines, as the SDK's stdio_server reads `anyio.AsyncFile` lines; a
    line over `max_frame` bytes is not passed on but answered through `refuse`."""

    def __init__(self, stream: Any, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._stream = stream
        self.max_frame = max_frame
        # Sends an answer to the client: set once the SDK's write stream exists (else logged only).
        self.refuse: Callable[[types.JSONRPCError], Awaitable[None]] | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        # A line's pieces are kept in a list and joined once, at its newline: a line of many
        # chunks costs its length, not its length squared (`buffer + chunk` for every chunk did).
        parts: list[bytes] = []
        size = 0  # the line's bytes so far, still counted past the cap
        while chunk := await self._stream.receive_some(1 << 16):
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                size += end - start
                if size <= self.max_frame:
                    parts.append(chunk[start:end])
                    yield b"".join(parts).decode("utf-8", "replace") + "\n"
                else:
                    await self._over_cap(size)
                parts, size, start = [], 0, end + 1
            if start < len(chunk):
                size += len(chunk) - start
                if size <= self.max_frame:
                    parts.append(chunk[start:] if start else chunk)
                else:
                    parts = []  # over the cap: the rest of this line is only counted
        if size > self.max_frame:
            await self._over_cap(size)
        elif size:
            yield b"".join(parts).decode("utf-8", "replace")

    async def _over_cap(self, size: int) -> None:
        message = (f"a message of {_size(size)} is over the {_size(self.max_frame)} this server "
                   "reads; it was skipped: send less in one message")
        logger.warning("stdin: %s", message)
        if self.refuse is not None:
            await self.refuse(_error_answer(None, INVALID_REQUEST, message))


class _Writer:
    """A non-blocking pipe, as the SDK's stdio_server writes an `anyio.AsyncFile`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def write(self, text: str) -> None:
        await self._stream.send_all(text.encode())

    async def flush(self) -> None:
        pass


# --- frames the SDK cannot read ------------------------------------------------------------
#
# The SDK's stdio transport parses each line once (pydantic) and, when that fails, sends the
# ValidationError into the read stream, where the server only logs it: the client's request
# then waits forever. `_Answering` takes those errors off the stream and works out an answer
# from them alone (a JSON error carries its line as the input; a model error the parsed
# object), so a well-formed line is still parsed once, and only a failed one again.

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# What to do, by the parser's reason (pydantic-core's JSON parser: its limits).
_UNREADABLE_HINTS = (
    ("recursion limit exceeded", "JSON nested 200 deep or more is not read: nest it less deeply"),
    ("number out of range", "numbers of more than 4300 digits are not read: send them as strings"),
)
_UNKNOWN = object()  # no top-level value found in a validation error


def _error_answer(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


def _request_id(obj: Any) -> str | int | None:
    """A request's own id, when `obj` is one (a JSON object with a method and a string or
    integer id); else None, as JSON-RPC answers what it cannot tie to a request."""
    if not isinstance(obj, dict) or "method" not in obj:
        return None
    found = obj.get("id")
    if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
        return found
    return None


def _int_or_none(digits: str) -> int | None:
    return int(digits) if len(digits) <= 4300 else None  # past Python's own conversion limit


def _salvage(exc: ValidationError, *, mend: bool = True) -> SessionMessage | types.JSONRPCError | None:
    """What becomes of a line the SDK could not read: the message, mended (a lone surrogate in a
    string made U+FFFD); an error answer; or None (a blank line: nothing to answer)."""
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        line = errors[0].get("input")
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        reason = str(errors[0]["msg"]).removeprefix("Invalid JSON: ")
        if not isinstance(line, str):
            return _error_answer(None, PARSE_ERROR, f"not JSON: {reason}")
        return _unreadable(line, reason, mend)
    return _invalid(_top_value(errors), errors)


def _unreadable(line: str, reason: str, mend: bool) -> SessionMessage | types.JSONRPCError | None:
    if not line.strip():
        return None
    try:
        obj: Any = json.loads(line, parse_int=_int_or_none)
    except (ValueError, RecursionError):
        obj = _UNKNOWN
    if mend and obj is not _UNKNOWN and ("\\ud" in line or "\\uD" in line):
        # JSON's `\ud800` escape alone: the SDK's parser refuses it. Made U+FFFD, as a UTF-8
        # decoder does with a broken byte (the ACP connection does the same), and served.
        text = json.dumps(obj, ensure_ascii=False)
        if _LONE_SURROGATE.search(text):
            mended = _LONE_SURROGATE.sub("\ufffd", text)
            try:
                return SessionMessage(types.jsonrpc_message_adapter.validate_json(mended, by_name=False))
            except ValidationError as again:
                return _salvage(again, mend=False)
    hint = next((hint for key, hint in _UNREADABLE_HINTS if key in reason), None)
    if hint is not None:
        message = f"the message cannot be read ({reason}): {hint}"
    elif obj is _UNKNOWN:
        message = f"not JSON: {reason}; send one JSON-RPC message, a JSON object, per line"
    else:
        message = f"the message cannot be read: {reason}"
    return _error_answer(_request_id(obj), PARSE_ERROR, message)


def _top_value(errors: list[Any]) -> Any:
    """The parsed line a model error was about: the input of an error about the message itself
    (the union's branch alone in its location) or of a field missing from it."""
    for error in errors:
        loc = error.get("loc", ())
        if len(loc) == 1 or (len(loc) == 2 and error.get("type") == "missing"):
            return error.get("input", _UNKNOWN)
    return _UNKNOWN


def _invalid(top: Any, errors: list[Any]) -> types.JSONRPCError:
    if isinstance(top, list):
        return _error_answer(None, INVALID_REQUEST,
                             "a batch (a JSON array) is not read: send each message, a JSON object, on its own line")
    if not isinstance(top, dict):
        what = "something else" if top is _UNKNOWN else type(top).__name__ if top is not None else "null"
        return _error_answer(None, INVALID_REQUEST,
                             f"a message must be a JSON-RPC message, a JSON object, not {what}")
    if "method" in top:
        kind, branch = ("request", "JSONRPCRequest") if "id" in top else ("notification", "JSONRPCNotification")
    elif "result" in top:
        kind, branch = "response", "JSONRPCResponse"
    elif "error" in top:
        kind, branch = "error response", "JSONRPCError"
    else:
        kind, branch = "message", "JSONRPCRequest"
    mine = [e for e in errors if tuple(e.get("loc", ()))[:1] == (branch,)] or errors
    what = "; ".join(_describe(kind, e) for e in mine[:3])
    if kind == "message":
        what += ' (a request is an object with "jsonrpc": "2.0", an "id", a "method" and its "params")'
    return _error_answer(_request_id(top), INVALID_REQUEST, what)


def _describe(kind: str, error: Any) -> str:
    field = ".".join(str(part) for part in tuple(error.get("loc", ()))[1:])
    msg = str(error.get("msg", "invalid"))
    if error.get("type") == "missing" and field:
        return f"the {kind} has no {field}"
    if not field:
        return f"the {kind}: {msg}"
    if msg.startswith("Input should be "):
        return f"the {kind}'s {field} must be {msg.removeprefix('Input should be ')}"
    return f"the {kind}'s {field}: {msg}"


class _Answering:
    """The SDK's stdio read stream without the lines it could not read: a mended message is
    passed on; any other is answered on the write stream (`_salvage`), and never reaches the
    server (which would only log it)."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write = write_stream

    @property
    def last_context(self) -> Any:  # the dispatcher runs each message in its sender's context
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, ValidationError):
                return item
            try:
                outcome = _salvage(item)
            except Exception:
                logger.exception("stdin: working out the answer to an unreadable message failed")
                outcome = _error_answer(None, PARSE_ERROR, "the message cannot be read")
            if isinstance(outcome, SessionMessage):
                return outcome
            if outcome is not None:
                logger.info("stdin: answered an unreadable message (id %r): %s", outcome.id, outcome.error.message)
                await _send_quietly(self._write, outcome)

    def __aiter__(self) -> _Answering:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Answering:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _send_quietly(write_stream: Any, answer: types.JSONRPCError) -> None:
    try:
        await write_stream.send(SessionMessage(answer))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass  # the client is gone: nobody to answer


@asynccontextmanager
async def _stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport on this process's stdin and stdout (trio's streams when they
    are pipes, `_native_stdio`), every line it cannot read answered (`_Answering`). On the pipes
    a line over the cap is answered too; on other files (a terminal, a regular file) the SDK
    reads lines itself, with no cap."""
    from mcp.server.stdio import stdio_server  # the stdio transport: only when serving on stdio

    async with _native_stdio() as native, stdio_server(*(native or (None, None))) as (read_stream, write_stream):
        if native is not None:

            async def refuse(answer: types.JSONRPCError) -> None:
                await _send_quietly(write_stream, answer)

            native[0].refuse = refuse
        yield _Answering(read_stream, write_stream), write_stream


@asynccontextmanager
async def _native_stdio() -> AsyncIterator[tuple[Any, Any] | None]:
    """stdin and stdout as trio's non-blocking streams for the SDK's stdio_server, whose own
    streams go through a worker thread for every line read, write and flush (~1 ms of a
    call's round trip on 2 busy cores). Pipes and sockets only (O_NONBLOCK on a terminal
    would reach the shell); else None, and the SDK's own are used. As the SDK does, fd 0 and
    1 point at /dev/null and stderr while serving, so a stray print or a child process cannot
    write into the protocol, and are restored after."""
    def is_pipe(fd: int) -> bool:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return False
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)

    if not (is_pipe(0) and is_pipe(1)):
        yield None
        return
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    # FdStream owns the duplicates: closing it restores their blocking mode, then closes them.
    reader, writer = trio.lowlevel.FdStream(wire_in), trio.lowlevel.FdStream(wire_out)
    try:
        yield _LineReader(reader, _max_frame()), _Writer(writer)
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        with trio.CancelScope(shield=True):
            await reader.aclose()
            await writer.aclose()


# --- HTTP ---------------------------------------------------------------------------------

Scope = Mapping[str, Any]
ASGIReceive = Callable[[], Any]
ASGISend = Callable[[dict[str, Any]], Any]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_host(host: str | None) -> bool:
    return host is not None and _host_name(host.strip().lower()) in LOOPBACK_HOSTS


def is_loopback_origin(origin: str | None) -> bool:
    if origin is None:
        return True
    try:
        parts = urlsplit(origin.strip().lower())
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOOPBACK_HOSTS


async def _plain(send: ASGISend, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


def _with_sse_retry(send: ASGISend) -> ASGISend:
    """`send`, plus an SSE `retry:` field right after the start of an event-stream response."""

    async def wrapped(message: dict[str, Any]) -> None:
        await send(message)
        if message["type"] == "http.response.start" and message.get("status") == 200 and any(
            k.lower() == b"content-type" and bytes(v).startswith(b"text/event-stream")
            for k, v in message.get("headers", [])
        ):
            await send({"type": "http.response.body", "body": b"retry: %d\n\n" % SSE_RETRY_MS, "more_body": True})

    return wrapped


@dataclass
class Mount:
    """One bridge on the HTTP app: streamable HTTP at `base/mcp`, SSE at `base/sse`."""

    bridge: BridgeServer
    token: str
    base: str
    manager: Any = None
    sse: Any = None
    cancel: anyio.CancelScope | None = None

    @property
    def mcp_path(self) -> str:
        return self.base + "/mcp"

    @property
    def sse_path(self) -> str:
        return self.base + "/sse"

    @property
    def messages_path(self) -> str:
        return self.base + "/messages/"


class BridgeHTTP:
    """An ASGI app serving many bridges, keyed by path and bearer token.

    Use as `async with BridgeHTTP() as app: await app.mount(bridge, token=..., base="/s/ID")`,
    then serve `app` (see `serve_http`). Requests: foreign Host or Origin -> 403; OAuth
    discovery probes -> 404 at once; no or wrong token -> 401; unknown path -> 404.
    """

    def __init__(self) -> None:
        self._mounts: dict[str, Mount] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> BridgeHTTP:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc)

    @property
    def mounts(self) -> list[Mount]:
        return list(self._mounts.values())

    async def mount(self, bridge: BridgeServer, *, token: str, base: str = "", watch: bool = True) -> Mount:
        """Serve `bridge` under `base` for requests bearing `token`. `watch=False` when several
        bridges share one backend and another mount already forwards its changes."""
        # the SDK's HTTP transports (starlette): only a bridge served over HTTP needs them
        from mcp.server.sse import SseServerTransport
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        if self._tg is None:
            raise RuntimeError("BridgeHTTP.mount needs `async with BridgeHTTP()`")
        base = "/" + base.strip("/") if base.strip("/") else ""
        if base in self._mounts:
            raise ValueError(f"a bridge is already mounted at {base or '/'}")
        # Host/Origin are checked once, in `__call__`, for every transport.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        m = Mount(bridge=bridge, token=token, base=base)
        m.manager = StreamableHTTPSessionManager(app=bridge.server, security_settings=security)
        m.sse = SseServerTransport(m.messages_path, security_settings=security)
        await self._tg.start(self._run_mount, m, watch)
        self._mounts[base] = m
        return m

    def unmount(self, base: str) -> None:
        m = self._mounts.pop("/" + base.strip("/") if base.strip("/") else "", None)
        if m is not None and m.cancel is not None:
            m.cancel.cancel()

    async def _run_mount(self, m: Mount, watch: bool, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            m.cancel = scope
            async with m.manager.run(), anyio.create_task_group() as tg:
                if watch:
                    m.bridge.expect_watcher()
                    tg.start_soon(m.bridge.run_watcher)
                task_status.started()
                await anyio.sleep_forever()

    def _route(self, path: str) -> tuple[Mount, str] | None:
        for m in self._mounts.values():
            if path in (m.mcp_path, m.mcp_path + "/"):
                return m, "mcp"
            if path == m.sse_path:
                return m, "sse"
            if path.startswith(m.messages_path) or path == m.messages_path.rstrip("/"):
                return m, "messages"
        return None

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if not is_loopback_host(_header(scope, b"host")):
            return await _plain(send, 403, "Forbidden: this server answers only on 127.0.0.1/localhost")
        if not is_loopback_origin(_header(scope, b"origin")):
            return await _plain(send, 403, "Forbidden: cross-origin requests are refused")
        path: str = scope.get("path", "")
        if path.startswith("/.well-known/") or path.rstrip("/").endswith("/register"):
            return await _plain(send, 404, "Not found: this server uses a bearer token, not OAuth")
        routed = self._route(path)
        if routed is None:
            return await _plain(send, 404, "Not found: MCP is served at /mcp (streamable HTTP) and /sse")
        m, kind = routed
        auth = _header(scope, b"authorization") or ""
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not given or not hmac.compare_digest(given.encode(), m.token.encode()):
            return await _plain(
                send,
                401,
                "Unauthorized: send the bridge's token as `Authorization: Bearer <token>`",
                [(b"www-authenticate", b'Bearer realm="crucible"')],
            )
        if kind == "mcp":
            if scope.get("method") == "GET":
                send = _with_sse_retry(send)
            await m.manager.handle_request(scope, receive, send)
        elif kind == "messages":
            await m.sse.handle_post_message(scope, receive, send)
        else:
            await self._serve_sse(m, scope, receive, send)

    async def _serve_sse(self, m: Mount, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope.get("method") != "GET":
            return await _plain(send, 405, "Method not allowed: open the SSE stream with GET")
        try:
            async with m.sse.connect_sse(scope, receive, send) as (read_stream, write_stream):
                await m.bridge.serve_streams(read_stream, write_stream)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:  # the client dropped the stream
            logger.debug("SSE connection ended", exc_info=True)


@asynccontextmanager
async def serving_http(
    app: BridgeHTTP, *, port: int = 0, host: str = "127.0.0.1"
) -> AsyncIterator[int]:
    """Serve `app` with hypercorn's trio worker on loopback; yields the bound port."""
    # hypercorn: only a bridge served over HTTP needs it
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve

    if host not in ("127.0.0.1", "::1", "localhost"):
        raise ValueError(f"the bridge listens on loopback only, not {host}")
    config = HyperConfig()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("mcp_bridge.http")
    config.graceful_timeout = 1.0
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:

        async def trigger() -> None:
            await shutdown.wait()

        binds: list[str] = await nursery.start(
            lambda task_status: serve(app, config, shutdown_trigger=trigger, task_status=task_status)  # type: ignore[arg-type]
        )
        actual = int(binds[0].rsplit(":", 1)[1])
        try:
            yield actual
        finally:
            shutdown.set()


class RelayError(Exception):
    """The bridge a relay points at cannot be used (message says why, safe to show)."""


async def _preflight(http: Any, url: str) -> None:
    import httpx2  # the relay's HTTP client: only `cru mcp --connect`

    try:
        response = await http.get(url, headers={"Accept": "text/event-stream"})
        await response.aclose()
    except httpx2.HTTPError as exc:
        raise RelayError(f"nothing answers at {url} ({type(exc).__name__})") from None
    if response.status_code == 401:
        raise RelayError(f"the bridge at {url} refused the token (check $CRUCIBLE_BRIDGE_TOKEN)")
    if response.status_code in (403, 404):
        raise RelayError(f"the bridge at {url} answered {response.status_code}: {response.text[:200]}")


async def relay_stdio(url: str, token: str) -> None:
    """A stdio MCP server that relays every message to a streamable-HTTP endpoint (a session's
    bridge) and back, so a stdio-only client reaches the same bridge as the HTTP agents."""
    # the relay's HTTP client and the stdio server: only `cru mcp --connect`
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        await _preflight(http, url)
        try:
            async with (
                streamable_http_client(url, http_client=http) as (up_read, up_write),
                _stdio_streams() as (down_read, down_write),
                anyio.create_task_group() as tg,
            ):

                async def pump(source: Any, sink: Any, what: str) -> None:
                    async for message in source:
                        if isinstance(message, Exception):  # a transport failure: say so, go on
                            logger.warning("relay (%s): %s", what, message)
                            continue
                        await sink.send(message)
                    tg.cancel_scope.cancel()  # either side closed: the relay is done

                tg.start_soon(pump, down_read, up_write, "client to bridge")
                tg.start_soon(pump, up_read, down_write, "bridge to client")
        except* httpx2.HTTPError as group:
            raise RelayError(f"lost the bridge at {url} ({type(group.exceptions[0]).__name__})") from None


# --- requests from upstreams, answered by our own client (cru mcp) ---------------------------


def _client_elicit(ctx: ServerRequestContext[Any]) -> ElicitFn | None:
    """An upstream's elicitation, forwarded to the client of this call when it can answer one
    (`cru mcp` behind Claude Code, say); None when it cannot (the upstream is declined)."""
    caps = ctx.session.client_capabilities
    if caps is None or caps.elicitation is None:
        return None
    session, request_id = ctx.session, ctx.request_id

    async def elicit(server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        if isinstance(params, types.ElicitRequestURLParams):
            return await session.elicit_url(f"[{server}] {params.message}", params.url, params.elicitation_id or "",
                                            related_request_id=request_id)
        return await session.elicit_form(f"[{server}] {params.message}", params.requested_schema,
                                         related_request_id=request_id)

    return elicit


# --- past the schema budget: three tools instead of every upstream tool ----------------------


class DiscoverArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(default="", description="words to look for in tool names and descriptions (empty: all)")
    limit: int = Field(default=20, ge=1, le=200, description="how many tools to return (1-200)")


class FoundTool(BaseModel):
    name: str
    description: str
    read_only: bool


class DiscoverResult(BaseModel):
    tools: list[FoundTool]
    total: int


class SchemaArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="a tool name from discover_tools")


class SchemaResult(BaseModel):
    name: str
    description: str | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any] | None


class InvokeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="a tool name from discover_tools")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments (see get_tool_schema)")


@dataclass(eq=False)
class _InvokeTool:
    """`invoke_tool`: a call of the named tool through the same dispatcher (its policy, its
    time limit); the outer call has no limit of its own."""

    bridge: BridgeServer
    name: str = "invoke_tool"
    kind: str = "discovery"
    read_only: bool = True  # the named tool's own policy decides
    timeout: float | None = math.inf
    prepare: None = None

    def to_mcp(self) -> types.Tool:
        return types.Tool(name=self.name, description=(
            "Call one of the MCP servers' tools found with discover_tools, with its arguments."),
            input_schema=input_schema(InvokeArgs), annotations=types.ToolAnnotations(open_world_hint=True))

    def validate(self, arguments: dict[str, Any] | None) -> InvokeArgs:
        spec = ToolSpec(self.name, "", InvokeArgs, SchemaResult, _never, read_only=True)
        return spec.validate(arguments)  # type: ignore[return-value]

    async def run(self, ctx: ToolContext, args: InvokeArgs) -> types.CallToolResult:
        if args.name in {"invoke_tool", "discover_tools", "get_tool_schema"}:
            raise ToolError(f"invoke_tool calls the MCP servers' tools, not {args.name}")
        return await self.bridge.call_tool(args.name, args.arguments, report_progress=ctx.report_progress,
                                           elicit=ctx.elicit)


async def _never(ctx: ToolContext, args: Any) -> BaseModel:
    raise ToolError("not callable")


def _discovery_tools(bridge: BridgeServer) -> list[Tool]:
    def upstream_tools() -> list[Tool]:
        gateway = bridge.gateway
        if gateway is None:
            return []
        return [t for t in gateway.tools() if bridge.decision(t.name) != "deny"]

    async def discover(ctx: ToolContext, a: DiscoverArgs) -> DiscoverResult:
        words = a.query.lower().split()
        found = [t for t in upstream_tools()
                 if all(w in f"{t.name} {t.to_mcp().description or ''}".lower() for w in words)]
        return DiscoverResult(total=len(found), tools=[
            FoundTool(name=t.name, description=(t.to_mcp().description or "")[:300], read_only=t.read_only)
            for t in found[: a.limit]])

    async def schema(ctx: ToolContext, a: SchemaArgs) -> SchemaResult:
        tool = next((t for t in upstream_tools() if t.name == a.name), None)
        if tool is None:
            raise ToolError(f"No MCP server tool named '{a.name}'; discover_tools lists them")
        mcp = tool.to_mcp()
        annotations = mcp.annotations.model_dump(by_alias=True, exclude_none=True) if mcp.annotations else None
        return SchemaResult(name=mcp.name, description=mcp.description, input_schema=mcp.input_schema,
                            output_schema=mcp.output_schema, annotations=annotations)

    return [
        ToolSpec("discover_tools", "Find tools of the person's MCP servers by words in their names and "
                 "descriptions (there are too many to list). Then get_tool_schema, then invoke_tool.",
                 DiscoverArgs, DiscoverResult, discover, read_only=True, idempotent=True),
        ToolSpec("get_tool_schema", "The input schema, output schema and annotations of one tool found with "
                 "discover_tools.", SchemaArgs, SchemaResult, schema, read_only=True, idempotent=True),
        _InvokeTool(bridge),
    ]
