"""Hard stops: SIGTERM, SIGHUP (a closed terminal) and the parent's death end `cru` at once.

`cru chat -p`, `cru acp` and `cru mcp` run `stop_on_signals` (and `cru acp`/`cru mcp`, whose
parent is an editor or an MCP client, `stop_when_orphaned`) beside their work: on one of
those signals every agent's process group gets SIGTERM at once (`acp_host.process.stop_all_now`)
and the given cancel scope is cancelled, so teardown runs with no grace periods — bounded at
~1 s, not the 30 s a graceful cancel may take. Ctrl-C (SIGINT) stays each command's own:
cancel the turn first. If `cru` is killed outright (kill -9), `acp_host.reaper` stops the
agents.

The parent's death: an editor that crashes usually closes our stdin (EOF ends `cru acp` and
`cru mcp`), but when the pipe's other end is also held elsewhere (a sibling inherited it) only
the parent pid tells: when it changes, the parent is gone and we are an orphan.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from acp_host.process import stop_all_now

__all__ = ["ORPHAN_POLL", "exit_code", "received", "run_stoppable", "stop_now", "stop_on_signals",
           "stop_when_orphaned", "why_stopped"]

# How often the parent pid is looked at (seconds): a cheap syscall.
ORPHAN_POLL = 0.5

# The signal (or "orphaned") that stopped this process, if any, and when.
received: list[int | str] = []
_first_stop: list[float] = []
# A process still there this long after its first stop is stuck: the next stop signal has its
# default effect (teardown is bounded at ~3 s).
STUCK_AFTER = 10.0


def stop_now(scope: trio.CancelScope, why: int | str) -> None:
    """Stop every agent now and cancel `scope`."""
    if not received:
        received.append(why)
    if not _first_stop:
        _first_stop.append(time.monotonic())
    stop_all_now()
    scope.cancel()


async def stop_on_signals(scope: trio.CancelScope,
                          signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Until cancelled: the first of `signals` stops everything (see `stop_now`).

    Outside the receiver (before it, and after it ends, until the process exits) `signals` stop
    every agent at once too but do not end the process: its teardown is bounded and saves the
    session's last events. A closing terminal sends SIGHUP more than once (the kernel, then the
    terminal or the shell), and its hang-up can end the chat first by the terminal's EIO; a
    SIGHUP meeting the default action then killed `cru` mid-teardown, before those events
    were saved."""
    for sig in signals:
        # A Python handler, not SIG_IGN: exec resets a caught signal to its default, so the
        # agents started meanwhile do not inherit it.
        signal.signal(sig, _stop_outside_the_loop)
    with trio.open_signal_receiver(*signals) as incoming:  # puts the handler above back when it ends
        async for signum in incoming:
            stop_now(scope, signum)
            return


def _stop_outside_the_loop(signum: int, frame: Any) -> None:
    """A stop signal while no trio receiver listens (starting, or stopping): every agent is
    stopped now; the process ends when its teardown does."""
    now = time.monotonic()
    if _first_stop and now - _first_stop[0] > STUCK_AFTER:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if not _first_stop:
        _first_stop.append(now)
    if not received:
        received.append(signum)
    stop_all_now()


async def stop_when_orphaned(scope: trio.CancelScope, poll: float = ORPHAN_POLL) -> None:
    """Until cancelled: when the parent process is gone (our parent pid changes), stop."""
    parent = os.getppid()
    while True:
        await trio.sleep(poll)
        if os.getppid() != parent:
            stop_now(scope, "orphaned")
            return


async def run_stoppable(main: Callable[..., Awaitable[Any]], *args: Any, orphan_check: bool = True) -> None:
    """`await main(*args)`, stopped at once by SIGTERM/SIGHUP (and by the parent's death).
    An error of `main` comes out as itself, not inside an exception group."""
    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signals, nursery.cancel_scope)
        if orphan_check:
            nursery.start_soon(stop_when_orphaned, nursery.cancel_scope)
        try:
            await main(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised below, outside the nursery
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


def why_stopped() -> str | None:
    """What stopped this process, as a transcript says it ("the terminal closed …"); None when
    nothing did."""
    if not received:
        return None
    why = received[0]
    if why == signal.SIGHUP:
        return "the terminal closed before the agent finished"
    if isinstance(why, int):
        return f"cru was stopped ({signal.Signals(why).name}) before the agent finished"
    return "the program that started cru went away before the agent finished"


def exit_code(default: int = 0) -> int:
    """128 + the signal that stopped us (the shell's convention), 1 when orphaned, else `default`.
    (`cru chat -p` uses it; `cru acp` and `cru mcp` end with 0 when told to stop: for the
    editor or client that started them, that is a normal end.)"""
    if not received:
        return default
    why = received[0]
    return 128 + why if isinstance(why, int) else 1
