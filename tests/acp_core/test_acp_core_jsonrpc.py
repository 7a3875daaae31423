"""The JSON-RPC peer: ids, concurrency, cancel, errors, framing, limits."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio
import trio.testing
from acp_core_helpers import peer_pair, peer_with_raw_end

from acp_host.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    ConnectionClosed,
    JsonRpcError,
    JsonRpcPeer,
    LineSplitter,
)


async def echo(method: str, params: Any) -> Any:
    if method == "echo":
        return params
    raise JsonRpcError(METHOD_NOT_FOUND, f"method not found: {method}")


# -- framing (sans-IO) ----------------------------------------------------------------


def test_splitter_every_split_point_parses() -> None:
    stream = b'{"a":1}\n{"b":"x\\ny"}\r\n\n{"c":[1,2,3]}\n'
    expected = [b'{"a":1}', b'{"b":"x\\ny"}\r', b"", b'{"c":[1,2,3]}']
    for cut in range(len(stream) + 1):
        s = LineSplitter()
        assert s.feed(stream[:cut]) + s.feed(stream[cut:]) == expected
    s = LineSplitter()
    assert [line for i in range(len(stream)) for line in s.feed(stream[i : i + 1])] == expected


def test_splitter_drops_oversized_line_and_keeps_going() -> None:
    seen: list[int] = []
    s = LineSplitter(10, seen.append)
    out = s.feed(b"0123456789ABC") + s.feed(b"DEF\nok\n")
    assert out == [b"ok"]
    assert len(seen) == 1
    # the same when the long line arrives complete in one chunk
    assert s.feed(b"short\n" + b"x" * 50 + b"\nafter\n") == [b"short", b"after"]
    assert len(seen) == 2
    # and when it is completed by the chunk that also carries the newline
    assert s.feed(b"12345") + s.feed(b"678901\nnext\n") == [b"next"]
    assert len(seen) == 3
    assert s.buffered == 0


# -- requests and responses -----------------------------------------------------------


async def test_request_roundtrip_and_notification_between_two_peers(running: Any) -> None:
    got: list[tuple[str, Any]] = []

    async def on_note(method: str, params: Any) -> None:
        got.append((method, params))

    a, b = peer_pair(b_kwargs={"request_handler": echo, "notification_handler": on_note})
    await running(a, b)
    assert await a.request("echo", {"x": [1, "é", None]}) == {"x": [1, "é", None]}
    await a.notify("hello", {"n": 1})
    assert await a.request("echo", [1, 2]) == [1, 2]  # ordered after the notification
    assert got == [("hello", {"n": 1})]


async def test_responses_matched_by_id_not_order(running: Any) -> None:
    peer, raw = peer_with_raw_end()
    await running(peer)
    results: dict[str, Any] = {}

    async def call(tag: str) -> None:
        results[tag] = await peer.request("m", {"tag": tag})

    async with trio.open_nursery() as nursery:
        for tag in ("first", "second", "third"):
            nursery.start_soon(call, tag)
        frames = [await raw.read_frame() for _ in range(3)]
        # answer in reverse order; each answer names the request it answers
        for frame in reversed(frames):
            answer = {"jsonrpc": "2.0", "id": frame["id"], "result": frame["params"]["tag"]}
            await raw.write(json.dumps(answer).encode() + b"\n")
    assert results == {"first": "first", "second": "second", "third": "third"}
    assert all(type(f["id"]) is int for f in frames)


async def test_concurrent_requests_in_both_directions(running: Any) -> None:
    # Each side's handler calls back into the other side before answering.
    a: JsonRpcPeer
    b: JsonRpcPeer

    async def a_handler(method: str, params: Any) -> Any:
        return {"a": params, "from_b": await a.request("leaf", params)}

    async def b_handler(method: str, params: Any) -> Any:
        if method == "leaf":
            return params[0] * 10
        return {"b": params, "from_a": await b.request("ask_a", params)}

    async def leaf_a(method: str, params: Any) -> Any:
        if method == "ask_a":
            return await a_handler(method, params)
        return params

    a, b = peer_pair(a_kwargs={"request_handler": leaf_a}, b_kwargs={"request_handler": b_handler})
    await running(a, b)
    out: dict[int, Any] = {}

    async def from_a(i: int) -> None:
        out[i] = await a.request("ask_b", [i])

    async def from_b(i: int) -> None:
        out[100 + i] = await b.request("leaf", [i])

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(from_a, i)
            nursery.start_soon(from_b, i)
    for i in range(20):
        assert out[i] == {"b": [i], "from_a": {"a": [i], "from_b": i * 10}}
        assert out[100 + i] == [i]


async def test_inbound_ids_echoed_in_their_own_type(running: Any) -> None:
    peer, raw = peer_with_raw_end(request_handler=echo)
    await running(peer)
    for request_id in ("7", 7, "abc", 0, -3, "", 2**60):
        await raw.write(
            json.dumps(
                {"jsonrpc": "2.0", "id": request_id, "method": "echo", "params": [1]}
            ).encode()
            + b"\n"
        )
        frame = await raw.read_frame()
        assert frame == {"jsonrpc": "2.0", "id": request_id, "result": [1]}
        assert type(frame["id"]) is type(request_id)


async def test_unknown_method_gets_32601_with_id_and_notification_gets_nothing(
    running: Any,
) -> None:
    for handler in (echo, None):
        peer, raw = peer_with_raw_end(request_handler=handler)
        await running(peer)
        await raw.write(b'{"jsonrpc":"2.0","method":"nope/notify","params":{}}\n')
        await raw.write(b'{"jsonrpc":"2.0","id":"x-1","method":"nope/method","params":{}}\n')
        frame = (
            await raw.read_frame()
        )  # the first frame is the request's answer: no reply to the notification
        assert frame["id"] == "x-1"
        assert frame["error"]["code"] == METHOD_NOT_FOUND
        assert "nope/method" in frame["error"]["message"]


async def test_error_data_preserved_both_directions(running: Any) -> None:
    async def fails(method: str, params: Any) -> Any:
        raise JsonRpcError(-32000, "auth required", {"authMethods": ["x"], "detail": params})

    a, b = peer_pair(b_kwargs={"request_handler": fails})
    await running(a, b)
    with pytest.raises(JsonRpcError) as info:
        await a.request("go", {"why": "test"})
    assert info.value.code == -32000
    assert info.value.message == "auth required"
    assert info.value.data == {"authMethods": ["x"], "detail": {"why": "test"}}


async def test_handler_crash_is_32603_without_traceback(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def crashes(method: str, params: Any) -> Any:
        raise KeyError("secret internals /home/someone/file")

    peer, raw = peer_with_raw_end(request_handler=crashes)
    await running(peer)
    with caplog.at_level(logging.ERROR, logger="acp_host.jsonrpc"):
        await raw.write(b'{"jsonrpc":"2.0","id":1,"method":"boom"}\n')
        frame = await raw.read_frame()
    assert frame["error"]["code"] == INTERNAL_ERROR
    assert "Traceback" not in json.dumps(frame) and "secret" not in json.dumps(frame)
    assert "data" not in frame["error"]
    assert "KeyError" in caplog.text  # logged locally with its traceback

    # a result that is not JSON is an internal error too, and the peer lives on
    async def unserialisable(method: str, params: Any) -> Any:
        return object() if method == "bad" else "fine"

    peer.request_handler = unserialisable
    await raw.write(
        b'{"jsonrpc":"2.0","id":2,"method":"bad"}\n{"jsonrpc":"2.0","id":3,"method":"ok"}\n'
    )
    frames = {f["id"]: f for f in [await raw.read_frame(), await raw.read_frame()]}
    assert frames[2]["error"]["code"] == INTERNAL_ERROR
    assert frames[3]["result"] == "fine"


# -- cancellation ---------------------------------------------------------------------


async def test_inbound_cancel_request_cancels_handler_with_32800(running: Any) -> None:
    started = trio.Event()
    cancelled = trio.Event()

    async def slow(method: str, params: Any) -> Any:
        if method != "slow":
            raise JsonRpcError(METHOD_NOT_FOUND, "nope")
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    peer, raw = peer_with_raw_end(request_handler=slow)
    await running(peer)
    await raw.write(b'{"jsonrpc":"2.0","id":"s1","method":"slow"}\n')
    await started.wait()
    # a cancel for an unknown id is ignored
    await raw.write(
        b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"other"}}\n'
    )
    await trio.testing.wait_all_tasks_blocked()
    assert not cancelled.is_set()
    await raw.write(b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"s1"}}\n')
    frame = await raw.read_frame()
    assert cancelled.is_set()
    assert frame == {
        "jsonrpc": "2.0",
        "id": "s1",
        "error": {"code": REQUEST_CANCELLED, "message": "request cancelled"},
    }
    # cancel for the finished request: ignored, and nothing more is sent
    await raw.write(b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"s1"}}\n')
    await raw.write(b'{"jsonrpc":"2.0","id":9,"method":"zzz"}\n')
    assert (await raw.read_frame())["id"] == 9


async def test_cancel_arriving_right_behind_its_request(running: Any) -> None:
    entered: list[str] = []

    async def handler(method: str, params: Any) -> Any:
        entered.append(method)
        await trio.sleep_forever()

    peer, raw = peer_with_raw_end(request_handler=handler)
    await running(peer)
    await raw.write(
        b'{"jsonrpc":"2.0","id":5,"method":"m"}\n'
        b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5}}\n'
    )
    frame = await raw.read_frame()
    assert frame["error"]["code"] == REQUEST_CANCELLED


async def test_cancelling_caller_sends_cancel_request(running: Any) -> None:
    handler_cancelled = trio.Event()

    async def slow(method: str, params: Any) -> Any:
        if method != "slow":
            return "yes"
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    a, b = peer_pair(b_kwargs={"request_handler": slow})
    await running(a, b)
    with trio.CancelScope() as scope:

        async def cancel_when_blocked() -> None:
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_blocked)
            await a.request("slow")
    assert scope.cancelled_caught
    await handler_cancelled.wait()  # b's handler saw the cancel
    await trio.testing.wait_all_tasks_blocked()
    assert b.stats.requests_received == 1
    assert a.stats.unknown_responses == 1  # b's -32800 answer arrived late, logged quietly
    assert await a.request("still_alive") == "yes"


async def test_eof_fails_pending_requests_with_connection_closed(running: Any) -> None:
    peer, raw = peer_with_raw_end(name="claude")
    await running(peer)

    async def close_after_request() -> None:
        await raw.read_frame()
        await raw.send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_after_request)
        with pytest.raises(ConnectionClosed, match="claude"):
            await peer.request("initialize", {})
    await peer.closed.wait()
    with pytest.raises(ConnectionClosed):
        await peer.request("again")


async def test_run_returns_on_eof_and_cancels_inbound_handlers() -> None:
    cancelled = trio.Event()

    async def slow(method: str, params: Any) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    peer, raw = peer_with_raw_end(request_handler=slow)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)
        await raw.write(b'{"jsonrpc":"2.0","id":1,"method":"slow"}\n')
        await trio.testing.wait_all_tasks_blocked()
        await raw.send.aclose()
    assert cancelled.is_set()
    assert peer.closed.is_set()


async def test_aclose_fails_pending_and_stops_run() -> None:
    peer, raw = peer_with_raw_end(name="agent")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)

        async def closer() -> None:
            await raw.read_frame()
            await peer.aclose()

        nursery.start_soon(closer)
        with pytest.raises(ConnectionClosed):
            await peer.request("x")
    await peer.aclose()  # idempotent
    assert peer.closed.is_set()


# -- notifications --------------------------------------------------------------------


async def test_notifications_handled_in_order_inline(running: Any) -> None:
    seen: list[int] = []

    async def on_note(method: str, params: Any) -> None:
        # a checkpoint inside the handler must not let the next one overtake
        await trio.lowlevel.checkpoint()
        seen.append(params["i"])

    peer, raw = peer_with_raw_end(notification_handler=on_note, request_handler=echo)
    await running(peer)
    await raw.write(
        b"".join(b'{"jsonrpc":"2.0","method":"n","params":{"i":%d}}\n' % i for i in range(500))
    )
    await raw.write(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":["done"]}\n')
    await raw.read_frame()
    assert seen == list(range(500))


async def test_request_inside_notification_handler_raises_instead_of_deadlock(running: Any) -> None:
    results: list[Any] = []
    peer: JsonRpcPeer

    async def on_note(method: str, params: Any) -> None:
        try:
            await peer.request("inner")
        except RuntimeError as exc:
            results.append(str(exc))

            async def later() -> None:
                results.append(await peer.request("inner"))

            peer.start_soon(later)

    a, peer = peer_pair(
        a_kwargs={"request_handler": lambda m, p: _const(m)},
        b_kwargs={"notification_handler": on_note},
    )
    await running(a, peer)
    await a.notify("go")
    while len(results) < 2:
        await trio.testing.wait_all_tasks_blocked()
    assert "start_soon" in results[0]
    assert results[1] == "inner"


async def _const(value: Any) -> Any:
    return value


async def test_notification_handler_errors_are_logged_not_replied(running: Any) -> None:
    async def bad(method: str, params: Any) -> None:
        if method == "crash":
            raise ValueError("bug")
        raise JsonRpcError(METHOD_NOT_FOUND, "unknown")

    peer, raw = peer_with_raw_end(notification_handler=bad, request_handler=echo)
    await running(peer)
    await raw.write(b'{"jsonrpc":"2.0","method":"crash"}\n{"jsonrpc":"2.0","method":"other"}\n')
    await raw.write(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":[1]}\n')
    assert (await raw.read_frame())["id"] == 1
    assert peer.stats.handler_errors == 1


# -- bad input ------------------------------------------------------------------------


async def test_garbage_lines_unknown_ids_and_bad_shapes(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    invalid: list[str] = []
    peer, raw = peer_with_raw_end(
        request_handler=echo, name="agent", on_invalid_line=lambda line, why: invalid.append(why)
    )
    await running(peer)
    with caplog.at_level(logging.WARNING, logger="acp_host.jsonrpc"):
        await raw.write(
            b"Loading config...\n"  # a log line on stdout
            b"\xff\xfe not utf8\n"
            b"\n   \n"  # blank lines are not errors
            b'{"jsonrpc":"2.0","id":999,"result":{}}\n'  # answer to nothing
            b"[1,2]\n"  # batch
            b'{"jsonrpc":"2.0","id":3}\n'  # no method
            b'{"jsonrpc":"2.0","id":4,"method":12}\n'  # bad method
            b'{"jsonrpc":"2.0","id":5,"method":"echo","params":"str"}\n'  # bad params
            b'{"jsonrpc":"2.0","method":"echo","params":3}\n'  # bad notification: logged only
            b'"just a string"\n' + b"[" * 100000 + b"\n"  # nesting deeper than the parser allows
            b'{"jsonrpc":"2.0","id":6,"method":"echo","params":{"ok":true}}\n'
        )
        frames = [await raw.read_frame() for _ in range(4)]
    by_id = {f["id"]: f for f in frames}
    assert by_id[3]["error"]["code"] == INVALID_REQUEST
    assert by_id[4]["error"]["code"] == INVALID_REQUEST
    assert by_id[5]["error"]["code"] == INVALID_REQUEST
    assert by_id[6]["result"] == {"ok": True}
    assert peer.stats.unknown_responses == 1
    assert "999" in caplog.text and "Loading config" in caplog.text
    assert len(invalid) == 9
    assert not peer.closed.is_set()


async def test_fifty_mib_line_parses(running: Any) -> None:
    got: list[int] = []

    async def on_note(method: str, params: Any) -> None:
        got.append(len(params["text"]))

    peer, raw = peer_with_raw_end(notification_handler=on_note, request_handler=echo)
    await running(peer)
    text = "x" * (50 * 1024 * 1024)
    line = (
        json.dumps({"jsonrpc": "2.0", "method": "big", "params": {"text": text}}).encode() + b"\n"
    )
    # arrive in pipe-sized pieces, like a real agent's stdout
    async with trio.open_nursery() as nursery:

        async def writer() -> None:
            for i in range(0, len(line), 65536):
                await raw.write(line[i : i + 65536])
            await raw.write(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":[1]}\n')

        nursery.start_soon(writer)
        assert (await raw.read_frame())["result"] == [1]
    assert got == [len(text)]


async def test_line_over_cap_is_skipped_and_connection_stays_up(running: Any) -> None:
    got: list[Any] = []

    async def on_note(method: str, params: Any) -> None:
        got.append(params)

    peer, raw = peer_with_raw_end(
        notification_handler=on_note, request_handler=echo, max_line_bytes=1000
    )
    await running(peer)
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": "y" * 5000}).encode()
    await raw.write(big[:700])
    await raw.write(big[700:3000])
    await raw.write(big[3000:] + b'\n{"jsonrpc":"2.0","method":"n","params":[1]}\n')
    await raw.write(b'{"jsonrpc":"2.0","id":2,"method":"echo","params":[2]}\n')
    assert await raw.read_frame() == {"jsonrpc": "2.0", "id": 2, "result": [2]}
    assert got == [[1]]
    assert peer.stats.oversized_lines == 1


async def test_outbound_frames_compact_utf8(running: Any) -> None:
    peer, raw = peer_with_raw_end()
    await running(peer)
    await peer.notify("n", {"t": "café ✓", "lone": "\ud800"})
    line = raw.buf
    while b"\n" not in line:
        line += await raw.receive.receive_some()
    assert b", " not in line and b": " not in line
    assert "café ✓".encode() in line or b"\\u00e9" in line
    assert json.loads(line) == {
        "jsonrpc": "2.0",
        "method": "n",
        "params": {"t": "café ✓", "lone": "\ud800"},
    }
    with pytest.raises(ValueError):
        await peer.notify("n", {"x": float("nan")})


# -- writes ---------------------------------------------------------------------------


class PausingStream(trio.abc.SendStream):
    """Writes like a pipe that fills up: part of the first frame, then a wait for room."""

    def __init__(self) -> None:
        self.data = b""
        self.part_written = trio.Event()
        self.room = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        if not self.part_written.is_set():
            self.data += data[:100]
            self.part_written.set()
            await self.room.wait()
            data = data[100:]
        self.data += data

    async def wait_send_all_might_not_block(self) -> None:
        await self.room.wait()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_cancelled_writer_never_leaves_half_a_frame() -> None:
    stream = PausingStream()
    peer = JsonRpcPeer(stream, trio.testing.memory_stream_one_way_pair()[1], name="p")
    payload = {"text": "z" * 5000}
    scope = trio.CancelScope()

    async def write_first() -> None:
        with scope:
            await peer.notify("first", payload)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_first)
        await stream.part_written.wait()  # the write is half done...
        scope.cancel()  # ...when its caller is cancelled
        await trio.testing.wait_all_tasks_blocked()
        stream.room.set()
    await peer.notify("second", {})
    first, second, rest = stream.data.split(b"\n")
    assert json.loads(first) == {"jsonrpc": "2.0", "method": "first", "params": payload}
    assert json.loads(second)["method"] == "second"
    assert rest == b""


async def test_aclose_breaks_a_blocked_write() -> None:
    a_stream, _b_stream = trio.testing.lockstep_stream_pair()
    peer = JsonRpcPeer(a_stream, trio.testing.memory_stream_one_way_pair()[1], name="stuck-agent")
    errors: list[Exception] = []

    async def write() -> None:
        try:
            await peer.notify("n", {"x": 1})
        except ConnectionClosed as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()  # nobody reads: the write is stuck
        await peer.aclose()
    assert len(errors) == 1 and "stuck-agent" in str(errors[0])


async def test_tap_sees_both_directions_and_its_bugs_do_not_break_the_peer(running: Any) -> None:
    seen: list[tuple[str, Any]] = []

    def tap(direction: str, msg: Any) -> None:
        seen.append((direction, msg))
        raise RuntimeError("tap bug")

    a, b = peer_pair(a_kwargs={"tap": tap}, b_kwargs={"request_handler": echo})
    await running(a, b)
    assert await a.request("echo", {"k": 1}) == {"k": 1}
    assert [d for d, _ in seen] == ["out", "in"]
    assert seen[1][1] == {"jsonrpc": "2.0", "id": 1, "result": {"k": 1}}


class JammingStream(trio.abc.SendStream):
    """A pipe the other side stops reading once a frame containing `jam_on` is written."""

    def __init__(self, jam_on: bytes) -> None:
        self.data = b""
        self.jam_on = jam_on

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self.jam_on in bytes(data):
            await trio.sleep_forever()
        self.data += bytes(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_cancel_notice_gives_up_when_the_pipe_is_stuck(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream = JammingStream(b'"method":"big"')
    peer = JsonRpcPeer(stream, trio.testing.memory_stream_one_way_pair()[1], name="stuck")
    scope = trio.CancelScope()
    caller_done = trio.Event()

    async def caller() -> None:
        try:
            with scope:
                await peer.request("slow", {})
        finally:
            caller_done.set()

    jammed_outcome: list[Exception] = []

    async def jammed_write() -> None:
        try:
            await peer.notify("big", {})
        except ConnectionClosed as exc:
            jammed_outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)
        nursery.start_soon(caller)
        await trio.testing.wait_all_tasks_blocked()  # the request went out
        nursery.start_soon(jammed_write)  # this write jams, holding the lock
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        scope.cancel()
        await caller_done.wait()
        assert scope.cancelled_caught
        assert trio.current_time() - start >= 1.0  # it waited for the lock, then gave up
        assert b"$/cancel_request" not in stream.data
        await peer.aclose()
    assert len(jammed_outcome) == 1  # aclose broke the jammed write


async def test_duplicate_in_flight_inbound_id_is_refused(running: Any) -> None:
    release = trio.Event()

    async def waits(method: str, params: Any) -> Any:
        await release.wait()
        return "first"

    peer, raw = peer_with_raw_end(request_handler=waits)
    await running(peer)
    await raw.write(
        b'{"jsonrpc":"2.0","id":1,"method":"m"}\n{"jsonrpc":"2.0","id":1,"method":"m"}\n'
    )
    dup = await raw.read_frame()
    assert dup["id"] == 1 and dup["error"]["code"] == INVALID_REQUEST
    release.set()
    assert (await raw.read_frame())["result"] == "first"


async def test_utf8_bom_and_non_ascii_lines_parse(running: Any) -> None:
    got: list[Any] = []

    async def on_note(method: str, params: Any) -> None:
        got.append(params)

    peer, raw = peer_with_raw_end(notification_handler=on_note, request_handler=echo)
    await running(peer)
    await raw.write(
        b'\xef\xbb\xbf{"jsonrpc":"2.0","method":"n","params":["bom"]}\n'
        + '{"jsonrpc":"2.0","method":"n","params":["héllo ✓ 🎉"]}\n'.encode()
        + b'{"jsonrpc":"2.0","id":1,"method":"echo","params":[]}\n'
    )
    await raw.read_frame()
    assert got == [["bom"], ["héllo ✓ 🎉"]]
    assert peer.stats.invalid_lines == 0


async def test_close_reason_tells_eof_from_our_own_close() -> None:
    peer, raw = peer_with_raw_end(name="gemini")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)
        await raw.send.aclose()
    assert peer.close_reason == "gemini closed the connection"
    peer, raw = peer_with_raw_end(name="gemini")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.run)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert peer.closed.is_set()
    assert peer.close_reason == "connection to gemini was closed"


def test_lone_surrogates_are_mended_in_keys_values_and_deep_lines() -> None:
    from acp_host.jsonrpc import mend_surrogates

    got = mend_surrogates(json.loads('{"k\\ud800": ["x\\udfff", {"pair": "\\ud83d\\ude00"}]}'))
    assert got == {"k\ufffd": ["x\ufffd", {"pair": "\U0001f600"}]}  # a pair stays one character
    deep = json.loads("[" * 900 + '"\\udc00"' + "]" * 900)  # as deep as the decoder takes
    inner = mend_surrogates(deep)
    for _ in range(900):
        inner = inner[0]
    assert inner == "\ufffd"
