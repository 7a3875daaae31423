"""The one place where asyncio meets trio.

prompt-toolkit runs on asyncio; Crucible runs on trio. Trio runs as a *guest* on
prompt-toolkit's asyncio loop (`trio.lowlevel.start_guest_run`): both run on the main
thread, so key handlers may touch trio objects directly (cancel a scope, set an Event,
`send_nowait`) and trio code may touch the prompt-toolkit application. Measured here it
beat a second-thread design on keystroke latency, resize and exit (FIELD-NOTES).

Everything else in crucible/tui is plain trio + prompt-toolkit objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio
from prompt_toolkit.application import Application

T = TypeVar("T")


class Pacer:
    """At most one redraw per `interval` for output-driven changes; keystrokes are not paced
    (the application runs with `max_render_postpone_time=None`, so they render at once)."""

    def __init__(self, app: Application[Any], interval: float = 1 / 30) -> None:
        self.app = app
        self.interval = interval
        self._scheduled = False

    def request(self) -> None:
        if self._scheduled:
            return
        self._scheduled = True
        asyncio.get_event_loop().call_later(self.interval, self._fire)

    def _fire(self) -> None:
        self._scheduled = False
        self.app.invalidate()


def run_with_trio(app: Application[Any], trio_main: Callable[[], Awaitable[T]]) -> T | None:
    """Run `app` (full screen) with `trio_main` as a trio guest. When `trio_main` returns the
    application exits; when the application exits first, trio is cancelled and awaited
    before the loop closes. Returns what `trio_main` returned (None if the application exited
    first), or raises what it raised."""

    async def host() -> T | None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[outcome.Outcome[T | None]] = loop.create_future()
        root: list[trio.CancelScope] = []

        def exit_app() -> None:
            if app.is_running and not app.is_done:
                app.exit()
            elif not app.is_done:
                loop.call_later(0.01, exit_app)  # trio ended before the app started: try again

        async def guest() -> T | None:
            with trio.CancelScope() as scope:
                root.append(scope)
                try:
                    return await trio_main()
                finally:
                    exit_app()
            return None  # cancelled because the application exited first

        def on_done(result: outcome.Outcome[T | None]) -> None:
            if not done.done():
                done.set_result(result)

        trio.lowlevel.start_guest_run(
            guest,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=on_done,
            host_uses_signal_set_wakeup_fd=True,
        )
        try:
            await app.run_async()
        finally:
            if not done.done() and root:
                root[0].cancel()
            result = await done
        return result.unwrap()

    return asyncio.run(host())
