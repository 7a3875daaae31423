"""Atomic writes: a reader (or a crash) sees the complete old file or the complete new one.

Temp file in the same folder (so the rename stays on one filesystem), fsync, `os.replace`,
fsync the folder. Temp names start with "." and end in ".tmp", so no listing shows them.
Inside a kiln (`root=`) each step is taken relative to an opened folder, never through a
symlink, so no gap remains between checking a path and using it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import threading
from pathlib import Path

from crucible.errors import CrucibleError
from crucible.kiln.paths import open_folder, open_in_folder, open_to_read, swapped_error

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


def file_hash(path: Path, *, root: Path | None = None) -> str | None:
    """The content hash of the file now on disk, or None when there is none. With `root`, read
    without following a symlink anywhere below it (see `open_folder`). A regular file only
    (`open_to_read`: NotRegularFileError)."""
    if root is None:
        try:
            fd = open_to_read(path, path.name)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return content_hash(f.read())
    folder, name = _open_parent(path, root, create=False)
    try:
        return _hash_in(folder, name)
    finally:
        os.close(folder)


def _open_parent(path: Path, root: Path | None, *, create: bool) -> tuple[int, str]:
    """(descriptor of the folder holding `path`, its name there). With `root`: every folder
    below the root opened with O_NOFOLLOW. Without: the folder as the path names it."""
    if root is None:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path.name
    parts = path.relative_to(root.resolve()).parts if path.is_absolute() else path.parts
    if not parts:
        raise IsADirectoryError(f"{path.name} is the kiln itself")
    try:
        return open_folder(root, parts[:-1], create=create), parts[-1]
    except FileNotFoundError:
        if create:
            raise
        raise FileNotFoundError(f"{'/'.join(parts)} does not exist") from None


def _hash_in(folder: int, name: str, rel: str | None = None) -> str | None:
    try:
        fd = open_in_folder(folder, name, os.O_RDONLY, rel=rel)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return content_hash(f.read())


def _fsync_dir(folder: int) -> None:
    try:
        os.fsync(folder)
    except OSError:
        pass  # some filesystems refuse to sync folders; the rename is still atomic


def atomic_write_bytes(path: Path, data: bytes, *, expected_hash: str | None = None,
                       root: Path | None = None, make_folders: bool = False,
                       new_file_mode: int | None = None, exclusive: bool = False) -> str:
    """Replace `path` with `data` atomically; returns the new content hash.

    `exclusive`: only if nothing is at `path` (else FileExistsError, nothing written): the new
    file is linked into place, which fails if another writer (any process) got there first.

    With `expected_hash`, the current content must hash to it (a missing file never does),
    else ConcurrentEditError and nothing is written. The file's mode is kept; a new file gets
    `new_file_mode` (default: 0o666 less the umask, as a plain open() would).

    With `root` (the kiln), `path` is the resolved path inside it and every folder on the way
    is opened relative to the last with O_NOFOLLOW, the temp file and the rename happen in the
    opened folder: a folder swapped for a symlink meanwhile is refused (KilnPathError), never
    followed out of the kiln. `make_folders`: create the missing folders on the way.
    """
    if root is None and path.is_symlink():
        # Write through a symlink to its target instead of replacing the link with a file.
        path = path.resolve()
    folder, name = _open_parent(path, root, create=make_folders)
    try:
        with _lock_for(path):
            return _write_in(folder, name, data, expected_hash, new_file_mode, path.name, exclusive)
    finally:
        os.close(folder)


def _write_in(folder: int, name: str, data: bytes, expected_hash: str | None, new_file_mode: int | None,
              shown: str, exclusive: bool = False) -> str:
    mode: int | None = None
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise swapped_error(name)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{shown} is a folder")
        mode = st.st_mode & 0o7777
    except FileNotFoundError:
        pass
    if exclusive and mode is not None:
        raise FileExistsError(f"{shown} exists")
    if expected_hash is not None:
        current = _hash_in(folder, name)
        if current != expected_hash:
            what = "was deleted" if current is None else "was changed by someone else"
            raise ConcurrentEditError(
                f"{shown} {what} since it was read; nothing was written",
                fix="read the note again and apply the change to its current content",
                current_hash=current,
            )
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    # 0o666 lets the umask decide for a new file, as a plain open() would.
    fd = open_in_folder(folder, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                        0o666 if new_file_mode is None else new_file_mode)
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
        if exclusive:
            _link_new(folder, tmp, name, shown)
        else:
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        raise
    _fsync_dir(folder)
    return content_hash(data)


def _link_new(folder: int, tmp: str, name: str, shown: str) -> None:
    """The written temp file as `name`, only if no file is there: link (atomic, also against
    other processes), then drop the temp name. A file system with no hard links (FAT, some
    network mounts) gets the check and the rename, exclusive among this process's writers."""
    try:
        os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(f"{shown} exists") from None
    except OSError:
        try:
            os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            return
        raise FileExistsError(f"{shown} exists") from None
    os.unlink(tmp, dir_fd=folder)


def atomic_write_text(path: Path, text: str, *, expected_hash: str | None = None,
                      root: Path | None = None, make_folders: bool = False,
                      new_file_mode: int | None = None, exclusive: bool = False) -> str:
    """`atomic_write_bytes` of the UTF-8 text; returns the new content hash."""
    return atomic_write_bytes(path, text.encode("utf-8"), expected_hash=expected_hash, root=root,
                              make_folders=make_folders, new_file_mode=new_file_mode, exclusive=exclusive)


def remove_file(path: Path, *, root: Path, expected_hash: str | None = None) -> int:
    """Delete the file at `path` (resolved, inside `root`) without following a symlink on the
    way (as `atomic_write_bytes` with a root); returns its size. With `expected_hash`, the
    current content must hash to it, else ConcurrentEditError and nothing is deleted."""
    folder, name = _open_parent(path, root, create=False)
    try:
        with _lock_for(path):
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise swapped_error(name)
            rel = path.relative_to(root.resolve()).as_posix() if path.is_absolute() else path.as_posix()
            if expected_hash is not None and _hash_in(folder, name, rel) != expected_hash:
                raise ConcurrentEditError(f"{path.name} changed since it was read; it was not deleted",
                                          fix="read it again first")
            os.unlink(name, dir_fd=folder)
            _fsync_dir(folder)
            return st.st_size
    finally:
        os.close(folder)
