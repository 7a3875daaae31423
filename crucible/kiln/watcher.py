"""Keep a kiln's index fresh while a session runs: watch the folder, re-index changed notes.

watchfiles' `awatch` is anyio-based, so it runs on trio as it is; the (blocking) index update
runs in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from watchfiles import Change, awatch

from crucible.errors import CrucibleError
from crucible.kiln.paths import to_rel

if TYPE_CHECKING:
    # The index pulls in Chroma and numpy (~0.7 s): a session that only watches never pays it.
    from crucible.kiln.index import KilnIndex

log = logging.getLogger(__name__)

# How long the folder must stay quiet before a batch of changes is indexed.
DEBOUNCE_MS = 300
# watchfiles wakes this often without changes; its first wake-up tells us the watch is armed.
_ARMED_TIMEOUT_MS = 200


def _filter(root: Path) -> Callable[[Change, str], bool]:
    """Keep notes and anything without a suffix (a folder: new, moved or deleted), outside
    dot-folders such as .crucible (judged on the kiln-relative part of the path)."""
    prefix = str(root).rstrip("/") + "/"

    def wanted(change: Change, path: str) -> bool:
        rel = path[len(prefix):] if path.startswith(prefix) else path
        if any(part.startswith(".") for part in rel.split("/")):
            return False
        name = rel.rsplit("/", 1)[-1]
        return name.lower().endswith(".md") or "." not in name

    return wanted


def _note_paths(root: Path, changes: set[tuple[Change, str]]) -> list[str]:
    """The kiln-relative paths of the changes."""
    out: set[str] = set()
    for _, raw in changes:
        try:
            rel = to_rel(root, Path(raw))
        except CrucibleError:
            continue
        if rel:  # notes, and folders (update_paths looks inside them)
            out.add(rel)
    return sorted(out)


async def watch_kiln(
    root: Path,
    index: KilnIndex | Callable[[], KilnIndex | None] | None,
    *,
    on_change: Callable[[list[str]], Awaitable[None]] | None = None,
    debounce_ms: int = DEBOUNCE_MS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Re-index notes as they are created, edited, moved or deleted, until cancelled.

    Start it with `await nursery.start(watch_kiln, root, index)`: it returns once the watch is
    armed, so no edit made after that is missed. `on_change` gets the kiln-relative note paths
    of each batch (a folder's notes included) once the index has them. `index` may be a
    getter (an index opened lazily, e.g. at the first search) or None: then changes are only
    reported. An update that fails (say, the index is locked by
    another process) is logged and retried with the next batch, which includes the missed paths.
    """
    root = Path(await trio.Path(root).resolve())
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_cancel, stop)
        await _watch(root, index, on_change, debounce_ms, stop, task_status)
        nursery.cancel_scope.cancel()


async def _stop_on_cancel(stop: trio.Event) -> None:
    """watchfiles waits for its watch thread on cancel, and that thread only looks at the
    stop event (every step) or returns at its timeout: set the event as soon as we are
    cancelled, or closing a session waits up to _ARMED_TIMEOUT_MS for the watcher."""
    try:
        await trio.sleep_forever()
    finally:
        stop.set()


async def _watch(
    root: Path,
    index: KilnIndex | Callable[[], KilnIndex | None] | None,
    on_change: Callable[[list[str]], Awaitable[None]] | None,
    debounce_ms: int,
    stop: trio.Event,
    task_status: trio.TaskStatus[None],
) -> None:
    started = False
    retry: set[str] = set()

    async for changes in awatch(
        root, watch_filter=_filter(root), debounce=debounce_ms, rust_timeout=_ARMED_TIMEOUT_MS,
        yield_on_timeout=True, stop_event=stop,
    ):
        if not started:
            started = True
            task_status.started()
        if not changes:  # the periodic wake-up
            continue
        paths = sorted(set(_note_paths(root, changes)) | retry)
        if not paths:
            continue
        current = index() if callable(index) else index
        try:
            if current is not None:
                paths = await trio.to_thread.run_sync(current.expand_paths, paths)
                await trio.to_thread.run_sync(current.update_paths, paths)
        except CrucibleError as exc:
            retry = set(paths)
            log.warning("kiln watcher: could not update the index: %s", exc.message)
            continue
        retry = set()
        if on_change is not None:
            await on_change(paths)
