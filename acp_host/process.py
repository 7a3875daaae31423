"""Spawn an agent: its own process group, the person's environment, stderr drained, teardown.

`AgentProcess` owns one agent subprocess and everything it started in its process group.
The group is also given to the host's watchdog (`acp_host.reaper`), which stops it if the
host dies without tearing down (kill -9, a closed terminal). `stop_all_now()` is for a host
told to stop (SIGTERM, SIGHUP): every agent group gets SIGTERM at once and teardowns skip the
exit grace, so the host is gone within ~1 s (SIGKILL follows for what ignores SIGTERM).
Its lifetime is tied to the nursery given to `start()`: when that nursery is cancelled the
process is torn down too, so no exit path (cancel, exception, agent crash) leaves a
process, a zombie or a pipe behind. Teardown (`aclose`): close stdin, wait `grace`
(`exit_grace` unless given), SIGTERM the group, wait ~1 s, SIGKILL the group, reap.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import trio

from acp_host.reaper import host_mark_env, signal_watched, unwatch_group, watch_group

__all__ = ["AgentNotFoundError", "AgentProcess", "AgentStartError", "login_shell_path", "merge_paths", "stop_all_now"]

logger = logging.getLogger(__name__)

# Time the agent gets to exit by itself once its stdin is closed (`AgentProcess.exit_grace`).
DEFAULT_EXIT_GRACE = 2.0
# Time the group gets between SIGTERM and SIGKILL.
_TERM_GRACE = 1.0
# Time the stderr drain gets to reach EOF once the group is dead (a process that left the
# group may still hold the pipe open).
_DRAIN_GRACE = 0.5
_READ_SIZE = 65536
_GROUP_POLL = 0.02
_SHELL_TIMEOUT = 3.0
_PATH_MARKER = "__CRUCIBLE_PATH__="

_shell_path_lock = threading.Lock()
_shell_path_cache: str | None = None


class AgentStartError(Exception):
    """The agent could not be started (or did not come up); the message says what to do."""


class AgentNotFoundError(AgentStartError):
    """The agent's command is not there (not on PATH, no such file): nothing was started."""


def merge_paths(*paths: str) -> str:
    """PATH strings joined in order, empty and repeated entries dropped."""
    seen: set[str] = set()
    out: list[str] = []
    for path in paths:
        for entry in path.split(os.pathsep):
            if entry and entry not in seen:
                seen.add(entry)
                out.append(entry)
    return os.pathsep.join(out)


def _ask_login_shell() -> str | None:
    shell = os.environ.get("SHELL")
    if not shell or not os.path.isabs(shell) or not os.access(shell, os.X_OK):
        return None
    # Profiles may print banners: the marker tells our output from theirs.
    script = f"printf '\\n{_PATH_MARKER}%s\\n' \"$PATH\""
    # Interactive too: version managers (nvm, pyenv, asdf) usually extend PATH in the rc
    # file, which a non-interactive login shell skips. Plain login shell as the fallback.
    for flags in ("-ilc", "-lc"):
        try:
            done = subprocess.run(
                [shell, flags, script],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_SHELL_TIMEOUT,
                start_new_session=True,  # no controlling terminal: a profile cannot grab ours
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            logger.debug("login shell PATH unavailable with %s: %s", flags, exc)
            continue
        text = done.stdout.decode("utf-8", "replace")
        for line in reversed(text.splitlines()):
            if line.startswith(_PATH_MARKER):
                path = line[len(_PATH_MARKER) :].strip()
                if path:
                    return path
    return None


def _wants_shell_path() -> bool:
    """Started from a terminal, our PATH already is the shell's: asking costs 0.5 s or more.
    Started by an editor or a desktop launcher (stdin not a TTY), it often is not.
    CRUCIBLE_LOGIN_PATH=1 / 0 forces either way."""
    forced = os.environ.get("CRUCIBLE_LOGIN_PATH")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return not os.isatty(0)
    except OSError:
        return True


def login_shell_path() -> str:
    """PATH as the person's login shell sets it, merged with ours (shell entries first).
    Asked once per process (blocking, bounded by a short timeout), then cached."""
    global _shell_path_cache
    with _shell_path_lock:
        if _shell_path_cache is None:
            shell = _ask_login_shell() if _wants_shell_path() else None
            _shell_path_cache = merge_paths(shell or "", os.environ.get("PATH", ""))
        return _shell_path_cache


def _resolve(command: str, path: str, cwd: Path | None) -> str:
    """Check the command exists and is executable, with a message saying what to do."""
    if os.sep in command:
        target = Path(command) if cwd is None or os.path.isabs(command) else cwd / command
        if not target.exists():
            raise AgentStartError(
                f"agent command `{command}` does not exist: check the path, or install the agent"
            )
        if target.is_dir() or not os.access(target, os.X_OK):
            raise AgentStartError(
                f"agent command `{command}` is not an executable file: check the path "
                "(or make it executable with chmod +x)"
            )
        return command
    found = shutil.which(command, path=path)
    if found is None:
        raise AgentNotFoundError(
            f"agent command `{command}` was not found on PATH: install it, or check that the "
            "directory it is in is on your PATH (your login shell's PATH is used)"
        )
    return found


_live: weakref.WeakSet[AgentProcess] = weakref.WeakSet()
_stopping = False


def stop_all_now() -> None:
    """The host was told to stop: SIGTERM every live agent's group now — and every other
    group the host watches (terminals, upstream MCP servers: their owners' graceful shutdowns
    would wait seconds for them) — and make every teardown from here on skip the exit grace
    (callable from a signal handler's task)."""
    global _stopping
    _stopping = True
    for agent in list(_live):
        agent.exit_grace = 0
        if not agent.exited.is_set():
            agent._signal_group(signal.SIGTERM)
    signal_watched(signal.SIGTERM)


def how_it_ended(returncode: int) -> str:
    """How a process ended, to follow "exited": " with exit code 3", or, for the negative code
    a signal leaves, " (killed by SIGKILL)" (an "exit code -9" reads as a bug of the program)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f" (killed by {name})"
    return f" with exit code {returncode}"


class AgentProcess:
    """A running agent. Use `await AgentProcess.start(nursery, argv)`, then `async with`."""

    def __init__(
        self,
        process: trio.Process,
        *,
        name: str,
        stderr_ring_bytes: int,
        on_stderr: Callable[[bytes], None] | None,
    ) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self.name = name
        self.stdin: trio.abc.SendStream = process.stdin
        self.stdout: trio.abc.ReceiveStream = process.stdout
        self.pid: int = process.pid
        self.pgid: int = process.pid  # start_new_session: the agent leads its own group
        self.returncode: int | None = None
        self.exited = trio.Event()
        self.on_stderr = on_stderr
        self._ring = bytearray()
        self._ring_max = max(0, stderr_ring_bytes)
        self._stderr_done = trio.Event()
        self._closing = False
        self._closed = trio.Event()
        # Some agents never exit on stdin EOF (claude-agent-acp): a host that has nothing
        # more to ask of the agent (one headless turn) may lower this.
        self.exit_grace = 0.0 if _stopping else DEFAULT_EXIT_GRACE
        watch_group(self.pgid)
        _live.add(self)

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<AgentProcess {self.name!r} pid={self.pid} {state}>"

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stderr_ring_bytes: int = 64 * 1024,
        name: str | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> AgentProcess:
        """Start `argv` with the person's full environment (or `env`) plus `extra_env`, PATH
        merged with the login shell's. `on_stderr` gets every stderr chunk as it arrives."""
        argv = list(argv)
        if not argv or not argv[0]:
            raise AgentStartError("no agent command given: name an agent or pass a command")
        workdir = Path(cwd) if cwd is not None else None
        if workdir is not None and not workdir.is_dir():
            raise AgentStartError(
                f"working directory `{cwd}` does not exist: create it or pick another"
            )
        child_env = dict(os.environ if env is None else env)
        shell_path = await trio.to_thread.run_sync(login_shell_path)
        child_env["PATH"] = merge_paths(shell_path, child_env.get("PATH", ""))
        if extra_env:
            child_env.update(extra_env)  # an explicit PATH in the profile wins
        child_env.update(host_mark_env())  # stopped by the watchdog even if we die before watching it
        executable = _resolve(argv[0], child_env["PATH"], workdir)
        try:
            process = await trio.lowlevel.open_process(
                argv,
                executable=executable,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env,
                cwd=workdir,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise AgentNotFoundError(
                f"agent command `{argv[0]}` could not be started ({exc.strerror}): install it or check PATH"
            ) from exc
        except PermissionError as exc:
            raise AgentStartError(
                f"agent command `{argv[0]}` is not executable ({exc.strerror}): check its permissions"
            ) from exc
        except OSError as exc:
            raise AgentStartError(f"agent command `{argv[0]}` could not be started: {exc}") from exc
        self = cls(
            process,
            name=name or os.path.basename(argv[0]),
            stderr_ring_bytes=stderr_ring_bytes,
            on_stderr=on_stderr,
        )
        try:
            nursery.start_soon(self._drain_stderr)
            nursery.start_soon(self._watch)
        except BaseException:  # e.g. the nursery is already closing: do not leak the agent
            self._stderr_done.set()
            await self.aclose(grace=0)
            raise
        return self

    # -- running ------------------------------------------------------------------------

    async def _drain_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        try:
            while True:
                chunk = await stream.receive_some(_READ_SIZE)
                if not chunk:
                    return
                self._ring += chunk
                if len(self._ring) > self._ring_max:
                    del self._ring[: len(self._ring) - self._ring_max]
                if self.on_stderr is not None:
                    try:
                        self.on_stderr(bytes(chunk))
                    except Exception:
                        logger.exception("%s: stderr callback failed", self.name)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        finally:
            self._stderr_done.set()

    async def _watch(self) -> None:
        """Reaps the agent when it exits, then stops what it left in its group (so its pipes
        reach EOF). Stays until `aclose()`, and runs it if the owning nursery is cancelled.
        The pipes are left open on a natural exit: the reader still has data to read."""
        try:
            self._set_exited(await self._process.wait())
            await self._stop_group_leftovers()
            await self._closed.wait()
        finally:
            await self.aclose()

    def _set_exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            logger.debug("%s (pid %d) exited with %d", self.name, self.pid, code)
        self.exited.set()

    def stderr_tail(self, max_bytes: int = 4096) -> str:
        """The last `max_bytes` of the agent's stderr, decoded with replacement."""
        data = bytes(self._ring[-max_bytes:]) if max_bytes > 0 else b""
        return data.decode("utf-8", "replace")

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None
        return self.returncode

    # -- teardown -----------------------------------------------------------------------

    async def aclose(self, grace: float | None = None) -> None:
        """Stop the agent and its group, reap it, close its pipes. Idempotent, shielded:
        returns only when it is all done (a second caller waits for the first). `grace`:
        how long the agent may take to exit after stdin closes (default `exit_grace`)."""
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            await self._teardown(0.0 if _stopping else self.exit_grace if grace is None else grace)

    async def _teardown(self, grace: float) -> None:
        try:
            await self._close_stream(self.stdin)
            if not self.exited.is_set():
                with trio.move_on_after(grace):
                    await self._reap()
            if not self.exited.is_set():
                self._signal_group(signal.SIGTERM)
                with trio.move_on_after(_TERM_GRACE):
                    await self._reap()
            if not self.exited.is_set():
                self._signal_group(signal.SIGKILL)
                await self._reap()
            await self._stop_group_leftovers()
            with trio.move_on_after(_DRAIN_GRACE):
                await self._stderr_done.wait()
        finally:
            await self._close_stream(self.stdout)
            assert self._process.stderr is not None
            await self._close_stream(self._process.stderr)
            if not self._group_alive():
                unwatch_group(self.pgid)  # else the watchdog keeps it, in case we die
            _live.discard(self)
            self._closed.set()

    async def _reap(self) -> None:
        self._set_exited(await self._process.wait())

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
            logger.debug("%s: sent %s to process group %d", self.name, sig.name, self.pgid)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # the group id was reused by someone else's group
            logger.warning("%s: could not signal process group %d: %s", self.name, self.pgid, exc)

    def _group_alive(self) -> bool:
        """Whether a live (non-zombie) process is left in the agent's group."""
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        # kill(0) also succeeds for zombies waiting for init to reap them: look closer.
        try:
            entries = os.listdir("/proc")
        except OSError:
            return True
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == self.pgid and fields[0] not in (b"Z", b"X"):
                return True
        return False

    async def _wait_group_gone(self) -> None:
        # Group members are not our children: there is nothing to wait on but the group.
        while True:
            if not self._group_alive():
                return
            await trio.sleep(_GROUP_POLL)

    async def _stop_group_leftovers(self) -> None:
        """After the leader exited: SIGTERM what is left in its group, SIGKILL it after
        ~1 s. The pgid cannot be reused while a member is alive, so this only ever reaches
        processes the agent started. Members are not our children: poll for their end."""
        if not self._group_alive():
            return
        self._signal_group(signal.SIGTERM)
        for sig in (signal.SIGKILL, None):
            with trio.move_on_after(_TERM_GRACE):
                await self._wait_group_gone()
            if not self._group_alive():
                return
            if sig is not None:
                self._signal_group(sig)
        logger.warning("%s: processes of group %d outlived SIGKILL", self.name, self.pgid)

    @staticmethod
    async def _close_stream(stream: trio.abc.AsyncResource) -> None:
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def __aenter__(self) -> AgentProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
