"""A JSON-RPC 2.0 peer over newline-delimited JSON, on trio, usable as either side.

Two layers:

* a sans-IO core: `LineSplitter` turns bytes into complete lines (with a size cap),
  `classify()` turns one decoded JSON value into a `Request`, `Notification`,
  `Response` or `Invalid`, and `encode()` turns a message into one wire line;
* `JsonRpcPeer`, a thin trio adapter that reads, dispatches and writes.

Rules a user of `JsonRpcPeer` must know:

* `run()` must be running (in a nursery) for `request()` to ever get its answer.
* Inbound notifications are handled one at a time, in arrival order, awaited inline in
  the read loop: a notification handler must be fast and must never await a response
  (`request()` from inside it raises `RuntimeError` instead of deadlocking). Work that
  needs a round trip goes to `peer.start_soon(...)`.
* Inbound requests each run in their own task with their own cancel scope; they may
  call `request()` freely. `$/cancel_request` {"requestId": id} cancels one and it is
  answered with error -32800.
* Cancelling a caller of `request()` sends `$/cancel_request` for it to the other side.
* While a notification handler runs, `current_line` holds the frame's raw bytes (without
  the newline), so a proxy can forward them without encoding them again; it is None
  otherwise, and only the handler itself (the read loop's task) may rely on it.
* EOF on the read side ends the connection: `closed` is set, pending requests fail with
  ConnectionClosed, inbound handlers are cancelled and further writes are refused.
* A write, once started, completes even if its caller is cancelled (half a frame would
  corrupt the stream); only `aclose()` interrupts it.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from acp_host.safe_text import terminal_safe

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "CANCEL_METHOD",
    "ConnectionClosed",
    "Invalid",
    "JsonRpcError",
    "JsonRpcPeer",
    "LineSplitter",
    "Notification",
    "NotificationHandler",
    "PeerStats",
    "Request",
    "RequestHandler",
    "Response",
    "classify",
    "encode",
]

logger = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800

CANCEL_METHOD = "$/cancel_request"

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# Pipes hand over at most 64 KiB at a time on Linux; asking for more costs nothing and
# lets socket-backed streams return bigger chunks.
_READ_SIZE = 256 * 1024
# Bounded wait for the courtesy `$/cancel_request` sent when a caller is cancelled.
_CANCEL_NOTICE_TIMEOUT = 1.0
_EXCERPT = 200
_DECODER = json.JSONDecoder()
# The decoder's own scanner, called directly (typeshed does not declare the attribute).
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_SKIP = object()  # sentinel: a line that carries no message
# A UTF-16 surrogate alone: JSON's `\ud800` escape decodes to one, which no UTF-8 file,
# pipe or terminal can take (a transcript write raised on it and lost the turn).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def mend_surrogates(obj: Any) -> Any:
    """`obj` (just decoded: changed in place) with every lone surrogate in its strings, keys
    too, made U+FFFD, as a UTF-8 decoder does with a broken byte. Iterative: a line as deep as
    the decoder takes is not a RecursionError here. Called only for a line with a `\\ud…` escape."""
    sub = _LONE_SURROGATE.sub
    if isinstance(obj, str):
        return sub("\ufffd", obj)
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = sub("\ufffd", v)
                elif isinstance(v, (list, dict)):
                    stack.append(v)
        elif isinstance(node, dict):
            for k in [k for k in node if _LONE_SURROGATE.search(k)]:
                node[sub("\ufffd", k)] = node.pop(k)
            for k, v in node.items():
                if isinstance(v, str):
                    node[k] = sub("\ufffd", v)
                elif isinstance(v, (list, dict)):
                    stack.append(v)
    return obj


def _has_surrogate_escape(line: bytes) -> bool:
    return b"\\ud" in line or b"\\uD" in line

RequestId = int | str
RequestHandler = Callable[[str, Any], Awaitable[Any]]
NotificationHandler = Callable[[str, Any], Awaitable[None]]
# (direction, message) for every frame read ("in") or written ("out"): for recordings.
Tap = Callable[[Literal["in", "out"], Any], None]
InvalidLineHook = Callable[[bytes, str], None]


class JsonRpcError(Exception):
    """An error reply: raised by handlers to answer with it, raised by `request()` on one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ConnectionClosed(Exception):
    """The connection ended (the other side closed it, or we did) before an answer came."""


# ---------------------------------------------------------------------------------------
# sans-IO core


class LineSplitter:
    """Splits a byte stream on b"\\n". A line longer than `max_line_bytes` is dropped whole
    (the rest of it is discarded as it arrives) and reported through `on_oversized`."""

    __slots__ = ("_discarding", "_max", "_parts", "_pending", "on_oversized")

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        on_oversized: Callable[[int], None] | None = None,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self._max = max_line_bytes
        self._parts: list[bytes] = []
        self._pending = 0
        self._discarding = False
        self.on_oversized = on_oversized

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held (0 while discarding an oversized one)."""
        return self._pending

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines found so far, without their b"\\n"."""
        if data.find(b"\n") < 0:
            self._hold(data)
            return []
        lines = data.split(b"\n")
        tail = lines.pop()
        if self._discarding:
            self._discarding = False
            del lines[0]
        elif self._parts:
            self._parts.append(lines[0])
            first = b"".join(self._parts)
            self._parts = []
            self._pending = 0
            if len(first) > self._max:
                self._oversized(len(first))
                del lines[0]
            else:
                lines[0] = first
        if len(data) > self._max:
            # Only possible when the cap is below the chunk size (small caps in tests).
            kept = []
            for line in lines:
                if len(line) > self._max:
                    self._oversized(len(line))
                else:
                    kept.append(line)
            lines = kept
        self._hold(tail)
        return lines

    def _hold(self, data: bytes) -> None:
        if not data or self._discarding:
            return
        self._pending += len(data)
        if self._pending > self._max:
            self._oversized(self._pending)
            self._parts = []
            self._pending = 0
            self._discarding = True
        else:
            self._parts.append(data)

    def _oversized(self, size: int) -> None:
        if self.on_oversized is not None:
            self.on_oversized(size)


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: Any


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Any


@dataclass(frozen=True, slots=True)
class Response:
    id: RequestId | None
    result: Any = None
    error: JsonRpcError | None = None


@dataclass(frozen=True, slots=True)
class Invalid:
    """Not a JSON-RPC message. `id` is set when the sender expects an answer to it;
    `answer_null` when it expects one but its id cannot be echoed (JSON-RPC: reply with null)."""

    reason: str
    id: RequestId | None = None
    answer_null: bool = False


Message = Request | Notification | Response | Invalid


def _valid_id(value: Any) -> bool:
    # bool is an int subclass; True is not a request id.
    return (type(value) is int) or isinstance(value, str)


def _error_from_wire(error: Any) -> JsonRpcError:
    if (
        isinstance(error, dict)
        and type(error.get("code")) is int
        and isinstance(error.get("message"), str)
    ):
        return JsonRpcError(error["code"], error["message"], error.get("data"))
    return JsonRpcError(INTERNAL_ERROR, "malformed error object from the peer", error)


def classify(obj: Any) -> Message:
    """What one decoded JSON value is. Lenient about a missing "jsonrpc" member."""
    if not isinstance(obj, dict):
        if isinstance(obj, list):
            return Invalid("batch requests are not supported")
        return Invalid(f"expected a JSON object, got {type(obj).__name__}")
    method = obj.get("method")
    if method is not None or "method" in obj:
        has_id = "id" in obj
        msg_id = obj.get("id")
        if has_id and not _valid_id(msg_id):
            return Invalid("request id must be an integer or a string", answer_null=True)
        echo = msg_id if has_id else None
        if not isinstance(method, str):
            return Invalid("method must be a string", echo)
        params = obj.get("params")
        if params is not None and not isinstance(params, dict | list):
            return Invalid("params must be an object or an array", echo)
        if has_id:
            return Request(obj["id"], method, params)
        return Notification(method, params)
    if "id" in obj and ("result" in obj or "error" in obj):
        msg_id = obj["id"]
        if msg_id is not None and not _valid_id(msg_id):
            return Invalid("response id must be an integer, a string or null")
        if "error" in obj and obj["error"] is not None:
            return Response(msg_id, error=_error_from_wire(obj["error"]))
        return Response(msg_id, result=obj.get("result"))
    if "id" in obj and _valid_id(obj["id"]):
        return Invalid("missing method", obj["id"])
    if "id" in obj:
        return Invalid("missing method, and the id is not an integer or a string", answer_null=True)
    return Invalid("neither a request, a notification nor a response")


def _dumps(msg: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # Lone surrogates cannot be UTF-8; the escaped form is still valid JSON.
        return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def encode(msg: Request | Notification | Response) -> bytes:
    """One wire line (with its b"\\n") for a message. Raises TypeError/ValueError when the
    params are not an object or array, or params/result are not JSON-serialisable."""
    out: dict[str, Any] = {"jsonrpc": "2.0"}
    if not isinstance(msg, Response) and not isinstance(msg.params, dict | list | None):
        raise TypeError(f"params of {msg.method} must be a dict, a list or None")
    if isinstance(msg, Request):
        out["id"] = msg.id
        out["method"] = msg.method
        if msg.params is not None:
            out["params"] = msg.params
    elif isinstance(msg, Notification):
        out["method"] = msg.method
        if msg.params is not None:
            out["params"] = msg.params
    else:
        out["id"] = msg.id
        if msg.error is not None:
            out["error"] = msg.error.to_error()
        else:
            out["result"] = msg.result
    return _dumps(out)


# ---------------------------------------------------------------------------------------
# trio adapter


@dataclass(slots=True)
class PeerStats:
    bytes_received: int = 0
    lines_received: int = 0
    requests_received: int = 0
    notifications_received: int = 0
    responses_received: int = 0
    invalid_lines: int = 0
    oversized_lines: int = 0
    unknown_responses: int = 0
    frames_sent: int = 0
    handler_errors: int = 0


@dataclass(slots=True)
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


def _excerpt(line: bytes) -> str:
    # An agent's stray output must not drive the terminal that shows this log line.
    text = terminal_safe(line[:_EXCERPT].decode("utf-8", "replace"))
    return text + ("…" if len(line) > _EXCERPT else "")


class JsonRpcPeer:
    """One end of a JSON-RPC connection over a pair of byte streams."""

    def __init__(
        self,
        send: trio.abc.SendStream,
        receive: trio.abc.ReceiveStream,
        *,
        name: str = "peer",
        request_handler: RequestHandler | None = None,
        notification_handler: NotificationHandler | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        tap: Tap | None = None,
        on_invalid_line: InvalidLineHook | None = None,
    ) -> None:
        self.name = name
        self.request_handler = request_handler
        self.notification_handler = notification_handler
        self.tap = tap
        self.on_invalid_line = on_invalid_line
        self.stats = PeerStats()
        self.closed = trio.Event()
        self.close_reason: str | None = None
        self._send = send
        self._receive = receive
        self._splitter = LineSplitter(max_line_bytes, self._on_oversized)
        self._max_line_bytes = max_line_bytes
        self._ids = itertools.count(1)
        self._pending: dict[RequestId, _Pending] = {}
        self._in_flight: dict[RequestId, trio.CancelScope] = {}
        self._cancelled_ids: set[RequestId] = set()
        self._write_lock = trio.Lock()
        self._write_scope: trio.CancelScope | None = None
        self._send_broken = False
        self._nursery: trio.Nursery | None = None
        self._run_scope: trio.CancelScope | None = None
        self._reader_task: trio.lowlevel.Task | None = None
        self._in_notification = False
        self._started = False
        # The raw frame of the notification being handled inline (see the module docstring).
        self.current_line: bytes | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed.is_set() else "open"
        return f"<JsonRpcPeer {self.name!r} {state}>"

    # -- reading ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read and dispatch until EOF or `aclose()`. On return every pending request has
        failed with ConnectionClosed and every inbound request handler is cancelled."""
        if self._started:
            raise RuntimeError(f"JsonRpcPeer {self.name!r}: run() was already called")
        self._started = True
        reason = f"connection to {self.name} was closed"
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._run_scope = nursery.cancel_scope
                self._reader_task = trio.lowlevel.current_task()
                try:
                    if not self.closed.is_set():
                        await self._read_loop()
                        reason = f"{self.name} closed the connection"
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    if not self.closed.is_set():
                        reason = (
                            f"the connection to {self.name} broke ({exc or type(exc).__name__})"
                        )
                finally:
                    # Nobody is left to read answers or cancels: stop inbound handlers.
                    nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._finish(reason)

    async def _read_loop(self) -> None:
        receive_some = self._receive.receive_some
        feed = self._splitter.feed
        # str decode + the decoder's scanner: faster than json.loads(bytes), which sniffs the
        # encoding of every line, and than JSONDecoder.decode, which matches whitespace around
        # the value with two regexes. A line the scanner does not end on (whitespace, garbage)
        # goes through `decode`, which accepts the first and explains the second.
        decode = _DECODER.decode
        scan = _SCAN
        stats = self.stats
        while True:
            data = await receive_some(_READ_SIZE)
            if not data:
                return
            if type(data) is not bytes:
                data = bytes(data)
            stats.bytes_received += len(data)
            lines = feed(data)
            stats.lines_received += len(lines)
            for line in lines:
                try:
                    text = line.decode("utf-8")
                    try:
                        obj, end = scan(text, 0)
                    except StopIteration:  # no value right at the start
                        end = -1
                    if end != len(text):
                        obj = decode(text)
                except (ValueError, RecursionError) as exc:
                    obj = self._parse_odd_line(line, exc)
                    if obj is _SKIP:
                        continue
                if _has_surrogate_escape(line):
                    obj = mend_surrogates(obj)
                if self.tap is not None:
                    self._call_tap("in", obj)
                # Fast path, inline: a well-formed notification (the flood case).
                if type(obj) is dict and "id" not in obj:
                    method = obj.get("method")
                    params = obj.get("params")
                    handler = self.notification_handler
                    if (
                        type(method) is str
                        and (params is None or type(params) is dict or type(params) is list)
                        and handler is not None
                        and method != CANCEL_METHOD
                    ):
                        stats.notifications_received += 1
                        self._in_notification = True
                        self.current_line = line
                        try:
                            await handler(method, params)
                        except JsonRpcError as exc:
                            # Notifications never get replies, even on errors.
                            logger.debug("%s: notification %s refused: %s", self.name, method, exc)
                        except Exception:
                            stats.handler_errors += 1
                            logger.exception(
                                "%s: notification handler failed on %s", self.name, method
                            )
                        finally:
                            self._in_notification = False
                            self.current_line = None
                        continue
                await self._dispatch(classify(obj), line)

    def _parse_odd_line(self, line: bytes, exc: BaseException) -> Any:
        """The slow path for a line the fast decode refused: blank, BOM-prefixed, garbage."""
        if not line.strip():
            return _SKIP
        if line.startswith(b"\xef\xbb\xbf"):
            try:
                return _DECODER.decode(line[3:].decode("utf-8"))
            except (ValueError, RecursionError) as exc2:
                exc = exc2
        self._invalid_line(line, f"not JSON ({type(exc).__name__})")
        return _SKIP

    async def _dispatch(self, msg: Message, line: bytes) -> None:
        if isinstance(msg, Notification):
            self.current_line = line
            try:
                await self._dispatch_notification(msg.method, msg.params)
            finally:
                self.current_line = None
        elif isinstance(msg, Request):
            self._start_request(msg)
        elif isinstance(msg, Response):
            self._deliver(msg)
        else:
            self._invalid_line(line, msg.reason)
            if msg.id is not None or msg.answer_null:
                self.reply_soon(Response(msg.id, error=JsonRpcError(INVALID_REQUEST, msg.reason)))

    async def _dispatch_notification(self, method: str, params: Any) -> None:
        self.stats.notifications_received += 1
        if method == CANCEL_METHOD:
            self._cancel_in_flight(params)
            return
        handler = self.notification_handler
        if handler is None:
            logger.debug("%s: notification %s ignored (no handler)", self.name, method)
            return
        self._in_notification = True
        try:
            await handler(method, params)
        except JsonRpcError as exc:
            # Notifications never get replies, even on errors.
            logger.debug("%s: notification %s refused: %s", self.name, method, exc)
        except Exception:
            self.stats.handler_errors += 1
            logger.exception("%s: notification handler failed on %s", self.name, method)
        finally:
            self._in_notification = False

    def _cancel_in_flight(self, params: Any) -> None:
        request_id: Any = params.get("requestId") if isinstance(params, dict) else None
        scope = self._in_flight.get(request_id) if _valid_id(request_id) else None
        if scope is None:
            logger.debug("%s: cancel for unknown or finished request %r", self.name, request_id)
            return
        scope.cancel()

    def _deliver(self, msg: Response) -> None:
        self.stats.responses_received += 1
        pending = self._pending.pop(msg.id, None) if msg.id is not None else None
        if pending is None:
            self.stats.unknown_responses += 1
            if msg.id in self._cancelled_ids:
                self._cancelled_ids.discard(msg.id)
                logger.debug("%s: late answer to cancelled request %r", self.name, msg.id)
            elif msg.id is None and msg.error is not None:
                logger.warning(
                    "%s reported an error about a frame it could not read: %s %r",
                    self.name,
                    msg.error.message,
                    msg.error.data,
                )
            else:
                logger.warning("%s: response with unknown id %r ignored", self.name, msg.id)
            return
        pending.result = msg.result
        pending.error = msg.error
        pending.done.set()

    def _invalid_line(self, line: bytes, reason: str) -> None:
        self.stats.invalid_lines += 1
        logger.warning("%s: skipped a line: %s: %s", self.name, reason, _excerpt(line))
        if self.on_invalid_line is not None:
            self._call_invalid_hook(line[:_EXCERPT], reason)

    # A hook's bug must not end the connection: hooks are observers.
    def _call_tap(self, direction: Literal["in", "out"], msg: Any) -> None:
        assert self.tap is not None
        try:
            self.tap(direction, msg)
        except Exception:
            logger.exception("%s: tap failed", self.name)

    def _call_invalid_hook(self, line: bytes, reason: str) -> None:
        assert self.on_invalid_line is not None
        try:
            self.on_invalid_line(line, reason)
        except Exception:
            logger.exception("%s: on_invalid_line hook failed", self.name)

    def _on_oversized(self, size: int) -> None:
        self.stats.oversized_lines += 1
        self.stats.invalid_lines += 1
        reason = f"line longer than {self._max_line_bytes} bytes (at least {size}) dropped"
        logger.warning("%s: %s", self.name, reason)
        if self.on_invalid_line is not None:
            self._call_invalid_hook(b"", reason)

    # -- inbound requests ---------------------------------------------------------------

    def _start_request(self, msg: Request) -> None:
        self.stats.requests_received += 1
        assert self._nursery is not None
        if msg.method == CANCEL_METHOD:
            self._cancel_in_flight(msg.params)
            self.reply_soon(Response(msg.id, result=None))
            return
        if msg.id in self._in_flight:
            self.reply_soon(
                Response(msg.id, error=JsonRpcError(INVALID_REQUEST, "request id already in use"))
            )
            return
        # Registered before the task starts, so a cancel right behind it finds it.
        scope = trio.CancelScope()
        self._in_flight[msg.id] = scope
        self._nursery.start_soon(self._serve_request, msg, scope)

    async def _serve_request(self, msg: Request, scope: trio.CancelScope) -> None:
        reply: Response
        try:
            with scope:
                if self.request_handler is None:
                    raise JsonRpcError(METHOD_NOT_FOUND, f"method not found: {msg.method}")
                result = await self.request_handler(msg.method, msg.params)
            if scope.cancelled_caught:
                reply = Response(msg.id, error=JsonRpcError(REQUEST_CANCELLED, "request cancelled"))
            else:
                reply = Response(msg.id, result=result)
        except JsonRpcError as exc:
            reply = Response(msg.id, error=exc)
        except Exception as exc:
            self.stats.handler_errors += 1
            logger.exception("%s: handler for %s failed", self.name, msg.method)
            reply = Response(
                msg.id,
                error=JsonRpcError(
                    INTERNAL_ERROR, f"internal error in {msg.method}: {type(exc).__name__}"
                ),
            )
        finally:
            self._in_flight.pop(msg.id, None)
        await self._send_reply(reply)

    def reply_soon(self, reply: Response) -> None:
        """Send a reply from code that cannot wait (e.g. a parse error seen by the read loop)."""
        if self._nursery is not None:
            self._nursery.start_soon(self._send_reply, reply)

    async def _send_reply(self, reply: Response) -> None:
        try:
            frame = encode(reply)
        except (TypeError, ValueError) as exc:
            logger.error("%s: result of request %r is not JSON: %s", self.name, reply.id, exc)
            frame = encode(
                Response(
                    reply.id, error=JsonRpcError(INTERNAL_ERROR, "result is not JSON-serialisable")
                )
            )
        try:
            await self._write(frame, reply)
        except ConnectionClosed:
            logger.debug("%s: reply to %r not sent: connection closed", self.name, reply.id)

    # -- outbound -----------------------------------------------------------------------

    async def request(self, method: str, params: Any = None) -> Any:
        """Send a request and wait for its answer (no timeout: use trio.fail_after)."""
        if self._in_notification and trio.lowlevel.current_task() is self._reader_task:
            raise RuntimeError(
                f"request({method!r}) awaited inside a notification handler would deadlock "
                "the read loop; run it with peer.start_soon()"
            )
        if self.closed.is_set():
            raise ConnectionClosed(self.close_reason or f"connection to {self.name} is closed")
        request_id = next(self._ids)
        msg = Request(request_id, method, params)
        frame = encode(msg)
        pending = _Pending()
        self._pending[request_id] = pending
        sent = False
        try:
            await self._write(frame, msg)
            sent = True
            await pending.done.wait()
        except trio.Cancelled:
            if sent and not pending.done.is_set() and not self.closed.is_set():
                self._remember_cancelled(request_id)
                with trio.move_on_after(_CANCEL_NOTICE_TIMEOUT, shield=True):
                    try:
                        await self.notify(CANCEL_METHOD, {"requestId": request_id})
                    except ConnectionClosed:
                        pass
            raise
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _remember_cancelled(self, request_id: RequestId) -> None:
        # Only to tell a late answer from a bogus one in the log; keep it bounded.
        if len(self._cancelled_ids) >= 1024:
            self._cancelled_ids.clear()
        self._cancelled_ids.add(request_id)

    async def notify(self, method: str, params: Any = None) -> None:
        msg = Notification(method, params)
        await self._write(encode(msg), msg)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the peer's nursery (the escape hatch for notification handlers
        that need a round trip). Cancelled when the connection ends; errors are logged."""
        if self._nursery is None:
            raise RuntimeError(f"JsonRpcPeer {self.name!r} is not running")
        self._nursery.start_soon(self._guarded, fn, args)

    async def _guarded(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        try:
            await fn(*args)
        except (ConnectionClosed, JsonRpcError) as exc:
            logger.debug("%s: background task %r ended: %s", self.name, fn, exc)
        except Exception:
            logger.exception("%s: background task %r failed", self.name, fn)

    async def _write(self, frame: bytes, msg: Any) -> None:
        async with self._write_lock:
            if self._send_broken or self.closed.is_set():
                raise ConnectionClosed(self.close_reason or f"connection to {self.name} is closed")
            # A frame cut in half would corrupt the stream: once started, a write is
            # finished whatever happens to its caller; only aclose() interrupts it.
            with trio.CancelScope(shield=True) as scope:
                self._write_scope = scope
                try:
                    await self._send.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._send_broken = True
                    raise ConnectionClosed(
                        f"cannot write to {self.name}: the connection is closed"
                    ) from exc
                finally:
                    self._write_scope = None
            if scope.cancelled_caught:
                self._send_broken = True
                raise ConnectionClosed(f"connection to {self.name} was closed while writing")
            self.stats.frames_sent += 1
            if self.tap is not None:
                self._call_tap("out", msg)

    # -- closing ------------------------------------------------------------------------

    def _finish(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.closed.set()
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.done.is_set():
                p.error = ConnectionClosed(self.close_reason)
                p.done.set()

    async def aclose(self) -> None:
        """Close both streams, stop `run()`, fail pending requests. Idempotent."""
        self._finish(f"connection to {self.name} was closed")
        if self._write_scope is not None:
            self._write_scope.cancel()
        if self._run_scope is not None:
            self._run_scope.cancel()
        with trio.CancelScope(shield=True):
            for stream in (self._send, self._receive):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def __aenter__(self) -> JsonRpcPeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
