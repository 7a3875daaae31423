"""Atomic writes: a reader (or a crash) sees the complete old file or the complete new one.

Temp file in the same folder (so the rename stays on one filesystem), fsync, `os.replace`,
fsync the folder. Temp names start with "." and end in ".tmp", so no listing shows them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from pathlib import Path

from crucible.errors import CrucibleError

# One lock per target path: makes "check the expected hash, then replace" atomic among this
# process's writers. Other programs (an editor) are caught by the hash check itself.
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    key = str(path)
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = threading.Lock()
        return lock


class ConcurrentEditError(CrucibleError):
    """The file changed since it was read: nothing was written."""

    def __init__(self, message: str, fix: str | None = None, current_hash: str | None = None) -> None:
        super().__init__(message, fix)
        self.current_hash = current_hash


def content_hash(data: str | bytes) -> str:
    """sha256 hex of the UTF-8 bytes."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def file_hash(path: Path) -> str | None:
    """The content hash of the file now on disk, or None when there is none."""
    try:
        return content_hash(path.read_bytes())
    except FileNotFoundError:
        return None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some filesystems refuse to open folders; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, expected_hash: str | None = None) -> str:
    """Replace `path` with `data` atomically; returns the new content hash.

    With `expected_hash`, the current content must hash to it (a missing file never does),
    else ConcurrentEditError and nothing is written. The file's mode is kept.
    """
    # Write through a symlink to its target instead of replacing the link with a file.
    target = path.resolve() if path.is_symlink() else path
    folder = target.parent
    with _lock_for(target):
        mode: int | None = None
        try:
            st = target.stat()
            mode = st.st_mode & 0o7777
        except FileNotFoundError:
            pass
        if expected_hash is not None:
            current = file_hash(target)
            if current != expected_hash:
                what = "was deleted" if current is None else "was changed by someone else"
                raise ConcurrentEditError(
                    f"{path.name} {what} since it was read; nothing was written",
                    fix="read the note again and apply the change to its current content",
                    current_hash=current,
                )
        tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
        # 0o666 lets the umask decide for a new file, as a plain open() would.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(folder)
    return content_hash(data)


def atomic_write_text(path: Path, text: str, *, expected_hash: str | None = None) -> str:
    """`atomic_write_bytes` of the UTF-8 text; returns the new content hash."""
    return atomic_write_bytes(path, text.encode("utf-8"), expected_hash=expected_hash)
