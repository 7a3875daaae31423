"""The person's own MCP servers (upstreams) behind every bridge of a process.

One `Gateway` per process (the `BridgeHost` of `cru chat` / `cru acp` and their delegated
children, or `cru mcp`) holds one connection per upstream, made with the `mcp` SDK's clients
(stdio, streamable HTTP, SSE) and shared by every bridge. Upstream tools, resources and prompts
appear with the server's prefix (`gh_search_issues`), everything else about them intact
(schemas, annotations, output schemas); calls go through the bridge's one dispatcher like any
other tool (`GatewayTool` is a `mcp_bridge.dispatch.Tool`).

Lifecycle: nothing starts with the process; a bridge's first tools/list starts every upstream
and waits a little (`startup_wait`) for them. Each upstream has a supervisor task: connect,
list, serve, and when the connection drops, reconnect with backoff (`auto_reconnect`). A call
while an upstream is down is answered at once, with the reason and the end of the server's
stderr. Requests from an upstream are answered: `roots/list` with the roots of the bridges
attached (their kilns and working folders), `elicitation/create` by the caller of the tool
call in flight (the person, through the session's dialog or the editor; `cru mcp`'s own
client), declined when nobody can answer. Sampling is not offered to upstreams (Crucible has
no model of its own to send it to), so the SDK declines it.

Secrets (`{env:VAR}` values, header and env values) are replaced by their names in every text
this module lets out: results, errors, stderr tails, logs, and the lists themselves (a tool,
prompt or resource whose name holds a secret is left out, with a log line: a redacted name
could not be called).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import re
import warnings
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import mcp_types as types
from mcp_types import CONNECTION_CLOSED

from mcp_bridge.tools import KILN_TOOLS, ElicitFn, ProgressReporter, ToolContext, ToolError

logger = logging.getLogger("mcp_bridge.gateway")

# Reconnect backoff: first retry after RETRY_FIRST s, doubling up to RETRY_MAX.
RETRY_FIRST = 0.5
RETRY_MAX = 30.0
# An upstream that does not finish its handshake (and first listing) in this long is down.
CONNECT_TIMEOUT = 30.0
STDERR_LINES = 20
STDERR_LINE_MAX = 400
# Bounds on what an upstream may hand us (it is hostile until bounded).
LIST_PAGES_MAX = 50
DESCRIPTION_MAX = 8192
# Tools taken from one server: past this many (an agent cannot choose among more), the rest are
# left out with a log line.
TOOLS_MAX = 1000
# How long a call that lost its connection waits for the supervisor to learn why (the server's
# exit, its last stderr lines) before it answers with what it knows.
LOST_WHY_WAIT = 5.0
# The MCP spec's tool name characters and length (of the prefixed name); anything else is left
# out (with a log line).
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
# Names the bridge keeps for its own tools besides the kiln tools (past the schema budget).
_BRIDGE_META_TOOLS = ("discover_tools", "get_tool_schema", "invoke_tool")

UpstreamState = Literal["idle", "starting", "up", "down", "stopped"]


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream server, as the application's config describes it (already interpolated)."""

    name: str
    prefix: str
    transport: Literal["stdio", "http", "sse"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] | None = None
    blocked_tools: tuple[str, ...] = ()
    auto_reconnect: bool = True
    timeout: float | None = None  # per call; None: the dispatcher's
    secrets: Mapping[str, str] = field(default_factory=dict)  # value -> what to show instead

    def allows(self, tool: str) -> bool:
        """blocked_tools wins over allowed_tools; no allowed_tools means all."""
        if any(fnmatch.fnmatchcase(tool, p) for p in self.blocked_tools):
            return False
        return self.allowed_tools is None or any(fnmatch.fnmatchcase(tool, p) for p in self.allowed_tools)

    def describe(self) -> str:
        if self.transport == "stdio":
            return " ".join([self.command or "", *self.args]).strip()
        return f"{self.transport} {self.url}"


class Redactor:
    """Replaces secret values with their names in text and JSON."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self._pairs = sorted(((v, n) for v, n in secrets.items() if v), key=lambda p: -len(p[0]))

    def holds_secret(self, text: str) -> bool:
        return any(value in text for value, _ in self._pairs)

    def text(self, text: str) -> str:
        for value, name in self._pairs:
            if value in text:
                text = text.replace(value, name)
        return text

    def deep(self, value: Any) -> Any:
        if not self._pairs:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.deep(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.deep(v) for v in value]
        return value

    def result(self, result: types.CallToolResult) -> types.CallToolResult:
        if not self._pairs:
            return result
        data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return types.CallToolResult.model_validate(self.deep(data))


@dataclass(eq=False)
class Caller:
    """Whom an upstream call is for: where its elicitations go and its progress goes."""

    elicit: ElicitFn | None = None
    progress: ProgressReporter | None = None


@dataclass
class UpstreamStatus:
    """What `cru mcp servers`, `/mcp` and `cru doctor` show for one upstream."""

    name: str
    prefix: str
    transport: str
    target: str
    state: UpstreamState
    tools: int
    resources: int
    prompts: int
    last_error: str | None
    restarts: int
    listed_bytes: int
    stderr_tail: list[str]


class GatewayListener(Protocol):
    """A bridge attached to the gateway: told when upstream lists change; its roots are offered."""

    roots: list[tuple[str, str]]  # (file:// URI, name)

    async def upstream_changed(self, kinds: set[str]) -> None: ...


class Upstream:
    """One upstream server: its connection, its lists, its state. Supervised by `run`."""

    def __init__(self, spec: UpstreamSpec, gateway: Gateway) -> None:
        self.spec = spec
        self.gateway = gateway
        self.redact = Redactor(spec.secrets)
        self.state: UpstreamState = "idle"
        self.last_error: str | None = None
        self.restarts = 0
        self._down_said = ""  # the down line logged for the current streak of failures
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self.tools: dict[str, GatewayTool] = {}  # by prefixed name
        self.resources: list[types.Resource] = []
        self.templates: list[types.ResourceTemplate] = []
        self.prompts: dict[str, tuple[str, types.Prompt]] = {}  # prefixed -> (original, prompt)
        self.capabilities: types.ServerCapabilities | None = None
        self._client: Any = None
        self._settled = anyio.Event()  # the current connection attempt is up or failed
        self._lost = anyio.Event()
        self._lost_reason = ""
        self._went_down = anyio.Event()  # the current connection is over and `last_error` says why
        self._ending = anyio.Event()  # the current connection's transport is being torn down
        self._connect_scope: anyio.CancelScope | None = None  # while connecting (handshake, first lists)
        self._dirty: set[str] = set()
        self._dirty_event = anyio.Event()
        self._callers: list[Caller] = []
        self.first_settled = False  # its first connection attempt is over (up or failed)

    # -- status ------------------------------------------------------------------------------

    def status(self) -> UpstreamStatus:
        return UpstreamStatus(
            name=self.spec.name, prefix=self.spec.prefix, transport=self.spec.transport,
            target=self.redact.text(self.spec.describe()), state=self.state, tools=len(self.tools),
            resources=len(self.resources) + len(self.templates), prompts=len(self.prompts),
            last_error=self.last_error, restarts=self.restarts,
            listed_bytes=sum(t.listed_bytes for t in self.tools.values()), stderr_tail=list(self.stderr),
        )

    def down_message(self) -> str:
        why = self.last_error or "it is not connected"
        if self.state == "stopped":
            what = f"MCP server '{self.spec.name}' is down and will not be restarted (auto_reconnect = false)"
        elif self.state == "idle":
            what = f"MCP server '{self.spec.name}' has not started yet"
        elif self.state == "starting" and not self.restarts and not self.first_settled:
            return (f"MCP server '{self.spec.name}' is still starting (its first connection is not up yet, so "
                    "its tools are not listed); try again in a moment")
        else:
            what = f"MCP server '{self.spec.name}' is down (restarting, attempt {self.restarts + 1})"
        tail = [line for line in self.stderr if line.strip()][-5:]
        stderr = ("; its last stderr lines: " + " | ".join(tail)) if tail else ""
        return _home_as_tilde(self.redact.text(f"{what}: {why}{stderr}"))  # an agent reads it

    # -- the supervisor ----------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, list, serve until the connection drops; reconnect with backoff. Runs until
        cancelled (or, with auto_reconnect = false, until the first connection ends)."""
        delay = RETRY_FIRST
        while True:
            self.state = "starting"
            if self._settled.is_set():
                self._settled = anyio.Event()
            self._lost = anyio.Event()
            self._lost_reason = ""
            self._went_down = anyio.Event()
            self._ending = anyio.Event()
            try:
                async with self._connected() as client:
                    self._client = client
                    self.state = "up"
                    self.last_error = None
                    if self._down_said:
                        self._down_said = ""
                        logger.warning("MCP server %s is up again (restarts: %d)", self.spec.name, self.restarts)
                    self._settle()
                    delay = RETRY_FIRST
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._refresher, client)
                        await self._lost.wait()
                        tg.cancel_scope.cancel()
                    self.last_error = self.redact.text(self._lost_reason or "the connection closed")
            except Exception as exc:  # the connection failed or dropped: say why, then retry
                # What ended it, when we know (a line past the bound, an unreadable message, the
                # server's exit), says more than the SDK's `Connection closed`.
                self.last_error = self.redact.text(self._lost_reason or _describe(exc, self.spec))
            finally:
                self._client = None
            self.state = "down"
            # Its last stderr line says why more often than the transport's error does. Said once
            # while it keeps failing the same way (it is retried with backoff, for as long as it takes).
            tail = next((line for line in reversed(self.stderr) if line.strip()), "")
            down = _home_as_tilde(f"MCP server {self.spec.name} is down: {self.last_error}"
                                  + (f" (its stderr: {tail})" if tail else ""))
            logger.log(logging.DEBUG if down == self._down_said else logging.WARNING, "%s", down)
            self._down_said = down
            self._went_down.set()
            self._settle()
            if not self.spec.auto_reconnect:
                self.state = "stopped"
                return
            await anyio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
            self.restarts += 1

    def _settle(self) -> None:
        self.first_settled = True
        self._settled.set()

    async def settled(self) -> None:
        """Wait until the current connection attempt is up or has failed."""
        if self.state in ("idle", "starting"):
            await self._settled.wait()

    def _lost_now(self, reason: str) -> None:
        """The connection is over (or, while connecting, the attempt fails) for `reason`."""
        if not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()
        if self._connect_scope is not None:
            self._connect_scope.cancel()

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[Any]:
        """An entered SDK `Client` (handshake done, lists fetched), watched for the end of its stream."""
        from mcp.client.client import (
            Client,  # the SDK's client loads when the first upstream starts
        )

        client = Client(
            self._watched(self._transport()),
            mode="legacy",  # the handshake era: list_changed arrives as plain notifications
            cache=None,  # lists must be fresh after list_changed
            elicitation_callback=self._on_elicit,
            list_roots_callback=self._on_list_roots,
            message_handler=self._on_message,
            client_info=types.Implementation(name="crucible-gateway", version="0.1.0"),
        )
        # One scope around the whole connection (the client's task groups live inside it): its
        # deadline bounds the handshake and the first listing, then it is lifted.
        with anyio.CancelScope(deadline=anyio.current_time() + CONNECT_TIMEOUT) as scope:
            self._connect_scope = scope
            try:
                async with client:
                    self.capabilities = client.server_capabilities
                    await self._refresh(client, {"tools", "resources", "prompts"})
                    scope.deadline = math.inf
                    self._connect_scope = None
                    yield client
            finally:
                self._connect_scope = None
        if scope.cancelled_caught:
            if self._lost_reason:  # ended early, for a reason (see `_lost_now`)
                raise ConnectionError(self._lost_reason)
            raise TimeoutError("the MCP handshake took too long")

    def _transport(self) -> Any:
        spec = self.spec
        if spec.transport == "stdio":
            return self._stdio()
        if spec.transport == "http":
            return self._http()
        from mcp.client.sse import (
            sse_client,  # each transport's client loads only when an upstream uses it
        )

        return sse_client(spec.url or "", headers=dict(spec.headers) or None)

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[Any]:
        from mcp.client.streamable_http import (
            streamable_http_client,  # each transport's client loads only when an upstream uses it
        )

        from mcp_bridge.upstream_http import (  # (the HTTP stack with it)
            SSE_EVENT_MAX_BYTES,
            bounded_http_client,
        )

        async with (bounded_http_client(headers=dict(self.spec.headers) or None) as http,
                    streamable_http_client(self.spec.url or "", http_client=http,
                                           max_sse_event_size=SSE_EVENT_MAX_BYTES) as streams):
            yield streams

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        """The stdio client (upstream_stdio: the SDK's, with a bound on a line), with the
        server's stderr read into a bounded tail (for the reason of an outage) instead of mixed
        into ours."""
        import trio  # the stdio upstream's stderr pipe is read on trio (the host's runtime)
        from mcp.client.stdio import (  # each transport's client loads only when an upstream uses it
            StdioServerParameters,
        )

        from mcp_bridge.upstream_stdio import bounded_stdio_client  # (with it)

        spec = self.spec
        params = StdioServerParameters(command=spec.command or "", args=list(spec.args),
                                       env=dict(spec.env) or None, cwd=spec.cwd)
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        reader = trio.lowlevel.FdStream(read_fd)
        self.stderr.clear()
        drained = anyio.Event()
        group: int | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stderr, reader, drained)
            try:
                async with bounded_stdio_client(params, errlog=errlog, on_oversized=self._lost_now) as streams:
                    group = await self._watch_server(write_fd)
                    errlog.close()  # the server holds its own copy; EOF comes when it exits
                    yield streams
            finally:
                if group is not None and self.gateway.unwatch_group is not None:
                    self.gateway.unwatch_group(group)  # the SDK has stopped the server's group
                if not errlog.closed:
                    errlog.close()
                with anyio.move_on_after(1.0):  # the last lines of a dying server
                    await drained.wait()
                nursery.cancel_scope.cancel()

    async def _watch_server(self, stderr_fd: int) -> int | None:
        """Hand the server's process group to the gateway's `watch_group` (if any). The SDK
        keeps the process to itself; it is our child that holds `stderr_fd`'s pipe as its fd 2,
        and it leads its own group (the SDK starts it with a new session)."""
        watch = self.gateway.watch_group
        if watch is None:
            return None
        pid = await anyio.to_thread.run_sync(_child_holding, os.fstat(stderr_fd).st_ino)
        if pid is not None:
            watch(pid)
        return pid

    async def _read_stderr(self, reader: Any, drained: anyio.Event) -> None:
        buffer = b""
        try:
            while chunk := await reader.receive_some(1 << 14):
                *lines, buffer = (buffer + chunk).split(b"\n")
                buffer = buffer[-STDERR_LINE_MAX:]
                for line in lines:
                    text = _home_as_tilde(self.redact.text(line.decode("utf-8", "replace").rstrip()[:STDERR_LINE_MAX]))
                    if text:
                        self.stderr.append(text)
                        logger.debug("%s stderr: %s", self.spec.name, text)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            if buffer.strip():
                self.stderr.append(_home_as_tilde(self.redact.text(buffer.decode("utf-8", "replace")[:STDERR_LINE_MAX])))
            drained.set()
            with anyio.CancelScope(shield=True):
                await reader.aclose()

    @asynccontextmanager
    async def _watched(self, inner: Any) -> AsyncIterator[Any]:
        """The transport's streams, with its read side relayed so that its end (the server
        exited, the stream broke) is noticed even when no call is in flight."""
        from mcp.shared.message import (
            SessionMessage,  # with the SDK's client, when an upstream starts
        )

        ending = self._ending
        async with inner as (read_stream, write_stream):
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def pump() -> None:
                try:
                    try:
                        async for item in read_stream:
                            await send.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        pass
                    # The stream ended (not our own teardown, a cancel): said before the session
                    # sees the end, so a call that ends with the SDK's `Connection closed` finds
                    # the connection lost (see `call`).
                    self._lost_now(_SERVER_GONE)
                finally:
                    send.close()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                try:
                    yield receive, _WatchedSend(write_stream, self._lost_now)
                finally:
                    ending.set()  # (the SDK's own failure, e.g. an HTTP server that cannot be reached)
                    tg.cancel_scope.cancel()

    # -- lists ---------------------------------------------------------------------------------

    async def _refresher(self, client: Any) -> None:
        """Refetch what an upstream said changed (list_changed), then tell the bridges."""
        while True:
            await self._dirty_event.wait()
            self._dirty_event = anyio.Event()
            kinds, self._dirty = self._dirty, set()
            try:
                await self._refresh(client, kinds)
            except Exception as exc:
                logger.warning("MCP server %s: refreshing %s failed: %s", self.spec.name, ", ".join(kinds),
                               self.redact.text(_describe(exc, self.spec)))
                continue
            await self.gateway.changed(kinds)

    async def _refresh(self, client: Any, kinds: set[str]) -> None:
        caps = self.capabilities
        if "tools" in kinds and (caps is None or caps.tools is not None):
            listed = await _all_pages(lambda c: client.list_tools(cursor=c, cache_mode="bypass"), "tools")
            self.tools = self._accept_tools(listed)
            self.gateway.reindex()
        if "resources" in kinds and caps is not None and caps.resources is not None:
            resources = await _all_pages(lambda c: client.list_resources(cursor=c, cache_mode="bypass"),
                                         "resources")
            templates = await _all_pages(
                lambda c: client.list_resource_templates(cursor=c, cache_mode="bypass"), "resource_templates")
            self.resources = [self._redacted(r.model_copy(update={"name": self.spec.prefix + r.name}))
                              for r in resources if self._secret_free("resource", r.name, str(r.uri))]
            self.templates = [self._redacted(t.model_copy(update={"name": self.spec.prefix + t.name}))
                              for t in templates if self._secret_free("resource template", t.name, t.uri_template)]
        if "prompts" in kinds and caps is not None and caps.prompts is not None:
            prompts = await _all_pages(lambda c: client.list_prompts(cursor=c, cache_mode="bypass"), "prompts")
            self.prompts = {self.spec.prefix + p.name:
                            (p.name, self._redacted(p.model_copy(update={"name": self.spec.prefix + p.name})))
                            for p in prompts if _TOOL_NAME.match(p.name) and self._secret_free("prompt", p.name)}

    def _secret_free(self, kind: str, name: str, *more: str) -> bool:
        """False (with a log line) when what names an item holds a secret: shown redacted, it
        could not be called (or read) by that name, so it is left out."""
        if not any(self.redact.holds_secret(text) for text in (name, *more)):
            return True
        logger.warning("MCP server %s: left out the %s %r: its name holds a secret (shown here by its name)",
                       self.spec.name, kind, self.redact.text(name)[:80])
        return False

    def _redacted(self, item: Any) -> Any:
        """A listed item (tool, prompt, resource) with the secrets in its texts (descriptions,
        titles, schemas) replaced by their names."""
        data = item.model_dump(by_alias=True, mode="json", exclude_none=True)
        clean = self.redact.deep(data)
        return item if clean == data else type(item).model_validate(clean)

    def _accept_tools(self, listed: list[types.Tool]) -> dict[str, GatewayTool]:
        accepted: dict[str, GatewayTool] = {}
        for tool in listed:
            name = self.spec.prefix + tool.name
            if not _TOOL_NAME.match(tool.name) or not _TOOL_NAME.match(name):
                what = "is longer than 128 characters with its prefix" if _TOOL_NAME.match(tool.name) else \
                    "is not a usable MCP tool name"
                logger.warning("MCP server %s: left out the tool %r: its name %s", self.spec.name,
                               self.redact.text(tool.name[:80]), what)
                continue
            if not self._secret_free("tool", tool.name):
                continue
            if not self.spec.allows(tool.name):
                continue
            if len(accepted) >= TOOLS_MAX:
                logger.warning("MCP server %s lists more than %d tools: the rest are left out (narrow them with "
                               "allowed_tools)", self.spec.name, TOOLS_MAX)
                break
            update: dict[str, Any] = {"name": name}
            if tool.description and len(tool.description) > DESCRIPTION_MAX:
                update["description"] = tool.description[:DESCRIPTION_MAX] + " […]"
            prefixed = self._redacted(tool.model_copy(update=update))
            accepted[prefixed.name] = GatewayTool(self, tool.name, prefixed)
        return accepted

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            why = self.redact.text(_unreadable(message))
            if self.state == "starting" and self._connect_scope is not None:
                # Its handshake or first listing will not come: the attempt fails now, with this
                # reason (not the handshake's time limit), and is retried with backoff.
                self._lost_now(why)
            else:
                logger.warning("MCP server %s: %s", self.spec.name, why)
            return
        kind: str | None = None
        if isinstance(message, types.ToolListChangedNotification):
            kind = "tools"
        elif isinstance(message, types.ResourceListChangedNotification):
            kind = "resources"
        elif isinstance(message, types.PromptListChangedNotification):
            kind = "prompts"
        if kind is not None:
            self._dirty.add(kind)
            self._dirty_event.set()

    # -- requests from the upstream ------------------------------------------------------------

    async def _on_list_roots(self, context: Any) -> types.ListRootsResult:
        roots = [types.Root.model_validate({"uri": uri, "name": name}) for uri, name in self.gateway.roots()]
        return types.ListRootsResult(roots=roots)

    async def _on_elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        # A shared connection cannot tell whose call asked: the newest caller that can ask a
        # person answers (elicitations come during a call, and most calls run alone).
        caller = next((c for c in reversed(self._callers) if c.elicit is not None), None)
        if caller is None or caller.elicit is None:
            return types.ElicitResult(action="decline")
        try:
            return await caller.elicit(self.spec.name, params)
        except Exception:
            logger.exception("asking the person for MCP server %s failed", self.spec.name)
            return types.ElicitResult(action="decline")

    # -- calls ---------------------------------------------------------------------------------

    async def _ready_client(self) -> Any:
        if self.state == "idle":
            self.gateway.start()
        if self.state == "starting":  # (re)connecting now: wait for it, within the caller's time limit
            await self.settled()
        client = self._client
        if self.state != "up" or client is None:
            raise ToolError(self.down_message())
        return client

    async def call(self, original: str, arguments: dict[str, Any], caller: Caller) -> types.CallToolResult:
        from mcp.shared.exceptions import (
            MCPError,  # with the SDK's client, when an upstream is called
        )

        client = await self._ready_client()
        lost, ending, went_down = self._lost, self._ending, self._went_down  # this connection's
        self._callers.append(caller)
        try:
            result = await client.call_tool(original, arguments, progress_callback=caller.progress)
        except MCPError as exc:
            # -32000 is both the SDK's "connection closed" and the first code of JSON-RPC's
            # server-error range, which a server may answer with: only a connection that did end
            # (its stream, watched by `_watched`) is one.
            if exc.code == CONNECTION_CLOSED and exc.error.message == "Connection closed":
                with anyio.move_on_after(LOST_WHY_WAIT):  # the SDK saw the end first: our watch is next
                    await _first_of(lost, ending)
            if exc.code == CONNECTION_CLOSED and (lost.is_set() or ending.is_set()):
                raise ToolError(await self._lost_message(went_down)) from None
            raise ToolError(self._refusal(exc.error.code, exc.error.message)) from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._lost_now("the connection broke during a call")
            raise ToolError(await self._lost_message(went_down)) from None
        except Exception as exc:  # e.g. a result that does not match the tool's output schema
            raise ToolError(self.redact.text(f"MCP server '{self.spec.name}': {type(exc).__name__}: {exc}")) from None
        finally:
            self._callers.remove(caller)
        if not isinstance(result, types.CallToolResult):
            raise ToolError(f"MCP server '{self.spec.name}' answered with a {type(result).__name__}, not a tool result")
        return self.redact.result(result)

    def _refusal(self, code: int, message: str) -> str:
        """What the agent is told of an error a server answered a call with (the connection goes on)."""
        from mcp_bridge.upstream_http import (
            TOO_LONG,  # its words (the HTTP stack loads with the first upstream)
        )

        if TOO_LONG in message:  # our own bound on an HTTP answer (upstream_http), as the SDK relays it
            message = message[message.index(TOO_LONG):]
        elif m := _SSE_TOO_LONG.search(message):  # the SDK's bound on one event of an event stream
            limit = int(m.group(1))
            message = f"{TOO_LONG} {_mib(limit)} (the limit for one answer): it was not read; the connection goes on"
        else:
            message = f"{message} (error {code})"
        return _home_as_tilde(self.redact.text(f"MCP server '{self.spec.name}' refused the call: {message}"))

    async def _lost_message(self, went_down: anyio.Event) -> str:
        """What the agent is told when the connection ended during its call: why, once the
        supervisor knows (the server's exit and last stderr lines), within a bound."""
        with anyio.move_on_after(LOST_WHY_WAIT):
            await went_down.wait()
        if went_down.is_set():
            return self.down_message()
        return _home_as_tilde(self.redact.text(
            f"MCP server '{self.spec.name}' is down: {self._lost_reason or 'the connection closed during the call'}"))

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        client = await self._ready_client()
        result = await client.read_resource(uri, cache_mode="bypass")
        data = self.redact.deep(result.model_dump(by_alias=True, mode="json", exclude_none=True))
        return types.ReadResourceResult.model_validate(data)

    async def get_prompt(self, original: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        client = await self._ready_client()
        result = await client.get_prompt(original, arguments)
        data = self.redact.deep(result.model_dump(by_alias=True, mode="json", exclude_none=True))
        return types.GetPromptResult.model_validate(data)

    def owns_uri(self, uri: str) -> bool:
        if any(str(r.uri) == uri for r in self.resources):
            return True
        return any(_template_matches(t.uri_template, uri) for t in self.templates)


async def _all_pages(fetch: Callable[[str | None], Awaitable[Any]], attr: str) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES_MAX):
        page = await fetch(cursor)
        items.extend(getattr(page, attr))
        cursor = page.next_cursor
        if not cursor:
            break
    return items


_SERVER_GONE = "the server exited or closed the connection"
# The SDK's words when an event of an event stream passes its bound (httpx2's SSEError).
_SSE_TOO_LONG = re.compile(r"[Ss]erver-sent event exceeded the (\d+) byte limit")


async def _first_of(*events: anyio.Event) -> None:
    if any(e.is_set() for e in events):
        return
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def _template_matches(template: str, uri: str) -> bool:
    """RFC 6570 level-1 matching, enough to route a read: `{var}` matches one path segment or more."""
    parts = re.split(r"\{[^}]*\}", template)
    pattern = "[^?#]+?".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, uri) is not None


def _home_as_tilde(text: str) -> str:
    """`text` with the folder cru runs in as `.` and the home folder as `~` (each as a whole
    path, not inside a longer name): a server's stderr (a traceback's paths) and the command
    that failed are told to the agent when it calls a server that is down, and an agent is not
    shown the machine's absolute paths."""
    try:
        here = os.getcwd()
    except OSError:  # the folder was removed under us
        here = ""
    # The longer first: the one inside the other (a home under the folder, or the reverse) wins.
    for folder, shown in sorted(((here, "."), (os.path.expanduser("~"), "~")), key=lambda f: -len(f[0])):
        if len(folder) > 1 and folder in text:
            text = re.sub(re.escape(folder) + r"(?![\w.-])", shown, text)
    return text


def _unreadable(exc: Exception) -> str:
    """Why a message from a server could not be read, in a line (pydantic's first error, not
    the whole message echoed back)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return (f"a message from the server could not be read: {first.get('msg', exc)}"
                    + (f" (at {where})" if where else ""))[:STDERR_LINE_MAX]
        except Exception:  # an error shaped otherwise: said as it is
            pass
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"a message from the server could not be read: {text}"[:STDERR_LINE_MAX]


def _describe(exc: BaseException, spec: UpstreamSpec) -> str:
    """One line saying why a connection failed."""
    if isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
        if inner:
            return _describe(inner[0], spec)
    if isinstance(exc, TimeoutError):
        return f"no answer to the MCP handshake within {CONNECT_TIMEOUT:g} s"
    if isinstance(exc, FileNotFoundError) and spec.transport == "stdio":
        return f"could not start `{spec.command}`: not found (is it installed and on PATH?)"
    if isinstance(exc, OSError) and spec.transport == "stdio":
        return f"could not start `{spec.command}`: {exc.strerror or exc}"
    error = getattr(exc, "error", None)
    if getattr(error, "code", None) == CONNECTION_CLOSED and getattr(error, "message", None) == "Connection closed":
        return _SERVER_GONE  # the SDK's words for it (seen before our watch of the stream said so)
    message = getattr(getattr(exc, "error", None), "message", None) or str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class _WatchedSend:
    """A transport's write stream whose failure (the transport is gone: an HTTP server that
    cannot be reached, a pipe that broke) is said as the connection's end before the session's
    `Connection closed` reaches a caller."""

    def __init__(self, inner: Any, lost: Callable[[str], None]) -> None:
        self._inner, self._lost = inner, lost

    async def send(self, item: Any) -> None:
        try:
            await self._inner.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._lost("the connection to the server broke: a message could not be sent")
            raise

    async def __aenter__(self) -> _WatchedSend:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(eq=False)
class GatewayTool:
    """An upstream tool on a bridge (a `mcp_bridge.dispatch.Tool`): listed as the upstream
    describes it, with the prefix; the upstream validates its own arguments."""

    upstream: Upstream
    original: str
    tool: types.Tool
    kind: str = "upstream"
    prepare: None = None
    listed_bytes: int = 0

    def __post_init__(self) -> None:
        self.listed_bytes = len(json.dumps(self.tool.model_dump(by_alias=True, mode="json", exclude_none=True)))

    @property
    def name(self) -> str:
        return self.tool.name

    @property
    def read_only(self) -> bool:
        # The server's own annotation; the person configured this server (see the README).
        return bool(self.tool.annotations is not None and self.tool.annotations.read_only_hint)

    @property
    def timeout(self) -> float | None:
        return self.upstream.spec.timeout

    def to_mcp(self) -> types.Tool:
        return self.tool

    def validate(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        return dict(arguments or {})

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> types.CallToolResult:
        elicit = ctx.elicit
        if elicit is not None:
            person = elicit

            async def elicit_paused(server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
                # The clock stops while the person is asked: their thinking time does not count
                # against the tool's time limit.
                scope = ctx.deadline
                if scope is None:
                    return await person(server, params)
                left = scope.deadline - anyio.current_time()
                scope.deadline = math.inf
                try:
                    return await person(server, params)
                finally:
                    scope.deadline = anyio.current_time() + max(left, 0.0)

            elicit = elicit_paused
        return await self.upstream.call(self.original, args, Caller(elicit=elicit, progress=ctx.report_progress))


def _child_holding(pipe_inode: int) -> int | None:
    """The pid of our child process whose stderr is the pipe `pipe_inode` (Linux /proc; None
    elsewhere or when it already exited)."""
    me = str(os.getpid())
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    target = f"pipe:[{pipe_inode}]"
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[1].decode() == me and os.readlink(f"/proc/{entry}/fd/2") == target:
                return int(entry)
        except (OSError, IndexError):
            continue
    return None


class Gateway:
    """Every upstream of the process. `async with gateway.running():` owns their connections;
    they start on the first `ensure_started()` (a bridge's first tools/list)."""

    def __init__(self, specs: Iterable[UpstreamSpec], *, schema_budget_bytes: int = 0,
                 startup_wait: float = 5.0, watch_group: Callable[[int], None] | None = None,
                 unwatch_group: Callable[[int], None] | None = None) -> None:
        self.upstreams: dict[str, Upstream] = {}
        # Told the process group of each stdio upstream started (and when it is gone): the
        # application's watchdog stops them if this process dies without its teardown (kill -9).
        self.watch_group = watch_group
        self.unwatch_group = unwatch_group
        for spec in specs:
            self.upstreams[spec.name] = Upstream(spec, self)
        self.schema_budget_bytes = schema_budget_bytes
        self.startup_wait = startup_wait
        self._tools: dict[str, GatewayTool] = {}
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False
        self._roots_sent: list[tuple[str, str]] = []
        self._clash_said: set[tuple[str, str]] = set()
        self.redact = Redactor({k: v for u in self.upstreams.values() for k, v in u.spec.secrets.items()})

    def __bool__(self) -> bool:
        return bool(self.upstreams)

    @property
    def started(self) -> bool:
        return self._started

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start every upstream not started yet (their supervisors run in `running()`)."""
        if self._tg is None:
            raise RuntimeError("Gateway.start needs `async with gateway.running()`")
        self._started = True
        for upstream in self.upstreams.values():
            if upstream.state == "idle":
                upstream.state = "starting"
                self._tg.start_soon(upstream.run)

    async def ensure_started(self, wait: float | None = None) -> None:
        """Start the upstreams (once) and wait up to `wait` (default `startup_wait`) seconds for
        each to be up or failed; later arrivals reach the bridges with list_changed."""
        if not self.upstreams:
            return
        self.start()
        # Only first starts are waited for: a server restarting later must not hold up a listing.
        first = [u for u in self.upstreams.values() if not u.first_settled]
        if not first:
            return
        with anyio.move_on_after(self.startup_wait if wait is None else wait):
            async with anyio.create_task_group() as tg:
                for upstream in first:
                    tg.start_soon(upstream.settled)

    def status(self) -> list[UpstreamStatus]:
        return [u.status() for u in self.upstreams.values()]

    # -- tools, resources, prompts -----------------------------------------------------------

    def reindex(self) -> None:
        ours = {spec.name for spec in KILN_TOOLS} | set(_BRIDGE_META_TOOLS)
        tools: dict[str, GatewayTool] = {}
        for upstream in self.upstreams.values():
            for name, tool in upstream.tools.items():
                if name in ours or name.startswith("lua_"):  # (config refuses a `lua_` prefix)
                    said = (upstream.spec.name, name)
                    if said not in self._clash_said:
                        self._clash_said.add(said)
                        logger.warning("MCP tool %s of server %s is left out: Crucible has a tool of that name, "
                                       "and Crucible's tool wins (choose another prefix for the server)",
                                       name, upstream.spec.name)
                    continue
                if name in tools:  # two prefixes make one name (`a_` + `b_x`, `a_b_` + `x`): the first wins
                    logger.warning("MCP tool %s of server %s is hidden by the same name from server %s", name,
                                   upstream.spec.name, tools[name].upstream.spec.name)
                    continue
                tools[name] = tool
        self._tools = tools

    def tools(self) -> list[GatewayTool]:
        return list(self._tools.values())

    def lookup(self, name: str) -> GatewayTool | None:
        return self._tools.get(name)

    def down_reason_for(self, name: str) -> str | None:
        """Why `name` (not a known tool) cannot be called: its server, by prefix, is not up."""
        for upstream in self.upstreams.values():
            if name.startswith(upstream.spec.prefix) and upstream.state != "up":
                return upstream.down_message()
        return None

    def listed_bytes(self) -> int:
        return sum(t.listed_bytes for t in self._tools.values())

    def over_budget(self) -> bool:
        return self.schema_budget_bytes > 0 and self.listed_bytes() > self.schema_budget_bytes

    def resources(self) -> list[types.Resource]:
        return [r for u in self.upstreams.values() for r in u.resources]

    def resource_templates(self) -> list[types.ResourceTemplate]:
        return [t for u in self.upstreams.values() for t in u.templates]

    def prompts(self) -> list[types.Prompt]:
        return [p for u in self.upstreams.values() for _, p in u.prompts.values()]

    def has_prompt(self, name: str) -> bool:
        return any(name in u.prompts for u in self.upstreams.values())

    async def read_resource(self, uri: str) -> types.ReadResourceResult | None:
        """None when no upstream serves `uri`."""
        for upstream in self.upstreams.values():
            if upstream.owns_uri(uri):
                return await upstream.read_resource(uri)
        return None

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult | None:
        for upstream in self.upstreams.values():
            if name in upstream.prompts:
                return await upstream.get_prompt(upstream.prompts[name][0], arguments)
        return None

    # -- bridges -------------------------------------------------------------------------------

    def attach(self, listener: GatewayListener) -> None:
        self._listeners.add(listener)
        self._roots_changed()

    def detach(self, listener: GatewayListener) -> None:
        self._listeners.discard(listener)
        self._roots_changed()

    def roots(self) -> list[tuple[str, str]]:
        seen: dict[str, str] = {}
        for listener in list(self._listeners):
            for uri, name in listener.roots:
                seen.setdefault(uri, name)
        return list(seen.items())

    def _roots_changed(self) -> None:
        roots = self.roots()
        if roots == self._roots_sent or self._tg is None:
            return
        self._roots_sent = roots
        for upstream in self.upstreams.values():
            client = upstream._client
            if upstream.state == "up" and client is not None:
                self._tg.start_soon(_send_roots_changed, client, upstream.spec.name)

    async def changed(self, kinds: set[str]) -> None:
        for listener in list(self._listeners):
            try:
                await listener.upstream_changed(kinds)
            except Exception:
                logger.exception("telling a bridge about changed MCP lists failed")


# The MCP spec deprecates roots (SEP-2577) while servers still read them: we offer them
# knowingly, and the SDK's warning (a source line of ours) says nothing to the person.
warnings.filterwarnings("ignore", message="The roots capability is deprecated", category=Warning)


async def _send_roots_changed(client: Any, name: str) -> None:
    try:
        await client.session.send_roots_list_changed()
    except Exception as exc:
        logger.debug("MCP server %s: roots/list_changed not sent: %s", name, exc)


def file_root(path: str, name: str | None = None) -> tuple[str, str]:
    """A folder as an MCP root (file:// URI, name)."""
    p = Path(path)
    return p.as_uri(), name or p.name
