"""The input box: its buffer, completion (slash commands, `@note` paths), and what becomes of
what was typed (its keys are keys.py): a slash command runs; a prompt joins the queue
(prompts.py) and, when its turn comes, is sent with its attachments: each `@note` of the kiln,
and each image (`@shot.png`, or a pasted path to one) as an image block when the agent takes
images, else with a note saying it was not sent."""

from __future__ import annotations

import base64
import mimetypes
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import trio
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import History, InMemoryHistory

from crucible.errors import CrucibleError
from crucible.kiln.paths import resolve_in_kiln
from crucible.terminal import sanitize
from crucible.tui.commands import OWN_COMMANDS, parse_slash
from crucible.tui.prompts import Queued

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


# `@path` or `@"path with spaces"`, starting a word.
MENTION = re.compile(r'(?<!\S)@(?:"([^"]+)"|([^\s"]+))')


# A pasted path: absolute, `~/…` or file://, maybe quoted as terminals quote a dropped file.
PASTED_PATH = re.compile(r"""(?<!\S)(?:'((?:/|~/|file://)[^']+)'|"((?:/|~/|file://)[^"]+)"|((?:/|~/|file://)(?:\\ |\S)+))""")
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024


def mentions(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in MENTION.finditer(text)]


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


class ChatCompleter(Completer):
    """Slash commands at the start of the input, note paths after `@`."""

    def __init__(self, agent_commands: Callable[[], dict[str, str]], notes: Callable[[], list[str]]) -> None:
        self.agent_commands = agent_commands
        self.notes = notes

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and " " not in before and "\n" not in before:
            word = before[1:]
            seen = set()
            for name, desc in [*OWN_COMMANDS.items(), *self.agent_commands().items()]:
                if name.startswith(word) and name not in seen:
                    seen.add(name)
                    yield Completion("/" + name, start_position=-len(before), display="/" + name,
                                     display_meta=desc[:60])
            return
        m = re.search(r'(?<!\S)@("?)([^\s"]*)$', before)
        if m is None:
            return
        typed = m.group(2).lower()
        count = 0
        for path in self.notes():
            low = path.lower()
            if typed in low:
                text = f'@"{path}"' if " " in path else f"@{path}"
                yield Completion(text, start_position=-(len(m.group(0))), display=path)
                count += 1
                if count >= 50:
                    return


class ChatInput:
    """What the person types, and what becomes of it."""

    def __init__(self, ui: ChatUI, history: History | None = None) -> None:
        self.ui = ui
        self.buffer = Buffer(
            multiline=True, history=history or InMemoryHistory(), complete_while_typing=True,
            completer=ChatCompleter(ui.agent_commands, lambda: ui.notes),
        )

    def edit_queued(self, number: int | None) -> bool:
        """A queued prompt back into the input box, out of the queue (the last by default)."""
        if self.buffer.text.strip():
            self.ui.say_flash("the input box is not empty: send or clear it first")
            return False
        item = self.ui.prompts.take(number)
        if item is None:
            return False
        self.buffer.set_document(Document(item.text))
        return True

    def submit(self) -> None:
        text = self.buffer.text
        if not text.strip():
            return
        self.buffer.append_to_history()
        self.buffer.reset()
        ui = self.ui
        ui.transcript.scroll = 0
        command = parse_slash(text, ui.agent_commands())
        if command is not None and command.own:
            ui.to_trio(ui.commands.run, command.name, command.args)
            return
        self.queue_prompt(text)

    def queue_prompt(self, text: str, *, steer: bool = False) -> None:
        """The prompt waits for its turn (at once when the agent is idle)."""
        ui = self.ui
        if not ui.prompts.put(Queued(text, steer=steer), first=steer):
            ui.error("too many prompts are queued; wait for the turn to end, or /queue drop some")
            return
        if not ui.agent_alive and ui.status.state not in ("starting", "starting agent"):  # else: sent when it is up
            ui.notice("the agent is not running: the prompt waits in the queue; /restart starts the agent "
                      "and sends it (/queue drop all drops it)")

    async def attachments(self, text: str) -> list[dict[str, Any]]:
        """The blocks sent with a prompt: its `@notes` and its images."""
        blocks = []
        names = list(dict.fromkeys(mentions(text)))
        images = [n for n in names if is_image(n)]
        images += [p for p in pasted_images(text) if p not in images]
        if images:
            blocks.extend(await self.image_blocks(images))
        notes = [n for n in names if not is_image(n)]
        if notes:
            blocks.extend(await self.mention_blocks(notes))
        return blocks

    def _prompt_caps(self) -> Any:
        session = self.ui.session
        caps = session.client.capabilities if session is not None and session.client is not None else None
        return getattr(caps, "prompt_capabilities", None)

    async def image_blocks(self, names: list[str]) -> list[dict[str, Any]]:
        """Each image as an image block, when the agent says it takes images."""
        ui = self.ui
        takes_images = bool(getattr(self._prompt_caps(), "image", False))
        blocks: list[dict[str, Any]] = []
        for name in names:
            shown = sanitize(name)
            path = image_path(name, ui.opts.cwd)

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
                ui.notice(f"image {shown}: {data}; not attached")
                continue
            if not takes_images:
                ui.notice(f"image {shown} not sent: this agent does not take images (it did not announce "
                          "promptCapabilities.image); only the text of your prompt was sent")
                continue
            mime = IMAGE_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "image/png"
            blocks.append({"type": "image", "mimeType": mime, "data": base64.b64encode(data).decode("ascii")})
            ui.notice(f"attached image {shown} ({len(data)} bytes)")
        return blocks

    async def mention_blocks(self, names: list[str]) -> list[dict[str, Any]]:
        """Each `@note` that names a note in the kiln becomes an embedded resource (or inline
        text when the agent cannot take embedded context)."""
        ui = self.ui
        embedded = bool(getattr(self._prompt_caps(), "embedded_context", False))
        blocks: list[dict[str, Any]] = []
        for name in names:
            rel = name if name.endswith(".md") else name + ".md"
            def load(rel: str = rel) -> str:
                path = resolve_in_kiln(ui.opts.kiln, rel, must_exist=True)
                return path.read_text(encoding="utf-8", errors="replace")

            try:
                body = await trio.to_thread.run_sync(load)
            except (CrucibleError, OSError):
                ui.notice(f"@{name}: no such note in the kiln; sent as plain text")
                continue
            if embedded:
                blocks.append({"type": "resource", "resource": {"uri": f"kiln://notes/{rel}", "text": body,
                                                                "mimeType": "text/markdown"}})
            else:
                blocks.append({"type": "text", "text": f"<note path=\"{rel}\">\n{body}\n</note>"})
            ui.notice(f"attached {rel} ({len(body)} characters)")
        return blocks
