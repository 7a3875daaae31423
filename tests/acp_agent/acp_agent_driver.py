"""An editor for tests: the ACP SDK's client side (asyncio) driving `cru acp` as a subprocess.

Run it from a sync test with `asyncio.run(...)`; it records what an editor would see (raw
frames, typed updates, permission requests, fs calls) and answers like a person would.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from acp import spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    FileSystemCapabilities,
    InitializeResponse,
    PermissionOption,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    TextContentBlock,
    ToolCallUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"
ECHO_MCP = REPO / "fixtures" / "echo_mcp_server.py"


class AcpSetup:
    """A private kiln, work folder, data dir and scripted-agent log for one test."""

    def __init__(self, tmp: Path, env: dict[str, str], kiln: Path, cru: str) -> None:
        self.tmp, self.env, self.kiln, self.cru = tmp, env, kiln, cru
        self.work = tmp / "work"
        self.work.mkdir()
        self.log_path = tmp / "agent-log.jsonl"
        self.stderr_path = tmp / "cru-acp-stderr.txt"
        self.script_path = tmp / "script.json"

    def script(self, data: dict[str, Any]) -> Path:
        self.script_path.write_text(json.dumps({"log": str(self.log_path), **data}), encoding="utf-8")
        return self.script_path

    @property
    def agent_command(self) -> str:
        return shlex.join([sys.executable, str(SCRIPTED), str(self.script_path)])

    def argv(self, *extra: str, agent_command: str | None = None) -> list[str]:
        return [self.cru, "acp", "--agent-command", agent_command or self.agent_command,
                "--kiln", str(self.kiln), *extra]

    def log(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def results(self, name: str | None = None) -> list[Any]:
        """What the backend got back for its requests named `name` (the JSON-RPC result, or the
        whole answer when it was an error)."""
        out = []
        for e in self.log():
            if e.get("kind") == "result" and (name is None or e.get("as") == name):
                r = e["result"]
                out.append(r["result"] if isinstance(r, dict) and "result" in r else r)
        return out

    def inbound(self, method: str) -> list[dict[str, Any]]:
        return [e["frame"] for e in self.log() if e.get("kind") == "in" and e["frame"].get("method") == method]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""


class RealClaude:
    """`cru acp -a claude` (the real claude-agent-acp from npm) against the fake LLM, offline."""

    def __init__(self, acp: AcpSetup, llm: Any) -> None:
        import agent_env

        self.acp, self.llm = acp, llm
        _, env = agent_env.agent_launch("claude", llm.url, acp.tmp / "home")
        self.env = {**env, "XDG_CONFIG_HOME": acp.env["XDG_CONFIG_HOME"], "XDG_DATA_HOME": acp.env["XDG_DATA_HOME"]}

    def argv(self, *extra: str) -> list[str]:
        import netns

        argv = [self.acp.cru, "acp", "-a", "claude", "--kiln", str(self.acp.kiln), *extra]
        if netns.unavailable_reason() is None:
            argv = netns.wrap(argv, [self.llm.port])
        return argv




class Editor:
    """Implements the SDK's `Client` protocol (the parts `cru acp` uses)."""

    def __init__(self, *, answer: str | None = "allow_once", fs: bool = True, terminal: bool = False,
                 buffers: dict[str, str] | None = None) -> None:
        self.answer = answer  # the option kind the person picks; None: they never answer
        self.fs = fs
        self.terminal = terminal  # the editor's terminals: records commands, "runs" none
        self.terminal_calls: list[tuple[str, str]] = []
        self.buffers = dict(buffers or {})  # unsaved editor buffers by absolute path
        self.frames: list[dict[str, Any]] = []  # every raw frame cru acp sent us
        self.updates: list[tuple[str, Any]] = []
        self.permissions: list[dict[str, Any]] = []
        self.fs_calls: list[tuple[str, str]] = []
        self.asked = asyncio.Event()
        self.cancelled = asyncio.Event()

    def observe(self, event: StreamEvent) -> None:
        if event.direction == StreamDirection.INCOMING:
            self.frames.append(event.message)

    def update_frames(self, kind: str | None = None) -> list[dict[str, Any]]:
        out = []
        for f in self.frames:
            if f.get("method") == "session/update":
                upd = f["params"]["update"]
                if kind is None or upd.get("sessionUpdate") == kind:
                    out.append(f["params"])
        return out

    def text(self, session_id: str | None = None) -> str:
        return "".join(u.content.text for sid, u in self.updates
                       if isinstance(u, AgentMessageChunk) and isinstance(u.content, TextContentBlock)
                       and (session_id is None or sid == session_id))

    # -- the Client protocol -----------------------------------------------------------------
    async def request_permission(self, options: list[PermissionOption], session_id: str,
                                 tool_call: ToolCallUpdate, **kwargs: Any) -> RequestPermissionResponse:
        self.permissions.append({"session_id": session_id, "title": tool_call.title,
                                 "tool_call_id": tool_call.tool_call_id, "kinds": [o.kind for o in options]})
        self.asked.set()
        if self.answer is None:
            # The person has not answered; after session/cancel the editor answers cancelled.
            await self.cancelled.wait()
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        for option in options:
            if option.kind == self.answer:
                return RequestPermissionResponse(
                    outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def read_text_file(self, session_id: str, path: str, line: int | None = None,
                             limit: int | None = None, **kwargs: Any) -> ReadTextFileResponse:
        self.fs_calls.append(("read", path))
        return ReadTextFileResponse(content=self.buffers.get(path, ""))

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **kwargs: Any) -> WriteTextFileResponse:
        self.fs_calls.append(("write", path))
        self.buffers[path] = content
        return WriteTextFileResponse()

    async def create_terminal(self, session_id: str, command: str, args: list[str] | None = None,
                              **kwargs: Any) -> CreateTerminalResponse:
        self.terminal_calls.append(("create", " ".join([command, *(args or [])])))
        return CreateTerminalResponse(terminal_id=f"editor-term-{len(self.terminal_calls)}")

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        self.terminal_calls.append(("output", terminal_id))
        return TerminalOutputResponse(output="from the editor's terminal\n", truncated=False,
                                      exit_status=TerminalExitStatus(exit_code=0))

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str,
                                     **kwargs: Any) -> WaitForTerminalExitResponse:
        self.terminal_calls.append(("wait_for_exit", terminal_id))
        return WaitForTerminalExitResponse(exit_code=0)

    async def release_terminal(self, session_id: str, terminal_id: str,
                               **kwargs: Any) -> ReleaseTerminalResponse:
        self.terminal_calls.append(("release", terminal_id))
        return ReleaseTerminalResponse()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


async def drive(argv: list[str], env: dict[str, str], editor: Editor, stderr_fd: int,
                body: Callable[[Any, InitializeResponse], Awaitable[T]], *, body_seconds: float = 120) -> tuple[T, int]:
    """Start `argv` (cru acp, its stderr to `stderr_fd`), initialize as `editor`, run
    `body(conn, init)`, close stdin. Returns body's result and the exit code of cru acp (it
    must exit on its own on EOF)."""
    async with spawn_agent_process(
        editor, argv[0], *argv[1:], env=env, observers=[editor.observe],  # type: ignore[arg-type]
        transport_kwargs={"stderr": stderr_fd, "limit": 64 * 1024 * 1024, "shutdown_timeout": 20.0},
    ) as (conn, proc):
        caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=editor.fs, write_text_file=editor.fs),
                                  terminal=editor.terminal)
        init = await asyncio.wait_for(conn.initialize(protocol_version=1, client_capabilities=caps), 30)
        result = await asyncio.wait_for(body(conn, init), body_seconds)
    assert proc.returncode is not None
    return result, proc.returncode


def pids_with(marker: str) -> list[int]:
    """Live processes whose command line contains `marker` (zombies count as gone), not
    counting `cru acp` itself (its --agent-command holds the marker too)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        cmdline = b" ".join(args).decode(errors="replace")
        if marker in cmdline and state != "Z" and b"--agent-command" not in args:
            found.append(int(entry))
    return found
