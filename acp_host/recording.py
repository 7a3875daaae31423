"""Record both directions of an ACP connection as JSONL, and replay a recording as a fake agent.

Format: a header line `{"recording": 1, "agent": "<command>", "started": "<ISO time>"}`, then
one line per frame: `{"t_ms": <ms since start>, "dir": "in" | "out", "frame": {...}}`, where
"in" is agent -> client and "out" is client -> agent.

Secrets: the values of every `env` entry and `headers` entry of `mcpServers` (in session/new,
load and resume) are written as "***" (that is where bearer tokens and keys travel), and a
host can pass `redact` to mask whatever else it knows to be secret. The file is created 0600.

Recording hooks into the JSON-RPC peer's `tap` (called with every frame read or written).
When recording is off the peer has no tap and pays nothing. When on, the tap only appends
the frame to a list; `Recorder.run()` writes batches from a worker thread.

Replay (`python -m acp_host.recording replay FILE`) is a stdio agent that plays the agent's
side: it walks the recording in order, sends each "in" frame, and at each "out" frame waits
until the client sends the matching one (a request: same method, in order; a response to
one of the agent's requests: same id; a notification: same method). Responses go out with
the live request's id. The replay loop itself needs only the standard library.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import trio

from acp_host.jsonrpc import Notification, Request, Response

RECORDING_VERSION = 1


def frame_of(msg: Any) -> Any:
    """The wire JSON of a frame as the peer's tap reports it (dict in, dataclass out)."""
    if isinstance(msg, Request):
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": msg.id, "method": msg.method}
        if msg.params is not None:
            frame["params"] = msg.params
        return frame
    if isinstance(msg, Notification):
        frame = {"jsonrpc": "2.0", "method": msg.method}
        if msg.params is not None:
            frame["params"] = msg.params
        return frame
    if isinstance(msg, Response):
        if msg.error is not None:
            return {"jsonrpc": "2.0", "id": msg.id, "error": msg.error.to_error()}
        return {"jsonrpc": "2.0", "id": msg.id, "result": msg.result}
    return msg


class Recorder:
    """Records a connection: `await Recorder.open(path, agent=...)`, pass `recorder.tap` to
    the peer, run `recorder.run()` in a nursery, and `await recorder.aclose()` at the end
    (it flushes)."""

    def __init__(self, file: TextIO, path: Path, *, agent: str,
                 redact: Callable[[str], str] | None = None,
                 held_length: Callable[[str], int] | None = None) -> None:
        self.path = path
        self.agent = agent
        self._redact = redact
        self._held_length = held_length
        # A streamed chunk's end that could begin a secret: (stream, text, its frame), sent on
        # with the stream's next chunk, or as a frame of its own before any other frame.
        self._held: tuple[tuple[Any, str], str, dict[str, Any]] | None = None
        self._file = file
        self._start = time.monotonic()
        self._lines: list[str] = []
        self._wakeup = trio.Event()
        self._writing = trio.Lock()
        self._closed = False

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, agent: str,
                   redact: Callable[[str], str] | None = None,
                   held_length: Callable[[str], int] | None = None) -> Recorder:
        """Create the recording file 0600 (replacing one there) and write its header.
        `redact`: applied to every line written (the header's agent command included).
        `held_length(text)`: how much of a text's end could begin a secret (with `redact`):
        a secret streamed in two chunks is then masked in the recording too."""
        header = {
            "recording": RECORDING_VERSION,
            "agent": agent,
            "started": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }

        def create() -> TextIO:
            # The person's prompts, files and keys go in here: readable by them only.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, 0o600)  # a file that was there keeps its mode otherwise
            f = os.fdopen(fd, "w", encoding="utf-8")
            line = json.dumps(header)
            f.write((redact(line) if redact is not None else line) + "\n")
            return f

        return cls(await trio.to_thread.run_sync(create), Path(path), agent=agent, redact=redact,
                   held_length=held_length)

    def tap(self, direction: Literal["in", "out"], msg: Any) -> None:
        if self._closed:
            return
        frame = _mask_mcp_servers(frame_of(msg))
        if self._held_length is not None and self._redact is not None:
            chunk = _chunk_text(frame) if direction == "in" else None
            held = self._held
            if held is not None and (chunk is None or chunk[0] != held[0]):
                self._append(direction, _with_text(held[2], held[1]))  # not a secret's start after all
                held = None
            if chunk is not None:
                text = self._redact((held[1] if held is not None else "") + chunk[1])
                keep = self._held_length(text)
                self._held = (chunk[0], text[len(text) - keep:], frame) if keep else None
                frame = _with_text(frame, text[:len(text) - keep])
            else:
                self._held = None
        self._append(direction, frame)

    def _append(self, direction: str, frame: Any) -> None:
        t_ms = round((time.monotonic() - self._start) * 1000, 3)
        record = {"t_ms": t_ms, "dir": direction, "frame": frame}
        line = json.dumps(record, separators=(",", ":"), default=str)
        self._lines.append(self._redact(line) if self._redact is not None else line)
        self._wakeup.set()

    def _write(self, lines: list[str]) -> None:
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    async def run(self) -> None:
        """Write recorded frames as they come, until `aclose()`."""
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            # One writer at a time, and none once closed: a frame tapped while `aclose` flushed
            # and closed (the peer still reading as the connection ends) wrote to a closed file.
            async with self._writing:
                if self._file.closed:
                    return
                await self._flush()

    async def _flush(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            await trio.to_thread.run_sync(self._write, lines)

    async def aclose(self) -> None:
        """Write what was recorded and close the file; frames tapped after are not recorded."""
        if self._closed:
            return
        if self._held is not None:
            self._append("in", _with_text(self._held[2], self._held[1]))
            self._held = None
        self._closed = True
        self._wakeup.set()
        with trio.CancelScope(shield=True):
            async with self._writing:  # after a write `run` has under way
                await self._flush()
                await trio.to_thread.run_sync(self._file.close)


_MASK = "***"
_CHUNKS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk"})


def _chunk_text(frame: Any) -> tuple[tuple[Any, str], str] | None:
    """((session, kind), text) of a streamed text chunk (a session/update), else None."""
    params = frame.get("params") if isinstance(frame, dict) and frame.get("method") == "session/update" else None
    update = params.get("update") if isinstance(params, dict) else None
    if not isinstance(update, dict) or update.get("sessionUpdate") not in _CHUNKS:
        return None
    content = update.get("content")
    if not isinstance(content, dict) or content.get("type") != "text" or not isinstance(content.get("text"), str):
        return None
    return (params.get("sessionId"), update["sessionUpdate"]), content["text"]  # type: ignore[union-attr]


def _with_text(frame: dict[str, Any], text: str) -> dict[str, Any]:
    """A chunk frame (see `_chunk_text`) with another text (a copy)."""
    params = frame["params"]
    update = params["update"]
    return {**frame, "params": {**params, "update": {**update, "content": {**update["content"], "text": text}}}}


def _mask_mcp_servers(frame: Any) -> Any:
    """The frame with the values of its mcpServers' `env` and `headers` entries masked (a copy;
    the frame itself goes on to the agent unchanged)."""
    params = frame.get("params") if isinstance(frame, dict) else None
    if not isinstance(params, dict) or not isinstance(params.get("mcpServers"), list):
        return frame
    servers = params["mcpServers"]
    masked = []
    for server in servers:
        if isinstance(server, dict):
            server = dict(server)
            for key in ("env", "headers"):
                entries = server.get(key)
                if isinstance(entries, list):
                    server[key] = [{**e, "value": _MASK} if isinstance(e, dict) and "value" in e else e
                                   for e in entries]
        masked.append(server)
    return {**frame, "params": {**params, "mcpServers": masked}}


def load_recording(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a recording file."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        raise ValueError(f"{path}: empty recording")
    header = json.loads(lines[0])
    if not isinstance(header, dict) or header.get("recording") != RECORDING_VERSION:
        raise ValueError(f"{path}: not a recording (version {RECORDING_VERSION} header missing)")
    return header, [json.loads(line) for line in lines[1:]]


# ---------------------------------------------------------------------------------------
# replay: the agent's side, played back on stdio


class _Inbox:
    """Frames the client sent, waiting to be matched."""

    def __init__(self) -> None:
        self._frames: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.eof = False

    def put(self, frame: dict[str, Any] | None) -> None:
        with self._cond:
            if frame is None:
                self.eof = True
            else:
                self._frames.append(frame)
            self._cond.notify_all()

    def take(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """The first frame matching, waiting for it; None at EOF."""
        with self._cond:
            while True:
                for i, frame in enumerate(self._frames):
                    if match(frame):
                        return self._frames.pop(i)
                if self.eof:
                    return None
                self._cond.wait()


def replay(path: str, out: Any = None, inp: Any = None) -> int:
    _, records = load_recording(path)
    out = out or sys.stdout.buffer
    inp = inp or sys.stdin.buffer
    inbox = _Inbox()

    def read() -> None:
        for line in inp:
            try:
                frame = json.loads(line)
            except ValueError:
                continue
            if isinstance(frame, dict):
                inbox.put(frame)
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    live_ids: dict[Any, Any] = {}

    def send(frame: dict[str, Any]) -> None:
        out.write(json.dumps(frame, separators=(",", ":")).encode() + b"\n")
        out.flush()

    def is_request(method: str) -> Callable[[dict[str, Any]], bool]:
        return lambda f: f.get("method") == method and "id" in f

    def is_notification(method: str) -> Callable[[dict[str, Any]], bool]:
        return lambda f: f.get("method") == method and "id" not in f

    def is_response(req_id: Any) -> Callable[[dict[str, Any]], bool]:
        return lambda f: "method" not in f and f.get("id") == req_id

    for record in records:
        frame = record.get("frame")
        if not isinstance(frame, dict):
            continue
        method = frame.get("method")
        if record.get("dir") == "out":
            if method is not None and "id" in frame:
                got = inbox.take(is_request(method))
                if got is None:
                    return 0
                live_ids[frame["id"]] = got["id"]
            elif method == "$/cancel_request":
                continue  # depends on the live client's timing: never wait for one
            elif method is not None:
                if inbox.take(is_notification(method)) is None:
                    return 0
            elif inbox.take(is_response(frame.get("id"))) is None:
                return 0
        else:
            if method is None and "id" in frame:
                frame = dict(frame, id=live_ids.get(frame["id"], frame["id"]))
            send(frame)
    # Played through: answer whatever else comes as unsupported until the client leaves.
    while True:
        extra = inbox.take(lambda f: True)
        if extra is None:
            return 0
        if "method" in extra and "id" in extra:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": extra["id"],
                    "error": {"code": -32601, "message": f"not in the recording: {extra['method']}"},
                }
            )


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "replay":
        sys.stderr.write("usage: python -m acp_host.recording replay FILE\n")
        return 2
    try:
        return replay(argv[2])
    except (OSError, ValueError) as e:
        sys.stderr.write(f"cannot replay {argv[2]}: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
