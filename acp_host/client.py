"""The client side of ACP over a `JsonRpcPeer`: typed methods, routing of the agent's requests.

Outbound params are built with `acp.schema` models and sent as `by_alias=True,
exclude_none=True` JSON. Inbound frames arrive as raw JSON from the peer and are validated
here, leniently: `session/update` never raises (see `acp_host.session`), answers are
validated with the SDK's models, which salvage what they can.

The agent's requests are routed by `sessionId`: `session/request_permission` to the session
(and its policy), `fs/*` and `terminal/*` to the session's services, anything else → -32601.

`connect_agent()` starts an agent process, wires a peer and a client to it, and initializes;
any failure there is an `AgentStartError` naming the command, with the agent's stderr tail.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Awaitable, Callable, Iterable, Sequence
from importlib import metadata
from typing import Any, TypeVar

import trio
from acp import schema
from pydantic import BaseModel, ValidationError

from acp_host.jsonrpc import ConnectionClosed, JsonRpcError, JsonRpcPeer
from acp_host.process import AgentProcess, AgentStartError, how_it_ended
from acp_host.recording import Recorder
from acp_host.services import SessionServices
from acp_host.session import (
    DEFAULT_CANCEL_TIMEOUT,
    DEFAULT_EVENT_BUFFER,
    DEFAULT_INACTIVITY_TIMEOUT,
    AcpSession,
    PermissionPolicy,
    dump,
)

__all__ = ["AcpClient", "AcpProtocolError", "AgentStartError", "UpdateHook", "connect_agent"]

PROTOCOL_VERSION = 1
DEFAULT_INIT_TIMEOUT = 60.0
_EARLY_UPDATES_PER_SESSION = 1000
_EARLY_SESSIONS = 16
# How long an agent's request may wait for a session whose session/new answer is in flight.
_SESSION_WAIT = 5.0

M = TypeVar("M", bound=BaseModel)


class AcpProtocolError(Exception):
    """The agent answered with something that is not ACP."""


def _client_version() -> str:
    try:
        return metadata.version("crucible-acp")
    except metadata.PackageNotFoundError:
        return "0"


def _parse(model: type[M], method: str, result: Any) -> M:
    try:
        return model.model_validate(result if result is not None else {})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "result"
        raise AcpProtocolError(f"the agent's answer to {method} is not valid ACP: {where}: {first['msg']}") from None


_MCP_MODELS: dict[str, type[BaseModel]] = {
    "http": schema.HttpMcpServer,
    "sse": schema.SseMcpServer,
    "acp": schema.AcpMcpServer,
}


def _session_params(session_id: str | None, cwd: str | os.PathLike[str], mcp_servers: Iterable[Any],
                    additional_directories: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """The params session/new, load and resume share (new has no sessionId)."""
    params: dict[str, Any] = {"cwd": os.fspath(cwd), "mcpServers": _mcp_servers(mcp_servers)}
    if session_id is not None:
        params = {"sessionId": session_id, **params}
    if additional_directories:
        params["additionalDirectories"] = [os.fspath(d) for d in additional_directories]
    return params


def _mcp_servers(servers: Iterable[Any]) -> list[Any]:
    """mcpServers as wire JSON, each entry checked: agents drop a malformed entry silently
    (a stdio entry without "args"/"env"), so a bad one is an error here."""
    out = []
    for i, server in enumerate(servers):
        if isinstance(server, BaseModel):
            out.append(dump(server))
            continue
        if not isinstance(server, dict):
            raise ValueError(f"mcpServers[{i}] must be an object, not {type(server).__name__}")
        kind = server.get("type")
        # A stdio entry has no "type" (claude-agent-acp reads any entry with one as HTTP).
        model = schema.McpServerStdio if kind is None else _MCP_MODELS.get(kind)
        if model is None:
            raise ValueError(f"mcpServers[{i}]: unknown type {kind!r} (http, sse, acp or none for stdio)")
        try:
            out.append(dump(model.model_validate(server)))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"mcpServers[{i}] ({server.get('name', '?')}): {where}: {first['msg']}"
                + (" (stdio entries need \"args\": [] and \"env\": [])" if kind is None else "")
            ) from None
    return out


# `AcpClient.on_update`: a session/update's params and its raw frame (None if not at hand).
UpdateHook = Callable[[dict[str, Any], bytes | None], Awaitable[None]]


class AcpClient:
    """ACP client over a peer. Installs itself as the peer's request and notification
    handler. `nursery` runs the sessions' background work (terminal output readers)."""

    def __init__(
        self,
        peer: JsonRpcPeer,
        nursery: trio.Nursery,
        *,
        process: AgentProcess | None = None,
        command: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.peer = peer
        self.process = process
        self.command = command or peer.name
        self.recorder = recorder
        self._nursery = nursery
        self.sessions: dict[str, AcpSession] = {}
        self._early: dict[str, list[dict[str, Any]]] = {}
        self._sessions_changed = trio.Event()
        self.init: schema.InitializeResponse | None = None
        self._closing = False
        # Sees every session/update before it is parsed, as params and as the frame's bytes
        # received (without the newline): a proxy (`cru acp`) forwards them as they are,
        # unknown variants included.
        self.on_update: UpdateHook | None = None
        peer.request_handler = self._on_request
        peer.notification_handler = self._on_notification

    # -- plumbing the session uses ---------------------------------------------------------
    async def request(self, method: str, params: Any) -> Any:
        return await self.peer.request(method, params)

    async def notify(self, method: str, params: Any) -> None:
        await self.peer.notify(method, params)

    async def describe_exit(self, when: str = "during the turn") -> str:
        """Why the connection ended, for the person: exit code and stderr tail if known."""
        # By its name, not its command line: the person chose the agent, and a full command
        # (absolute venv paths) in the chat wraps over rows and pushes the conversation away.
        agent = self.peer.name
        proc = self.process
        if proc is None:
            return f"the connection to the agent {agent} closed {when}"
        with trio.move_on_after(2):
            await proc.exited.wait()
        if proc.returncode is None:
            text = f"the agent {agent} closed its output {when}"
        else:
            text = f"the agent {agent} exited {when}{how_it_ended(proc.returncode)}"
        tail = proc.stderr_tail().strip()
        return f"{text}; its last stderr output:\n{tail}" if tail else f"{text} (no stderr output)"

    # -- inbound ---------------------------------------------------------------------------
    async def _on_notification(self, method: str, params: Any) -> None:
        if method != "session/update" or type(params) is not dict:
            return  # other notifications (none in ACP 1 for clients) are ignored
        session_id = params.get("sessionId")
        if self.on_update is not None:
            await self.on_update(params, self.peer.current_line)
        session = self.sessions.get(session_id)  # type: ignore[arg-type]
        if session is not None:
            await session.handle_update(params)
        elif isinstance(session_id, str):
            # Updates can beat the session/new answer to us (available commands right away).
            if session_id in self._early or len(self._early) < _EARLY_SESSIONS:
                queue = self._early.setdefault(session_id, [])
                if len(queue) < _EARLY_UPDATES_PER_SESSION:
                    queue.append(params)

    async def _session_for(self, params: Any, method: str) -> AcpSession:
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        if not isinstance(session_id, str):
            raise JsonRpcError(-32602, f"{method}: sessionId missing")
        with trio.move_on_after(_SESSION_WAIT):
            while session_id not in self.sessions:
                await self._sessions_changed.wait()
        session = self.sessions.get(session_id)
        if session is None:
            raise JsonRpcError(-32602, f"{method}: unknown session {session_id}")
        return session

    async def _on_request(self, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            session = await self._session_for(params, method)
            return await session.handle_permission(params)
        if method.startswith(("fs/", "terminal/")):
            session = await self._session_for(params, method)
            if session.services is None or not session.services.handles(method):
                raise JsonRpcError(-32601, f"Method not found: {method}")
            return await session.serve(method, params)
        raise JsonRpcError(-32601, f"Method not found: {method}")

    def _register(self, session: AcpSession) -> None:
        """Add a session and hand it the updates that came before it, in order, with no
        await in between (so a later update cannot overtake them)."""
        self.sessions[session.session_id] = session
        for params in self._early.pop(session.session_id, []):
            if not session.handle_update_nowait(params):
                break
        self._sessions_changed.set()
        self._sessions_changed = trio.Event()

    def _new_session_object(
        self,
        session_id: str,
        cwd: str | os.PathLike[str],
        allowed_dirs: Sequence[str | os.PathLike[str]],
        policy: PermissionPolicy | None,
        inactivity_timeout: float,
        cancel_timeout: float,
        event_buffer: int | float,
        env: dict[str, str] | None,
    ) -> AcpSession:
        services = SessionServices(self._nursery, cwd, allowed_dirs=allowed_dirs, env=env)
        return AcpSession(
            self,
            session_id,
            services=services,
            policy=policy,
            inactivity_timeout=inactivity_timeout,
            cancel_timeout=cancel_timeout,
            event_buffer=event_buffer,
            nursery=self._nursery,
        )

    # -- client -> agent -------------------------------------------------------------------
    async def initialize(
        self,
        *,
        client_name: str = "crucible",
        client_version: str | None = None,
        fs: bool = True,
        terminal: bool = True,
    ) -> schema.InitializeResponse:
        req = schema.InitializeRequest(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=schema.ClientCapabilities(
                fs=schema.FileSystemCapabilities(read_text_file=fs, write_text_file=fs),
                terminal=terminal,
            ),
            client_info=schema.Implementation(name=client_name, version=client_version or _client_version()),
        )
        result = await self.request("initialize", dump(req))
        init = _parse(schema.InitializeResponse, "initialize", result)
        if init.protocol_version != PROTOCOL_VERSION:
            raise AcpProtocolError(
                f"the agent ({self.command}) speaks ACP protocol version {init.protocol_version}; "
                f"this client speaks version {PROTOCOL_VERSION}"
            )
        self.init = init
        return init

    @property
    def capabilities(self) -> schema.AgentCapabilities:
        if self.init is None or self.init.agent_capabilities is None:
            return schema.AgentCapabilities()
        return self.init.agent_capabilities

    async def authenticate(self, method_id: str) -> None:
        await self.request("authenticate", dump(schema.AuthenticateRequest(method_id=method_id)))

    async def new_session(
        self,
        cwd: str | os.PathLike[str],
        mcp_servers: Iterable[Any] = (),
        *,
        additional_directories: Sequence[str | os.PathLike[str]] = (),
        policy: PermissionPolicy | None = None,
        inactivity_timeout: float = DEFAULT_INACTIVITY_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        event_buffer: int | float = DEFAULT_EVENT_BUFFER,
        env: dict[str, str] | None = None,
    ) -> AcpSession:
        """session/new. `additional_directories` are sent to the agent (when it supports
        them) and are also roots the session's fs/terminal services may use."""
        result = await self.request("session/new", _session_params(None, cwd, mcp_servers, additional_directories))
        parsed = _parse(schema.NewSessionResponse, "session/new", result)
        session = self._new_session_object(
            parsed.session_id, cwd, additional_directories, policy, inactivity_timeout,
            cancel_timeout, event_buffer, env,
        )
        session.apply_session_result(result)
        self._register(session)
        return session

    async def load_session(
        self,
        session_id: str,
        cwd: str | os.PathLike[str],
        mcp_servers: Iterable[Any] = (),
        *,
        additional_directories: Sequence[str | os.PathLike[str]] = (),
        policy: PermissionPolicy | None = None,
        inactivity_timeout: float = DEFAULT_INACTIVITY_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        event_buffer: int | float = DEFAULT_EVENT_BUFFER,
        env: dict[str, str] | None = None,
    ) -> AcpSession:
        """session/load. The agent replays the history as updates while this runs: they come
        on `session.events` between HistoryReplay(started=True) and HistoryReplay(False),
        so read the events concurrently."""
        session = self._new_session_object(
            session_id, cwd, additional_directories, policy, inactivity_timeout,
            cancel_timeout, event_buffer, env,
        )
        self._register(session)
        await session.mark_history(True)
        params = _session_params(session_id, cwd, mcp_servers, additional_directories)
        try:
            result = await self.request("session/load", params)
        except BaseException:
            del self.sessions[session_id]
            await session.aclose()
            raise
        await session.replay_settled()
        await session.mark_history(False)
        session.apply_session_result(result)
        return session

    async def resume_session(
        self,
        session_id: str,
        cwd: str | os.PathLike[str],
        mcp_servers: Iterable[Any] = (),
        *,
        additional_directories: Sequence[str | os.PathLike[str]] = (),
        policy: PermissionPolicy | None = None,
        inactivity_timeout: float = DEFAULT_INACTIVITY_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        event_buffer: int | float = DEFAULT_EVENT_BUFFER,
        env: dict[str, str] | None = None,
    ) -> AcpSession:
        """session/resume: like load, without the history replay."""
        params = _session_params(session_id, cwd, mcp_servers, additional_directories)
        result = await self.request("session/resume", params)
        _parse(schema.ResumeSessionResponse, "session/resume", result)
        session = self._new_session_object(
            session_id, cwd, additional_directories, policy, inactivity_timeout,
            cancel_timeout, event_buffer, env,
        )
        session.apply_session_result(result)
        self._register(session)
        return session

    async def list_sessions(
        self, cwd: str | os.PathLike[str] | None = None, cursor: str | None = None
    ) -> schema.ListSessionsResponse:
        req = schema.ListSessionsRequest(cwd=os.fspath(cwd) if cwd else None, cursor=cursor)
        result = await self.request("session/list", dump(req))
        return _parse(schema.ListSessionsResponse, "session/list", result)

    async def close_session(self, session_id: str) -> None:
        """session/close (when the agent supports it), then close our side of the session."""
        session = self.sessions.pop(session_id, None)
        try:
            caps = self.capabilities.session_capabilities
            if caps is not None and caps.close is not None:
                await self.request("session/close", dump(schema.CloseSessionRequest(session_id=session_id)))
        finally:
            if session is not None:
                await session.aclose()

    def session(self, session_id: str) -> AcpSession:
        return self.sessions[session_id]

    async def set_mode(self, session_id: str, mode_id: str) -> None:
        await self.session(session_id).set_mode(mode_id)

    async def set_config_option(self, session_id: str, config_id: str, value: str | bool) -> tuple[Any, ...]:
        return await self.session(session_id).set_config_option(config_id, value)

    async def prompt(self, session_id: str, blocks: str | Iterable[Any]) -> Any:
        return await self.session(session_id).prompt(blocks)

    async def cancel(self, session_id: str) -> None:
        await self.session(session_id).cancel()

    async def watch_connection(self) -> None:
        """When the agent goes away between turns, tell each idle session (a SessionError on
        its events) so nobody waits forever. A running turn ends with its own error."""
        await self.peer.closed.wait()
        if self._closing:
            return
        message: str | None = None
        for session in list(self.sessions.values()):
            if not session.turn_running and not session.closed:
                if message is None:
                    message = await self.describe_exit("between turns")
                await session.report_error(message)

    # -- closing ---------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close every session (killing their terminals), the connection and the agent."""
        self._closing = True
        with trio.CancelScope(shield=True):
            for session in list(self.sessions.values()):
                await session.aclose()
            self.sessions.clear()
            await self.peer.aclose()
            if self.process is not None:
                await self.process.aclose()
            if self.recorder is not None:
                await self.recorder.aclose()

    async def __aenter__(self) -> AcpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def connect_agent(
    nursery: trio.Nursery,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    name: str | None = None,
    init_timeout: float = DEFAULT_INIT_TIMEOUT,
    record_to: str | os.PathLike[str] | None = None,
    client_name: str = "crucible",
    max_line_bytes: int = 64 * 1024 * 1024,
    process: AgentProcess | None = None,
    record_redact: Callable[[str], str] | None = None,
    record_held_length: Callable[[str], int] | None = None,
) -> AcpClient:
    """Start the agent `argv`, connect, and initialize it. The client (and the agent process)
    live in `nursery`; `await client.aclose()` ends them. Raises AgentStartError naming the
    command, with its stderr tail, if the agent cannot start, exits, refuses or does not
    answer initialize within `init_timeout` seconds. `process`: an agent already started
    from `argv` (a host spawns early to overlap the agent's boot with its own imports).
    `record_redact`, `record_held_length`: mask the host's secrets in the recording, also one
    streamed in pieces (see `Recorder`)."""
    command = shlex.join(argv)
    recorder = (await Recorder.open(record_to, agent=command, redact=record_redact, held_length=record_held_length)
                if record_to is not None else None)
    try:
        if process is None:
            process = await AgentProcess.start(
                nursery, list(argv), env=env, extra_env=extra_env, cwd=cwd, name=name
            )
    except BaseException:
        if recorder is not None:
            await recorder.aclose()
        raise
    peer = JsonRpcPeer(
        process.stdin,
        process.stdout,
        name=name or os.path.basename(argv[0]),
        tap=recorder.tap if recorder is not None else None,
        max_line_bytes=max_line_bytes,
    )
    client = AcpClient(peer, nursery, process=process, command=command, recorder=recorder)
    if recorder is not None:
        nursery.start_soon(recorder.run)
    nursery.start_soon(peer.run)
    nursery.start_soon(client.watch_connection)
    failure: str | None = None
    try:
        with trio.fail_after(init_timeout):
            await client.initialize(client_name=client_name)
    except trio.TooSlowError:
        failure = f"the agent `{command}` did not answer initialize within {init_timeout:g} s"
    except ConnectionClosed:
        with trio.move_on_after(2):
            await process.exited.wait()
        code = process.returncode
        failure = f"the agent `{command}` exited" + (how_it_ended(code) if code is not None else "")
        failure += " before answering initialize"
    except JsonRpcError as e:
        failure = f"the agent `{command}` refused initialize: {e.message} (code {e.code})"
    except AcpProtocolError as e:
        failure = f"the agent `{command}`: {e}"
    except BaseException:
        await client.aclose()
        raise
    if failure is not None:
        tail = process.stderr_tail().strip()
        await client.aclose()
        if tail:
            failure += f"; its last stderr output:\n{tail}"
        raise AgentStartError(failure)
    return client
