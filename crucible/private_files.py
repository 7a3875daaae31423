"""The person's files that Crucible writes (sessions, recordings, the config it edits): 0600
files in 0700 folders, so other users of the machine cannot read prompts, answers or keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["FILE_MODE", "FOLDER_MODE", "open_private", "private_dir", "private_tree"]

FILE_MODE = 0o600
FOLDER_MODE = 0o700


def private_dir(path: Path, *, own_up_to: Path | None = None) -> Path:
    """Make the missing folders of `path` 0700. Folders that already exist keep their mode,
    except `own_up_to` and those below it on the way to `path` (Crucible's own data folders):
    those are made 0700 if an older version left them open."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=FOLDER_MODE)
        except FileExistsError:
            pass
        try:
            folder.chmod(FOLDER_MODE)  # mkdir's mode is masked by the umask
        except OSError:
            pass
    if own_up_to is not None:
        for folder in (path, *path.parents):
            if not (folder == own_up_to or folder.is_relative_to(own_up_to)):
                break
            try:
                if folder.stat().st_mode & 0o777 != FOLDER_MODE:
                    folder.chmod(FOLDER_MODE)
            except OSError:
                pass
    return path


def private_tree(path: Path) -> None:
    """Close what another library wrote under `path` with the process's umask (Chroma's
    database and segment files come out 0644 in 0755 folders): files 0600, folders 0700.
    Links are not followed; what cannot be changed is left (best effort, like the rest)."""
    for folder, dirs, files in os.walk(path):
        for name, mode in [(d, FOLDER_MODE) for d in dirs] + [(f, FILE_MODE) for f in files]:
            entry = os.path.join(folder, name)
            try:
                st = os.lstat(entry)
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                    os.chmod(entry, mode)
            except OSError:
                pass


def open_private(path: Path, mode: str = "a", **kwargs: Any) -> IO[Any]:
    """`open(path, mode)` creating the file 0600 (and making an existing one 0600)."""

    def opener(name: str, flags: int) -> int:
        fd = os.open(name, flags | os.O_CLOEXEC, FILE_MODE)
        try:
            if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
        except OSError:
            pass
        return fd

    return open(path, mode, opener=opener, **kwargs)  # noqa: SIM115 - the caller closes it
