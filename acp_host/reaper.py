"""Agents die with their host, however the host dies (kill -9, a closed terminal, a crash).

Teardown code cannot run when the host is killed, and an agent in its own process group
outlives it (claude-agent-acp ignores stdin EOF and starts its own CLI, which would run on
under PID 1). So each host process has one small watchdog, started with the first agent: a
separate Python process, in its own session (a terminal's SIGHUP or Ctrl-C does not reach it),
that is told over a pipe which process groups the host owns. When the pipe reaches EOF — the
host exited, normally or not — it sends SIGTERM to every group still listed, and SIGKILL
~1 s later to what is left. Linux's PR_SET_PDEATHSIG would reach only the direct child (not the
CLI the adapter starts) and fires when the forking *thread* exits; a pipe has neither problem
and works on every POSIX system.

A group is told to the watchdog once its process is started, so a host killed in between
(under load, the hand-back of a new process to the async task can take a tenth of a second)
would leave it unlisted: as a backstop, every process the host starts carries
`CRUCIBLE_HOST_MARK` (random per host, `host_mark_env()`) in its environment, and when the
host dies without exiting (kill -9, a crash: no `atexit`), the watchdog also stops the group
of every process that carries this host's mark. A process met with no environment yet (in
the middle of its exec: its parent saw the exec succeed a moment before the kernel set up its
environment) is followed for up to a second, through the execs after it, until it shows the
mark. One forked but not yet exec'd needs nothing: it holds the host's end of the pipe until
its exec, so the watchdog's EOF comes after it carries the mark. After an orderly exit the
watchdog does not scan: what an agent's command started on purpose to outlive it (a detached
server) is left alone.

`watch_group(pgid)` when a group is started, `unwatch_group(pgid)` once it is gone. Both are
cheap (one short write) and never raise: without a watchdog the host still tears its
groups down itself on every orderly way out. The host keeps the same list, so a hard stop
(SIGTERM, SIGHUP) can signal every group it owns at once — agents, their terminals and
upstream MCP servers alike — with `signal_watched` instead of waiting out each owner's grace.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from typing import IO

__all__ = ["host_mark_env", "reaper_pid", "signal_watched", "unwatch_group", "watch_group"]

logger = logging.getLogger(__name__)

# The watchdog itself: standard library only, no site packages (starts in ~20 ms).
_WATCHDOG = r"""
import os, signal, sys, time
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
groups = set()
clean = False
for line in sys.stdin.buffer:
    if line == b"=\n":
        clean = True
        continue
    try:
        sign, pgid = line[:1], int(line[1:])
    except ValueError:
        continue
    if pgid <= 1:
        continue
    if sign == b"+":
        groups.add(pgid)
    else:
        groups.discard(pgid)
mark = ("\0CRUCIBLE_HOST_MARK=" + sys.argv[1] + "\0").encode()
def scan(pids, following):
    # -> (groups of marked processes, processes to look at again). Looked at again: one with no
    # environment yet (in the middle of its exec: its parent saw the exec succeed a moment
    # before the kernel set it up) and, once followed, any still alive: an exec chain such as
    # `env … agent` shows an environment without the mark on its way.
    found, again = set(), []
    for pid in pids:
        try:
            with open("/proc/" + pid + "/environ", "rb") as f:
                env = f.read()
            if mark in b"\0" + env + b"\0":
                found.add(os.getpgid(int(pid)))
            elif following or not env:
                with open("/proc/" + pid + "/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                # not a zombie, nor a kernel thread
                if fields[0] not in (b"Z", b"X") and not int(fields[6]) & 0x00200000:
                    again.append(pid)
        except (OSError, IndexError, ValueError):
            pass
    return found, again
if not clean and len(sys.argv) > 1 and os.path.isdir("/proc"):
    found, again = scan([e for e in os.listdir("/proc") if e.isdigit()], False)
    groups |= found
    deadline = time.monotonic() + 1.0
    while again and time.monotonic() < deadline:
        time.sleep(0.02)
        found, again = scan(again, True)
        groups |= found
groups.discard(os.getpgid(0))
def alive():
    out = set()
    for g in groups:
        try:
            os.killpg(g, 0)
            out.add(g)
        except OSError:
            pass
    return out
for sig in (signal.SIGTERM, signal.SIGKILL):
    groups = alive()
    for g in groups:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    deadline = time.monotonic() + 1.0
    while groups and time.monotonic() < deadline:
        time.sleep(0.02)
        groups = alive()
"""

_lock = threading.Lock()
_process: subprocess.Popen[bytes] | None = None
_pipe: IO[bytes] | None = None
_owner_pid = 0  # the pid that started the watchdog (a forked child must start its own)
_watched: set[int] = set()  # this process's copy of the watchdog's list
_mark = ""  # this host's mark (see host_mark_env), made with the watchdog


def _ensure() -> IO[bytes] | None:
    global _process, _pipe, _owner_pid, _mark
    if _pipe is not None and _owner_pid == os.getpid():
        return _pipe
    mark = secrets.token_hex(8)
    try:
        _process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, mark],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
            # None of the person's environment (it holds no copy of their keys), and not an empty
            # one either: another host's watchdog would take it for a process in the middle of
            # its exec and follow it for its full second after that host's kill -9.
            env={"CRUCIBLE_WATCHDOG": "1"},
            cwd="/",  # nor keeps a folder busy
        )
    except OSError as exc:
        logger.warning("could not start the watchdog that stops agents if this process dies: %s", exc)
        return None
    _pipe, _owner_pid, _mark = _process.stdin, os.getpid(), mark
    atexit.register(_exiting)
    return _pipe


def _exiting() -> None:
    """An orderly exit (the interpreter's, so not kill -9): the watchdog skips the mark scan."""
    if _pipe is not None and _owner_pid == os.getpid():
        with contextlib.suppress(OSError, ValueError):
            _pipe.write(b"=\n")
            _pipe.flush()


def host_mark_env() -> dict[str, str]:
    """What to add to the environment of a process the host starts (an agent, a terminal):
    this host's mark, which the watchdog looks for when the host dies (the watchdog starts
    now if it does not run yet). Empty without a watchdog."""
    with _lock:
        if _ensure() is None:
            return {}
        return {"CRUCIBLE_HOST_MARK": _mark}


def _tell(line: bytes) -> None:
    with _lock:
        pipe = _ensure()
        if pipe is None:
            return
        try:
            pipe.write(line)
            pipe.flush()
        except OSError:  # the watchdog is gone (killed by hand): start another next time
            global _pipe
            _pipe = None


def watch_group(pgid: int) -> None:
    """Have the watchdog stop process group `pgid` if this process dies before it is gone."""
    with _lock:
        _watched.add(pgid)
    _tell(b"+%d\n" % pgid)


def unwatch_group(pgid: int) -> None:
    """The group is gone (or no longer ours): forget it."""
    with _lock:
        _watched.discard(pgid)
    if _pipe is not None:
        _tell(b"-%d\n" % pgid)


def signal_watched(sig: int = signal.SIGTERM) -> None:
    """Send `sig` to every process group watched now (a hard stop: callable from a signal
    handler's task; never raises). Each group's owner still reaps it as it winds down."""
    with _lock:
        groups = [g for g in _watched if g > 1]
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:  # already gone, or no longer ours to signal
            pass


def reaper_pid() -> int | None:
    """The watchdog's pid, if it runs (for diagnostics and tests)."""
    return _process.pid if _process is not None and _process.poll() is None else None
