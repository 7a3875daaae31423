"""Safe paths inside a kiln: every path a tool sees is relative to the kiln and stays in it.

Errors show only kiln-relative paths, never an absolute path of the person's machine.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from crucible.errors import CrucibleError
from crucible.private_files import open_private, private_dir

RESERVED_DIR = ".crucible"
# The built-in vector store of a kiln (a Chroma server, `[index] url`, keeps it elsewhere).
STORE_DIR = f"{RESERVED_DIR}/chroma"

# Folders no tool may read or write, wherever they are: a repository's .git (its config can
# hold credentials in remote URLs; hooks run code) and Obsidian's settings and workspace.
PROTECTED_DIRS = frozenset({".git", ".obsidian"})
# The file system's limits (Linux: NAME_MAX 255 bytes a name); a kiln path is kept well under PATH_MAX.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
# Folders never listed: tool state, VCS, editor config, trash, dependencies (plus any dot-folder).
SKIP_DIRS = frozenset({".crucible", ".git", ".obsidian", ".trash", "node_modules"})


def reserved_dir(root: Path) -> Path:
    """The kiln's `.crucible` folder, created (or made) 0700: its index holds the notes' text
    (chunks, words, properties), which a note in a private folder must not leak to other users.
    A `.crucible` that is a symbolic link is refused (KilnPathError): a vault from elsewhere
    could point it anywhere, and Crucible would make that folder 0700, write the notes' text
    into it, and delete a `chroma` folder there on `--rebuild`."""
    folder = root / RESERVED_DIR
    if folder.is_symlink():
        raise KilnPathError(
            f"the kiln's {RESERVED_DIR} folder is a symbolic link: Crucible keeps the kiln's index "
            "there and does not write through a link (it may lead out of the kiln)",
            f"remove the link (`rm {RESERVED_DIR}` in the kiln's folder); Crucible makes the folder again",
        )
    made = private_dir(folder, own_up_to=folder)
    _ignore_for_git(made)
    return made


# What Crucible writes in `.crucible` is rebuilt from the notes: a kiln kept in git (as many
# vaults are) must not commit a vector store of its notes' text. The cards there are not listed.
_GITIGNORE_HEAD = "# Written by Crucible: its index of this kiln, rebuilt from the notes (cards in agents/ are yours).\n"
_GITIGNORE = (_GITIGNORE_HEAD + ".gitignore\nchroma/\nlexical-*.idx\nlexical-*.json\nproperties.json\nindex.lock\n"
              "index-build.json\ntokens-*.sqlite*\n")


def _ignore_for_git(folder: Path) -> None:
    path = folder / ".gitignore"
    try:
        with open_private(path, "x") as f:
            f.write(_GITIGNORE)
        return
    except OSError:  # there already, or a read-only kiln
        pass
    try:
        # One an older version wrote (its first line) is brought up to date; the person's own is kept.
        text = path.read_text(encoding="utf-8")
        if text.startswith(_GITIGNORE_HEAD) and text != _GITIGNORE and not path.is_symlink():
            tmp = folder / ".gitignore.new"  # replaced, never written through (it may be a link)
            tmp.unlink(missing_ok=True)
            with open_private(tmp, "x") as f:
                f.write(_GITIGNORE)
            os.replace(tmp, path)
    except (OSError, UnicodeDecodeError):
        pass


# "C:/x" or "C:\\x" (backslashes are already slashes when this is checked); "Q: notes.md" is a name.
_DRIVE = re.compile(r"^[A-Za-z]:(?:/|$)")


class KilnPathError(CrucibleError):
    """A path that is not allowed, or not there, in the kiln (message: kiln-relative paths only)."""

    def __init__(self, message: str, fix: str | None = None, rel: str | None = None) -> None:
        super().__init__(message, fix)
        self.rel = rel


class KilnNotFoundError(KilnPathError):
    """The path is allowed but nothing is there."""


def shown_rel(rel: str) -> str:
    """A path as an error message quotes it: in quotes, escape sequences and control characters
    as Python writes them (`\\x1b`), long ones cut."""
    shown = rel.replace("\\", "/")
    return repr(shown if len(shown) <= 120 else shown[:100] + "…")


def normalize_folder(folder: str | None) -> str:
    """`None`, "null", "", ".", "/" (and "./") mean the kiln root: ""."""
    if folder is None:
        return ""
    f = folder.strip().replace("\\", "/")
    if f in ("", ".", "/", "./", "null"):
        return ""
    while f.startswith("./"):
        f = f[2:]
    return f.rstrip("/")


def _is_reserved(parts: tuple[str, ...]) -> bool:
    # casefold: on a case-insensitive filesystem `.Crucible` is the same folder
    return bool(parts) and parts[0].casefold() == RESERVED_DIR


def _protected(parts: tuple[str, ...]) -> str | None:
    """The protected folder (`.git`, `.obsidian`) the path goes into, if any."""
    return next((p for p in parts if p.casefold() in PROTECTED_DIRS), None)


def _check_lengths(rel: str, parts: tuple[str, ...]) -> None:
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise KilnPathError(
                f"{shown_rel(rel)}: a name in the path is longer than {MAX_NAME_BYTES} bytes, "
                "the most a file system allows", fix="use a shorter note or folder name", rel=rel)
    if len("/".join(parts).encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise KilnPathError(f"{shown_rel(rel)}: the path is longer than {MAX_PATH_BYTES} bytes",
                            fix="use shorter or fewer folder names", rel=rel)


# What a new note's name may not hold: control characters (C0, DEL, C1: a name that prints as an
# escape sequence or a line break in every listing), bidi controls (a name that reads as another,
# "gpj.md" shown as "md.jpg") and zero-width characters (two names that look the same).
# (Not ZWJ and ZWNJ, U+200C/D: emoji sequences and Persian or Indic names need them.)
_BAD_NAME_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff\u061c]")


def _check_new_names(rel: str, parts: tuple[str, ...]) -> None:
    """A new note's path: no name with the characters above, none ending in a dot or a space
    (Windows and SMB drop them: `.crucible./x.md` would land in .crucible), no note named only
    `.md`."""
    for part in parts:
        bad = _BAD_NAME_CHARS.search(part)
        if bad:
            raise KilnPathError(
                f"{shown_rel(rel)}: a name holds the character U+{ord(bad.group()):04X}, which a note's "
                "name may not (control, direction and zero-width characters)",
                fix="use letters, digits, spaces and punctuation", rel=rel)
        if part != part.rstrip(". ") or part.startswith(" "):
            raise KilnPathError(f"{shown_rel(rel)}: a name begins with a space or ends with a dot or a space",
                                fix="remove the leading space or the trailing dot or space", rel=rel)
    if parts and parts[-1].lower() == ".md":
        raise KilnPathError(f"{shown_rel(rel)}: the note has no name before .md", fix="name the note, e.g. 'idea.md'",
                            rel=rel)


def _inside(root: Path, path: Path) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_in_kiln(
    root: Path, rel: str, *, for_write: bool = False, must_exist: bool = False
) -> Path:
    """The absolute, symlink-resolved path of kiln-relative `rel`, or KilnPathError.

    Refuses NUL, `~`, absolute paths, any `..`, `.crucible/`, `.git/` and `.obsidian/` (anywhere in
    the path), names over 255 bytes, and symlinks (the file or a parent) that resolve outside the
    kiln or into those folders. `for_write=True` allows only `.md` notes. "" is the kiln root.
    """
    root = root.resolve()
    if not isinstance(rel, str):
        raise KilnPathError(f"a kiln path must be a string, not {type(rel).__name__}")
    if "\x00" in rel:
        raise KilnPathError("the path contains a NUL byte", fix="give a plain kiln-relative path")
    text = rel.strip().replace("\\", "/")
    if text.startswith("~"):
        raise KilnPathError(
            f"{shown_rel(rel)}: '~' is not allowed in kiln paths",
            fix="give the path relative to the kiln, e.g. 'folder/note.md'", rel=rel,
        )
    if text.startswith("/") or _DRIVE.match(text):
        hint = "give the path relative to the kiln, e.g. 'folder/note.md'"
        try:
            inside = Path(rel).resolve()
            if _inside(root, inside) and inside != root:
                hint = f"use {inside.relative_to(root).as_posix()!r}"
        except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop
            pass
        # The absolute path itself is not echoed: it may name the person's home folder.
        raise KilnPathError("absolute paths are not allowed; paths are relative to the kiln",
                            fix=hint, rel=rel)
    parts = tuple(p for p in PurePosixPath(text).parts if p not in ("", "."))
    if ".." in parts:
        raise KilnPathError(f"{shown_rel(rel)}: '..' is not allowed in kiln paths",
                            fix="give the path from the kiln root, without '..'", rel=rel)
    _check_lengths(rel, parts)
    if _is_reserved(parts):
        raise KilnPathError(f"{shown_rel(rel)}: {RESERVED_DIR}/ is reserved for Crucible's own data",
                            fix="choose a path outside .crucible/", rel=rel)
    if (folder := _protected(parts)) is not None:
        raise KilnPathError(f"{shown_rel(rel)}: {folder}/ is not part of the notes; its files cannot be used",
                            fix=f"choose a path outside {folder}/", rel=rel)
    clean = "/".join(parts)
    if for_write and not clean.lower().endswith(".md"):
        raise KilnPathError(f"{shown_rel(rel)}: only markdown notes (.md) can be written",
                            fix="use a path ending in .md", rel=rel)
    candidate = root.joinpath(*parts)
    if for_write:  # only the names this write makes: a note or folder made elsewhere stays usable
        new = next((i for i in range(len(parts)) if not os.path.lexists(root.joinpath(*parts[: i + 1]))), None)
        if new is not None:
            _check_new_names(rel, parts[new:])
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        loop = isinstance(e, RuntimeError) or getattr(e, "errno", None) == errno.ELOOP
        why = "a symbolic link in it leads back to itself" if loop else f"cannot be resolved ({type(e).__name__})"
        raise KilnPathError(f"{shown_rel(rel)}: {why}", fix="fix or remove the symbolic link", rel=rel) from e
    if not _inside(root, resolved):
        raise KilnPathError(f"{shown_rel(rel)}: leads outside the kiln through a symbolic link",
                            fix="only notes inside the kiln can be used", rel=rel)
    inner = resolved.relative_to(root).parts
    if _is_reserved(inner):
        raise KilnPathError(f"{shown_rel(rel)}: leads into {RESERVED_DIR}/, which is reserved",
                            fix="choose a path outside .crucible/", rel=rel)
    if (folder := _protected(inner)) is not None:
        raise KilnPathError(f"{shown_rel(rel)}: leads into {folder}/, which is not part of the notes",
                            fix=f"choose a path outside {folder}/", rel=rel)
    if for_write and not resolved.name.lower().endswith(".md"):
        raise KilnPathError(f"{shown_rel(rel)}: links to a file that is not a .md note",
                            fix="write to a .md note", rel=rel)
    if for_write and resolved.is_dir():
        raise KilnPathError(f"{shown_rel(rel)}: is a folder, not a note", rel=rel,
                            fix="give a note's path in it, e.g. 'folder/note.md'")
    if must_exist and not resolved.exists():
        raise KilnNotFoundError(f"{shown_rel(rel)}: no such file in the kiln",
                                fix="list the notes to find the right path", rel=rel)
    return resolved


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_folder(root: Path, parts: Sequence[str], *, create: bool = False) -> int:
    """A file descriptor of the folder `root/parts…`, each step opened relative to the one
    before with O_NOFOLLOW, so a folder swapped for a symlink after `resolve_in_kiln` checked
    the path is refused (KilnPathError) instead of followed out of the kiln. `create`: make
    missing folders on the way. The caller closes the descriptor.

    `root` itself may be a symlink (a kiln kept elsewhere); `parts` must be the resolved path
    (what `resolve_in_kiln` returns), which has no symlinks while nobody changes it."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            try:
                try:
                    step = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)  # never follows a symlink there (EEXIST)
                    except FileExistsError:
                        pass  # made meanwhile by another writer: opened below if still a folder
                    step = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno == errno.ENOTDIR and not _is_link(fd, part):
                    rel = "/".join(parts[: i + 1])
                    raise KilnPathError(f"{shown_rel(rel)} is a file, not a folder, so nothing can be in it",
                                        fix="choose a path whose folders are folders", rel=rel) from None
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise swapped_error("/".join(parts[: i + 1])) from None
                raise
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(folder_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return True  # gone meanwhile: changing under us, as a swap is


def open_in_folder(folder_fd: int, name: str, flags: int, mode: int = 0o666, *, rel: str | None = None) -> int:
    """`os.open` of `name` inside an opened folder, never through a symlink (KilnPathError).
    Opened to read (O_RDONLY), it must be a regular file (`open_to_read`); `rel`: the
    kiln-relative path its errors show (default: `name`)."""
    try:
        if (flags & os.O_ACCMODE) == os.O_RDONLY and not flags & os.O_CREAT:
            return open_to_read(name, rel or name, dir_fd=folder_fd, flags=flags | os.O_NOFOLLOW)
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise swapped_error(rel or name) from None
        raise


class NotRegularFileError(KilnPathError):
    """A named pipe, socket, device or folder where a note (a regular file) was to be read."""


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def not_regular_error(rel: str, mode: int) -> NotRegularFileError:
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return NotRegularFileError(f"{shown_rel(rel)}: not a regular file ({kind}); notes are regular files",
                               fix="remove it or give it another name than .md", rel=rel)


def open_to_read(path: str | os.PathLike[str], rel: str, *, dir_fd: int | None = None,
                 flags: int = os.O_RDONLY) -> int:
    """A descriptor to read the file at `path`, which must be a regular file: anything else
    is refused (NotRegularFileError), never read. Every read of a note's bytes opens it here.

    A named pipe called x.md would block its reader in open() until some process writes to
    it, forever: 45 calls of read_note on one took all of cru mcp's worker threads, and every
    other tool timed out. So the file is opened with O_NONBLOCK (a pipe's open returns at
    once; O_NOCTTY: a terminal does not become ours), what was opened is checked with fstat
    (no gap between a check and the open for a swap to slip into), then reads block again."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular_error(rel, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def swapped_error(rel: str) -> KilnPathError:
    return KilnPathError(f"{shown_rel(rel)}: was replaced by a symbolic link while it was being used; "
                         "nothing was done", fix="try again once the kiln's folders stop changing", rel=rel)


def to_rel(root: Path, path: Path) -> str:
    """The kiln-relative posix path of `path` (which must be inside the kiln)."""
    root_r = root.resolve()
    for base, p in ((root, path), (root_r, path), (root_r, None)):
        try:
            rel = (p or path.resolve()).relative_to(base)
        except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop
            continue
        return rel.as_posix() if rel.parts else ""
    raise KilnPathError("the path is outside the kiln")


# Why a link in the kiln is not listed (`unfollowed` of iter_markdown: `cru kiln index` says so).
LINKED_FOLDER = "a link to a folder: not followed (move the folder into the kiln, or link its notes one by one)"
LINK_OUTSIDE = "a link to a file outside the kiln: not followed (the kiln's tools stay inside it)"
LINK_BROKEN = "a link to nothing: its target is gone"
LINK_LOOP = "a link that leads back to itself"


def _walk(root: Path, start: Path, want_md: bool,
          unfollowed: list[tuple[str, str]] | None = None) -> Iterator[str]:
    """Yield kiln-relative paths under `start` (unsorted). Symlinked folders are not followed
    (no loops, no duplicates); a symlinked file counts only if it resolves inside the kiln.
    `unfollowed` (for notes): gets (path, why) of each such link not listed."""
    prefix = str(root).rstrip("/") + "/"  # entries' paths start with it (strings: pathlib was slow)
    stack: list[str | Path] = [start]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # unreadable folder: skipped, like an ignored one
        for entry in entries:
            name = entry.name
            if name.startswith(".") or name in SKIP_DIRS:
                continue  # dot-files too: atomic-write temp files start with "."
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if unfollowed is not None and entry.is_symlink():
                    try:
                        linked_folder = entry.is_dir()
                    except OSError:  # a loop: the checks below say so (of a note)
                        linked_folder = False
                    if linked_folder:
                        unfollowed.append((entry.path[len(prefix):] + "/", LINKED_FOLDER))
                        continue
                if want_md and not name.lower().endswith(".md"):
                    continue
                if entry.is_symlink():
                    try:
                        target = Path(entry.path).resolve()
                    except RuntimeError:  # a loop: Python 3.11 raises this, not an OSError
                        if unfollowed is not None:
                            unfollowed.append((entry.path[len(prefix):], LINK_LOOP))
                        continue
                    if not _inside(root, target) or not target.is_file():
                        if unfollowed is not None:
                            why = LINK_BROKEN if not target.exists() else LINK_OUTSIDE
                            unfollowed.append((entry.path[len(prefix):], why))
                        continue
                    inner = target.relative_to(root).parts
                    if _is_reserved(inner) or _protected(inner) is not None:
                        continue
                elif not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            yield entry.path[len(prefix):]


def iter_markdown(root: Path, folder: str = "", unfollowed: list[tuple[str, str]] | None = None) -> Iterator[str]:
    """Sorted kiln-relative paths of the `.md` notes under `folder` (default: the whole kiln).
    `unfollowed`: gets (path, why) of the links in it that are not listed (a linked folder, a
    note linked from outside the kiln, a broken link), once the listing is read."""
    root = root.resolve()
    rel = normalize_folder(folder)
    start = resolve_in_kiln(root, rel, must_exist=True) if rel else root
    if not start.is_dir():
        raise KilnPathError(f"{shown_rel(rel)}: is not a folder", rel=rel)
    if start != root and start.relative_to(root).as_posix() != "/".join(PurePosixPath(rel).parts):
        # a folder reached through a symlink: list it under the path the caller gave
        for sub in sorted(_walk(start, start, want_md=True)):
            yield f"{rel}/{sub}"
        return
    found: list[tuple[str, str]] | None = [] if unfollowed is not None else None
    yield from sorted(_walk(root, start, want_md=True, unfollowed=found))
    if unfollowed is not None and found:
        unfollowed.extend(sorted(found))


def iter_files(root: Path) -> Iterator[str]:
    """Sorted kiln-relative paths of every file (for kiln stats), with the same skipping."""
    root = root.resolve()
    yield from sorted(_walk(root, root, want_md=False))


@dataclass(frozen=True)
class KilnSizes:
    files: int
    markdown_files: int
    total_bytes: int
    markdown_bytes: int
    unfollowed: int = 0  # links not followed: to a folder, out of the kiln, broken


def kiln_sizes(root: Path) -> KilnSizes:
    """File counts and sizes of the whole kiln (`cru kiln info`, the kiln_info/kiln_stats tools)."""
    files = md = total = md_total = 0
    root = root.resolve()
    unfollowed: list[tuple[str, str]] = []
    for rel in sorted(_walk(root, root, want_md=False, unfollowed=unfollowed)):
        try:
            size = (root / rel).stat().st_size
        except OSError:
            continue
        files += 1
        total += size
        if rel.lower().endswith(".md"):
            md += 1
            md_total += size
    return KilnSizes(files, md, total, md_total, len(unfollowed))
