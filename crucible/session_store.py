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

A conversation is one entry, whatever happens to the agent process: a resume or a /restart
goes on writing into the entry it continues (a `resumed` record marks where). Only when that
entry is open in another `cru` at the same time (its `.lock` is held) does the new part get an
entry of its own, chained to the first by `resumed_from`; `conversations()` shows a chain as
one. An id may be shortened to any unique prefix, of the whole id or of its random part.
"""

from __future__ import annotations

import bisect
import builtins
import fcntl
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from crucible.config import data_dir
from crucible.errors import CrucibleError
from crucible.private_files import open_private, private_dir
from crucible.redaction import StreamRedactor, held_length, redact
from crucible.terminal import json_safe, sanitize, terminal_safe, without_escapes

# Events whose text streams in chunks; consecutive chunks of one kind are stored as one event.
_CHUNKED = ("agent_message", "agent_thought", "user_message")
# Written through to the file at once (a prompt is whole; a tool call is where a crash hurts).
_FLUSH_NOW = frozenset({"user_message", "tool_call", "permission", "terminal", "file_write", "turn_end",
                        "error", "warning"})
# The stop reason of a turn that had not ended when its session closed (not an ACP stopReason:
# the agent never said one). `SessionWriter.end_open_turn`.
INTERRUPTED = "interrupted"
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
    resumed_from: str | None = None  # the entry this one goes on from, when that one was busy
    extra: dict[str, Any] = field(default_factory=dict)
    # The argv of an `--agent-command` agent (resumed with the same command); None for a
    # built-in or a profile, which `agent` names.
    agent_command: list[str] | None = None
    title_source: str = ""  # "agent" (its session_info_update) or "prompt" (the first one)
    # The agent's mode and model the person chose last (/mode, Shift-Tab, /model, --mode,
    # --model): set again when the conversation is resumed with the same agent.
    mode: str | None = None
    model: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> SessionMeta:
        """A saved session.json; keys this version does not know are kept in `extra`."""
        if not isinstance(data, dict):
            raise TypeError("session.json is not an object")
        known = {f.name for f in fields(cls)}
        meta = cls(**{k: v for k, v in data.items() if k in known})
        meta.extra.update({k: v for k, v in data.items() if k not in known})
        return meta


# A title the agent sent is shown in lists and terminals: one line, bounded.
TITLE_MAX = 120


def clean_title(text: str) -> str:
    """One printable line: escape sequences dropped whole (not just their ESC, which left
    "[31m" in the title), other control characters dropped, white space folded."""
    kept = "".join(c if c.isprintable() else " " if c.isspace() else "" for c in without_escapes(text))
    return " ".join(kept.split())[:TITLE_MAX]


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
        # errors="replace": a string no UTF-8 can hold (a lone surrogate) is written as "?",
        # never an error that loses the turn (the connection mends the agent's; this is the rest)
        self._events: IO[str] = open_private(folder / "events.jsonl", "a", encoding="utf-8", errors="replace")
        self._md: IO[str] = open_private(folder / "transcript.md", "a", encoding="utf-8", errors="replace")
        self._pending: dict[str, Any] | None = None  # a chunked event still growing
        self._pending_text: list[str] = []  # its text, joined when written (`+=` is O(n²))
        self._md_section: str | None = None
        self._md_stream = StreamRedactor()  # the section's streamed text: a secret cut between chunks is masked
        self.lock: IO[bytes] | None = None  # the entry's .lock, held while this writer is open
        self._unflushed_since: float | None = None  # monotonic time of the oldest unflushed write
        self._split: str | None = None  # a chunked event cut by a timed flush: the next one continues it
        self._turn_open = False  # a prompt written and no turn_end after it yet
        if self._md.tell() == 0:
            self._write_md_text(f"# {meta.title or 'Session ' + meta.id}\n\nagent: {meta.agent}"
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
        if kind == "user_message":
            self._turn_open = True
        elif kind == "turn_end":
            self._turn_open = False
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
        self._events.write(json_safe(redact(json.dumps(record, ensure_ascii=False, default=str))) + "\n")
        self._write_md(str(kind), _md_line(record))
        if kind == "turn_end":
            self.meta.turns += 1
        if kind in _FLUSH_NOW:
            self.flush()
        if kind == "turn_end":
            self.save_meta()

    def flush_due(self) -> None:
        """Flush when something written is `FLUSH_EVERY` seconds old (call it at least that often).
        A message still streaming is cut there; its end that could begin a secret stays pending."""
        since = self._unflushed_since
        if since is not None and time.monotonic() - since >= FLUSH_EVERY:
            held = self._flush_pending(hold=True)
            self._events.flush()
            self._md.flush()
            self._unflushed_since = time.monotonic() if held else None

    def _flush_pending(self, *, hold: bool = False) -> bool:
        """Write the growing chunked event. With `hold` (a timed cut, the message goes on): keep
        its end pending when it could be the start of a secret; True if something was kept."""
        if self._pending is None:
            return False
        text = redact("".join(self._pending_text))
        keep = held_length(text) if hold else 0
        if keep < len(text):
            self._pending["text"] = text[:len(text) - keep]
            self._events.write(json_safe(redact(json.dumps(self._pending, ensure_ascii=False, default=str))) + "\n")
            if not keep:
                if hold:
                    self._split = self._pending["type"]  # the next chunk continues this message
                self._pending = None
                self._pending_text = []
                return False
            self._pending = {**self._pending, "t": round(time.time(), 3), "text": "", "cont": True}
        self._pending_text = [text[len(text) - keep:]]
        return True

    def _write_md_text(self, text: str) -> None:
        # The transcript is read with `cat` and `less` too: an agent's escape sequences (window
        # title, clipboard, clear screen) and bidi controls are kept visible, as `session show` does.
        self._md.write(terminal_safe(text))

    def _write_md(self, kind: str, text: str) -> None:
        if not text:
            return
        section = {"user_message": "## You", "agent_message": "## Agent",
                   "agent_thought": "### Thinking"}.get(kind)
        if section != self._md_section:
            self._write_md_text(self._md_stream.end())  # the previous section's last characters
        if section is None:
            self._md_section = None
            self._write_md_text(f"\n\n{redact(text)}\n")
            return
        if section != self._md_section:
            self._write_md_text(f"\n\n{section}\n\n")
            self._md_section = section
        self._write_md_text(self._md_stream.feed(text))

    def flush(self) -> None:
        self._flush_pending()
        self._events.flush()
        self._md.flush()
        self._unflushed_since = None

    def end_open_turn(self, why: str) -> None:
        """Say the last turn was cut short (`why`), if its prompt has no turn_end yet: a session
        closed mid-turn (a closed terminal, SIGTERM, the editor gone) is then read back, listed
        and counted as a turn that ended, not as a transcript that stops for no reason."""
        if self._turn_open:
            self.append({"type": "turn_end", "stop_reason": INTERRUPTED, "error": None, "why": why})

    def close(self) -> None:
        self._write_md_text(self._md_stream.end())
        self.flush()
        self.save_meta()
        self._events.close()
        self._md.close()
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None


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
    if kind == "turn_end" and event.get("stop_reason") == INTERRUPTED:
        return f"*turn cut short: {event.get('why', '')}*"
    if kind == "turn_end":
        return f"*turn ended: {event.get('stop_reason', '')}*"
    if kind == "resumed":
        return f"*resumed with {event.get('agent', '')}*"
    if kind == "error":
        return f"**error:** {event.get('message', '')}"
    if kind == "plan":
        entries = event.get("entries") or []
        return "Plan:\n" + "\n".join(f"- [{'x' if e.get('status') == 'completed' else ' '}] {e.get('content', '')}"
                                     for e in entries)
    return ""


@dataclass
class Conversation:
    """One conversation: its entries in order (more than one only when a part of it had to be
    saved apart, see the module's doc). `id` is the first entry's: what resume and show take."""

    entries: list[SessionMeta]

    @property
    def id(self) -> str:
        return self.entries[0].id

    @property
    def latest(self) -> SessionMeta:
        return max(self.entries, key=lambda m: m.updated)

    @property
    def updated(self) -> float:
        return self.latest.updated

    @property
    def turns(self) -> int:
        return sum(m.turns for m in self.entries)

    @property
    def title(self) -> str:
        by_agent = [m.title for m in self.entries if m.title and m.title_source == "agent"]
        if by_agent:
            return by_agent[-1]
        return next((m.title for m in self.entries if m.title), "")

    @property
    def said(self) -> bool:
        """Something was said in it: a turn, or a first prompt (its title is saved at once, so
        a first turn killed midway counts). A client's `sessions new` alone says nothing."""
        return bool(self.turns or self.title)

    @property
    def agent(self) -> str:
        return self.latest.agent

    @property
    def card(self) -> str | None:
        return self.latest.card

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.entries]


def message_records(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records with each message that was saved in parts (`"cont": true`, written when a
    long stream was flushed mid-way) joined into one."""
    held: dict[str, Any] | None = None
    parts: list[str] = []  # the held message's text, joined once (`+=` would be O(n²))

    def whole(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "text": "".join(parts)} if len(parts) > 1 else record

    for record in records:
        if record.get("cont") and held is not None and held.get("type") == record.get("type"):
            parts.append(str(record.get("text", "")))
            continue
        if held is not None:
            yield whole(held)
        held, parts = record, [str(record.get("text", ""))]
    if held is not None:
        yield whole(held)


class SessionStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or sessions_root()
        # Folders that are Crucible's own, made 0700 even if they exist: the data dir by default.
        self._own = self.root.parent if root is None else self.root

    def create(self, meta: SessionMeta) -> SessionWriter:
        writer = SessionWriter(self.root / meta.id, meta, own_up_to=self._own)
        writer.lock = _try_lock(writer.folder)
        return writer

    def continue_conversation(self, ref: str, meta: SessionMeta) -> tuple[SessionWriter, bool]:
        """A writer that goes on with the conversation `ref`: its own entry, updated with what
        `meta` says of the new run (agent, card, kiln, cwd), with a `resumed` record; or, when
        that entry is open in another process, a new entry chained to it (then False)."""
        conv = self.conversation(ref)
        first = conv.entries[0]
        folder = self.root / first.id
        lock = _try_lock(folder)
        if lock is None:
            chained = SessionMeta(**{**asdict(meta), "resumed_from": first.id})
            return self.create(chained), False
        current = self.meta(first.id)
        current.agent, current.agent_command = meta.agent, meta.agent_command
        current.cwd, current.kiln, current.card = meta.cwd, meta.kiln, meta.card
        writer = SessionWriter(folder, current, own_up_to=self._own)
        writer.lock = lock
        if conv.said:  # else nothing to go on from: nothing to mark
            writer.append({"type": "resumed", "agent": meta.agent})
        return writer, True

    def list(self) -> list[SessionMeta]:
        """Every entry, newest first (see `conversations` for what a person is shown)."""
        out = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                try:
                    out.append(self._load(folder))
                except CrucibleError:
                    continue
        return sorted(out, key=lambda m: m.updated, reverse=True)

    def conversations(self, *, include_empty: bool = False, include_children: bool = False) -> builtins.list[Conversation]:
        """The conversations, newest first: a chain of entries is one; those where nothing was
        said (`Conversation.said`: a first prompt counts, though its turn was killed midway) are
        left out unless `include_empty`, delegated children unless `include_children`."""
        metas = {m.id: m for m in self.list()}
        groups: dict[str, list[SessionMeta]] = {}
        for meta in metas.values():
            groups.setdefault(_first_of(meta, metas), []).append(meta)
        out = []
        for first, entries in groups.items():
            entries.sort(key=lambda m: (m.id != first, m.created))
            conv = Conversation(entries)
            if not include_children and conv.entries[0].parent is not None:
                continue
            if not include_empty and not conv.said:
                continue
            out.append(conv)
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def conversation(self, ref: str) -> Conversation:
        """The conversation the session `ref` (an id or a unique prefix) belongs to."""
        metas = {m.id: m for m in self.list()}
        target = metas.get(self.resolve(ref))
        if target is None:
            raise CrucibleError(f"no saved session {ref!r}", "see `cru session list`")
        first = _first_of(target, metas)
        entries = [m for m in metas.values() if _first_of(m, metas) == first]
        entries.sort(key=lambda m: (m.id != first, m.created))
        return Conversation(entries)

    def resolve(self, ref: str) -> str:
        """The full id of session `ref`: an id, or a unique prefix of one (or of its random
        part, the last six characters). An ambiguous prefix is an error listing the candidates."""
        if not ref or "/" in ref or "\\" in ref or ref.startswith("."):
            raise CrucibleError(f"no saved session {ref!r}", "see `cru session list`")
        if (self.root / ref / "session.json").is_file():
            return ref
        names = sorted(p.name for p in self.root.iterdir()
                       if (p / "session.json").is_file()) if self.root.is_dir() else []
        matches = [n for n in names if n.startswith(ref) or n.rsplit("-", 1)[-1].startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise CrucibleError(f"no saved session {ref!r}", "see `cru session list`")
        shown = []
        for name in matches[:10]:
            try:
                m = self._load(self.root / name)
                shown.append(f"{name}  {when_text(m.updated)}  {m.agent}  {m.title[:40]}")
            except CrucibleError:
                shown.append(name)
        more = f" (and {len(matches) - 10} more)" if len(matches) > 10 else ""
        raise CrucibleError(f"the session id {ref!r} is ambiguous; it starts {len(matches)} sessions{more}:\n  "
                            + "\n  ".join(shown), "give more of the id")

    def _folder(self, session_id: str) -> Path:
        return self.root / self.resolve(session_id)

    def _load(self, folder: Path) -> SessionMeta:
        try:
            data = json.loads((folder / "session.json").read_text(encoding="utf-8"))
            return SessionMeta.from_json(data)
        except FileNotFoundError:
            raise CrucibleError(f"no saved session {folder.name!r}", "see `cru session list`") from None
        except (OSError, ValueError, TypeError) as exc:
            raise CrucibleError(f"saved session {folder.name!r} is damaged ({exc.__class__.__name__})") from None

    def meta(self, session_id: str) -> SessionMeta:
        return self._load(self._folder(session_id))

    def events(self, session_id: str) -> Iterator[dict[str, Any]]:
        path = self._folder(session_id) / "events.jsonl"
        if not path.exists():
            return
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash
                if isinstance(record, dict):
                    yield record

    def conversation_events(self, ref: str) -> Iterator[dict[str, Any]]:
        """Every record of the conversation `ref` belongs to, entry after entry, each message
        whole (see `message_records`)."""
        for sid in self.conversation(ref).ids:
            yield from message_records(self.events(sid))

    def transcript(self, session_id: str) -> str:
        return (self._folder(session_id) / "transcript.md").read_text(encoding="utf-8")

    def history_as_context(self, session_id: str, max_chars: int = 20000) -> str:
        """The conversation so far, as text to hand a fresh agent session when it cannot load the old one."""
        lines: list[str] = []
        for ev in self.conversation_events(session_id):  # messages saved in parts come whole
            kind = ev.get("type")
            if kind == "user_message":
                lines.append(f"User: {ev.get('text', '')}")
            elif kind == "agent_message":
                lines.append(f"Assistant: {ev.get('text', '')}")
        text = "\n\n".join(lines)
        return text[-max_chars:]


def _first_of(meta: SessionMeta, metas: Mapping[str, SessionMeta]) -> str:
    """The first entry of `meta`'s conversation (walking `resumed_from` back, loops cut)."""
    seen = {meta.id}
    current = meta
    while current.resumed_from and current.resumed_from in metas and current.resumed_from not in seen:
        current = metas[current.resumed_from]
        seen.add(current.id)
    return current.id


def when_text(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _try_lock(folder: Path) -> IO[bytes] | None:
    """The entry's lock (in its folder, which exists), held until closed; None when another
    process holds it."""
    fh = open_private(folder / ".lock", "ab")  # held for the writer's life
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    return fh


# -- search ------------------------------------------------------------------------------------

# Text of one conversation read for the index (characters): a flood of output says little more.
SEARCH_TEXT_MAX = 2_000_000


@dataclass(frozen=True)
class SessionHit:
    conversation: Conversation
    score: float
    snippet: str  # the part of a message that matched, one line


def _conversation_text(store: SessionStore, conv: Conversation) -> list[str]:
    """The searchable texts of a conversation: the person's and the agent's messages and the
    tool calls' titles, in order, bounded by SEARCH_TEXT_MAX."""
    texts: list[str] = []
    size = 0
    for sid in conv.ids:
        for record in message_records(store.events(sid)):
            kind = record.get("type")
            if kind in ("user_message", "history_user_message", "agent_message"):
                text = str(record.get("text", ""))
            elif kind == "tool_call" and record.get("title"):
                text = str(record.get("title"))
            else:
                continue
            texts.append(text)
            size += len(text)
            if size >= SEARCH_TEXT_MAX:
                return texts
    return texts


class ConversationIndex:
    """The saved conversations, across agents, tokenized once for BM25 over the title (counted
    twice) and the full text of each transcript: what `cru session search` and the chat's
    /sessions picker search. `refresh` re-reads only the conversations that changed since the
    last one, so a picker opened again is ready at once. One thread at a time uses it (the lock)."""

    def __init__(self) -> None:
        # The kiln's lexical search: the same words, stems and stop words as a note search.
        from crucible.kiln.lexical import Bm25  # snowball + ruamel (80 ms): only when searching

        self.bm25 = Bm25()
        self.conversations: dict[str, Conversation] = {}
        self._stamps: dict[str, tuple[float, tuple[str, ...]]] = {}  # what each was indexed from
        self._vocabulary: builtins.list[str] | None = None  # sorted terms, for prefixes (made when asked)
        self.lock = threading.Lock()

    def refresh(self, store: SessionStore, convs: Iterable[Conversation] | None = None,
                stop: Callable[[], bool] | None = None) -> bool:
        """Index `convs` (every conversation, children included, by default), re-reading only
        those new or changed, dropping those gone. False when `stop` said to stop half-way."""
        from crucible.kiln.lexical import term_counts  # snowball + ruamel (80 ms): when searching

        wanted = builtins.list(convs) if convs is not None else store.conversations(include_children=True)
        with self.lock:
            seen = set()
            for conv in wanted:
                if stop is not None and stop():
                    return False
                seen.add(conv.id)
                stamp = (conv.updated, tuple(conv.ids))
                self.conversations[conv.id] = conv
                if self._stamps.get(conv.id) == stamp:
                    continue
                counts, length = term_counts([conv.title, conv.title, *_conversation_text(store, conv)])
                self.bm25.add_counts(conv.id, counts, length)
                self._stamps[conv.id] = stamp
                self._vocabulary = None
            for gone in set(self._stamps) - seen:
                self.bm25.remove(gone)
                del self._stamps[gone]
                self.conversations.pop(gone, None)
                self._vocabulary = None
            return True

    def terms(self, query: str, *, prefix: bool = False) -> builtins.list[str]:
        """The index terms of `query`; with `prefix`, the last word, still being typed, also
        stands for the terms that start with it (at most PREFIX_TERMS of them)."""
        from crucible.kiln.lexical import tokenize  # snowball + ruamel (80 ms): only when searching

        terms = tokenize(query)
        words = query.lower().split()
        if not prefix or not words or query[-1:].isspace() or len(words[-1]) < PREFIX_MIN:
            return terms
        last = "".join(c for c in words[-1] if c.isalnum())
        if len(last) < PREFIX_MIN:
            return terms
        with self.lock:
            if self._vocabulary is None:
                self._vocabulary = sorted(self.bm25.vocabulary())
            vocabulary = self._vocabulary
        start = bisect.bisect_left(vocabulary, last)
        extra = []
        for term in vocabulary[start:start + PREFIX_TERMS]:
            if not term.startswith(last):
                break
            extra.append(term)
        # A stem shorter than the word typed so far ("seedl" while "seedli" is typed).
        for cut in range(len(last) - 1, PREFIX_MIN - 1, -1):
            index = bisect.bisect_left(vocabulary, last[:cut])
            if index < len(vocabulary) and vocabulary[index] == last[:cut]:
                extra.append(last[:cut])
                break
        return terms + [t for t in extra if t not in terms]

    def search(self, store: SessionStore, query: str, limit: int = 10, *, prefix: bool = False,
               snippets: int | None = None, snippet_width: int = 160) -> builtins.list[SessionHit]:
        """The conversations that match `query` best, the first `snippets` (all by default)
        with the line that matched (read again from the transcript, cut to `snippet_width`)."""
        terms = self.terms(query, prefix=prefix)
        if not terms:
            return []
        with self.lock:
            ranked = [(self.conversations[cid], score) for cid, score in self.bm25.search(terms, limit)]
        wanted = set(terms)
        shown = len(ranked) if snippets is None else snippets
        return [SessionHit(conv, score, _snippet([conv.title, *_conversation_text(store, conv)], wanted,
                                                 snippet_width) if i < shown else "")
                for i, (conv, score) in enumerate(ranked)]


# The last word of a query being typed stands for the terms it starts (the picker): from this
# many characters, for at most this many terms.
PREFIX_MIN = 3
PREFIX_TERMS = 50


def search_conversations(store: SessionStore, query: str, limit: int = 10) -> list[SessionHit]:
    """Every saved conversation, across agents, ranked by BM25 over its title (counted twice)
    and the full text of its transcript; each hit with the line that matched best."""
    from crucible.kiln.lexical import tokenize  # snowball + ruamel (80 ms): only when searching

    if not tokenize(query):
        raise CrucibleError(f"nothing to search for in {query!r}", "use words that are not all stop words")
    index = ConversationIndex()
    index.refresh(store)
    return index.search(store, query, limit)


def _snippet(texts: list[str], wanted: set[str], width: int = 160) -> str:
    """The line of `texts` with the most of the `wanted` terms, cut to `width` around the first."""
    from crucible.kiln.lexical import tokenize  # snowball + ruamel (80 ms): only when searching

    best, best_count = "", 0
    heads = {t[:4] for t in wanted}  # a stem's first letters are its word's: most lines are skipped untokenized
    for text in texts:
        for line in text.splitlines():
            lowered = line.lower()
            if not any(head in lowered for head in heads):
                continue
            count = len(wanted & set(tokenize(line)))
            if count > best_count:
                best, best_count = line.strip(), count
    if len(best) <= width:
        return best
    lowered = best.lower()
    first = min((i for i in (lowered.find(t[:4]) for t in wanted) if i >= 0), default=0)
    start = max(0, first - width // 3)
    return ("…" if start else "") + best[start:start + width] + "…"


# -- what a person is shown -------------------------------------------------------------------


def conversation_line(conv: Conversation) -> str:
    """One conversation as `cru session list` and `cru session search` show it."""
    card = f" card={conv.card}" if conv.card else ""
    return sanitize(f"{conv.id}  {when_text(conv.updated)}  {conv.agent}{card}  turns={conv.turns}  {conv.title}")
