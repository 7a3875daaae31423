"""What a prompt carries besides its text: each `@note` of the kiln as an embedded resource (or
inline text for an agent without embedded context), and each image (`@shot.png`, or a pasted or
dropped path to one) as an image block when the agent takes images. The same for the chat and
for `cru chat -p`; what became of each attachment is said through `say`."""

from __future__ import annotations

import base64
import mimetypes
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import trio

from crucible.errors import CrucibleError
from crucible.kiln.paths import NotRegularFileError, open_to_read, resolve_in_kiln
from crucible.terminal import sanitize

# `@path` or `@"path with spaces"`, starting a word.
MENTION = re.compile(r'(?<!\S)@(?:"([^"]+)"|([^\s"]+))')


# A pasted path: absolute, `~/…` or file://, maybe quoted as terminals quote a dropped file.
PASTED_PATH = re.compile(r"""(?<!\S)(?:'((?:/|~/|file://)[^']+)'|"((?:/|~/|file://)[^"]+)"|((?:/|~/|file://)(?:\\ |\S)+))""")
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024


# What ends a sentence or a clause after an unquoted `@note` is not part of its name.
_CLAUSE_END = re.compile(r"[,.;:!?)\]}'\"]+$")


def mentions(text: str) -> list[str]:
    """The notes and images named with `@` ("read @Index.md, please" names `Index.md`)."""
    return [m.group(1) or _CLAUSE_END.sub("", m.group(2)) or m.group(2) for m in MENTION.finditer(text)]


def is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_TYPES


def pasted_images(text: str) -> list[str]:
    """Paths to images pasted (or dropped) into the prompt, as they were written."""
    out = []
    for m in PASTED_PATH.finditer(text):
        raw = m.group(1) or m.group(2) or m.group(3).replace("\\ ", " ")
        if is_image(raw):
            out.append(raw)
    return out


def image_path(name: str, cwd: Path) -> Path:
    """An image named in a prompt: `~` expanded, file:// dropped, relative to the session's folder."""
    if name.startswith("file://"):
        name = unquote(urlparse(name).path)
    path = Path(name).expanduser()
    return path if path.is_absolute() else cwd / path


async def prompt_attachments(text: str, *, kiln: Path, cwd: Path, prompt_caps: Any,
                             say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The blocks sent with the prompt `text`: its images, then its `@notes`. `prompt_caps`:
    the agent's promptCapabilities (None: it announced none)."""
    names = list(dict.fromkeys(mentions(text)))
    images = [n for n in names if is_image(n)]
    images += [p for p in pasted_images(text) if p not in images]
    blocks = await _image_blocks(images, cwd, bool(getattr(prompt_caps, "image", False)), say)
    notes = [n for n in names if not is_image(n)]
    return blocks + await _note_blocks(notes, kiln, bool(getattr(prompt_caps, "embedded_context", False)), say)


async def _image_blocks(names: list[str], cwd: Path, takes_images: bool,
                        say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each image as an image block, when the agent says it takes images."""
    blocks: list[dict[str, Any]] = []
    for name in names:
        shown = sanitize(name)
        path = image_path(name, cwd)

        def load(path: Path = path) -> bytes | str:
            if not path.is_file():
                return "no such file"
            size = path.stat().st_size
            if size > MAX_IMAGE_BYTES:
                return f"{size // (1024 * 1024)} MiB, over the {MAX_IMAGE_BYTES // (1024 * 1024)} MiB limit"
            return path.read_bytes()

        try:
            data = await trio.to_thread.run_sync(load)
        except OSError as exc:
            data = exc.strerror or "unreadable"
        if isinstance(data, str):
            say(f"image {shown}: {data}; not attached")
            continue
        if not takes_images:
            say(f"image {shown} not sent: this agent does not take images (it did not announce "
                "promptCapabilities.image); only the text of your prompt was sent")
            continue
        mime = IMAGE_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "image/png"
        blocks.append({"type": "image", "mimeType": mime, "data": base64.b64encode(data).decode("ascii")})
        say(f"attached image {shown} ({len(data)} bytes)")
    return blocks


async def _note_blocks(names: list[str], kiln: Path, embedded: bool,
                       say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each `@note` that names a note in the kiln as an embedded resource (or inline text when
    the agent cannot take embedded context)."""
    blocks: list[dict[str, Any]] = []
    for name in names:
        rel = name if name.endswith(".md") else name + ".md"

        def load(rel: str = rel) -> str:
            path = resolve_in_kiln(kiln, rel, must_exist=True)
            with os.fdopen(open_to_read(path, rel), "rb") as f:  # a named pipe is not read
                return f.read().decode("utf-8", errors="replace")

        try:
            body = await trio.to_thread.run_sync(load)
        except NotRegularFileError as exc:  # a named pipe called x.md, say
            say(f"@{sanitize(name)}: {sanitize(exc.message)}; sent as plain text")
            continue
        except (CrucibleError, OSError):
            say(f"@{sanitize(name)}: no such note in the kiln; sent as plain text")
            continue
        if embedded:
            blocks.append({"type": "resource", "resource": {"uri": f"kiln://notes/{rel}", "text": body,
                                                            "mimeType": "text/markdown"}})
        else:
            blocks.append({"type": "text", "text": f"<note path=\"{rel}\">\n{body}\n</note>"})
        say(f"attached {sanitize(rel)} ({len(body)} characters)")
    return blocks
