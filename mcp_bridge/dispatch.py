"""The one tool dispatcher. Every tool call on a bridge — a kiln tool, a session's own tool
(delegation), an upstream MCP server's tool, a Lua plugin's tool — passes `Dispatcher.call`:
the permission policy first (deny hides and refuses, ask asks the person), then the call
under its time limit (30 s unless the tool says otherwise: `delegate_session` takes its
delegation timeout plus a margin), then the result. Failures of every kind become `isError`
results with a message the agent can read; nothing a tool does stops the server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
import mcp_types as types

from mcp_bridge.kiln_api import KilnError
from mcp_bridge.tools import DEFAULT_TOOL_TIMEOUT, ToolContext, ToolError, error_result

logger = logging.getLogger("mcp_bridge.dispatch")

Decision = Literal["allow", "ask", "deny"]
Policy = Callable[[str], Decision]


class AskFn(Protocol):
    async def __call__(self, tool: str, arguments: dict[str, Any]) -> bool: ...


class Tool(Protocol):
    """A tool as the dispatcher sees it, whatever runs it. `validate` raises `ToolError` for
    bad arguments; `prepare` (or None) runs before the clock starts; `run` returns the result
    or raises `ToolError` with a message for the agent."""

    @property
    def name(self) -> str: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def timeout(self) -> float | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def prepare(self) -> Callable[[ToolContext], Awaitable[None]] | None: ...

    def to_mcp(self) -> types.Tool: ...

    def validate(self, arguments: dict[str, Any] | None) -> Any: ...

    async def run(self, ctx: ToolContext, args: Any) -> types.CallToolResult: ...


def timeout_message(name: str, seconds: float) -> str:
    """The documented message, the same for every kind of tool."""
    return f"Tool '{name}' timed out after {seconds:g} seconds"


def _redact(ctx: ToolContext, text: str) -> str:
    return ctx.backend.redact(text) if ctx.backend is not None else text


async def run_tool(tool: Tool, ctx: ToolContext, arguments: dict[str, Any] | None, *,
                   time_limit: float) -> types.CallToolResult:
    """Validate, prepare, run under `time_limit`; never raises for a tool's failure."""
    try:
        args = tool.validate(arguments)
        if tool.prepare is not None:
            await tool.prepare(ctx)
        # move_on_after, not fail_after: a TimeoutError raised inside a tool (a socket timeout)
        # is that tool's failure, not ours.
        with anyio.move_on_after(time_limit) as scope:
            ctx.deadline = scope
            result = await tool.run(ctx, args)
        if scope.cancelled_caught:
            return error_result(timeout_message(tool.name, time_limit))
    except (ToolError, KilnError) as exc:
        return error_result(_redact(ctx, str(exc)))
    except Exception as exc:  # the tool boundary: report, log, keep serving
        message = _redact(ctx, f"{type(exc).__name__}: {exc}")
        logger.error("tool %s failed: %s", tool.name, message)
        return error_result(f"Tool '{tool.name}' failed: {message}")
    return result


class Dispatcher:
    """Policy, then the call under its timeout. `lookup` finds a tool by the name the agent
    called (kiln, prefixed upstream, `lua_...`); `listed` names the tools the agent may see."""

    def __init__(self, lookup: Callable[[str], Tool | None], listed: Callable[[], list[str]], *,
                 policy: Policy | None = None, ask: AskFn | None = None,
                 timeout: float = DEFAULT_TOOL_TIMEOUT, unknown: Callable[[str], str | None] | None = None) -> None:
        self.lookup = lookup
        self.listed = listed
        # Says why a name that is not callable might be (an upstream server that is down).
        self.unknown = unknown
        self.policy = policy
        self.ask = ask
        self.timeout = timeout

    def decision(self, name: str) -> Decision:
        return self.policy(name) if self.policy is not None else "allow"

    async def call(self, name: str, arguments: dict[str, Any] | None,
                   ctx: ToolContext) -> tuple[types.CallToolResult, Decision | None]:
        tool = self.lookup(name)
        decision = self.decision(name) if tool is not None else None
        if tool is None and self.unknown is not None and (why := self.unknown(name)) is not None:
            result = error_result(why)
        elif tool is None or decision == "deny":
            result = error_result(f"Unknown tool {name[:200]!r}. Available tools: {', '.join(self.listed())}")
        elif decision == "ask" and not await self._approved(name, arguments or {}):
            result = error_result(f"The person did not allow tool '{name}' to run")
        else:
            limit = tool.timeout if tool.timeout is not None else self.timeout
            result = await run_tool(tool, ctx, arguments, time_limit=limit)
        return result, decision

    async def _approved(self, name: str, arguments: dict[str, Any]) -> bool:
        if self.ask is None:
            return False
        try:
            return await self.ask(name, arguments)
        except Exception:
            logger.exception("asking about tool %s failed", name)
            return False
