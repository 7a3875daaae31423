"""What the client serves to the agent: `fs/*` and `terminal/*`, confined to the session's roots.

Every path an agent names (a file, a terminal's cwd) must resolve, symlinks followed, inside
one of the roots (the session's cwd plus any allowed directories); otherwise the request gets
a JSON-RPC error that repeats the path as the agent gave it and nothing else about the disk.

Terminals are real subprocesses in their own process group. Their output (stdout and stderr
merged) is drained continuously into a buffer bounded by `outputByteLimit` (default
`DEFAULT_OUTPUT_LIMIT`), truncated from the start at a UTF-8 character boundary. The services
object owns every terminal it started: `aclose()` kills them all (the session calls it).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio
from acp import schema
from pydantic import BaseModel, ValidationError

from acp_host.jsonrpc import JsonRpcError
from acp_host.reaper import host_mark_env, unwatch_group, watch_group

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002

DEFAULT_OUTPUT_LIMIT = 4 * 1024 * 1024
"""Output kept per terminal when the agent gives no `outputByteLimit`, so a chatty command
cannot hold unbounded memory."""

_SHELL_CHARS = set(" \t|&;<>()$`\\\"'*?[]#~=%")

# The agent's requests that change something, and the ACP tool kind each amounts to: a host
# gives them to its permission policy before they run (`AcpSession.service_gate`), so a
# rule or a "no" holds whether or not the agent asked first with session/request_permission.
GATED_METHODS: dict[str, str] = {"terminal/create": "execute", "fs/write_text_file": "edit"}


def describe_request(method: str, params: Any) -> str:
    """What a gated request would do, in one line for the person: the command line (and its
    folder when not the session's), or the file path."""
    p = params if isinstance(params, dict) else {}
    if method == "terminal/create":
        command = str(p.get("command", ""))
        args = p.get("args") if isinstance(p.get("args"), list) else []
        line = shlex.join([command, *map(str, args)]) if args else command
        return f"{line} (in {p['cwd']})" if isinstance(p.get("cwd"), str) and p["cwd"] else line
    if method == "fs/write_text_file":
        return str(p.get("path", ""))
    return method

M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], method: str, params: Any) -> M:
    try:
        return model.model_validate(params)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "params"
        raise JsonRpcError(INVALID_PARAMS, f"invalid {method} params: {where}: {first['msg']}") from None


@dataclass
class _Terminal:
    terminal_id: str
    process: trio.Process
    limit: int
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    exit_status: dict[str, Any] | None = None
    exited: trio.Event = field(default_factory=trio.Event)
    reader_scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    def append(self, data: bytes | bytearray) -> None:
        self.output += data
        excess = len(self.output) - self.limit
        if excess > 0:
            del self.output[:excess]
            self.truncated = True

    def text(self) -> str:
        data = bytes(self.output)
        if self.truncated:
            # The cut may have split a character: drop continuation bytes at the front.
            start = 0
            while start < len(data) and start < 4 and (data[start] & 0xC0) == 0x80:
                start += 1
            data = data[start:]
        return data.decode("utf-8", errors="replace")


class SessionServices:
    """`fs/*` and `terminal/*` for one session. Construct with the nursery that runs the
    terminals' output readers; call `aclose()` when the session ends."""

    def __init__(
        self,
        nursery: trio.Nursery,
        cwd: str | os.PathLike[str],
        *,
        allowed_dirs: Sequence[str | os.PathLike[str]] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self._nursery = nursery
        self.cwd = Path(os.path.realpath(cwd))
        self.roots = [self.cwd] + [Path(os.path.realpath(d)) for d in allowed_dirs]
        self._env = dict(os.environ if env is None else env)
        self._terminals: dict[str, _Terminal] = {}
        self._next_terminal = 0
        # Told when a terminal's command exits: (terminalId, {"exitCode", "signal"}).
        self.on_exit: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        self._closed = False
        self._handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "fs/read_text_file": self.read_text_file,
            "fs/write_text_file": self.write_text_file,
            "terminal/create": self.terminal_create,
            "terminal/output": self.terminal_output,
            "terminal/wait_for_exit": self.terminal_wait_for_exit,
            "terminal/kill": self.terminal_kill,
            "terminal/release": self.terminal_release,
        }

    def handles(self, method: str) -> bool:
        return method in self._handlers

    async def handle(self, method: str, params: Any) -> Any:
        handler = self._handlers.get(method)
        if handler is None:
            raise JsonRpcError(-32601, f"Method not found: {method}")
        return await handler(params)

    # -- paths ----------------------------------------------------------------------------
    def resolve(self, given: str) -> Path:
        """The real path of `given` (relative paths are taken from the cwd), if inside a root.
        Touches the disk (symlinks): call it from a worker thread."""
        if not isinstance(given, str) or not given or "\0" in given:
            raise JsonRpcError(INVALID_PARAMS, f"invalid path: {given!r}")
        path = Path(given)
        if not path.is_absolute():
            path = self.cwd / path
        real = Path(os.path.realpath(path))
        for root in self.roots:
            if real == root or real.is_relative_to(root):
                return real
        raise JsonRpcError(
            INVALID_PARAMS,
            f"access denied: {given} is outside the folders this session may use",
        )

    # -- fs -------------------------------------------------------------------------------
    async def read_text_file(self, params: Any) -> dict[str, Any]:
        req = _parse(schema.ReadTextFileRequest, "fs/read_text_file", params)
        start = max((req.line or 1) - 1, 0)
        limit = req.limit

        def read() -> str:
            path = self.resolve(req.path)
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                # Gemini reads a file before writing it; an error here makes its write fail.
                return ""
            except IsADirectoryError:
                raise JsonRpcError(INVALID_PARAMS, f"{req.path} is a directory") from None
            except OSError as e:
                raise JsonRpcError(INTERNAL_ERROR, f"cannot read {req.path}: {e.strerror}") from None
            if start == 0 and limit is None:
                return text
            lines = text.splitlines(keepends=True)
            end = None if limit is None else start + limit
            return "".join(lines[start:end])

        return {"content": await trio.to_thread.run_sync(read)}

    async def write_text_file(self, params: Any) -> dict[str, Any]:
        req = _parse(schema.WriteTextFileRequest, "fs/write_text_file", params)

        def write() -> None:
            path = self.resolve(req.path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                _atomic_write(path, req.content)
            except IsADirectoryError:
                raise JsonRpcError(INVALID_PARAMS, f"{req.path} is a directory") from None
            except OSError as e:
                raise JsonRpcError(INTERNAL_ERROR, f"cannot write {req.path}: {e.strerror}") from None

        await trio.to_thread.run_sync(write)
        return {}

    # -- terminals ------------------------------------------------------------------------
    def _terminal(self, params: Any, model: type[Any], method: str) -> _Terminal:
        req = _parse(model, method, params)
        term = self._terminals.get(req.terminal_id)
        if term is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, f"unknown terminal: {req.terminal_id}")
        return term

    async def terminal_create(self, params: Any) -> dict[str, Any]:
        req = _parse(schema.CreateTerminalRequest, "terminal/create", params)
        if self._closed:
            raise JsonRpcError(INTERNAL_ERROR, "the session is closing")
        def check_cwd() -> Path:
            cwd = self.resolve(req.cwd) if req.cwd else self.cwd
            if not cwd.is_dir():
                raise JsonRpcError(INVALID_PARAMS, f"terminal cwd {req.cwd} is not a directory")
            return cwd

        cwd = await trio.to_thread.run_sync(check_cwd)
        env = dict(self._env)
        for var in req.env or []:
            env[var.name] = var.value
        env.update(host_mark_env())  # stopped by the watchdog even if the host dies before watching it
        if req.args:
            argv = [req.command, *req.args]
        elif any(c in _SHELL_CHARS for c in req.command):
            # A bare command line ("ls -la | head"): agents mean it for a shell.
            argv = ["/bin/sh", "-c", req.command]
        else:
            argv = [req.command]
        limit = req.output_byte_limit if req.output_byte_limit is not None else DEFAULT_OUTPUT_LIMIT
        try:
            process = await trio.lowlevel.open_process(
                argv,
                cwd=str(cwd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise JsonRpcError(INTERNAL_ERROR, f"cannot start {req.command}: {e.strerror}") from None
        watch_group(process.pid)  # stopped by the host's watchdog if the host dies first
        self._next_terminal += 1
        term = _Terminal(f"term-{self._next_terminal}", process, limit)
        self._terminals[term.terminal_id] = term
        self._nursery.start_soon(self._drain, term)
        return {"terminalId": term.terminal_id}

    async def _drain(self, term: _Terminal) -> None:
        stream = term.process.stdout
        assert stream is not None
        with term.reader_scope:
            try:
                while data := await stream.receive_some(65536):
                    term.append(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass
        with trio.CancelScope(shield=True):
            code = await term.process.wait()
            await stream.aclose()
        if code < 0:
            term.exit_status = {"exitCode": None, "signal": signal.Signals(-code).name}
        else:
            term.exit_status = {"exitCode": code, "signal": None}
        term.exited.set()
        if self.on_exit is not None:
            await self.on_exit(term.terminal_id, dict(term.exit_status))

    async def terminal_output(self, params: Any) -> dict[str, Any]:
        term = self._terminal(params, schema.TerminalOutputRequest, "terminal/output")
        result: dict[str, Any] = {"output": term.text(), "truncated": term.truncated}
        if term.exit_status is not None:
            result["exitStatus"] = term.exit_status
        return result

    async def terminal_wait_for_exit(self, params: Any) -> dict[str, Any]:
        term = self._terminal(params, schema.WaitForTerminalExitRequest, "terminal/wait_for_exit")
        await term.exited.wait()
        assert term.exit_status is not None
        return dict(term.exit_status)

    async def terminal_kill(self, params: Any) -> dict[str, Any]:
        term = self._terminal(params, schema.KillTerminalRequest, "terminal/kill")
        self._kill(term)
        return {}

    async def terminal_release(self, params: Any) -> dict[str, Any]:
        term = self._terminal(params, schema.ReleaseTerminalRequest, "terminal/release")
        del self._terminals[term.terminal_id]
        await self._finish(term)
        return {}

    @staticmethod
    def _kill(term: _Terminal) -> None:
        if term.exited.is_set():
            return
        try:
            os.killpg(term.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def _finish(self, term: _Terminal) -> None:
        self._kill(term)
        # A grandchild that left the group may still hold the pipe: stop reading after a beat.
        with trio.move_on_after(2):
            await term.exited.wait()
        term.reader_scope.cancel()
        with trio.CancelScope(shield=True):
            await term.exited.wait()
        unwatch_group(term.process.pid)

    def output_so_far(self, terminal_id: str) -> str | None:
        """What a terminal printed so far (within its byte limit), or None once it is released."""
        term = self._terminals.get(terminal_id)
        return term.text() if term is not None else None

    def terminal_pids(self) -> list[int]:
        """Process ids of the terminals not yet released (for diagnostics)."""
        return [t.process.pid for t in self._terminals.values()]

    async def aclose(self) -> None:
        """Kill every terminal this session started and wait for them."""
        self._closed = True
        terms = list(self._terminals.values())
        self._terminals.clear()
        with trio.CancelScope(shield=True):
            for term in terms:
                await self._finish(term)


def _atomic_write(path: Path, content: str) -> None:
    """Temp file in the same folder, fsync, rename: a reader never sees half a file."""
    mode = None
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
