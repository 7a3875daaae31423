"""Saved sessions: files the person owns, under the data dir.

Each session is a folder `DATA/sessions/<id>/` with
- `session.json`  what it was: agent, card, cwd, the agent's own session id, title, times
- `events.jsonl`  every event, one JSON object a line (message chunks coalesced)
- `transcript.md` the conversation as markdown, readable without Crucible
Writes are appends plus an atomic rewrite of session.json, so a crash loses at most the
event being written.
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

# Events whose text streams in chunks; consecutive chunks of one kind are stored as one event.
_CHUNKED = ("agent_message", "agent_thought", "user_message")


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

    def __init__(self, folder: Path, meta: SessionMeta) -> None:
        self.folder = folder
        self.meta = meta
        folder.mkdir(parents=True, exist_ok=True)
        self._events: IO[str] = open(folder / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._md: IO[str] = open(folder / "transcript.md", "a", encoding="utf-8")  # noqa: SIM115
        self._pending: dict[str, Any] | None = None  # a chunked event still growing
        self._pending_text: list[str] = []  # its text, joined when written (`+=` is O(n²))
        self._md_section: str | None = None
        if self._md.tell() == 0:
            self._md.write(f"# {meta.title or 'Session ' + meta.id}\n\nagent: {meta.agent}"
                           + (f" · card: {meta.card}" if meta.card else "") + f" · cwd: {meta.cwd}\n")
        self.save_meta()

    def save_meta(self) -> None:
        self.meta.updated = time.time()
        tmp = self.folder / ".session.json.tmp"
        tmp.write_text(json.dumps(asdict(self.meta), indent=2), encoding="utf-8")
        os.replace(tmp, self.folder / "session.json")

    def append(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind in _CHUNKED:
            text = str(event.get("text", ""))
            if self._pending is not None and self._pending["type"] == kind:
                self._pending_text.append(text)
            else:
                self._flush_pending()
                self._pending = {"t": round(time.time(), 3), **event, "text": ""}
                self._pending_text = [text]
            self._write_md(kind, text)
            return
        self._flush_pending()
        record = {"t": round(time.time(), 3), **event}
        self._events.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._write_md(str(kind), _md_line(record))
        if kind == "turn_end":
            self.meta.turns += 1
            self.flush()
            self.save_meta()

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._pending["text"] = "".join(self._pending_text)
            self._events.write(json.dumps(self._pending, ensure_ascii=False, default=str) + "\n")
            self._pending = None
            self._pending_text = []

    def _write_md(self, kind: str, text: str) -> None:
        if not text:
            return
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

    def create(self, meta: SessionMeta) -> SessionWriter:
        return SessionWriter(self.root / meta.id, meta)

    def reopen(self, session_id: str) -> SessionWriter:
        return SessionWriter(self.root / session_id, self.meta(session_id))

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
        for ev in (ev for sid in reversed(chain) for ev in self.events(sid)):
            if ev.get("type") == "user_message":
                lines.append(f"User: {ev.get('text', '')}")
            elif ev.get("type") == "agent_message":
                lines.append(f"Assistant: {ev.get('text', '')}")
        text = "\n\n".join(lines)
        return text[-max_chars:]

