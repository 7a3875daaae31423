"""AgentProcess: environment, stderr drain, teardown of the whole group, no leaks."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

import acp_host.process as process_mod
from acp_host.process import AgentProcess, AgentStartError, login_shell_path, merge_paths
from acp_host.reaper import reaper_pid

PY = sys.executable


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie left for init to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def _where(pid: int) -> str:
    """What process `pid` is doing, for a failure's message."""
    out = []
    for name in ("stat", "cmdline", "wchan", "stack"):
        try:
            out.append(f"{name}: {Path(f'/proc/{pid}/{name}').read_text(errors='replace').strip()[:500]}")
        except OSError as exc:
            out.append(f"{name}: {exc}")
    return f"process {pid}: " + "; ".join(out)


def _no_children_left() -> bool:
    """No child of ours is left (exited ones are reaped here), but the agents' watchdog
    (acp_host.reaper), which lives as long as this process by design."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            break
    me = str(os.getpid())
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].split()[1] == me:
            children.append(int(entry))
    return [p for p in children if p != reaper_pid()] == []


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = await stream.receive_some()
        if not chunk:
            break
        buf += chunk
    return buf


def test_merge_paths_order_and_dedupe() -> None:
    assert merge_paths("/a:/b:", "/b:/c::/a", "") == "/a:/b:/c"


FAKE_SHELL = """#!/bin/sh
# A login shell: its profile prints a banner and extends PATH; its rc file (read only
# when interactive, like nvm's lines in .bashrc) extends it further.
echo "Welcome!"
PATH=/opt/from-profile/bin:$PATH
case "$1" in *i*) [ -n "$RC_BROKEN" ] && exit 1; PATH=/opt/from-rc/bin:$PATH ;; esac
export PATH
exec /bin/sh -c "$2"
"""


def test_login_shell_path_reads_rc_and_profile_past_banners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell = tmp_path / "fake-login-shell"
    shell.write_text(FAKE_SHELL)
    shell.chmod(0o755)
    monkeypatch.setenv("SHELL", str(shell))
    monkeypatch.setenv("PATH", "/usr/bin:/bin:/only/in/current")
    # Started from a terminal (or forced off), the shell is not asked: our PATH is its PATH.
    monkeypatch.setenv("CRUCIBLE_LOGIN_PATH", "0")
    monkeypatch.setattr(process_mod, "_shell_path_cache", None)
    assert login_shell_path() == "/usr/bin:/bin:/only/in/current"
    monkeypatch.setenv("CRUCIBLE_LOGIN_PATH", "1")
    monkeypatch.setattr(process_mod, "_shell_path_cache", None)
    path = login_shell_path().split(":")
    assert path[:2] == ["/opt/from-rc/bin", "/opt/from-profile/bin"]
    assert "/only/in/current" in path
    assert len(path) == len(set(path))
    # an interactive shell that fails: the plain login shell's PATH is used
    monkeypatch.setenv("RC_BROKEN", "1")
    monkeypatch.setattr(process_mod, "_shell_path_cache", None)
    assert login_shell_path().split(":")[0] == "/opt/from-profile/bin"
    # a shell that is missing falls back to our own PATH
    monkeypatch.setenv("SHELL", str(tmp_path / "no-such-shell"))
    monkeypatch.setattr(process_mod, "_shell_path_cache", None)
    assert login_shell_path() == "/usr/bin:/bin:/only/in/current"
    monkeypatch.setattr(process_mod, "_shell_path_cache", None)


async def test_child_gets_full_env_plus_extra_and_shell_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SOME_API_KEY", "k-123")
    monkeypatch.setenv("PATH", "/usr/bin:/bin:/only/current")
    monkeypatch.setattr(process_mod, "_shell_path_cache", "/opt/shell-only/bin:/usr/bin:/bin")
    code = "import os; print(os.environ.get('SOME_API_KEY'), os.environ.get('PROFILE_VAR'), os.environ['PATH'], os.getcwd())"
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(
            nursery, [PY, "-c", code], extra_env={"PROFILE_VAR": "p"}, cwd=tmp_path
        )
        async with proc:
            out = (await _read_line(proc.stdout)).decode().split()
    assert out[0] == "k-123" and out[1] == "p"
    assert out[2] == "/opt/shell-only/bin:/usr/bin:/bin:/only/current"
    assert await trio.Path(out[3]).resolve() == await trio.Path(tmp_path).resolve()


async def test_missing_or_unexecutable_command_says_what_to_do(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(
            AgentStartError, match=r"`no-such-agent-xyz` was not found on PATH: install it"
        ):
            await AgentProcess.start(nursery, ["no-such-agent-xyz", "--acp"])
        script = tmp_path / "agent.sh"
        script.write_text("#!/bin/sh\n")
        with pytest.raises(AgentStartError, match="not an executable file"):
            await AgentProcess.start(nursery, [str(script)])
        with pytest.raises(AgentStartError, match="does not exist"):
            await AgentProcess.start(nursery, [str(tmp_path / "nope")])
        with pytest.raises(AgentStartError, match="working directory"):
            await AgentProcess.start(nursery, ["sh"], cwd=tmp_path / "missing-dir")


async def test_megabytes_of_stderr_never_block_and_tail_is_kept() -> None:
    # 5 MB of stderr before the agent's first stdout line: an unread pipe would block it.
    code = (
        "import sys\n"
        "for i in range(50000): sys.stderr.write('%06d-' % i + 'x' * 93 + '\\n')\n"
        "sys.stderr.write('the last words\\n'); sys.stderr.flush()\n"
        "print('ready', flush=True)\n"
    )
    seen = 0

    def on_stderr(chunk: bytes) -> None:
        nonlocal seen
        seen += len(chunk)

    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(
            nursery, [PY, "-c", code], stderr_ring_bytes=8192, on_stderr=on_stderr
        )
        async with proc:
            assert await _read_line(proc.stdout) == b"ready\n"
            assert await proc.wait() == 0
        assert proc.stderr_tail(100).endswith("the last words\n")
        assert len(proc.stderr_tail(10**9).encode()) <= 8192
    assert seen == 50000 * 101 + len("the last words\n")


async def test_stdout_after_exit_is_not_lost_and_exit_code_kept() -> None:
    code = (
        "import sys; sys.stdout.write('line\\n' * 2000); sys.stderr.write('boom\\n'); sys.exit(3)"
    )
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, [PY, "-c", code])
        async with proc:
            assert await proc.wait() == 3
            assert proc.exited.is_set()
            data = b""
            while chunk := await proc.stdout.receive_some():
                data += chunk
        assert data == b"line\n" * 2000
        assert proc.stderr_tail() == "boom\n"


async def test_grandchild_in_the_group_is_killed() -> None:
    # An agent that re-launches itself: the real work runs in a child of the direct child.
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, ["sh", "-c", "sleep 100 & echo $!; wait"])
        grandchild = int(await _read_line(proc.stdout))
        assert not _gone(grandchild)
        await proc.aclose(grace=0)
    assert _gone(proc.pid) and _gone(grandchild)
    assert proc.returncode == -signal.SIGTERM


async def test_leftovers_of_an_exited_agent_are_stopped_so_stdout_ends() -> None:
    # The leader exits but its background child keeps stdout open: the reader must still see EOF.
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, ["sh", "-c", "sleep 100 & echo $!; exit 0"])
        async with proc:
            grandchild = int(await _read_line(proc.stdout))
            assert await proc.stdout.receive_some() == b""
            assert await proc.wait() == 0
        # (EOF comes as the grandchild closes its files, a moment before it is a zombie;
        # aclose waits for the group to be gone.)
        assert _gone(grandchild)


async def test_agent_that_ignores_stdin_and_sigterm_is_killed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Zero wall time: the clock jumps the 2 s grace and the 1 s after SIGTERM.
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(
            nursery, ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"]
        )
        assert await _read_line(proc.stdout) == b"ready\n"  # the trap is set
        start = trio.current_time()
        await proc.aclose(grace=2.0)
        assert proc.returncode == -signal.SIGKILL
        assert trio.current_time() - start >= 3.0
        assert _gone(proc.pid)
        await proc.aclose()  # idempotent


async def test_agent_that_exits_on_stdin_close_or_sigterm_is_not_killed() -> None:
    # Real clock: these react within milliseconds, far inside their grace periods.
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.start(nursery, ["cat"])
        await proc.aclose(grace=2.0)
        assert proc.returncode == 0
        proc = await AgentProcess.start(nursery, ["sh", "-c", "exec sleep 1000 < /dev/null"])
        await proc.aclose(grace=0)
        assert proc.returncode == -signal.SIGTERM


async def test_cancelling_the_nursery_tears_the_agent_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            proc = await AgentProcess.start(nursery, ["sh", "-c", "trap '' TERM; sleep 100 & wait"])
            scope.cancel()
    assert proc.exited.is_set() and _gone(proc.pid)


async def test_hundred_spawn_kill_cycles_no_zombies_no_fds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Boom(Exception):
        pass

    async def one(i: int) -> list[int]:
        kind = i % 4
        pids: list[int] = []
        if kind == 0:  # plain close
            async with trio.open_nursery() as nursery:
                proc = await AgentProcess.start(nursery, ["cat"])
                async with proc:
                    await proc.stdin.send_all(b"x\n")
                    assert await _read_line(proc.stdout) == b"x\n"
                pids.append(proc.pid)
        elif kind == 1:  # cancelled while talking to it, group with a grandchild
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    proc = await AgentProcess.start(
                        nursery, ["sh", "-c", "sleep 100 & echo $!; wait"]
                    )
                    pids += [proc.pid, int(await _read_line(proc.stdout))]
                    scope.cancel()
                    await trio.sleep_forever()
        elif kind == 2:  # an exception in the body
            with pytest.raises(ExceptionGroup) as info:
                async with trio.open_nursery() as nursery:
                    proc = await AgentProcess.start(nursery, ["sh", "-c", "trap '' TERM; cat"])
                    pids.append(proc.pid)
                    async with proc:
                        raise Boom
            assert info.group_contains(Boom)
        else:  # the agent crashes on its own
            async with trio.open_nursery() as nursery:
                proc = await AgentProcess.start(nursery, ["sh", "-c", "echo dying >&2; kill -9 $$"])
                async with proc:
                    assert await proc.wait() == -signal.SIGKILL
                assert proc.stderr_tail() == "dying\n"
                pids.append(proc.pid)
        return pids

    await one(0)  # warm up: the login shell PATH lookup, trio's lazily opened fds
    await one(1)
    fds_before = _fd_count()
    all_pids: list[int] = []
    for i in range(100):
        all_pids += await one(i)
    assert _fd_count() == fds_before
    assert _no_children_left()
    assert all(_gone(pid) for pid in all_pids)
    assert len(all_pids) >= 125


async def test_start_into_a_closed_nursery_leaves_nothing_behind() -> None:
    async with trio.open_nursery() as nursery:
        pass
    fds = _fd_count()
    with pytest.raises(RuntimeError):
        await AgentProcess.start(nursery, ["cat"])
    assert _fd_count() == fds
    assert _no_children_left()


# -- the watchdog's backstop: a process started but not yet watched when the host dies ---------

_HOST = r"""
import os, subprocess, sys, time
from acp_host.reaper import host_mark_env, reaper_pid
env = {**os.environ, **host_mark_env()}
# Started, never given to watch_group: the moment between a process starting and the host
# watching it, made long. `setsid` also takes it out of any group the host knows.
child = subprocess.Popen(["sleep", "3600"], env=env, start_new_session=True)
print(child.pid, reaper_pid(), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(3600)
"""


_HOST_MID_EXEC = r"""
import os, subprocess, sys, time
from acp_host.reaper import host_mark_env, reaper_pid
mark = host_mark_env()["CRUCIBLE_HOST_MARK"]
then = "sleep 0.3; exec env CRUCIBLE_HOST_MARK=" + mark + " sleep 3600"
if sys.argv[1] == "exec":
    # A process whose environment is empty when the host dies, then holds the mark (through an
    # `env` between): what the watchdog's scan meets when the host is killed while a process it
    # started is in the middle of its exec (the parent has seen the exec succeed; the kernel has
    # not set up its environment).
    child = subprocess.Popen(["env", "-i", "sh", "-c", then], start_new_session=True).pid
else:
    # Forked, not exec'd yet: the host's own environment, without the mark, until its exec (it
    # holds the host's end of the watchdog's pipe until then).
    child = os.fork()
    if child == 0:
        os.setsid()
        time.sleep(0.3)
        os.execvpe("sleep", ["sleep", "3600"], {**os.environ, "CRUCIBLE_HOST_MARK": mark})
print(child, reaper_pid(), flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("moment", ["exec", "fork"])
def test_a_process_in_the_middle_of_its_start_when_the_host_dies_is_stopped(moment: str) -> None:
    import subprocess

    host = subprocess.Popen([sys.executable, "-c", _HOST_MID_EXEC, moment], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    child, watchdog = (int(pid) for pid in host.stdout.readline().split())
    handle = os.pidfd_open(child)
    try:
        host.kill()
        host.wait(10)
        poll = select.poll()
        poll.register(handle, select.POLLIN)
        assert poll.poll(20_000), f"child: {_where(child)}; {_where(watchdog)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        os.close(handle)


@pytest.mark.parametrize("how", ["kill -9", "exit"])
def test_a_process_the_host_started_but_did_not_watch_yet(how: str) -> None:
    """kill -9 of the host: the watchdog finds it by the host's mark and stops it. An orderly
    exit: what is left is the host's choice (a detached server an agent started), not stopped."""
    import subprocess

    host = subprocess.Popen([sys.executable, "-c", _HOST, how], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    child, watchdog = (int(pid) for pid in host.stdout.readline().split())
    # The child itself, not its pid: this machine's pids wrap at 32,768, and a suite of two
    # workers forks that many in minutes, so a pid seen alive 20 s on may be another process
    # (CI saw "alive" with the watchdog gone, its work done).
    handle = os.pidfd_open(child)
    try:
        assert not _gone(child)
        if how == "kill -9":
            host.kill()
        host.wait(10)
        # the stop is awaited longer than the orderly exit's "not stopped" is watched
        poll = select.poll()
        poll.register(handle, select.POLLIN)  # readable once the process has exited
        ended = bool(poll.poll((20 if how == "kill -9" else 5) * 1000))
        assert ended is (how == "kill -9"), f"child: {_where(child)}; {_where(watchdog)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        os.close(handle)


def test_the_watchdog_holds_none_of_the_persons_environment_and_is_not_taken_for_a_starting_process() -> None:
    """Its environment is one variable of its own: no key of the person's, and not empty, since
    another host's watchdog follows a process with an empty environment (one in the middle of
    its exec) for up to a second after that host's kill -9 before it stops anything."""
    import subprocess

    code = "from acp_host.reaper import host_mark_env, reaper_pid; host_mark_env(); print(reaper_pid(), flush=True); input()"
    host = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "ANTHROPIC_API_KEY": "sk-the-persons-key"})
    assert host.stdout is not None and host.stdin is not None
    try:
        watchdog = int(host.stdout.readline())
        # Popen returns once the exec has begun (its close-on-exec pipe closed); the kernel sets
        # the new environment a moment later, and /proc shows an empty one until then (a CI run
        # read it in that window). Wait for the exec to finish, then read what it holds.
        deadline = time.monotonic() + 5
        while not (environ := Path(f"/proc/{watchdog}/environ").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert environ == b"CRUCIBLE_WATCHDOG=1\0"
    finally:
        host.stdin.close()
        host.wait(10)
