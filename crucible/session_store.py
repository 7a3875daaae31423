"""Saved sessions: files the person owns, under the data dir.

Each session is a folder `DATA/sessions/<id>/` with
- `session.json`  what it was: agent, card, cwd, the agent's own session id, title, times
- `events.jsonl`  every event, one JSON object a line (message chunks coalesced)
- `transcript.md` the conversation as markdown, readable without Crucible
Writes are appends plus an atomic rewrite of session.json. They reach the file as they
happen: at once for the prompt, every tool call, permission and turn end, and within
`FLUSH_EVERY` seconds for streamed text (a chunked event still growing is then written, and
the text that follows goes in an event marked `"cont": true`), so a crash (kill -9 included)
loses at most the last second of streamed text. Files are 0600 in 0700 folders, and secrets (`crucible.redaction`) are
written as ***.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from crucible.config import data_dir
from crucible.errors import CrucibleError
from crucible.private_files import open_private, private_dir
from crucible.redaction import redact

# Events whose text streams in chunks; consecutive chunks of one kind are stored as one event.
_CHUNKED = ("agent_message", "agent_thought", "user_message")
# Written through to the file at once (a prompt is whole; a tool call is where a crash hurts).
_FLUSH_NOW = frozenset({"user_message", "tool_call", "permission", "terminal", "file_write", "turn_end",
                        "error", "warning"})
# Streamed text reaches the file at most this long after it came (seconds).
FLUSH_EVERY = 1.0


@dataclass
class SessionMeta:
    id: str
    agent: str
    created: float
    updated: float
    cwd: str
    kiln: str = ""
    card: str | None = None
    agent_session_id: str | None = None
    title: str = ""
    turns: int = 0
    parent: str | None = None  # the delegating session, for child sessions
    resumed_from: str | None = None  # the saved session this one goes on from (resume, /restart)
    extra: dict[str, Any] = field(default_factory=dict)


def sessions_root(env: Mapping[str, str] | None = None) -> Path:
    return data_dir(env) / "sessions"


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class SessionWriter:
    """Appends one session's events and transcript. Not thread-safe; one owner."""

    def __init__(self, folder: Path, meta: SessionMeta, *, own_up_to: Path | None = None) -> None:
        self.folder = folder
        self.meta = meta
        private_dir(folder, own_up_to=own_up_to)
        self._events: IO[str] = open_private(folder / "events.jsonl", "a", encoding="utf-8")
        self._md: IO[str] = open_private(folder / "transcript.md", "a", encoding="utf-8")
        self._pending: dict[str, Any] | None = None  # a chunked event still growing
        self._pending_text: list[str] = []  # its text, joined when written (`+=` is O(n²))
        self._md_section: str | None = None
        self._unflushed_since: float | None = None  # monotonic time of the oldest unflushed write
        self._split: str | None = None  # a chunked event cut by a timed flush: the next one continues it
        if self._md.tell() == 0:
            self._md.write(f"# {meta.title or 'Session ' + meta.id}\n\nagent: {meta.agent}"
                           + (f" · card: {meta.card}" if meta.card else "") + f" · cwd: {meta.cwd}\n")
        self.save_meta()

    def save_meta(self) -> None:
        self.meta.updated = time.time()
        tmp = self.folder / ".session.json.tmp"
        with open_private(tmp, "w", encoding="utf-8") as f:
            f.write(redact(json.dumps(asdict(self.meta), indent=2)))
        os.replace(tmp, self.folder / "session.json")

    def append(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if self._unflushed_since is None:
            self._unflushed_since = time.monotonic()
        if kind in _CHUNKED:
            text = str(event.get("text", ""))
            if self._pending is not None and self._pending["type"] == kind:
                self._pending_text.append(text)
            else:
                self._flush_pending()
                cont = {"cont": True} if self._split == kind else {}
                self._pending = {"t": round(time.time(), 3), **event, "text": "", **cont}
                self._pending_text = [text]
            self._split = None
            self._write_md(kind, text)
            if kind == "user_message":
                if not self.meta.title and text.strip():
                    self.meta.title = text.strip().splitlines()[0][:80]
                self.flush()
                self.save_meta()  # the title is known: a crash mid-turn still lists the session
            else:
                self.flush_due()
            return
        self._split = None
        self._flush_pending()
        record = {"t": round(time.time(), 3), **event}
        self._events.write(redact(json.dumps(record, ensure_ascii=False, default=str)) + "\n")
        self._write_md(str(kind), _md_line(record))
        if kind == "turn_end":
            self.meta.turns += 1
        if kind in _FLUSH_NOW:
            self.flush()
        if kind == "turn_end":
            self.save_meta()

    def flush_due(self) -> None:
        """Flush when something written is `FLUSH_EVERY` seconds old (call it at least that often)."""
        since = self._unflushed_since
        if since is not None and time.monotonic() - since >= FLUSH_EVERY:
            if self._pending is not None:
                self._split = self._pending["type"]
            self.flush()

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._pending["text"] = "".join(self._pending_text)
            self._events.write(redact(json.dumps(self._pending, ensure_ascii=False, default=str)) + "\n")
            self._pending = None
            self._pending_text = []

    def _write_md(self, kind: str, text: str) -> None:
        if not text:
            return
        text = redact(text)
        section = {"user_message": "## You", "agent_message": "## Agent",
                   "agent_thought": "### Thinking"}.get(kind)
        if section is None:
            self._md_section = None
            self._md.write(f"\n\n{text}\n")
            return
        if section != self._md_section:
            self._md.write(f"\n\n{section}\n\n")
            self._md_section = section
        self._md.write(text)

    def flush(self) -> None:
        self._flush_pending()
        self._events.flush()
        self._md.flush()
        self._unflushed_since = None

    def close(self) -> None:
        self.flush()
        self.save_meta()
        self._events.close()
        self._md.close()


def _md_line(event: Mapping[str, Any]) -> str:
    kind = event.get("type")
    if kind == "tool_call":
        return f"- tool `{event.get('title', '')}` ({event.get('kind', 'other')}): {event.get('status', '')}"
    if kind == "permission":
        return f"- permission for `{event.get('title', '')}`: {event.get('decision', '')} ({event.get('reason', '')})"
    if kind in ("terminal", "file_write"):
        what = "terminal" if kind == "terminal" else "write"
        if event.get("status") == "exited":
            end = (f"exit {event['exit_code']}" if event.get("exit_code") is not None
                   else f"killed by {event.get('signal')}")
            return f"- {what} `{event.get('what', '')}`: {end}"
        reason = f" ({event.get('reason')})" if event.get("reason") else ""
        return f"- {what} `{event.get('what', '')}`: {event.get('status', '')}{reason}"
    if kind == "turn_end":
        return f"*turn ended: {event.get('stop_reason', '')}*"
    if kind == "error":
        return f"**error:** {event.get('message', '')}"
    if kind == "plan":
        entries = event.get("entries") or []
        return "Plan:\n" + "\n".join(f"- [{'x' if e.get('status') == 'completed' else ' '}] {e.get('content', '')}"
                                     for e in entries)
    return ""


class SessionStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or sessions_root()
        # Folders that are Crucible's own, made 0700 even if they exist: the data dir by default.
        self._own = self.root.parent if root is None else self.root

    def create(self, meta: SessionMeta) -> SessionWriter:
        return SessionWriter(self.root / meta.id, meta, own_up_to=self._own)

    def reopen(self, session_id: str) -> SessionWriter:
        return SessionWriter(self.root / session_id, self.meta(session_id), own_up_to=self._own)

    def list(self) -> list[SessionMeta]:
        out = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                try:
                    out.append(self.meta(folder.name))
                except CrucibleError:
                    continue
        return sorted(out, key=lambda m: m.updated, reverse=True)

    def _folder(self, session_id: str) -> Path:
        if not session_id or "/" in session_id or session_id.startswith("."):
            raise CrucibleError(f"no saved session {session_id!r}", "see `cru session list`")
        folder = self.root / session_id
        if not (folder / "session.json").is_file():
            matches = [p for p in self.root.glob(f"*{session_id}*") if (p / "session.json").is_file()] \
                if self.root.is_dir() else []
            if len(matches) == 1:
                return matches[0]
            raise CrucibleError(f"no saved session {session_id!r}", "see `cru session list`")
        return folder

    def meta(self, session_id: str) -> SessionMeta:
        folder = self._folder(session_id)
        try:
            data = json.loads((folder / "session.json").read_text(encoding="utf-8"))
            return SessionMeta(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise CrucibleError(f"saved session {session_id!r} is damaged ({exc.__class__.__name__})") from None

    def events(self, session_id: str) -> Iterator[dict[str, Any]]:
        path = self._folder(session_id) / "events.jsonl"
        if not path.exists():
            return
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash

    def transcript(self, session_id: str) -> str:
        return (self._folder(session_id) / "transcript.md").read_text(encoding="utf-8")

    def history_as_context(self, session_id: str, max_chars: int = 20000) -> str:
        """The conversation so far, as text to hand a fresh agent session when it cannot load the old one."""
        # A session resumed from another holds only its own turns: walk back the chain first.
        chain: list[str] = []
        current: str | None = session_id
        while current is not None and current not in chain and len(chain) < 50:
            chain.append(current)
            try:
                current = self.meta(current).resumed_from
            except CrucibleError:
                break
        lines: list[str] = []
        last = ""
        for ev in (ev for sid in reversed(chain) for ev in self.events(sid)):
            kind = ev.get("type")
            if kind in ("user_message", "agent_message") and ev.get("cont") and last == kind and lines:
                lines[-1] += str(ev.get("text", ""))  # the rest of a message cut by a timed flush
            elif kind == "user_message":
                lines.append(f"User: {ev.get('text', '')}")
            elif kind == "agent_message":
                lines.append(f"Assistant: {ev.get('text', '')}")
            if kind in ("user_message", "agent_message"):
                last = kind
        text = "\n\n".join(lines)
        return text[-max_chars:]

