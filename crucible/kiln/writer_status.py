"""Whether another process is writing a kiln's index, and how far it is: the kiln's writer
lock (flock on .crucible/index.lock) and the status file its holder keeps
(.crucible/index-build.json). Read without the vector store (no chromadb import), so a search
that must not wait can ask it; the lock itself is `index.WriterLock`."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crucible.bounded_load import load_json
from crucible.kiln.paths import RESERVED_DIR

LOCK_FILE = f"{RESERVED_DIR}/index.lock"
STATUS_FILE = f"{RESERVED_DIR}/index-build.json"

__all__ = ["LOCK_FILE", "STATUS_FILE", "build_status", "other_cru", "read_status", "stopped", "stopped_hint",
           "wait_while_stopped"]


def read_status(root: Path) -> dict[str, Any] | None:
    """The status file as its writer left it (None if absent or not a JSON object)."""
    try:
        data = load_json((root / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_status(root: Path) -> dict[str, Any] | None:
    """The status of the update another process is running on this kiln, if one holds the
    writer lock (its pid, notes_done/notes_total, embedded/notes), else None."""
    lock_path = root / LOCK_FILE
    if not lock_path.exists():
        return None
    try:
        with open(lock_path) as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return read_status(root) or {}
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None


def other_cru(status: dict[str, Any] | None) -> str:
    """Who holds the writer lock, as the person can find it: the `cru` the update is for (a
    session's index worker is its child; its own pid would say nothing)."""
    status = status or {}
    pid = status.get("cru", status.get("pid"))
    return f"another cru (pid {pid})" if isinstance(pid, int) and not isinstance(pid, bool) else "another cru"


def stopped(status: dict[str, Any] | None) -> bool:
    """Whether the process writing (the status's pid) is stopped (Ctrl-Z, SIGSTOP): then it
    holds the store in the middle of a write until it goes on."""
    pid = (status or {}).get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def stopped_hint(status: dict[str, Any] | None) -> str:
    """What to do when the writer is stopped (it never goes on by itself), else ""."""
    if not stopped(status):
        return ""
    return f"; it is stopped (Ctrl-Z?): `fg` it in its terminal, or `kill -CONT {(status or {}).get('pid')}`"


def wait_while_stopped(root: Path, wait: Callable[[dict[str, Any]], bool]) -> bool:
    """Before opening the kiln's embedded store: while the process writing it is stopped,
    `wait(status)` (it waits a while; False: give up). Opening the store while that process is
    stopped in the middle of a write waits until it goes on, in silence and holding the GIL
    (Chroma's open does: a session started then froze whole). True once it runs or is gone."""
    while (status := build_status(root)) is not None and stopped(status):
        if not wait(status):
            return False
    return True
