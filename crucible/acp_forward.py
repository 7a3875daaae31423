"""`cru acp`: the backend's session/update frames on their way to the editor.

`UpdateForwarder` is the backend's update hook (`acp_host.client.AcpClient.on_update`) for one
editor session. It holds the updates that come before the editor knows the session (the
session/new answer not sent yet), then forwards each as it comes: the frame as the backend
wrote it, unknown variants too, with only the sessionId replaced in the bytes
(`with_session_id`); an update Crucible adds to (its card option, its commands) is decoded,
spliced by the editor session and encoded again. Forwarded frames skip the editor peer's
per-frame write lock: they are queued straight on its `CoalescingSendStream`, so their order
with the peer's own frames holds, and a burst goes to the editor in one write.

Light on purpose: `cru acp` needs the send stream before it answers initialize.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import trio

from acp_host.jsonrpc import ConnectionClosed, JsonRpcPeer, Notification, encode
from crucible.replayed import shown_user_text

# Updates Crucible adds to (its card option, its commands): decoded, changed, encoded again.
# Every other update goes to the editor as the backend wrote it.
SPLICED = ("available_commands_update", "config_option_update")
# The updates a backend's replay of its conversation is made of (session/load): the raw kinds of
# what `crucible.events.ReplayFilter` leaves out of the typed events (keep the two in step).
CONVERSATION = frozenset({"user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call",
                          "tool_call_update", "plan"})
# An update forwarded from its decoded form, framed by hand.
_UPDATE_HEAD = b'{"jsonrpc":"2.0","method":"session/update","params":'
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class CoalescingSendStream(trio.abc.SendStream):
    """Frames written in a burst go to the editor in one write, in order.

    A flood of backend updates would otherwise cost a pipe write (and a wake-up of the
    editor) per frame. `send_all` appends to a buffer that `run()` writes out at most `delay`
    seconds later (at once when `batch` bytes are pending); callers wait only when more than
    `limit` bytes are pending (backpressure)."""

    def __init__(self, inner: trio.abc.SendStream, *, delay: float = 0.002, batch: int = 64 * 1024,
                 limit: int = 1 << 20) -> None:
        self.inner = inner
        self.delay = delay
        self.batch = batch
        self.limit = limit
        self._buf = bytearray()
        self._wake = trio.Event()
        self._full = trio.Event()
        self._space = trio.Event()
        self._error: BaseException | None = None
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if self._error is not None:
            raise trio.BrokenResourceError("the editor's side of the pipe is closed") from self._error
        self._buf += data
        self._wake.set()
        if len(self._buf) >= self.batch:
            self._full.set()
        while len(self._buf) > self.limit and self._error is None and not self._closed:
            await self._space.wait()

    def put_nowait(self, frame: bytes) -> bool:
        """Queue one whole frame if there is room and the editor is there (else False, and
        nothing is queued): a forwarded flood then costs no scheduler round per update."""
        if len(self._buf) > self.limit or self._closed or self._error is not None:
            return False
        self._buf += frame
        self._wake.set()
        if len(self._buf) >= self.batch:
            self._full.set()
        return True

    async def send_frame(self, frame: bytes) -> bool:
        """Queue one whole frame, waiting for room (backpressure) only when it is short of it.
        False when the editor is gone."""
        while len(self._buf) > self.limit and self._error is None and not self._closed:
            await self._space.wait()
        return self.put_nowait(frame)

    async def wait_send_all_might_not_block(self) -> None:
        while len(self._buf) > self.limit and self._error is None:
            await self._space.wait()

    async def run(self) -> None:
        """Write what is buffered, until cancelled or the editor goes away."""
        try:
            while True:
                await self._wake.wait()
                with trio.move_on_after(self.delay):
                    await self._full.wait()
                self._wake = trio.Event()
                self._full = trio.Event()
                await self._flush()
                if self._error is not None:
                    return
        finally:
            self._space.set()

    async def _flush(self) -> None:
        while self._buf and self._error is None:
            data = bytes(self._buf)
            self._buf.clear()
            try:
                await self.inner.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._error = exc
            self._space.set()
            self._space = trio.Event()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.move_on_after(2, shield=True):
            await self._flush()
        self._space.set()
        await self.inner.aclose()


def _as_shown(params: dict[str, Any]) -> dict[str, Any] | None:
    """A held update (a replay comes before the editor knows the session) as the chat shows it:
    a message of the person's without what is not their words (`replayed.shown_user_text`), None
    if nothing is left of it."""
    update = params.get("update")
    if type(update) is not dict or update.get("sessionUpdate") != "user_message_chunk":
        return params
    content = update.get("content")
    if type(content) is not dict or content.get("type") != "text" or not isinstance(text := content.get("text"), str):
        return params
    shown = shown_user_text(text)
    if not shown:
        return None
    return params if shown == text else {**params, "update": {**update, "content": {**content, "text": shown}}}


def with_session_id(line: bytes, old_id: bytes, new_id: bytes) -> bytes | None:
    """The frame `line` with the JSON string `new_id` in place of `old_id` as its sessionId
    (both encoded JSON strings), newline-terminated; None when that cannot be done safely on
    the bytes (then the update is re-encoded).

    Safe: the frame starts with the jsonrpc member, and `"sessionId"` occurs once as a token,
    followed by the old id. Inside a JSON string every quote is escaped, so that one occurrence
    is the params' own key (a nested sessionId key would make two); serialisers do not escape
    ASCII letters in keys."""
    if not (line.startswith(b'{"jsonrpc":"2.0"') or line.startswith(b'{"jsonrpc": "2.0"')):
        return None
    at = line.find(b'"sessionId"')
    if at < 0 or line.find(b'"sessionId"', at + 11) >= 0:
        return None
    at += 11
    if line.startswith(b": ", at):
        at += 2
    elif line.startswith(b":", at):
        at += 1
    else:
        return None
    if not line.startswith(old_id, at):
        return None
    return b"".join((line[:at], new_id, line[at + len(old_id):], b"\n"))


class EditorSession(Protocol):
    """What the forwarder needs of an editor session (`crucible.acp_agent.ProxySession`)."""

    id: str  # the editor's sessionId
    commands_sent: bool

    @property
    def backend_id(self) -> str: ...

    def splice(self, update: dict[str, Any]) -> dict[str, Any]:
        """A decoded update of a `SPLICED` kind, with Crucible's part put in."""
        ...

    def commands(self) -> list[Any]: ...


class UpdateForwarder:
    """The backend's session/update hook for one editor session (see the module docstring)."""

    def __init__(self, editor: JsonRpcPeer, out: CoalescingSendStream | None, editor_id: str | None = None) -> None:
        self.editor = editor
        self.out = out  # None: every update goes through `editor.notify`
        self.editor_id = editor_id  # known before the session is open when it is loaded
        self.session: EditorSession | None = None
        self.early: list[dict[str, Any]] = []
        self.live = False
        self._old_id = b""
        self._new_id = b""

    def attach(self, session: EditorSession) -> None:
        self.session, self.editor_id = session, session.id
        self._old_id = _dumps(session.backend_id).encode()
        self._new_id = _dumps(session.id).encode()

    async def __call__(self, params: dict[str, Any], raw: bytes | None) -> None:
        if not self.live:
            # No cap: a backend's native session/load replays the whole history before our answer
            # (the session layer holds it unbounded too). On session/new the session's own bounded
            # event buffer, not drained before the session is open, holds the backend back.
            self.early.append(params)
            return
        out = self.out
        if raw is not None and out is not None:
            # The flood's path, with no await: the frame as the backend wrote it.
            update = params.get("update")
            kind = update.get("sessionUpdate") if type(update) is dict else None
            if kind not in SPLICED and not self.editor.closed.is_set():
                frame = with_session_id(raw, self._old_id, self._new_id)
                if frame is not None:
                    if not out.put_nowait(frame):
                        await out.send_frame(frame)
                    return
        await self.forward(params)

    async def forward(self, params: dict[str, Any]) -> None:
        """One update to the editor, decoded: with the editor's sessionId, and Crucible's card
        option and commands spliced in."""
        session, editor = self.session, self.editor
        if session is None:
            return
        update = params.get("update")
        kind = update.get("sessionUpdate") if type(update) is dict else None
        out = {**params, "sessionId": session.id}
        if kind in SPLICED:
            out["update"] = session.splice(update)  # type: ignore[arg-type]
        if self.out is not None and not editor.closed.is_set():
            try:
                frame = _UPDATE_HEAD + _dumps(out).encode() + b"}\n"
            except UnicodeEncodeError:  # lone surrogates: the escaped form is still JSON
                frame = encode(Notification("session/update", out))
            await self.out.send_frame(frame)
            return
        try:
            await editor.notify("session/update", out)
        except ConnectionClosed:
            pass  # the editor is gone; the session is being torn down

    def drop_replay(self) -> None:
        """Leave out the conversation the backend replayed while it was loaded (held until
        `go_live`): an editor that resumed the session (session/resume) has it, and shows a
        replay as new messages. Its commands, modes and options stay."""
        self.early = [p for p in self.early
                      if not (type(u := p.get("update")) is dict and u.get("sessionUpdate") in CONVERSATION)]

    async def go_live(self) -> None:
        """Send what was held, in order; later updates go straight through. Then Crucible's
        commands, if the backend did not announce its own (they are spliced into those)."""
        while self.early:
            params = _as_shown(self.early.pop(0))
            if params is not None:
                await self.forward(params)
        self.live = True
        session = self.session
        if session is None or session.commands_sent:
            return
        session.commands_sent = True
        try:
            await self.editor.notify("session/update", {"sessionId": session.id, "update": {
                "sessionUpdate": "available_commands_update", "availableCommands": session.commands()}})
        except ConnectionClosed:
            pass
