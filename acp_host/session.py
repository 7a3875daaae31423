"""One ACP session seen from the client: its state, its event stream, its turns.

Event stream
    `session.events` is a bounded trio memory channel of the frozen event objects below.
    Updates are pushed in wire order by the connection's read loop, which waits when the
    channel is full: that is the backpressure that keeps a flood of chunks from piling up
    in memory, and it means **someone must keep reading `session.events`** while a turn runs
    (a consumer that stops reading stalls the whole connection, answers included). The
    channel closes when the session closes. Under a flood, `receive_batch()` keeps up far
    better than one `receive()` per event (measured: ~60k vs ~20k chunks/s).

Updates are read raw first: a known variant is turned into its event (validated with
`acp.schema` where that is cheap and useful); an unknown or newer variant, or a known one
that fails validation (Claude's usage update with a null total), becomes a `RawUpdate` with
the reason. No update ever raises.

Tool calls are tracked by `toolCallId` and merged partially: `tool_call_update` may come
before its `tool_call`, twice, or bring `rawInput` late; every change yields a
`ToolCallEvent` with the merged state.

Turns: `prompt()` has no RPC timeout. An inactivity watchdog ends the turn with an error
when the agent sends nothing for `inactivity_timeout` seconds (time spent waiting for the
person's permission answer or for our own fs/terminal work does not count). `cancel()`
sends `session/cancel`, answers every pending permission request `cancelled`, keeps
accepting updates and waits for the agent's `stopReason: "cancelled"` (at most
`cancel_timeout` seconds). A permission decision that comes after its turn ended or was
cancelled is dropped, never sent.

Permissions: each `session/request_permission` goes to the `policy` callback, whose
`Decision` is mapped onto the options the agent offered, by kind (ids differ per agent).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import trio
from acp import schema
from pydantic import BaseModel, ValidationError

from acp_host.jsonrpc import INVALID_PARAMS, REQUEST_CANCELLED, ConnectionClosed, JsonRpcError
from acp_host.services import GATED_METHODS, describe_request

if TYPE_CHECKING:
    from acp_host.services import SessionServices

DEFAULT_INACTIVITY_TIMEOUT = 300.0
DEFAULT_CANCEL_TIMEOUT = 30.0
DEFAULT_EVENT_BUFFER = 1024
# session/load's replay is over once the agent's updates pause this long after its answer (s),
# or at most REPLAY_SETTLE_LIMIT after it: Gemini CLI 0.61 answers before its replay is all
# sent (it does not await the stream), and the tail must not read as the live conversation.
REPLAY_QUIET = 0.2
REPLAY_SETTLE_LIMIT = 5.0
# The JSON-RPC error a gated fs/terminal request gets when the host's policy refuses it.
SERVICE_REFUSED = -32000
_DATA_CAP = 2000

# ---------------------------------------------------------------------------------------
# events


@dataclass(frozen=True, slots=True)
class MessageChunk:
    text: str
    content: dict[str, Any]
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class ThoughtChunk:
    text: str
    content: dict[str, Any]
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class UserChunk:
    """The user's own message, as an agent replays it (session/load)."""

    text: str
    content: dict[str, Any]
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The merged state of one tool call. Content and locations stay raw JSON (newer
    content kinds pass through)."""

    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    content: tuple[dict[str, Any], ...] = ()
    locations: tuple[dict[str, Any], ...] = ()
    raw_input: Any = None
    raw_output: Any = None
    announced: bool = False
    """True once the agent sent a `tool_call` for it (Gemini may never do so)."""

    @property
    def diffs(self) -> list[dict[str, Any]]:
        return [c for c in self.content if c.get("type") == "diff"]


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    call: ToolCall
    created: bool
    """The first time this toolCallId was seen (by a tool_call, an update or a permission)."""


@dataclass(frozen=True, slots=True)
class PlanChanged:
    entries: tuple[schema.PlanEntry, ...]


@dataclass(frozen=True, slots=True)
class ModeChanged:
    mode_id: str


@dataclass(frozen=True, slots=True)
class ConfigOptionsChanged:
    options: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class CommandsChanged:
    commands: tuple[schema.AvailableCommand, ...]


@dataclass(frozen=True, slots=True)
class UsageChanged:
    used: int
    size: int
    cost: schema.Cost | None = None


@dataclass(frozen=True, slots=True)
class SessionInfoChanged:
    title: str | None
    updated_at: str | None = None


@dataclass(frozen=True, slots=True)
class RawUpdate:
    """An update we could not type: unknown/newer variant or failed validation."""

    update: Any
    reason: str


DecisionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always", "cancelled"]


@dataclass(frozen=True, slots=True)
class Decision:
    kind: DecisionKind
    reason: str = ""
    # Someone was asked (the person, in the chat or in their editor); False when a rule, a
    # remembered answer or a flag such as --approve-all decided without asking.
    asked: bool = True


@dataclass(frozen=True, slots=True)
class PermissionOption:
    option_id: str
    name: str
    kind: str


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    request_no: int
    session_id: str
    tool_call: ToolCall
    options: tuple[PermissionOption, ...]
    had_tool_call: bool
    """Whether a tool_call/update for this id came before the request (Gemini: no)."""
    raw: Any = field(repr=False, default=None)


@dataclass(frozen=True, slots=True)
class PermissionRequested:
    request: PermissionRequest


@dataclass(frozen=True, slots=True)
class PermissionResolved:
    request: PermissionRequest
    outcome: dict[str, Any]
    """What was sent: {"outcome": "selected", "optionId": ...} or {"outcome": "cancelled"}."""
    decision: Decision | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class HistoryReplay:
    """Brackets the updates an agent replays during session/load: not part of a live turn."""

    started: bool


@dataclass(frozen=True, slots=True)
class TurnEnded:
    stop_reason: str | None
    error: str | None = None
    usage: schema.Usage | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class SessionError:
    message: str


@dataclass(frozen=True, slots=True)
class ServiceCall:
    """A gated fs/terminal request of the agent (see `acp_host.services.GATED_METHODS`):
    what it would do, and whether the host's gate let it run (else why not)."""

    method: str
    kind: str  # "execute" | "edit"
    summary: str  # the command line, or the path
    allowed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TerminalExited:
    """A terminal the agent started has exited (seen by our services, or in the answer of the
    editor that runs it)."""

    terminal_id: str
    command: str
    exit_code: int | None
    signal: str | None


Event = (
    MessageChunk
    | ThoughtChunk
    | UserChunk
    | ToolCallEvent
    | PlanChanged
    | ModeChanged
    | ConfigOptionsChanged
    | CommandsChanged
    | UsageChanged
    | SessionInfoChanged
    | RawUpdate
    | PermissionRequested
    | PermissionResolved
    | HistoryReplay
    | TurnEnded
    | SessionError
    | ServiceCall
    | TerminalExited
)
# Decides a gated fs/terminal request before it runs: (method, kind, summary, params) ->
# None to let it run, or the reason it is refused.
ServiceGate = Callable[[str, str, str, Any], Awaitable[str | None]]

TurnResult = TurnEnded
PermissionPolicy = Callable[[PermissionRequest], Awaitable[Decision]]

CANCELLED_OUTCOME: dict[str, Any] = {"outcome": "cancelled"}

# ---------------------------------------------------------------------------------------
# pure parts: tool-call merge, permission mapping, update parsing


_TOOL_FIELDS = (
    ("title", "title"),
    ("kind", "kind"),
    ("status", "status"),
    ("rawInput", "raw_input"),
    ("rawOutput", "raw_output"),
)


class ToolCallTracker:
    """Merged tool-call state keyed by toolCallId."""

    def __init__(self) -> None:
        self.calls: dict[str, ToolCall] = {}

    def merge(self, raw: dict[str, Any], *, announce: bool) -> tuple[ToolCall, bool]:
        """Merge a `tool_call` (announce=True) or partial `tool_call_update`. Fields absent
        or null in the update keep their value. Returns (merged, created)."""
        call_id = raw["toolCallId"]
        old = self.calls.get(call_id)
        created = old is None
        call = old or ToolCall(call_id)
        changes: dict[str, Any] = {}
        for wire, attr in _TOOL_FIELDS:
            value = raw.get(wire)
            if value is not None:
                changes[attr] = value
        content = raw.get("content")
        if isinstance(content, list):
            changes["content"] = tuple(c for c in content if isinstance(c, dict))
        locations = raw.get("locations")
        if isinstance(locations, list):
            changes["locations"] = tuple(c for c in locations if isinstance(c, dict))
        if announce:
            changes["announced"] = True
        if changes or created:
            call = replace(call, **changes)
            self.calls[call_id] = call
        return call, created


_FALLBACKS: dict[str, tuple[str, ...]] = {
    # Never widen a grant: "once" does not fall back to "always".
    "allow_always": ("allow_always", "allow_once"),
    "allow_once": ("allow_once",),
    "reject_once": ("reject_once", "reject_always"),
    "reject_always": ("reject_always", "reject_once"),
}


def choose_outcome(
    decision: Decision, options: Sequence[PermissionOption]
) -> tuple[dict[str, Any], str]:
    """The outcome to send for a decision, chosen among the offered options by kind, and a
    note when it is not what was asked. An allow with no allowing option becomes a reject;
    a reject with no rejecting option becomes `cancelled`."""
    if decision.kind == "cancelled":
        return dict(CANCELLED_OUTCOME), ""
    wanted = decision.kind
    chain = _FALLBACKS.get(wanted, ())
    for kind in chain:
        for opt in options:
            if opt.kind == kind:
                note = "" if kind == wanted else f"{wanted} not offered; chose {kind}"
                return {"outcome": "selected", "optionId": opt.option_id}, note
    if wanted.startswith("allow"):
        for kind in _FALLBACKS["reject_once"]:
            for opt in options:
                if opt.kind == kind:
                    return (
                        {"outcome": "selected", "optionId": opt.option_id},
                        f"{wanted} not offered; rejected instead",
                    )
    return dict(CANCELLED_OUTCOME), f"{wanted} not offered; answered cancelled"


def parse_options(raw: Any) -> tuple[PermissionOption, ...]:
    out = []
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, dict) and isinstance(item.get("optionId"), str):
            out.append(
                PermissionOption(
                    item["optionId"], str(item.get("name", item["optionId"])), str(item.get("kind"))
                )
            )
    return tuple(out)


def _validate(model: type[BaseModel], update: dict[str, Any]) -> Any:
    return model.model_validate(update)


def _chunk_parts(update: dict[str, Any]) -> tuple[str, dict[str, Any], str | None] | None:
    content = update.get("content")
    if type(content) is not dict:
        return None
    text = content.get("text", "") if content.get("type") == "text" else ""
    if type(text) is not str:
        return None
    mid = update.get("messageId")
    return text, content, mid if isinstance(mid, str) else None


def _short(value: Any, cap: int = _DATA_CAP) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)
    return text if len(text) <= cap else text[:cap] + "…"


def rpc_error_reason(exc: JsonRpcError) -> str:
    """An agent's error in a few words: its message, and the detail its data gives (Gemini CLI
    says only "Internal error", with the reason in `data.details`), capped and sanitised."""
    data = exc.data
    if isinstance(data, dict):
        data = data.get("details") or data.get("message") or data
    text = _short(exc.message, 200)
    return f"{text}: {_short(data, 300)}" if data not in (None, "", {}) else text


def describe_rpc_error(exc: JsonRpcError) -> str:
    """An agent's error for a person: message, code and (capped, sanitised) data."""
    text = f"{_short(exc.message, 500)} (code {exc.code})"
    if exc.data is not None:
        text += f": {_short(exc.data)}"
    return text


# ---------------------------------------------------------------------------------------
# the session


class _Connection(Protocol):
    """What a session needs from its client."""

    async def request(self, method: str, params: Any) -> Any: ...

    async def notify(self, method: str, params: Any) -> None: ...

    async def describe_exit(self, when: str = ...) -> str: ...


@dataclass(frozen=True, slots=True)
class Choice:
    """A value an agent offers to choose: a select config option's value (value, name), or a
    model of the older `models` state of session/new (modelId, name) that Gemini CLI still sends."""

    id: str
    name: str
    description: str | None = None


def _legacy_models(raw: Any) -> tuple[tuple[Choice, ...], str | None]:
    """`{"availableModels": [{"modelId", "name", "description"}], "currentModelId"}`, the
    unstable model state acp.schema no longer describes: read by hand, what is malformed left out."""
    if not isinstance(raw, dict) or not isinstance(raw.get("availableModels"), list):
        return (), None
    choices = []
    for item in raw["availableModels"][:1000]:
        if isinstance(item, dict) and isinstance(item.get("modelId"), str):
            name, about = item.get("name"), item.get("description")
            choices.append(Choice(item["modelId"], name if isinstance(name, str) else item["modelId"],
                                       about if isinstance(about, str) else None))
    current = raw.get("currentModelId")
    return tuple(choices), current if isinstance(current, str) else None


def _select_values(option: Any) -> tuple[Choice, ...]:
    """The values a select config option offers, its groups' values flattened."""
    choices: list[Choice] = []
    for item in getattr(option, "options", None) or ():
        for value in getattr(item, "options", None) or [item]:
            if isinstance(getattr(value, "value", None), str):
                choices.append(Choice(value.value, value.name, getattr(value, "description", None)))
    return tuple(choices)


@dataclass
class SessionState:
    modes: tuple[schema.SessionMode, ...] = ()
    current_mode: str | None = None
    # The older `models` state (session/set_model), for an agent with no model config option.
    agent_models: tuple[Choice, ...] = ()
    current_model: str | None = None
    config_options: tuple[Any, ...] = ()
    commands: tuple[schema.AvailableCommand, ...] = ()
    plan: tuple[schema.PlanEntry, ...] = ()
    usage: UsageChanged | None = None
    last_turn_usage: schema.Usage | None = None
    title: str | None = None

    @property
    def models(self) -> tuple[Any, ...]:
        """Config options of category "model" (the spec's way; `agent_models` is the older one)."""
        return tuple(o for o in self.config_options if getattr(o, "category", None) == "model")

    @property
    def model_choices(self) -> tuple[Choice, ...]:
        """The models the agent offers, whichever way: its model config option (grouped values
        flattened), else its `models` state."""
        option = next(iter(self.models), None)
        return self.agent_models if option is None else _select_values(option)

    @property
    def model_now(self) -> str | None:
        """The current model's value or id."""
        option = next(iter(self.models), None)
        if option is None:
            return self.current_model
        value = getattr(option, "current_value", None)
        return value if isinstance(value, str) else None

    @property
    def mode_option(self) -> Any | None:
        """The config option of category "mode", where an agent offers its modes (OpenCode
        since 1.x: build / plan) instead of the older `modes` of session/new."""
        return next((o for o in self.config_options if getattr(o, "category", None) == "mode"), None)

    @property
    def mode_choices(self) -> tuple[schema.SessionMode, ...]:
        """The agent's modes, whichever way it offers them: its `modes`, else the values of
        its mode option (grouped values flattened)."""
        if self.modes or self.mode_option is None:
            return self.modes
        return tuple(schema.SessionMode(id=c.id, name=c.name, description=c.description)
                     for c in _select_values(self.mode_option))

    @property
    def mode_now(self) -> str | None:
        """The current mode's id, from `modes` or from the mode option."""
        if self.modes or self.mode_option is None:
            return self.current_mode
        value = getattr(self.mode_option, "current_value", None)
        return value if isinstance(value, str) else None


@dataclass
class _Turn:
    number: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: bool = False
    cancel_requested_at: float | None = None
    cancel_requested: trio.Event = field(default_factory=trio.Event)
    error: str | None = None


@dataclass(eq=False)
class _PendingPermission:
    request: PermissionRequest
    turn: _Turn
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    retired: str = ""


async def deny_all(request: PermissionRequest) -> Decision:
    return Decision("reject_once", "no permission policy is set")


class AcpSession:
    def __init__(
        self,
        connection: _Connection,
        session_id: str,
        *,
        services: SessionServices | None = None,
        policy: PermissionPolicy | None = None,
        inactivity_timeout: float = DEFAULT_INACTIVITY_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        event_buffer: int | float = DEFAULT_EVENT_BUFFER,
        nursery: trio.Nursery | None = None,
    ) -> None:
        self.session_id = session_id
        self._nursery = nursery
        self.state = SessionState()
        self.tool_calls = ToolCallTracker()
        self.services = services
        self.service_gate: ServiceGate | None = None
        self._terminal_commands: dict[str, str] = {}  # terminalId -> command line, until it exits
        self._early_exits: dict[str, dict[str, Any]] = {}  # exits seen before the create answer
        self._told_exits: set[str] = set()
        if services is not None and hasattr(services, "on_exit"):
            services.on_exit = self._terminal_exit
        self.policy: PermissionPolicy = policy or deny_all
        self.inactivity_timeout = inactivity_timeout
        self.cancel_timeout = cancel_timeout
        self._conn = connection
        self._send, self.events = trio.open_memory_channel[Event](event_buffer)
        self._turn: _Turn | None = None
        self._turns = itertools.count(1)
        self._permission_nos = itertools.count(1)
        self._pending: set[_PendingPermission] = set()
        self._busy = 0
        self._last_activity = trio.current_time()
        self.closed = False
        # The host's reading of an agent's error answer to a prompt (its cause and fix, for the
        # person), used instead of the bare error when it returns one.
        self.explain_error: Callable[[JsonRpcError], str | None] | None = None

    # -- state from session/new|load|resume --------------------------------------------
    def apply_session_result(self, result: Any) -> None:
        """modes / configOptions from a session/new, load or resume answer (raw dict)."""
        if not isinstance(result, dict):
            return
        modes = result.get("modes")
        if isinstance(modes, dict):
            try:
                state = schema.SessionModeState.model_validate(modes)
                self.state.modes = tuple(state.available_modes)
                self.state.current_mode = state.current_mode_id
            except ValidationError:
                pass
        if isinstance(result.get("configOptions"), list):
            self._set_config_options(result)
        if "models" in result:
            self.state.agent_models, self.state.current_model = _legacy_models(result["models"])

    def _set_config_options(self, container: dict[str, Any]) -> tuple[Any, ...] | None:
        try:
            parsed = schema.SetSessionConfigOptionResponse.model_validate(
                {"configOptions": container.get("configOptions")}
            )
        except ValidationError:
            return None
        self.state.config_options = tuple(parsed.config_options)
        return self.state.config_options

    # -- events ---------------------------------------------------------------------------
    async def _emit(self, event: Event) -> None:
        # No checkpoint while there is room: a flood of chunks then costs one scheduler
        # round per read, not per event. Waits (backpressure) only when the channel is full.
        try:
            try:
                self._send.send_nowait(event)
            except trio.WouldBlock:
                await self._send.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # nobody listens any more (session closed)

    async def receive_batch(self, max_events: int = 1024) -> list[Event]:
        """The next event and any already queued behind it (up to `max_events`): a cheaper
        way to keep up with a flood than one `receive()` per event. Raises
        trio.EndOfChannel when the session is closed and drained."""
        batch = [await self.events.receive()]
        receive_nowait = self.events.receive_nowait
        try:
            while len(batch) < max_events:
                batch.append(receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            pass
        return batch

    def _touch(self) -> None:
        self._last_activity = trio.current_time()

    async def handle_update(self, params: dict[str, Any]) -> None:
        """A `session/update` notification for this session (params as raw JSON)."""
        self._last_activity = trio.current_time()
        event = self.parse_update(params.get("update"))
        try:
            self._send.send_nowait(event)  # `_emit` inlined: the flood's path, one coroutine less
        except trio.WouldBlock:
            await self._emit(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # nobody listens any more (session closed)

    def handle_update_nowait(self, params: dict[str, Any]) -> bool:
        """Queue an update without waiting (False if the event channel is full)."""
        try:
            self._send.send_nowait(self.parse_update(params.get("update")))
        except trio.WouldBlock:
            return False
        return True

    def parse_update(self, update: Any) -> Event:
        """Turn one raw update into an event, updating the state. Never raises."""
        if type(update) is not dict:
            return RawUpdate(update, "the update is not an object")
        kind = update.get("sessionUpdate")
        try:
            if kind == "agent_message_chunk":
                parts = _chunk_parts(update)
                if parts is not None:
                    return MessageChunk(*parts)
            elif kind == "agent_thought_chunk":
                parts = _chunk_parts(update)
                if parts is not None:
                    return ThoughtChunk(*parts)
            elif kind == "user_message_chunk":
                parts = _chunk_parts(update)
                if parts is not None:
                    return UserChunk(*parts)
            elif kind in ("tool_call", "tool_call_update"):
                if isinstance(update.get("toolCallId"), str):
                    call, created = self.tool_calls.merge(update, announce=kind == "tool_call")
                    return ToolCallEvent(call, created)
            elif kind == "plan":
                plan = schema.AgentPlanUpdate.model_validate(update)
                self.state.plan = tuple(plan.entries)
                return PlanChanged(self.state.plan)
            elif kind == "current_mode_update":
                mode = schema.CurrentModeUpdate.model_validate(update)
                self.state.current_mode = mode.current_mode_id
                return ModeChanged(mode.current_mode_id)
            elif kind == "config_option_update":
                options = self._set_config_options(update)
                if options is not None:
                    return ConfigOptionsChanged(options)
            elif kind == "available_commands_update":
                cmds = schema.AvailableCommandsUpdate.model_validate(update)
                self.state.commands = tuple(cmds.available_commands)
                return CommandsChanged(self.state.commands)
            elif kind == "usage_update":
                usage = schema.UsageUpdate.model_validate(update)
                self.state.usage = UsageChanged(usage.used, usage.size, usage.cost)
                return self.state.usage
            elif kind == "session_info_update":
                info = schema.SessionInfoUpdate.model_validate(update)
                if info.title is not None:
                    self.state.title = info.title
                return SessionInfoChanged(info.title, info.updated_at)
            else:
                return RawUpdate(update, f"unknown session update {_short(kind, 80)!r}")
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return RawUpdate(update, f"invalid {kind}: {where}: {first['msg']}")
        return RawUpdate(update, f"invalid {kind}")

    # -- agent -> client requests ---------------------------------------------------------
    async def serve(self, method: str, params: Any) -> Any:
        """fs/* and terminal/* for this session; the watchdog pauses while they run. A request
        that changes something goes through `service_gate` first (when set)."""
        if self.services is None:
            raise JsonRpcError(-32601, f"Method not found: {method}")
        self._busy += 1
        try:
            kind = GATED_METHODS.get(method)
            summary = describe_request(method, params) if kind is not None else ""
            if kind is not None and self.service_gate is not None:
                refusal = await self.service_gate(method, kind, summary, params)
                await self._emit(ServiceCall(method, kind, summary, refusal is None, refusal or ""))
                if refusal is not None:
                    raise JsonRpcError(SERVICE_REFUSED, f"permission denied: {refusal}")
            result = await self.services.handle(method, params)
            await self._observe_terminal(method, params, result, summary)
            return result
        finally:
            self._busy -= 1
            self._touch()

    async def _observe_terminal(self, method: str, params: Any, result: Any, summary: str) -> None:
        """Keep each terminal's command until its exit status is seen (from our services, or
        from the answers of an editor that runs the terminal)."""
        if not isinstance(result, dict):
            return
        if method == "terminal/create" and isinstance(result.get("terminalId"), str):
            self._terminal_commands[result["terminalId"]] = summary
            early = self._early_exits.pop(result["terminalId"], None)
            if early is not None:  # a quick command ended before its create was answered
                await self._terminal_exit(result["terminalId"], early)
            return
        status = result if method == "terminal/wait_for_exit" else result.get("exitStatus")
        term_id = params.get("terminalId") if isinstance(params, dict) else None
        if isinstance(status, dict) and isinstance(term_id, str):
            await self._terminal_exit(term_id, status)

    async def _terminal_exit(self, terminal_id: str, status: dict[str, Any]) -> None:
        command = self._terminal_commands.pop(terminal_id, None)
        if command is None:
            if terminal_id not in self._told_exits and len(self._early_exits) < 64:
                self._early_exits[terminal_id] = status
            return
        self._told_exits.add(terminal_id)
        code = status.get("exitCode")
        sig = status.get("signal")
        await self._emit(TerminalExited(terminal_id, command, code if type(code) is int else None,
                                        sig if isinstance(sig, str) else None))

    async def handle_permission(self, params: dict[str, Any]) -> dict[str, Any]:
        """`session/request_permission`: ask the policy, map its decision by kind."""
        self._touch()
        raw_call = params.get("toolCall")
        options = parse_options(params.get("options"))
        if not isinstance(raw_call, dict) or not options:
            # Nothing to ask the person about, or nothing they could choose: the agent hears why
            # (a malformed ask once showed as a real one and answered "cancelled").
            raise JsonRpcError(INVALID_PARAMS, "session/request_permission needs toolCall (an object) and "
                                               "options (a list of at least one {optionId, name, kind})")
        call_id = raw_call.get("toolCallId") if isinstance(raw_call, dict) else None
        if isinstance(call_id, str):
            had = call_id in self.tool_calls.calls
            call, created = self.tool_calls.merge(raw_call, announce=False)
            await self._emit(ToolCallEvent(call, created))
        else:
            had = False
            call = ToolCall(str(call_id) if call_id is not None else "")
        request = PermissionRequest(
            next(self._permission_nos), self.session_id, call, options, had, raw=params
        )
        turn = self._turn
        if turn is None or turn.done or turn.cancel_requested_at is not None:
            note = "no turn in progress" if turn is None or turn.done else "the turn was cancelled"
            await self._emit(PermissionResolved(request, dict(CANCELLED_OUTCOME), None, note))
            return {"outcome": dict(CANCELLED_OUTCOME)}
        # Registered before the event goes out: a consumer may cancel as soon as it sees it.
        pending = _PendingPermission(request, turn)
        self._pending.add(pending)
        self._busy += 1
        decision: Decision | None = None
        try:
            await self._emit(PermissionRequested(request))
            with pending.scope:
                decision = await self._ask_policy(pending)
        finally:
            self._pending.discard(pending)
            self._busy -= 1
            self._touch()
        if pending.retired or turn.done or turn.cancel_requested_at is not None:
            note = pending.retired or "the turn ended"
            if decision is not None:
                note += f"; the late answer {decision.kind} was dropped"
            outcome, decision = dict(CANCELLED_OUTCOME), None
        else:
            assert decision is not None
            outcome, note = choose_outcome(decision, options)
        await self._emit(PermissionResolved(request, outcome, decision, note))
        return {"outcome": outcome}

    async def _ask_policy(self, pending: _PendingPermission) -> Decision:
        """The policy's decision. With a nursery the policy runs in its own task, so a retired
        request is answered `cancelled` at once even if the policy does not notice the
        cancellation (a dialog still open); its late decision is then dropped."""
        if self._nursery is None:
            return await self._call_policy(pending.request)
        decided = trio.Event()
        box: list[Decision] = []
        policy_scope = trio.CancelScope()

        async def ask() -> None:
            with policy_scope:
                box.append(await self._call_policy(pending.request))
                decided.set()

        self._nursery.start_soon(ask)
        try:
            await decided.wait()
        finally:
            policy_scope.cancel()
        return box[0]

    async def _call_policy(self, request: PermissionRequest) -> Decision:
        try:
            return await self.policy(request)
        except Exception as e:  # a broken policy must not approve anything
            return Decision("reject_once", f"permission policy failed: {e!r}")

    def _retire_permissions(self, why: str) -> None:
        for pending in list(self._pending):
            if not pending.retired:
                pending.retired = why
            pending.scope.cancel()

    @property
    def pending_permissions(self) -> list[PermissionRequest]:
        return [p.request for p in self._pending]

    # -- turns ----------------------------------------------------------------------------
    @property
    def turn_running(self) -> bool:
        return self._turn is not None and not self._turn.done

    async def prompt(self, blocks: str | Iterable[Any]) -> TurnEnded:
        """Run one turn: send session/prompt and wait for its end (no fixed timeout; see the
        watchdog). Returns the TurnEnded event, also sent on `events`."""
        if self.closed:
            raise RuntimeError("the session is closed")
        if self.turn_running:
            raise RuntimeError("a turn is already running in this session")
        turn = _Turn(next(self._turns))
        self._turn = turn
        params = {"sessionId": self.session_id, "prompt": _prompt_blocks(blocks)}
        self._touch()
        result: Any = None
        error: str | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watchdog, turn)
            try:
                with turn.scope:
                    result = await self._conn.request("session/prompt", params)
            except JsonRpcError as e:
                if e.code == REQUEST_CANCELLED and turn.cancel_requested_at is not None:
                    # Some agents answer a cancelled prompt with -32800 instead of the
                    # stopReason the spec asks for: same meaning.
                    result = {"stopReason": "cancelled"}
                else:
                    explained = self.explain_error(e) if self.explain_error is not None else None
                    error = explained or f"the agent failed the turn: {describe_rpc_error(e)}"
            except ConnectionClosed:
                error = await self._conn.describe_exit()
            finally:
                turn.done = True
                # Also when our caller is cancelled: no permission may outlive its turn.
                self._retire_permissions("the turn ended")
                nursery.cancel_scope.cancel()
        if turn.error is not None:
            error = turn.error
        ended = self._turn_ended(result, error)
        await self._emit(ended)
        return ended

    def _turn_ended(self, result: Any, error: str | None) -> TurnEnded:
        if error is not None:
            return TurnEnded(None, error)
        if not isinstance(result, dict) or not isinstance(result.get("stopReason"), str):
            return TurnEnded(None, f"the agent answered the prompt without a stopReason: {_short(result, 300)}")
        stop = result["stopReason"]
        usage = None
        if isinstance(result.get("usage"), dict):
            try:
                usage = schema.Usage.model_validate(result["usage"])
                self.state.last_turn_usage = usage
            except ValidationError:
                pass
        return TurnEnded(stop, None, usage)

    async def _watchdog(self, turn: _Turn) -> None:
        while True:
            deadline = self._last_activity + self.inactivity_timeout
            if turn.cancel_requested_at is not None:
                deadline = min(deadline, turn.cancel_requested_at + self.cancel_timeout)
            with trio.move_on_at(deadline) as sleep:
                if turn.cancel_requested_at is None:
                    await turn.cancel_requested.wait()
                else:
                    await trio.sleep_forever()
            if not sleep.cancelled_caught:
                continue  # a cancel came: recompute the deadline
            now = trio.current_time()
            if turn.cancel_requested_at is not None and now >= turn.cancel_requested_at + self.cancel_timeout:
                turn.error = (
                    f"the agent did not end the turn within {self.cancel_timeout:g} s of the cancel"
                )
                break
            if self._busy:
                # Waiting on the person or on our own fs/terminal work is not the agent's silence.
                self._touch()
                continue
            if now >= self._last_activity + self.inactivity_timeout:
                turn.error = (
                    f"the agent sent nothing for {self.inactivity_timeout:g} s; the turn was stopped "
                    "(the agent may be retrying an unreachable model; raise inactivity_timeout "
                    "if it needs longer)"
                )
                with trio.move_on_after(2):
                    try:
                        await self._conn.notify("session/cancel", {"sessionId": self.session_id})
                    except ConnectionClosed:
                        pass
                break
        self._retire_permissions("the turn was stopped")
        turn.scope.cancel()

    async def cancel(self) -> None:
        """Ask the agent to stop the current turn. Pending permission requests are answered
        `cancelled` at once; the turn itself ends when the agent answers (stopReason
        "cancelled") or after `cancel_timeout`."""
        turn = self._turn
        if turn is None or turn.done or turn.cancel_requested_at is not None:
            return
        turn.cancel_requested_at = trio.current_time()
        turn.cancel_requested.set()
        self._retire_permissions("the turn was cancelled")
        try:
            await self._conn.notify("session/cancel", {"sessionId": self.session_id})
        except ConnectionClosed:
            pass  # the prompt request fails with ConnectionClosed on its own

    # -- modes and config options -----------------------------------------------------------
    async def set_mode(self, mode_id: str) -> None:
        params = schema.SetSessionModeRequest(session_id=self.session_id, mode_id=mode_id)
        await self._conn.request("session/set_mode", dump(params))
        self.state.current_mode = mode_id

    async def switch_mode(self, mode_id: str) -> None:
        """To mode `mode_id` of `state.mode_choices`: session/set_mode for an agent that offers
        `modes`, else its mode option set to that value."""
        option = self.state.mode_option
        if self.state.modes or option is None:
            await self.set_mode(mode_id)
        else:
            await self.set_config_option(option.id, mode_id)

    async def switch_model(self, model_id: str) -> None:
        """To model `model_id` of `state.model_choices`: the model config option set to it, else
        session/set_model (the older, unstable method Gemini CLI serves)."""
        option = next(iter(self.state.models), None)
        if option is not None:
            await self.set_config_option(option.id, model_id)
            return
        await self._conn.request("session/set_model", {"sessionId": self.session_id, "modelId": model_id})
        self.state.current_model = model_id

    async def set_config_option(self, config_id: str, value: str | bool) -> tuple[Any, ...]:
        """Set a config option (a model is a select option of category "model"); returns
        the agent's full set of options after the change."""
        params: BaseModel
        if isinstance(value, bool):
            params = schema.SetSessionConfigOptionBooleanRequest(
                session_id=self.session_id, config_id=config_id, value=value, type="boolean"
            )
        else:
            params = schema.SetSessionConfigOptionSelectRequest(
                session_id=self.session_id, config_id=config_id, value=value
            )
        result = await self._conn.request("session/set_config_option", dump(params))
        if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
            self._set_config_options(result)
        return self.state.config_options

    # -- history (session/load) -------------------------------------------------------------
    async def mark_history(self, started: bool) -> None:
        await self._emit(HistoryReplay(started))

    async def replay_settled(self, quiet: float = REPLAY_QUIET, limit: float = REPLAY_SETTLE_LIMIT) -> None:
        """Wait until no update has come for `quiet` seconds (at most `limit`): what an agent
        still sends of its replay after answering session/load arrives meanwhile."""
        deadline = trio.current_time() + limit
        while (now := trio.current_time()) < deadline:
            idle = now - self._last_activity
            if idle >= quiet:
                return
            await trio.sleep(min(quiet - idle, deadline - now))

    async def report_error(self, message: str) -> None:
        await self._emit(SessionError(message))

    # -- closing ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Cancel a running turn, kill the session's terminals, close the event stream."""
        if self.closed:
            return
        self.closed = True
        with trio.CancelScope(shield=True):
            if self.turn_running:
                with trio.move_on_after(1):
                    await self.cancel()
                if self._turn is not None and not self._turn.done:
                    self._turn.error = self._turn.error or "the session was closed during the turn"
                    self._turn.scope.cancel()
            self._retire_permissions("the session closed")
            if self.services is not None:
                await self.services.aclose()
        self._send.close()


def dump(model: BaseModel) -> dict[str, Any]:
    """A model as wire JSON: aliases, no nulls."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _prompt_blocks(blocks: str | Iterable[Any]) -> list[Any]:
    if isinstance(blocks, str):
        return [{"type": "text", "text": blocks}]
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, BaseModel):
            out.append(dump(block))
        elif isinstance(block, str):
            out.append({"type": "text", "text": block})
        else:
            out.append(block)
    return out
