"""`cru acp`'s forwarding of backend updates to the editor (crucible/acp_forward.py), on memory
streams: the raw frame with only its sessionId replaced, what Crucible splices in, what is held
until the editor knows the session, and one write per burst."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from acp_host.jsonrpc import JsonRpcPeer
from crucible.acp_forward import CoalescingSendStream, UpdateForwarder, with_session_id

OLD, NEW = b'"backend-1"', b'"editor-7"'


@pytest.mark.parametrize("line,expected", [
    (b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"backend-1","update":{}}}',
     b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"editor-7","update":{}}}\n'),
    (b'{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "backend-1", "update": {}}}',
     b'{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "editor-7", "update": {}}}\n'),
    # A quote inside a string is escaped: text that spells the key is not taken for it.
    (b'{"jsonrpc":"2.0","params":{"update":{"text":"say \\"sessionId\\": x"},"sessionId":"backend-1"}}',
     b'{"jsonrpc":"2.0","params":{"update":{"text":"say \\"sessionId\\": x"},"sessionId":"editor-7"}}\n'),
])
def test_the_session_id_is_replaced_in_the_bytes(line: bytes, expected: bytes) -> None:
    assert with_session_id(line, OLD, NEW) == expected


@pytest.mark.parametrize("line", [
    b'{"method":"session/update","jsonrpc":"2.0","params":{"sessionId":"backend-1"}}',  # not the usual head
    b'{"jsonrpc":"2.0","params":{"sessionId":"backend-1","update":{"sessionId":"backend-1"}}}',  # twice
    b'{"jsonrpc":"2.0","params":{"sessionId":"backend-10","update":{}}}',  # another session
    b'{"jsonrpc":"2.0","params":{"sessionId" :"backend-1","update":{}}}',  # spacing not seen
])
def test_a_frame_that_cannot_be_changed_safely_is_left_to_re_encoding(line: bytes) -> None:
    assert with_session_id(line, OLD, NEW) is None


class EditorSession:
    def __init__(self) -> None:
        self.id = "editor-7"
        self.backend_id = "backend-1"
        self.commands_sent = False
        self.backend_commands: list[Any] = []

    def commands(self) -> list[Any]:
        return [*self.backend_commands, {"name": "card", "description": "Crucible's"}]

    def splice(self, update: dict[str, Any]) -> dict[str, Any]:
        self.backend_commands = list(update.get("availableCommands", []))
        self.commands_sent = True
        return {**update, "availableCommands": self.commands()}


def frame(update: dict[str, Any], session_id: str = "backend-1") -> tuple[dict[str, Any], bytes]:
    params = {"sessionId": session_id, "update": update}
    raw = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params},
                     separators=(",", ":")).encode()
    return params, raw


async def read_frames(stream: trio.abc.ReceiveStream, count: int) -> list[bytes]:
    data = b""
    with trio.fail_after(5):
        while data.count(b"\n") < count:
            data += await stream.receive_some(1 << 16)
    return data.splitlines()


async def test_updates_reach_the_editor_as_the_backend_wrote_them() -> None:
    ours, editors = trio.testing.memory_stream_pair()
    out = CoalescingSendStream(ours)
    editor = JsonRpcPeer(out, ours, name="editor")
    fwd = UpdateForwarder(editor, out)
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "é \\ \"hi\""}}
    newer = {"sessionUpdate": "a_variant_from_the_future", "x": [1, 2]}
    commands = {"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "compact"}]}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.run)
        # Before the editor knows the session: held, then sent in order, decoded.
        await fwd(*frame(chunk))
        await fwd(*frame(commands))
        assert fwd.early and not fwd.live
        session = EditorSession()
        fwd.attach(session)
        await fwd.go_live()
        held = [json.loads(line) for line in await read_frames(editors, 2)]
        assert [f["params"]["sessionId"] for f in held] == ["editor-7", "editor-7"]
        assert held[0]["params"]["update"] == chunk
        # The backend's commands with Crucible's spliced in; no second announcement.
        assert held[1]["params"]["update"]["availableCommands"] == [{"name": "compact"},
                                                                     {"name": "card", "description": "Crucible's"}]
        # Live: byte for byte, unknown variants too, only the sessionId replaced.
        params, raw = frame(newer)
        await fwd(params, raw)
        params2, raw2 = frame(chunk)
        await fwd(params2, raw2)
        live = await read_frames(editors, 2)
        assert live == [raw.replace(OLD, NEW), raw2.replace(OLD, NEW)]
        # Without the raw frame at hand it is encoded again, with the same meaning.
        await fwd(params, None)
        [again] = await read_frames(editors, 1)
        assert json.loads(again) == json.loads(raw.replace(OLD, NEW))
        nursery.cancel_scope.cancel()


async def test_commands_are_announced_when_the_backend_has_none() -> None:
    ours, editors = trio.testing.memory_stream_pair()
    editor = JsonRpcPeer(ours, ours, name="editor")
    fwd = UpdateForwarder(editor, None)  # no coalescing stream: the peer's own notify
    fwd.attach(EditorSession())
    await fwd.go_live()
    [announced] = [json.loads(line) for line in await read_frames(editors, 1)]
    assert announced["params"] == {"sessionId": "editor-7", "update": {
        "sessionUpdate": "available_commands_update",
        "availableCommands": [{"name": "card", "description": "Crucible's"}]}}


class Writes(trio.abc.SendStream):
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.written = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        self.written.set()
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_burst_of_frames_is_one_write_in_order() -> None:
    inner = Writes()
    out = CoalescingSendStream(inner, delay=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.run)
        for i in range(1000):
            assert out.put_nowait(b"%d\n" % i)
        await out.send_frame(b"last\n")
        with trio.fail_after(5):
            await inner.written.wait()
        nursery.cancel_scope.cancel()
    assert inner.writes == [b"".join(b"%d\n" % i for i in range(1000)) + b"last\n"]
    # Over its limit it takes no more without waiting; closed, none at all.
    full = CoalescingSendStream(Writes(), limit=10)
    assert full.put_nowait(b"x" * 11) and not full.put_nowait(b"y")
    await full.aclose()
    assert not full.put_nowait(b"z")
